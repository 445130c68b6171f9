"""One HTTP exchange of an LLM SDK as a boundary call: the request the SDK built, the response it
got (or a stream of server-sent events), recorded as JSON and served again as the SDK's own
``httpx2``/``httpx`` response, so the SDK rebuilds its typed objects, streams and errors itself.

Recorded input (the real request, never its headers' secrets)::

    {"method": "POST", "url": "chat/completions", "body": {...}, "query": {...}?, "headers": {...}?}

``url`` is relative to the client's ``base_url`` (a bundle recorded against one deployment
replays against another), ``query`` holds the URL parameters (Azure's ``api-version``) and
``headers`` only the few request headers that change what the API does (:data:`SEMANTIC_HEADERS`,
e.g. ``anthropic-version``). Authorization, API keys, cookies, idempotency keys, retry counts,
user agents and trace headers are never recorded: they are secrets or vary between runs.

Recorded output: ``{"status": 200, "headers": {...}, "body": <JSON>}`` (``"text"`` when the body is
not JSON), or for an event stream ``{"status", "headers", "chunks": [event, ...], "complete"}``
(see :mod:`stepfork_otel.recording.streams`), each event ``{"event"?, "data": <JSON>}`` (``"text"``
for data that is not JSON, like OpenAI's ``[DONE]``). Only :data:`RESPONSE_HEADERS` are kept: the
ones the SDKs read (content type, request id, retry hints, rate-limit state).

Live, the SDK gets the real response (a stream passes through the recorder, re-serialised event by
event, so what the SDK parses live and in replay is the same bytes). In replay it gets a response
built here from the recording -- no socket is opened. A transport failure (timeout, connection
error) is recorded as the call's error and replayed as the HTTP library's own exception class,
picked by name from :data:`TRANSPORT_ERRORS` (trusted code, a fixed list; a name outside it
replays as the session's ``RecordedDependencyError``), which the SDK wraps exactly as it did live
(``APITimeoutError``, ``APIConnectionError``). Error statuses need nothing special: a recorded 429
is served as a 429, and the SDK raises its own ``RateLimitError`` from it.
"""

from __future__ import annotations

import datetime
import functools
import json
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import orjson

#: Request headers recorded (and matched) because they change what the API does.
SEMANTIC_HEADERS: frozenset[str] = frozenset({"anthropic-version", "anthropic-beta", "openai-beta"})

#: Response headers recorded and served again: the ones the SDKs read.
RESPONSE_HEADERS: frozenset[str] = frozenset(
    {
        "content-type",
        "x-request-id",
        "request-id",
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
        "openai-processing-ms",
    }
)
_RESPONSE_HEADER_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")

#: Transport errors a recorded failure may be replayed as (class names of httpx/httpx2).
TRANSPORT_ERRORS: frozenset[str] = frozenset(
    {
        "TimeoutException",
        "ConnectTimeout",
        "ReadTimeout",
        "WriteTimeout",
        "PoolTimeout",
        "NetworkError",
        "ConnectError",
        "ReadError",
        "WriteError",
        "CloseError",
        "RemoteProtocolError",
        "LocalProtocolError",
        "ProtocolError",
        "ProxyError",
        "TransportError",
        "UnsupportedProtocol",
    }
)

_SSE = "text/event-stream"

#: Keys of a recorded response that hold its body (a streamed request answered without events,
#: e.g. a 429, records its body like any response).
STREAM_BODY_KEYS: frozenset[str] = frozenset({"body", "text", "bytes"})


def _kept_response_headers(headers: Any) -> dict[str, str]:
    kept: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in RESPONSE_HEADERS or lower.startswith(_RESPONSE_HEADER_PREFIXES):
            kept[lower] = value
    return kept


def _decoded(content: bytes, content_type: str) -> tuple[str, Any]:
    """``("body", JSON value)`` for JSON content, else ``("text", str)``, else raw bytes."""
    if content and ("json" in content_type or content[:1] in (b"{", b"[")):
        try:
            return "body", json.loads(content)
        except ValueError:
            pass
    try:
        return "text", content.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes", content


def _relative_url(url: Any, base_url: Any) -> str:
    """The request URL without scheme, host and query, relative to the client's base URL."""
    path = str(url.copy_with(query=None, fragment=None))
    base = str(base_url).rstrip("/") + "/"
    if path.startswith(base):
        return path[len(base) :]
    return str(url.path).lstrip("/")


