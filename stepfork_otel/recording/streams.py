"""Streamed boundary calls: a stream is recorded chunk by chunk and replayed as a stream.

A streaming call returns before its result exists: the chunks arrive while the agent consumes
them, and the agent may stop early, or the stream may break half-way. So the boundary cannot
record the outcome when the body returns, as it does for every other call. Instead the body
returns a :class:`StreamStart` -- what is known before the first chunk (``head``: for an SDK call,
the HTTP status and headers) and the chunk iterator -- and the boundary hands the caller a
:class:`LiveStream` that passes every chunk through, keeps it, and finishes the call exactly once:
when the iterator is exhausted (``complete``), closed early (not ``complete``: the recording says
how far the agent read), broken by an exception (the chunks so far, and the error), or dropped
unclosed (finished when it is garbage-collected, so the span always ends).

The recorded outcome is one value, with one fingerprint::

    {**head, "chunks": [chunk, ...], "complete": true | false, "error": {...}?}

Replay serves it as a :class:`ReplayedStream` yielding the same chunks. A stream recorded as
cut short is replayed cut short: reading past its last recorded chunk is a divergence (the agent
read further than it did while recording) and raises the session's mismatch error.

Why not record the stream as many events: one call is one recorded outcome everywhere else
(matching, fingerprints, the report); a stream of N chunks is still one call of the agent.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from stepfork_otel import constants as k

T = TypeVar("T")

Finish = Callable[["Recorder", bool, "BaseException | None"], None]
"""Finishes a live stream's call: ``(its recorder, complete, the error that broke it or None)``."""


@dataclass(slots=True)
class StreamStart(Generic[T]):
    """What a streaming boundary body returns."""

    chunks: Iterator[T] | AsyncIterator[T]
    head: dict[str, Any] = field(default_factory=dict)
    """JSON values known before the first chunk; recorded beside the chunks."""
    close: Callable[[], Any] | None = None
    """Releases the source when the agent stops early (e.g. closes the HTTP response)."""
    is_last: Callable[[T], bool] | None = None
    """Tells the source's own end marker (OpenAI's ``[DONE]``, Anthropic's ``message_stop``):
    a stream closed right after it was read to its end, so it is recorded as complete."""


def stream_value(
    head: dict[str, Any],
    chunks: list[Any],
    complete: bool,
    error: BaseException | None,
    error_type: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """The recorded value of a stream (see the module docstring)."""
    value = dict(head)
    value[k.STREAM_CHUNKS] = chunks
    value[k.STREAM_COMPLETE] = complete
    if error is not None:
        value[k.STREAM_ERROR] = {"error_type": error_type, "message": message}
    return value


def stream_head(value: dict[str, Any]) -> dict[str, Any]:
    """A recorded stream value without its chunks, end and error: what the body knew first."""
    return {
        key: item
        for key, item in value.items()
        if key not in (k.STREAM_CHUNKS, k.STREAM_COMPLETE, k.STREAM_ERROR)
    }


def is_stream_value(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get(k.STREAM_CHUNKS), list)
        and isinstance(value.get(k.STREAM_COMPLETE), bool)
    )


class Recorder:
    """The chunks of one live stream so far, and the once-only finish."""

    __slots__ = ("__weakref__", "_finish", "_is_last", "_lock", "chunks", "done", "head")

    def __init__(self, start: StreamStart[Any], finish: Finish) -> None:
        self.head = start.head
        self.chunks: list[Any] = []
        self.done = False
        self._finish = finish
        self._is_last = start.is_last
        self._lock = threading.Lock()

    def end(self, complete: bool, error: BaseException | None = None) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
        if not complete and error is None and self.chunks and self._is_last is not None:
            complete = bool(self._is_last(self.chunks[-1]))
        self._finish(self, complete, error)


def _finish_unclosed(recorder: Recorder) -> None:
    recorder.end(False)


class _Live(Generic[T]):
    """What the sync and async live streams share: the source, its recorder, and the finaliser
    that finishes the call if the stream is dropped unclosed."""

    def __init__(self, start: StreamStart[T], finish: Finish) -> None:
        self._chunks = start.chunks
        self._source_close = start.close
        self._recorder = Recorder(start, finish)
        weakref.finalize(self, _finish_unclosed, self._recorder)

    @property
    def head(self) -> dict[str, Any]:
        return self._recorder.head


class LiveStream(_Live[T]):
    """A live stream passed through to the agent and recorded as it is read.

    Iterate it, use it as a context manager, or ``close()`` it early; the call is finished
    exactly once, on whichever comes first."""

    def __iter__(self) -> LiveStream[T]:
        return self

    def __next__(self) -> T:
        recorder = self._recorder
        if recorder.done:
            raise StopIteration
        try:
            chunk = next(self._chunks)  # type: ignore[arg-type]
        except StopIteration:
            recorder.end(True)
            raise
        except BaseException as exc:
            recorder.end(False, exc)
            raise
        recorder.chunks.append(chunk)
        return chunk

    def close(self) -> None:
        """Stop reading: the call is recorded as cut short here, and the source is closed."""
        try:
            closer = self._source_close or getattr(self._chunks, "close", None)
            if closer is not None:
                closer()
        finally:
            self._recorder.end(False)

    def __enter__(self) -> LiveStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLiveStream(_Live[T]):
    """:class:`LiveStream` for an async iterator of chunks."""

    def __aiter__(self) -> AsyncLiveStream[T]:
        return self

    async def __anext__(self) -> T:
        recorder = self._recorder
        if recorder.done:
            raise StopAsyncIteration
        try:
            chunk = await self._chunks.__anext__()  # type: ignore[union-attr]
        except StopAsyncIteration:
            recorder.end(True)
            raise
        except BaseException as exc:
            recorder.end(False, exc)
            raise
        recorder.chunks.append(chunk)
        return chunk

    async def aclose(self) -> None:
        """Stop reading: the call is recorded as cut short here, and the source is closed."""
        try:
            closer = self._source_close or getattr(self._chunks, "aclose", None)
            if closer is not None:
                result = closer()
                if isinstance(result, Awaitable):
                    await result
        finally:
            self._recorder.end(False)

    async def __aenter__(self) -> AsyncLiveStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


Overrun = Callable[[int], BaseException]
"""Builds the error for reading past the last chunk of a stream recorded as cut short."""

BrokenBy = Callable[[], BaseException]
"""Builds the error that broke the recorded stream after its last chunk."""


class ReplayedStream(Generic[T]):
    """A recorded stream served again: the same chunks, in order; then the end it had."""

    def __init__(
        self,
        head: dict[str, Any],
        chunks: list[T],
        complete: bool,
        overrun: Overrun,
        broken_by: BrokenBy | None = None,
    ) -> None:
        self.head = head
        self._chunks = chunks
        self._next = 0
        self._complete = complete
        self._overrun = overrun
        self._broken_by = broken_by
        self._closed = False

    def __iter__(self) -> ReplayedStream[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if self._next < len(self._chunks):
            chunk = self._chunks[self._next]
            self._next += 1
            return chunk
        self._closed = True
        if self._broken_by is not None:
            raise self._broken_by()
        if not self._complete:
            raise self._overrun(len(self._chunks))
        raise StopIteration

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> ReplayedStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> ReplayedStream[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return self.__next__()
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> ReplayedStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
