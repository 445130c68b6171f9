"""Instrumenting a Stainless-generated LLM SDK (``openai``, ``anthropic``): where, and why there.

Where: two points of the SDK's base client, both stable across its releases. ``request`` (the
method every resource method ends in, on ``SyncAPIClient``/``AsyncAPIClient``) marks the calls
that come from the SDK, in a context variable; the HTTP client's ``send`` (``httpx2``, or
``httpx`` for older releases and for a client given ``http_client=httpx.Client()``) is where the
request is complete -- model, messages, tools, ``extra_body`` all in its body -- and where a
response can be served without a socket. Each ``send`` is one boundary call (an HTTP attempt),
so the SDK's own retries replay attempt by attempt; ``_sleep_for_retry`` returns at once during
a replay session, so a replayed 429-then-200 costs no real waiting (an SDK release without that
method sleeps as it did live).

Why not the public methods (``chat.completions.create`` & co.), as the GenAI instrumentations
do: a recorded response would have to be rebuilt into the SDK's types by us, per method and per
release, and streams, ``with_raw_response``, ``.parse()``, error classes and responses the SDK
accepts without validating would each be a special case. At ``send`` the SDK does all of it
itself, from the bytes it was given, the same way live and in replay.

Why the context variable: ``send`` of an HTTP client that is not the SDK's (the agent's own
``httpx`` calls) must stay untouched; only sends made inside an instrumented SDK ``request`` are
boundaries. A replay error raised at ``send`` is carried through the SDK's ``except Exception``
blocks (which would wrap it as ``APIConnectionError`` and retry) as a ``BaseException`` and raised
unchanged from ``request``.

Instrumenting patches the classes, so clients created before and after are covered; passing a
client patches that instance only (copies made with ``with_options`` are not covered).

Beside other instrumentations of the same methods (openinference wraps ``OpenAI.request`` with
wrapt, before or after stepfork): a method stepfork wraps is called bound, as Python calls a
method, whatever kind of wrapper it is; stepfork knows its own wrappers by their own
``__dict__`` (a proxy around one of them hands out its attributes), so undoing stepfork never
takes another instrumentation's wrapper off; the loggers of the instrumentations found around
``request`` are watched, and an error one logs is said on stepfork's logger (they catch their own
failures and their spans silently go missing); and a send by an SDK's HTTP client outside
``request`` while the SDK is instrumented -- another instrumentation, undone, put back the
method it saved before stepfork's -- is said too.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import logging
import sys
import threading
import time
import types
import typing
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace as trace_api

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors
from stepfork_otel._patching import Patcher
from stepfork_otel.config import CONFIG
from stepfork_otel.recording import boundaries
from stepfork_otel.recording.contract import current_session
from stepfork_otel.recording.integrations import exchange
from stepfork_otel.recording.integrations.exchange import Http
from stepfork_otel.recording.streams import StreamStart
from stepfork_otel.trace.foreign_responses import restreamed
from stepfork_otel.trace.payload import exception_message, qualified_name

logger = logging.getLogger("stepfork_otel")

Describe = Callable[[str, str, bool, Any], dict[str, Any]]
"""``(redacted input text, redacted output text, usage counted elsewhere, the output already
parsed from that text or None) -> span attributes``."""


INPUT_HINT = (
    "the input is the request the SDK sent: every parameter counts, and an id or a timestamp "
    "that the agent or its framework puts in the request must be the same as when recorded"
)


@dataclass(frozen=True, slots=True)
class Provider:
    """One SDK: how its requests become boundary calls."""

    name: str
    """``gen_ai.provider.name``."""
    module: str
    """The SDK's top-level package."""
    operation: Callable[[str, str], str]
    """``(method, relative url) -> gen_ai.operation.name``."""
    describe: Describe


@dataclass(slots=True)
class _SdkCall:
    provider: Provider
    base_url: Any


_current: ContextVar[_SdkCall | None] = ContextVar("stepfork_sdk_call", default=None)