def request_input(request: Any, base_url: Any) -> dict[str, Any]:
    """The recorded input of an SDK request (see the module docstring)."""
    content = request.read() if hasattr(request, "read") else request.content
    recorded: dict[str, Any] = {
        "method": request.method,
        "url": _relative_url(request.url, base_url),
    }
    if content:
        key, value = _decoded(content, request.headers.get("content-type", ""))
        recorded[key] = value
    params = request.url.params
    if params:
        recorded["query"] = {name: params.get_list(name) for name in sorted(set(params.keys()))}
    headers = {
        name.lower(): value
        for name, value in request.headers.items()
        if name.lower() in SEMANTIC_HEADERS
    }
    if headers:
        recorded["headers"] = dict(sorted(headers.items()))
    return recorded


def response_head(response: Any) -> dict[str, Any]:
    return {"status": response.status_code, "headers": _kept_response_headers(response.headers)}


def response_record(response: Any) -> dict[str, Any]:
    """The recorded output of a response whose body was read."""
    head = response_head(response)
    content = response.content
    if content:
        key, value = _decoded(content, response.headers.get("content-type", ""))
        head[key] = value
    return head


def is_event_stream(response: Any) -> bool:
    return _SSE in response.headers.get("content-type", "")


# --- server-sent events -------------------------------------------------------------------------


def _event(lines: list[str]) -> dict[str, Any] | None:
    name: str | None = None
    data: list[str] = []
    event_id: str | None = None
    for line in lines:
        if not line or line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value
    if name is None and not data and event_id is None:
        return None
    event: dict[str, Any] = {}
    if name is not None:
        event["event"] = name
    if event_id is not None:
        event["id"] = event_id
    text = "\n".join(data)
    try:
        event["data"] = json.loads(text)
    except ValueError:
        event["text"] = text
    return event


class _EventSplitter:
    """Splits a byte stream into events (lines to a blank line), whatever the chunk borders."""

    def __init__(self) -> None:
        self._buffer = b""
        self._lines: list[str] = []

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        events: list[dict[str, Any]] = []
        while True:
            cut = min(
                (i for i in (self._buffer.find(b"\n"), self._buffer.find(b"\r")) if i >= 0),
                default=-1,
            )
            if cut < 0:
                return events
            line = self._buffer[:cut]
            skip = 2 if self._buffer[cut : cut + 2] == b"\r\n" else 1
            if self._buffer[cut : cut + 1] == b"\r" and cut + 1 == len(self._buffer):
                return events  # a lone CR at the end: wait, it may be half of CRLF
            self._buffer = self._buffer[cut + skip :]
            if line:
                self._lines.append(line.decode("utf-8", errors="replace"))
                continue
            event = _event(self._lines)
            self._lines = []
            if event is not None:
                events.append(event)

    def end(self) -> list[dict[str, Any]]:
        lines = self._lines
        if self._buffer:
            lines.append(self._buffer.decode("utf-8", errors="replace"))
        self._buffer, self._lines = b"", []
        event = _event(lines)
        return [] if event is None else [event]


