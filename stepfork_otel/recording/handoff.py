"""The payload hand-off: how full payloads reach the span processors of this process.

A payload above the span size cap (or with content capture off) is not on the span, and an
``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` may cut one that is; the local bundle must keep them whole
all the same. Payloads never travel as private span attributes (those would reach every
exporter), so the boundary hands them over here, keyed by span id, and the processors read them
when the span ends.

One object with one owner, and every change to what it keeps under its lock (the writer thread
reads without it, :meth:`~PayloadHandoff.peek`):

* a processor :meth:`~PayloadHandoff.attach` es when it starts listening and
  :meth:`~PayloadHandoff.detach` es on shutdown; it :meth:`~PayloadHandoff.read` s a *copy* of a
  span's payloads in ``on_end`` (or while flushing an open span), so two processors on one
  provider both get them whole;
* a boundary asks once per call under which id to keep its span's payloads
  (:meth:`~PayloadHandoff.kept_id`: None while no processor listens, or for a span a sampler
  dropped -- that one never reaches a processor), :meth:`~PayloadHandoff.keep` s them, and
  :meth:`~PayloadHandoff.release` s the span's entry once ``span.end()`` returned -- by then every
  processor's ``on_end`` has run, whether it returned or raised.

:attr:`~PayloadHandoff.pending` (entries not yet released) is for tests and health checks: it is
0 whenever no boundary span is open.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from opentelemetry.trace import Span

from stepfork_otel.trace.payload import Payload

_EMPTY: Mapping[str, Payload] = {}


class PayloadHandoff:
    """Full payloads of open spans, from the boundaries to the span processors of this process."""

    __slots__ = ("_kept", "_listeners", "_lock")

    def __init__(self) -> None:
        # re-entrant: a signal handler in the thread that holds it (inside keep() or release())
        # may end a span whose processor reads here; the bundle writer, which may be waited on
        # by such a handler, reads without it (``peek``)
        self._lock = threading.RLock()
        self._kept: dict[int, dict[str, Payload]] = {}
        self._listeners = 0

    # -- processors ------------------------------------------------------------------------------

    def attach(self) -> None:
        """A processor starts listening: payloads are kept from now on."""
        with self._lock:
            self._listeners += 1

    def detach(self) -> None:
        """A processor stops listening; with none left, whatever was kept is dropped."""
        with self._lock:
            self._listeners = max(0, self._listeners - 1)
            if not self._listeners:
                self._kept.clear()

    def read(self, span_id: int) -> Mapping[str, Payload]:
        """A copy of the payloads kept for ``span_id`` (empty if none)."""
        with self._lock:
            kept = self._kept.get(span_id)
            return dict(kept) if kept else _EMPTY

    def peek(self, span_id: int) -> Mapping[str, Payload]:
        """:meth:`read` without the lock, for the exit handler's writer: the signal handler that
        waits for it may have interrupted a thread holding the lock. A dict lookup and a dict
        copy are each one C call under the GIL, so the copy is whole."""
        kept = self._kept.get(span_id)
        return dict(kept) if kept else _EMPTY

    # -- boundaries ------------------------------------------------------------------------------

    def kept_id(self, span: Span) -> int | None:
        """The id under which ``span``'s payloads are kept, or None when nothing is kept for it:
        no processor listens, or a sampler dropped the span (it never reaches a processor, and
        keeping its payloads would only leak them). A boundary asks once per call."""
        if not self._listeners or not span.is_recording():  # (an int read: no lock needed)
            return None
        return span.get_span_context().span_id

    def keep(self, span_id: int, key: str, payload: Payload) -> None:
        """Keep ``payload`` under ``key`` for the span ``span_id`` (see :meth:`kept_id`)."""
        with self._lock:
            if self._listeners:
                self._kept.setdefault(span_id, {})[key] = payload

    def keep_for(self, span: Span, key: str, payload: Payload) -> None:
        """:meth:`keep` for a span whose :meth:`kept_id` was not asked yet."""
        span_id = self.kept_id(span)
        if span_id is not None:
            self.keep(span_id, key, payload)

    def release(self, span_id: int) -> None:
        """Drop what was kept for the span ``span_id`` (call once it has ended)."""
        with self._lock:
            self._kept.pop(span_id, None)

    @property
    def pending(self) -> int:
        """Spans whose payloads are kept (not yet released)."""
        with self._lock:
            return len(self._kept)


HANDOFF = PayloadHandoff()
"""The process's hand-off, shared by every boundary and every bundle processor."""
if hasattr(os, "register_at_fork"):  # (another thread may have held its lock at the fork)
    os.register_at_fork(after_in_child=HANDOFF._lock._at_fork_reinit)  # type: ignore[attr-defined]