class _Carried(BaseException):
    """A replay error on its way through the SDK's ``except Exception`` blocks."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


_PATCHES = Patcher("instrumenting LLM SDKs")
"""Every patch of the SDKs' clients and of the HTTP libraries' ``send``."""


def _original(function: Any) -> Any:
    """What ``function`` wraps when it is one of stepfork's wrappers, else None (see
    :meth:`~stepfork_otel._patching.Patcher.replaced`: never read through a proxy)."""
    return _PATCHES.replaced(function)


def _as_function(method: Any) -> Callable[..., Any]:
    """``method`` (a class attribute) as a plain function of ``(self, *args, **kwargs)``.

    Another instrumentation's wrapper is not always a function: wrapt's ``FunctionWrapper``
    (openinference, most OpenTelemetry instrumentations) is a descriptor that learns the
    instance by being bound to it. Called unbound with the instance as first argument, it takes
    the instance for the method's first argument (openinference then read the client as
    ``cast_to`` and dropped its span); bound through the descriptor protocol, as Python binds a
    method, it works as it does on its own."""
    if type(method) is types.FunctionType:
        return typing.cast(Callable[..., Any], method)

    def bound(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method.__get__(self, type(self))(*args, **kwargs)

    # (not its __dict__: a proxy's is that of what it wraps, which may be a wrapper of ours)
    return functools.update_wrapper(bound, method, updated=())


def _wrapper(
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> Callable[[Any], Callable[..., Any]]:
    """What :meth:`Patcher.wrap` calls with the method it replaces: ``wrap`` applied to it."""
    return lambda current: wrap(_as_function(current))


# --- the SDK's request: marks the calls that come from the SDK -----------------------------------


def _marks(provider: Provider, client: Any) -> bool:
    """A wrapper left behind (another instrumentation restored a copy of it when it was undone)
    marks nothing once the SDK is no longer instrumented."""
    return provider.module in _instrumented or "request" in vars(client)


def _mark(provider: Provider, client: Any) -> Token[_SdkCall | None]:
    """Mark the calls made in this request as the SDK's; the outermost mark first looks at
    what else wraps the client's ``request`` (see :func:`_look_around`)."""
    if _current.get() is None:
        _look_around(type(client), provider)
    return _current.set(_SdkCall(provider, getattr(client, "base_url", "")))