def sse_events(pieces: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    splitter = _EventSplitter()
    for piece in pieces:
        yield from splitter.feed(piece)
    yield from splitter.end()


async def async_sse_events(pieces: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    splitter = _EventSplitter()
    async for piece in pieces:
        for event in splitter.feed(piece):
            yield event
    for event in splitter.end():
        yield event


#: Events after which a stream has nothing more to say (the SDKs stop reading there).
_FINAL_EVENTS = frozenset(
    {"message_stop", "response.completed", "response.failed", "response.incomplete", "error"}
)


def is_final_event(event: Any) -> bool:
    if not isinstance(event, dict):
        return False
    if event.get("text") == "[DONE]":
        return True
    data = event.get("data")
    kind = data.get("type") if isinstance(data, dict) else None
    return event.get("event") in _FINAL_EVENTS or kind in _FINAL_EVENTS


def event_bytes(event: Any) -> bytes:
    """One recorded event as the server sent it (``event:``/``id:``/``data:`` lines)."""
    if not isinstance(event, dict):
        return b""
    out: list[bytes] = []
    if "event" in event:
        out.append(b"event: " + str(event["event"]).encode())
    if "id" in event:
        out.append(b"id: " + str(event["id"]).encode())
    if "data" in event:
        out.append(b"data: " + orjson.dumps(event["data"]))
    elif "text" in event:
        out.extend(b"data: " + line.encode() for line in str(event["text"]).split("\n"))
    return b"\n".join(out) + b"\n\n"


# --- responses given to the SDK ------------------------------------------------------------------


def body_bytes(record: dict[str, Any]) -> bytes:
    if "body" in record:
        return orjson.dumps(record["body"])
    if "text" in record:
        return str(record["text"]).encode("utf-8")
    raw = record.get("bytes")
    return raw if isinstance(raw, bytes) else b""


def _elapsed(start: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=time.perf_counter() - start)


def _set_elapsed(response: Any, start: float) -> None:
    """A streamed response's ``elapsed``, set when it is closed (the first time)."""
    if response is not None and not hasattr(response, "_elapsed"):
        response.elapsed = _elapsed(start)


def _no_response() -> None:
    return None


@functools.cache
def _event_streams(module: ModuleType) -> tuple[type, type]:
    """Byte streams (sync, async) of the HTTP library ``module`` that serialise events as they
    are read: its responses accept only its own stream classes. Closing one sets its response's
    ``elapsed``, as the HTTP client's own stream does (a response's ``elapsed`` is readable once
    it is closed)."""

    class Events(module.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, events: Iterator[Any], start: float) -> None:
            self._events = events
            self._start = start
            self.response: Callable[[], Any] = _no_response

        def __iter__(self) -> Iterator[bytes]:
            for event in self._events:
                yield event_bytes(event)

        def close(self) -> None:
            _set_elapsed(self.response(), self._start)
            closer = getattr(self._events, "close", None)
            if closer is not None:
                closer()

    class AsyncEvents(module.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, events: AsyncIterator[Any], start: float) -> None:
            self._events = events
            self._start = start
            self.response: Callable[[], Any] = _no_response

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for event in self._events:
                yield event_bytes(event)

        async def aclose(self) -> None:
            _set_elapsed(self.response(), self._start)
            closer = getattr(self._events, "aclose", None)
            if closer is not None:
                await closer()

    return Events, AsyncEvents


@dataclass(frozen=True, slots=True)
class Http:
    """The HTTP library a client sends with (``httpx2``, or ``httpx`` for older SDKs).

    The responses built here behave as the client's own: a read one has its ``elapsed`` (the
    time since ``start``, when the SDK's ``send`` was called: in replay, the time replay took to
    serve it), a streamed one gets it when it is closed. ``with_raw_response`` and
    ``with_streaming_response`` hand these objects to the agent."""

    module: ModuleType

    def response(self, request: Any, record: dict[str, Any], start: float) -> Any:
        """A read response built from a recorded one."""
        response = self.module.Response(
            int(record.get("status", 200)),
            headers=dict(record.get("headers") or {}),
            content=body_bytes(record),
            request=request,
        )
        response.elapsed = _elapsed(start)
        return response

    def streamed(
        self, request: Any, status: int, headers: Any, events: Iterator[Any], start: float
    ) -> Any:
        """A response whose body is ``events``, re-serialised as they are read."""
        return self._streamed(
            _event_streams(self.module)[0](events, start), request, status, headers
        )

    def astreamed(
        self, request: Any, status: int, headers: Any, events: AsyncIterator[Any], start: float
    ) -> Any:
        return self._streamed(
            _event_streams(self.module)[1](events, start), request, status, headers
        )

    def _streamed(self, stream: Any, request: Any, status: int, headers: Any) -> Any:
        response = self.module.Response(status, headers=headers, stream=stream, request=request)
        stream.response = weakref.ref(response)  # (no cycle: the response goes when dropped)
        return response

    def transport_error(self, error_type: str, message: str, request: Any) -> BaseException | None:
        """The HTTP library's own exception for a recorded transport failure, or None."""
        name = error_type.rsplit(".", 1)[-1]
        if name not in TRANSPORT_ERRORS:
            return None
        cls = getattr(self.module, name, None)
        if not (isinstance(cls, type) and issubclass(cls, self.module.TransportError)):
            return None
        error: BaseException = cls(message, request=request)
        return error

    def is_transport_error(self, error: BaseException) -> bool:
        return isinstance(error, self.module.TransportError)


def head_of(record: dict[str, Any]) -> tuple[int, dict[str, str]]:
    status = record.get("status", 200)
    headers = record.get("headers")
    return (
        status if isinstance(status, int) else 200,
        dict(headers) if isinstance(headers, dict) else {},
    )