def _sync_request(provider: Provider, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _marks(provider, self):
            return original(self, *args, **kwargs)
        token = _mark(provider, self)
        try:
            return original(self, *args, **kwargs)
        except _Carried as carried:
            raise carried.error from None
        finally:
            _current.reset(token)

    return request


def _async_request(provider: Provider, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _marks(provider, self):
            return await original(self, *args, **kwargs)
        token = _mark(provider, self)
        try:
            return await original(self, *args, **kwargs)
        except _Carried as carried:
            raise carried.error from None
        finally:
            _current.reset(token)

    return request


def _sync_sleep(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current_session.get() is not None:
            return None  # a replayed retry: the recorded response is already here
        return original(self, *args, **kwargs)

    return sleep_for_retry


def _async_sleep(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def sleep_for_retry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if current_session.get() is not None:
            return None
        return await original(self, *args, **kwargs)

    return sleep_for_retry


# --- the HTTP client's send: the boundary --------------------------------------------------------


def _usage_elsewhere() -> bool:
    """True when the current span is another instrumentation's GenAI span (openai-v2,
    openinference, the Anthropic SDK's own spans): it reports the token usage, so this call's
    span does not, and dashboards count it once."""
    span = trace_api.get_current_span()
    attributes = getattr(span, "attributes", None)
    if not attributes or attributes.get(k.KIND) is not None:
        return False
    return attributes.get(k.GEN_AI_OPERATION_NAME) is not None or attributes.get(
        k.OPENINFERENCE_SPAN_KIND
    ) in ("LLM", "EMBEDDING")


def _prepare(call: _SdkCall, http: Http, request: Any) -> Any:
    """The boundary call of one request (None: stepfork failed preparing it, logged)."""
    with handle_internal_errors("preparing an SDK call"):
        recorded = exchange.request_input(request, call.base_url)
        body = recorded.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        model = model if isinstance(model, str) else ""
        provider = call.provider
        operation = provider.operation(recorded["method"], recorded["url"])
        elsewhere = _usage_elsewhere()
        return boundaries.prepare_integration_call(
            provider.name,
            model,
            operation,
            recorded,
            span_name=f"{operation} {model}" if model else operation,
            input_hint=INPUT_HINT,
            view=exchange.response_record,
            describe=lambda i, o, parsed: provider.describe(i, o, elsewhere, parsed),
            rebuild_error=lambda error_type, message: http.transport_error(
                error_type, message, request
            ),
            restream=lambda record: restreamed(provider.name, recorded, record),
        )
    return None


_said_unmarked: set[str] = set()


def _check_unmarked(http_client: Any) -> None:
    """A send by the HTTP client an SDK made for itself, outside any ``request`` of ours,
    while the SDK is instrumented class-wide: the client class's ``request`` was replaced after
    stepfork patched it -- another instrumentation, undone, put back the method it had saved
    before stepfork's (openinference does) -- and the SDK's calls are silently not recorded.
    Said once, with the way out."""
    package = type(http_client).__module__.partition(".")[0]
    if package in _instrumented and package not in _said_unmarked:
        _said_unmarked.add(package)
        logger.warning(
            "stepfork_otel: a request of the %s SDK was sent outside stepfork_otel's "
            "instrumentation and is not recorded: its client's request method was replaced "
            "after instrument_%s() (undoing another instrumentation puts back the method it "
            "saved); call instrument_%s() again",
            package,
            package,
            package,
        )


def _carry(error: BaseException, raised_by_body: list[BaseException], http: Http) -> BaseException:
    """What ``send`` raises: the SDK's own path for a live or replayed transport failure;
    anything else stepfork raised on purpose is carried past the SDK to ``request``."""
    if (raised_by_body and error is raised_by_body[0]) or http.is_transport_error(error):
        return error
    return _Carried(error)


def _sync_send(http: Http, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        call = _current.get()
        if call is None:
            if _instrumented:
                _check_unmarked(self)
            return original(self, request, *args, **kwargs)
        start = time.perf_counter()  # (a response built here has its elapsed from it)
        prepared = _prepare(call, http, request)
        if prepared is None:
            return original(self, request, *args, **kwargs)
        raised: list[BaseException] = []
        live: list[Any] = []

        def perform() -> Any:
            try:
                response = original(self, request, *args, **kwargs)
            except BaseException as exc:
                raised.append(exc)
                raise
            live.append(response)
            return response

        try:
            if not kwargs.get("stream"):
                result = boundaries.run_sync(prepared, perform)
                return result if live else http.response(request, result, start)

            def open_stream() -> StreamStart[Any]:
                response = perform()
                if not exchange.is_event_stream(response):
                    response.read()
                    return StreamStart(iter(()), exchange.response_record(response))
                events = exchange.sse_events(response.iter_bytes())
                return StreamStart(
                    events,
                    exchange.response_head(response),
                    response.close,
                    exchange.is_final_event,
                )

            head, events = boundaries.run_stream_sync(prepared, open_stream)
            if live and not exchange.is_event_stream(live[0]):
                for _ in events:  # no events: the call is finished now
                    pass
                return live[0]
            if not live and exchange.STREAM_BODY_KEYS & head.keys():
                return http.response(request, head, start)
            status, headers = (
                (live[0].status_code, live[0].headers) if live else exchange.head_of(head)
            )
            return http.streamed(request, status, headers, events, start)
        except BaseException as exc:
            raise _carry(exc, raised, http) from None

    return send


def _async_send(http: Http, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def send(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        call = _current.get()
        if call is None:
            if _instrumented:
                _check_unmarked(self)
            return await original(self, request, *args, **kwargs)
        start = time.perf_counter()  # (a response built here has its elapsed from it)
        prepared = _prepare(call, http, request)
        if prepared is None:
            return await original(self, request, *args, **kwargs)
        raised: list[BaseException] = []
        live: list[Any] = []

        async def perform() -> Any:
            try:
                response = await original(self, request, *args, **kwargs)
            except BaseException as exc:
                raised.append(exc)
                raise
            live.append(response)
            return response

        try:
            if not kwargs.get("stream"):
                result = await boundaries.run_async(prepared, perform)
                return result if live else http.response(request, result, start)

            async def open_stream() -> StreamStart[Any]:
                response = await perform()
                if not exchange.is_event_stream(response):
                    await response.aread()
                    return StreamStart(_no_events(), exchange.response_record(response))
                events = exchange.async_sse_events(response.aiter_bytes())
                return StreamStart(
                    events,
                    exchange.response_head(response),
                    response.aclose,
                    exchange.is_final_event,
                )

            head, events = await boundaries.run_stream_async(prepared, open_stream)
            if live and not exchange.is_event_stream(live[0]):
                async for _ in events:
                    pass
                return live[0]
            if not live and exchange.STREAM_BODY_KEYS & head.keys():
                return http.response(request, head, start)
            status, headers = (
                (live[0].status_code, live[0].headers) if live else exchange.head_of(head)
            )
            return http.astreamed(request, status, headers, events, start)
        except BaseException as exc:
            raise _carry(exc, raised, http) from None

    return send


async def _no_events() -> Any:
    return
    yield  # an async generator with nothing in it


# --- other instrumentations of the same methods -------------------------------------------------


class _FailureWatch(logging.Filter):
    """Sees the errors an instrumentation logs about itself (it never raises into the SDK call:
    its spans of the call are then silently missing, and nobody sees the log unless logging is
    configured, as openinference logs on a logger with only a ``NullHandler``) and says them
    on stepfork's logger, once per failure. A filter on the instrumentation's own loggers, not a
    handler: it changes nothing of where their records go."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and (_instrumented or any(_clients.values())):
            with contextlib.suppress(Exception):  # a log record must never break the SDK call
                _say_failure(record)
        return True


_WATCH = _FailureWatch()
_said: set[tuple[str, str, str]] = set()
_looked: set[tuple[type, int]] = set()
"""(client class, id of its ``request`` attribute) already looked at."""


def _say_failure(record: logging.LogRecord) -> None:
    error = record.exc_info[1] if record.exc_info else None
    key = (record.name, str(record.msg), type(error).__name__)
    if key in _said:
        return
    _said.add(key)
    redactor = CONFIG.settings.redactor
    why = "" if error is None else f" ({qualified_name(type(error))}: "
    why += "" if error is None else exception_message(error, redactor) + ")"
    logger.warning(
        "stepfork_otel: %s failed on an SDK call that stepfork_otel instruments too: %s%s; "
        "its telemetry of such calls is missing or partial (stepfork_otel's own recording is "
        "not affected). Said once per failure.",
        record.name,
        redactor.redact_message(record.getMessage()),
        why,
    )


def _look_around(cls: type, provider: Provider) -> None:
    """Watch the loggers of every other instrumentation that wraps ``cls.request`` (before or
    after stepfork did), found by walking the chain of wrappers (``__wrapped__``). Looked at
    once per class and ``request`` attribute: an instrumentation added later puts a new
    attribute there."""
    head = _static(cls, "request")
    key = (cls, id(head))
    if key in _looked:
        return
    _looked.add(key)
    with handle_internal_errors("looking for other instrumentations of an SDK"):
        packages = _wrapping_packages(head, provider.module)
        inside = tuple(package + "." for package in packages)
        for name, found in list(logging.Logger.manager.loggerDict.items()):
            watched = packages and (name in packages or name.startswith(inside))
            if watched and isinstance(found, logging.Logger) and _WATCH not in found.filters:
                found.addFilter(_WATCH)


def _wrapping_packages(method: Any, sdk_module: str) -> list[str]:
    """The packages whose wrappers are in ``method``'s chain of wrappers, other than the SDK and
    stepfork: each wrapper's package, cut before its first private part
    (``openinference.instrumentation.openai._request`` -> ``openinference.instrumentation.openai``)."""
    found: list[str] = []
    for _ in range(64):  # each wrapper points at the next (bounded: a cycle ends too)
        if method is None:
            break
        original = _original(method)
        if original is not None:
            method = original
            continue
        module = _defined_in(method)
        if module is not None and module.split(".")[0] not in (sdk_module, "stepfork_otel"):
            if not hasattr(sys.modules.get(module), "__path__"):  # a module: its package
                module = module.rpartition(".")[0] or module
            parts = itertools.takewhile(lambda part: not part.startswith("_"), module.split("."))
            package = ".".join(parts)
            if package and package not in found:
                found.append(package)
        method = getattr(method, "__wrapped__", None)
    return found


def _defined_in(method: Any) -> str | None:
    """The module that defined a wrapper: a function's own globals (``functools.wraps`` copies
    the wrapped function's ``__module__``), or for wrapt's ``FunctionWrapper`` that of its
    wrapper (a function, a method, or an object with ``__call__``)."""
    if type(method) is not types.FunctionType:
        method = getattr(method, "_self_wrapper", None)
        while isinstance(method, functools.partial):
            method = method.func
        method = getattr(method, "__func__", method)  # a bound method: its function
        if method is None:
            return None
        if type(method) is not types.FunctionType:
            return type(method).__module__
    name = method.__globals__.get("__name__")
    return name if isinstance(name, str) else None


# --- instrumenting and undoing it ----------------------------------------------------------------

_lock = threading.Lock()
_instrumented: set[str] = set()
"""The SDK packages instrumented class-wide."""
_clients: dict[str, int] = {}
"""Providers with instrumented clients (count), which need the HTTP patch too."""


def _static(cls: type, name: str) -> Any:
    """The attribute ``name`` of ``cls`` as its class dictionary holds it (not bound)."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _with_own(root: type, name: str) -> list[type]:
    """``root`` and every subclass that defines ``name`` itself: another instrumentation
    (openinference wraps ``OpenAI.request``) puts its own wrapper on the subclass, which
    would otherwise hide the base class's method from this one."""
    found: list[type] = [root]
    todo: list[type] = list(root.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if name in vars(cls):
            found.append(cls)
    return found


def _http_libraries() -> list[Http]:
    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(Http(importlib.import_module(name)))
        except ImportError:
            continue
    return found


def _install_http() -> None:
    for http in _http_libraries():
        _PATCHES.wrap(http.module.Client, "send", _wrapper(functools.partial(_sync_send, http)))
        _PATCHES.wrap(
            http.module.AsyncClient, "send", _wrapper(functools.partial(_async_send, http))
        )


def _uninstall_http() -> None:
    if _instrumented or any(_clients.values()):
        return
    for http in _http_libraries():
        _PATCHES.restore(http.module.Client, "send")
        _PATCHES.restore(http.module.AsyncClient, "send")


def _base_client(provider: Provider) -> Any:
    try:
        return importlib.import_module(f"{provider.module}._base_client")
    except ImportError as exc:
        raise ImportError(
            f"instrumenting {provider.name} needs the '{provider.module}' package: "
            f"pip install 'stepfork-otel[{provider.module}]'"
        ) from exc


def instrument(provider: Provider, client: Any = None) -> None:
    """Make every request of the SDK (or of ``client`` only) a boundary call. Idempotent."""
    base = _base_client(provider)
    with _lock:
        _install_http()
        if client is None:
            for cls in _with_own(base.SyncAPIClient, "request"):
                _PATCHES.wrap(cls, "request", _wrapper(functools.partial(_sync_request, provider)))
            for cls in _with_own(base.AsyncAPIClient, "request"):
                _PATCHES.wrap(cls, "request", _wrapper(functools.partial(_async_request, provider)))
            _PATCHES.wrap(base.SyncAPIClient, "_sleep_for_retry", _wrapper(_sync_sleep))
            _PATCHES.wrap(base.AsyncAPIClient, "_sleep_for_retry", _wrapper(_async_sleep))
            _instrumented.add(provider.module)
            _said_unmarked.discard(provider.module)
            _said.clear()  # said once per failure from here on
            _looked.clear()
            return
        if not isinstance(client, (base.SyncAPIClient, base.AsyncAPIClient)):
            raise TypeError(
                f"instrument_{provider.module}() expects a {provider.module} client, "
                f"got {type(client).__name__}"
            )
        if "request" in vars(client):
            return  # this client is instrumented already
        is_async = isinstance(client, base.AsyncAPIClient)
        wrap = _async_request if is_async else _sync_request
        method = wrap(provider, _as_function(_static(type(client), "request")))
        _PATCHES.replace(client, "request", types.MethodType(method, client))
        sleep = _static(type(client), "_sleep_for_retry")
        if sleep is not None and _original(sleep) is None:
            sleeper = (_async_sleep if is_async else _sync_sleep)(_as_function(sleep))
            _PATCHES.replace(client, "_sleep_for_retry", types.MethodType(sleeper, client))
        _clients[provider.name] = _clients.get(provider.name, 0) + 1


def uninstrument(provider: Provider, client: Any = None) -> None:
    """Undo :func:`instrument` (for the SDK, or for ``client``). Idempotent."""
    try:
        base = _base_client(provider)
    except ImportError:
        return
    with _lock:
        if client is None:
            for root in (base.SyncAPIClient, base.AsyncAPIClient):
                for cls in _with_own(root, "request"):
                    _PATCHES.restore(cls, "request")
                _PATCHES.restore(root, "_sleep_for_retry")
            _instrumented.discard(provider.module)
        elif "request" in vars(client):
            _PATCHES.restore(client, "request")
            _PATCHES.restore(client, "_sleep_for_retry")
            _clients[provider.name] = max(0, _clients.get(provider.name, 0) - 1)
        _uninstall_http()
