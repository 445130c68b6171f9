"""``SftraceSpanProcessor``: turns each finished run into a `.sftrace` bundle.

It follows spans by trace id; a bundle is complete when its *bundle root* ends (the one
span -> event conversion makes each call's events, written as the calls end; see below):

* a **run span** (opened by ``record(...)``) -> the run's bundle, at the path ``record`` was given
  (or ``<trace_id>.sftrace`` in the configured directory); the run's spans then leave the buffer,
  so a long-lived span of the application around many runs does not pile them up;
* a **local root** (no parent, or a remote parent) -> ``<trace_id>.sftrace`` in the configured
  directory, if its subtree holds boundary spans outside every run (calls made outside any run).
  The application's own spans in the subtree are kept as context. The first bundle of a trace to
  start takes ``<trace_id>.sftrace``; a later one ``<trace_id>-<run span id>.sftrace``, or
  ``<trace_id>-outside-runs.sftrace`` for the calls outside runs.

Design choices, and why:

* It never raises into the program (every callback goes through ``handle_internal_errors``) and
  blocks on nothing but the bundle write itself, done in ``on_end`` of the root so the file exists
  when ``with record(...)`` returns. Instrumentation is suppressed while it writes.
* A run with a destination is written **as it goes**: its bundle's header when it starts, each
  call's events when the call ends (:class:`~stepfork_otel.otel.writer.BundleAppender`, the
  per-span step of the one conversion), the trailer when it ends. Its spans are not buffered:
  what the processor holds of it is what is open (the span, and which call it nests in), so
  memory does not grow with the run's length and the run's end costs one trailer line. The
  file on disk is always a bundle that loads (``complete: false`` until the trailer): after
  ``SIGKILL`` it holds every call that ended more than ``flush_interval`` (1 s) before the kill.
* So are the **calls outside runs** under an application span, from the first of them (the
  local root's subtree without the runs' subtrees; the root's end writes the trailer). What is
  left -- a call made outside any span -- is buffered and written at once. Memory is bounded: at
  most ``max_open_traces`` traces and ``max_spans_per_trace`` spans per trace held at a time
  (for a bundle written as it goes: its open spans -- a safety valve that a long run never
  meets). Beyond that spans are dropped, counted in :attr:`stats`, and a warning is logged. A
  bundle from a trace that lost spans says so (``dropped_spans``, ``complete: false``); a run
  whose whole trace was refused still gets a bundle, holding only the run and the reason.
  Traces whose spans have all ended but whose root was never seen are evicted first when the
  cap is reached.
* ``force_flush`` flushes every bundle written as it goes (the file is its own snapshot) and
  writes a snapshot of what is buffered, marked incomplete; ``shutdown`` flushes and then stops.
* Crash durability: a bundle left by a dead process loads as it is (``complete: false``, the
  calls that had ended); at exit and on ``SIGTERM`` (when the program has no handler of its
  own) :meth:`finalise` closes the bundles of the runs still open, their open calls without an
  outcome.
* Full payloads come from the boundaries through the in-process hand-off
  (:class:`~stepfork_otel.recording.handoff.PayloadHandoff`), so a payload left
  off the span (size cap, capture off) or cut by an ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` is still
  whole in the local bundle.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors
from stepfork_otel.config import CONFIG, RecordingConfig
from stepfork_otel.otel.writer import BundleAppender, BundleWriter, QueuedCall, recover_directory
from stepfork_otel.recording.handoff import HANDOFF, PayloadHandoff
from stepfork_otel.trace import grouping
from stepfork_otel.trace.bundle import BundleEncoder, bundle_file_name
from stepfork_otel.trace.conversion import (
    SpanRecord,
    captured_reads,
    context_span,
    replay_mode_of,
    run_info,
    span_events,
    spans_to_trace,
    unreadable_reads_reason,
)
from stepfork_otel.trace.models import ContextSpan, Trace
from stepfork_otel.trace.payload import Payload

logger = logging.getLogger("stepfork_otel")


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    """A copy of a span's attributes, the span perhaps still open. Without the SDK's lock on
    them: the SIGTERM handler copies the open calls' attributes in the main thread, perhaps in
    the middle of the SDK setting them under that (non-reentrant) lock. An open span may be
    written to by its thread while this copies it: a torn copy is retried."""
    # (the SDK span's BoundedAttributes, behind the read-only proxy ``span.attributes``: its dict,
    # copied in one C call under the GIL)
    items = getattr(getattr(span, "_attributes", None), "_dict", None)
    if isinstance(items, dict):
        return dict(items)
    for _ in range(3):  # (another SDK: its mapping is iterated in Python)
        try:
            return dict(span.attributes or {})
        except (RuntimeError, KeyError):
            continue
    return dict(span.attributes or {})


def _ended_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The attributes of an ended span, not copied: the SDK's own dict behind the read-only
    proxy (an ended span's attributes no longer change), whose lookups are C calls -- the
    proxy's are the ``Mapping`` mixin's, in Python, and the conversion makes a dozen."""
    items = getattr(getattr(span, "_attributes", None), "_dict", None)
    return items if isinstance(items, dict) else (span.attributes or {})


def span_record(
    span: ReadableSpan, payloads: Mapping[str, Payload] | None = None, *, copy: bool = True
) -> SpanRecord:
    """Describe an SDK span for the conversion (the processor's side of the one conversion).
    ``copy=False``: the span's own attribute mapping, for a span that has ended (and so can no
    longer change: the record may be queued for the writer thread)."""
    ctx = span.get_span_context()
    parent = span.parent
    return SpanRecord(
        trace_id=format(ctx.trace_id, "032x") if ctx else "0" * 32,
        span_id=format(ctx.span_id, "016x") if ctx else "0" * 16,
        parent_span_id=format(parent.span_id, "016x") if parent is not None else None,
        name=span.name,
        kind=span.kind.name,
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time,
        status=span.status.status_code.name.lower(),
        attributes=_attributes(span) if copy else _ended_attributes(span),
        payloads=dict(payloads or {}),
    )


def _str_attr(record: SpanRecord, key: str) -> str | None:
    value = record.attributes.get(key)
    return value if isinstance(value, str) and value else None


def _kind(span: ReadableSpan) -> Any:
    return (span.attributes or {}).get(k.KIND)


def _local_parent(span: ReadableSpan) -> int | None:
    parent = span.parent
    return None if parent is None or parent.is_remote else parent.span_id


def _release(lock: threading.RLock) -> None:
    """Release ``lock`` if this thread holds it (it may have been interrupted before taking it:
    locks are listed before they are taken, so that one taken is never left held)."""
    if lock._is_owned():  # type: ignore[attr-defined]
        with contextlib.suppress(RuntimeError):
            lock.release()


def _in_scope(lives: list[_Live] | None, span: Span) -> bool:
    """Whether ``span`` starts inside a bundle written as it goes (its parent is in scope)."""
    if not lives:
        return False
    parent = _local_parent(span)
    return any(parent in live.scope for live in lives)


@dataclass(slots=True)
class _OpenTrace:
    ended: dict[int, tuple[ReadableSpan, Mapping[str, Payload]]] = field(default_factory=dict)
    open: dict[int, Span] = field(default_factory=dict)
    dropped: int = 0
    capped: bool = False
    """A span was refused at its start (``max_spans_per_trace``): an untracked span's end is one
    of those, counted as dropped (by then the bundles written as they go have freed room)."""
    claimed: set[Path] = field(default_factory=set)
    """Default bundle paths already given to a run of this trace."""

    def parents(self) -> dict[int, int | None]:
        parents = {span_id: _local_parent(span) for span_id, span in self.open.items()}
        parents.update((span_id, _local_parent(s)) for span_id, (s, _) in self.ended.items())
        return parents

    def kinds(self) -> dict[int, Any]:
        kinds = {span_id: _kind(span) for span_id, span in self.open.items()}
        kinds.update((span_id, _kind(s)) for span_id, (s, _) in self.ended.items())
        return kinds

    def size(self) -> int:
        return len(self.open) + len(self.ended)


@dataclass
class ProcessorStats:
    """Counters, for health checks and tests."""

    bundles_written: int = 0
    dropped_spans: int = 0
    """Spans not buffered: over ``max_spans_per_trace``, or of a trace refused as a whole."""
    dropped_traces: int = 0
    """Traces refused as a whole because ``max_open_traces`` traces were buffered."""
    evicted_traces: int = 0
    """Buffered traces whose spans had all ended but whose root was never seen, evicted at the
    open-trace cap."""
    write_errors: int = 0


@dataclass
class _Job:
    """One bundle to write (built under the lock, written outside it)."""

    trace_id: int
    root_span_id: int | None
    spans: list[tuple[ReadableSpan, Mapping[str, Payload]]]
    path: Path
    complete: bool
    reason: str | None
    dropped: int


@dataclass(slots=True, eq=False)
class _Live:
    """A run whose bundle is written as it goes (:class:`~stepfork_otel.otel.writer.
    BundleAppender`): only what is open is held -- which open span nests in which call, and the
    number of each open call."""

    trace_id: int
    run_id: int
    appender: BundleAppender
    encoder: BundleEncoder
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Held while this run's events are converted and appended (after the processor's lock).
    Reentrant and released only by its owner (see :func:`_release`)."""
    next_call: int = 1
    scope: dict[int, str | None] = field(default_factory=dict)
    """Each open span of the run's subtree -> the call id its children nest in (None: none)."""
    calls: dict[int, tuple[str, int, str | None]] = field(default_factory=dict)
    """Each open boundary span of the run -> (call id, call number, the call it is nested in)."""
    context: list[ContextSpan] = field(default_factory=list)
    """The application's spans of the run, kept as context (small: no payloads)."""
    replay_mode: tuple[int, str] | None = None
    """(call number, mode) of the first call that said it was replayed."""
    lost: int = 0
    """Spans whose events could not be written (an internal error, logged)."""
    interrupted: str | None = None
    """The exception (``KeyboardInterrupt``, ...) that cut off the writing of a call."""
    captured: list[SpanRecord] = field(default_factory=list)
    """Of each call span that carried captured reads, its span id and those reads (small)."""
    captured_seq: dict[str, int] = field(default_factory=dict)
    """The call number of each span in ``captured``."""
    outside: bool = False
    """The bundle of the trace's calls outside every run: ``run_id`` is the local root (an
    application span, kept as context), and run spans under it stay out of its scope."""


@dataclass(slots=True, eq=False)
class _Ending:
    """A run's bundle being closed: its calls still open, and spans dropped in its trace."""

    live: _Live
    still_open: list[tuple[tuple[str, int, str | None], SpanRecord]] | None = None
    dropped: int = 0
    span: ReadableSpan | None = None
    """The run's span, ended (None: at exit, the open span is read then)."""
    payloads: Mapping[str, Payload] | None = None


class SftraceSpanProcessor(SpanProcessor):
    """Writes one bundle per run. Add it to any SDK ``TracerProvider`` (``configure()`` does)."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        max_open_traces: int = 1000,
        max_spans_per_trace: int = 10_000,
        compress: bool = False,
        config: RecordingConfig | None = None,
        handoff: PayloadHandoff | None = None,
        background_flush: bool = True,
        fsync_interval: float | None = k.DEFAULT_FSYNC_INTERVAL,
        flush_interval: float | None = k.DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        self.writer = BundleWriter(directory, compress=compress)
        self.background_flush = background_flush
        """Crash durability: flush each run's bundle every ``flush_interval`` seconds while it is
        recorded. False: only when its buffer fills and when the run ends."""
        self.fsync_interval = fsync_interval
        """Seconds between fsyncs of a bundle being written (0: every write; None: never)."""
        self.flush_interval = flush_interval
        """Seconds at most between a call's end and its events reaching the OS (0: at once)."""
        #: trace id -> the runs of that trace whose bundles are being written as they go.
        self._lives: dict[int, list[_Live]] = {}
        #: (trace id, run span id) of runs whose bundles were closed before the run ended.
        self._closed_early: set[tuple[int, int]] = set()
        #: Runs ending now, from before they leave ``_lives`` until their trailer is queued (for
        #: the SIGTERM handler, which may land in between).
        self._endings: set[_Ending] = set()
        self._recovered: set[Path] = set()
        if self.writer.directory is not None:  # a start in that directory
            self._recovered.add(self.writer.directory)
            with handle_internal_errors(f"recovering runs cut short in {self.writer.directory}"):
                recover_directory(self.writer.directory)
        self.max_open_traces = max_open_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.config = config or CONFIG
        """Whose redaction rules the conversion applies (the process's, by default)."""
        self._handoff = handoff or HANDOFF
        self.stats = ProcessorStats()
        #: Reentrant: the SIGTERM handler closes the bundles in the main thread, perhaps while the
        #: code it interrupted holds it (the process dies right after).
        self._lock = threading.RLock()
        self._traces: dict[int, _OpenTrace] = {}
        #: Traces refused as a whole (at the open-trace cap): trace id -> spans dropped.
        self._refused: OrderedDict[int, int] = OrderedDict()
        #: (trace id, run span id or None for the trace's own bundle) -> bundle path.
        self._destinations: dict[tuple[int, int | None], Path] = {}
        self._shutdown = False
        self._handoff.attach()

    @property
    def directory(self) -> Path | None:
        """Where bundles of traces without a ``record(path)`` destination go (None: nowhere)."""
        return self.writer.directory

    @property
    def compress(self) -> bool:
        return self.writer.compress

    # -- destinations ----------------------------------------------------------------------------

    def _default_path(self, trace_id: int, directory: Path | None) -> Path:
        return self.writer.default_path(f"{trace_id:032x}", directory)

    def _claim(self, path: Path, trace_id: int, span_id: int | None) -> Path:
        """A default path not yet used by another bundle of the same trace (caller holds lock):
        the first gets ``<trace_id>.sftrace``, a later run ``<trace_id>-<span_id>.sftrace``."""
        entry = self._traces.get(trace_id)
        if entry is None:
            return path
        if path in entry.claimed:
            tag = "outside-runs" if span_id is None else f"{span_id:016x}"
            n, named = 1, tag
            while True:  # (several local roots of one trace each have calls outside runs)
                path = path.with_name(
                    bundle_file_name(f"{trace_id:032x}", named, compressed=self.compress)
                )
                if path not in entry.claimed:
                    break
                n += 1
                named = f"{tag}-{n}"
        entry.claimed.add(path)
        return path

    def set_destination(
        self,
        trace_id: int,
        destination: str | os.PathLike[str] | None,
        *,
        span_id: int | None = None,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
        span: object = None,
    ) -> Path:
        """Where the bundle of the run ``span_id`` (None: of the trace) goes: a file, or a
        directory (an existing one, or a path ending in a separator), named by trace id.
        ``flush_interval`` / ``fsync_interval``: the run's own (None: the processor's;
        ``math.inf``: never). ``span``: the run's span, tracked now if its start was not (a
        sampler that dropped its attributes: the bundle then says it holds no call)."""
        durability = (flush_interval, fsync_interval, span)
        directory: Path | None = None
        if destination is not None:
            text = os.fspath(destination)
            path = Path(text)
            if path.is_dir() or text.endswith((os.sep, "/")):
                directory = path
            else:
                with self._lock:
                    self._destinations[(trace_id, span_id)] = path
                if span_id is not None:
                    self._open_live(trace_id, span_id, path, *durability)
                return path
        with self._lock:
            path = self._claim(self._default_path(trace_id, directory), trace_id, span_id)
            self._destinations[(trace_id, span_id)] = path
        if span_id is not None:
            self._open_live(trace_id, span_id, path, *durability)
        return path

    # -- runs written as they go -----------------------------------------------------------------

    def _open_live(
        self,
        trace_id: int,
        run_id: int,
        path: Path,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
        run_span: object = None,
    ) -> None:
        """Start writing the bundle of a run to ``path`` (after recovering what dead processes
        left in that directory, once per directory): its header now, its calls as they end."""
        if self._shutdown:
            return
        with handle_internal_errors(f"starting the bundle {path}"):
            directory = path.parent
            if directory not in self._recovered:
                self._recovered.add(directory)
                recover_directory(directory)
            with self._lock:
                entry = self._traces.get(trace_id)
                span = None if entry is None else entry.open.get(run_id)
                if span is None and isinstance(run_span, Span) and run_span.end_time is None:
                    entry = self._entry(trace_id)  # (its start was a span not stepfork's)
                    if entry is not None and entry.size() < self.max_spans_per_trace:
                        span = entry.open[run_id] = run_span
                lives = self._lives.setdefault(trace_id, [])
                if span is None or any(live.run_id == run_id for live in lives):
                    if not lives:
                        del self._lives[trace_id]
                    return
                record = span_record(span, self._handoff.read(run_id))
                start = Trace(
                    trace_id=record.trace_id,
                    created_by=_str_attr(record, k.SDK_VERSION),
                    run=run_info(record, None),
                )
                encoder = BundleEncoder(start)
                appender = self._appender(path, encoder, flush_interval, fsync_interval)
                lives.append(_Live(trace_id, run_id, appender, encoder, scope={run_id: None}))
            _watch_for_exit(self)

    def _appender(
        self,
        path: Path,
        encoder: BundleEncoder,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
    ) -> BundleAppender:
        """The file of a bundle written as it goes, its header written (``*_interval``: a
        run's own, None: the processor's; ``math.inf``: never)."""
        flush = self.flush_interval if flush_interval is None else flush_interval
        fsync = self.fsync_interval if fsync_interval is None else fsync_interval
        return BundleAppender(
            path,
            encoder,
            flush_interval=flush if self.background_flush and not math.isinf(flush or 0) else None,
            fsync_interval=None if fsync is None or math.isinf(fsync) else fsync,
        )

    def _live_start(self, lives: list[_Live], span: Span, span_id: int) -> None:
        """Number a span that starts in runs written as they go (caller holds the lock)."""
        parent = _local_parent(span)
        kind = (span.attributes or {}).get(k.KIND)
        is_call = kind in k.BOUNDARY_KINDS
        for live in lives:
            if parent not in live.scope or (live.outside and kind == k.KIND_RUN):
                continue  # (a run's spans are its own bundle's, not the calls outside runs')
            enclosing = live.scope[parent]
            if is_call:
                n = live.next_call
                live.next_call = n + 1
                call_id = f"call-{n}"
                live.calls[span_id] = (call_id, n, enclosing)
                live.scope[span_id] = call_id
            else:
                live.scope[span_id] = enclosing

    def _open_outside(self, entry: _OpenTrace, trace_id: int, call_id: int) -> None:
        """At the first boundary call of a trace outside every run, start writing the trace's
        own bundle (the calls outside runs) as it goes, like a run's (caller holds the lock):
        its header now, each call as it ends, the trailer when the local root ends -- so a
        killed process keeps those calls too. Left buffered, as before: a call with no span
        around it (its bundle is the call alone, written when it ends), one inside a run that is
        not written as it goes, a trace with no directory to go to, and the calls under a
        second local root of the same trace in this process."""
        lives = self._lives.get(trace_id, ())
        if self.directory is None or any(live.outside for live in lives):
            return  # (a second local root of the trace here: its calls are buffered, as before)
        root, steps = call_id, 0
        while True:  # up to the local root, through the spans open here
            parent = _local_parent(entry.open[root])
            if parent is None or parent not in entry.open or steps > len(entry.open):
                break
            root, steps = parent, steps + 1
            if _kind(entry.open[root]) == k.KIND_RUN:
                return
        if _kind(entry.open[root]) in k.BOUNDARY_KINDS:
            return  # a call outside any span (and the calls it makes): its own bundle, buffered
        parents, kinds = entry.parents(), entry.kinds()
        ids = {
            i
            for i in grouping.subtree(parents, root)
            if kinds.get(i) != k.KIND_RUN and grouping.enclosing_run(parents, kinds, i) is None
        }
        if any(kinds.get(i) in k.BOUNDARY_KINDS for i in ids if i in entry.ended):
            return  # calls of it were buffered already (the processor came late): stay so
        # a name of its own (not a destination, which a buffered bundle of the trace would take)
        path = self._claim(self._default_path(trace_id, None), trace_id, None)
        redactor = self.config.settings.redactor
        encoder = BundleEncoder(Trace(trace_id=format(trace_id, "032x"), run=run_info(None, None)))
        appender = self._appender(path, encoder)
        live = _Live(trace_id, root, appender, encoder, outside=True)
        live.scope = {i: None for i in ids if i in entry.open and i != call_id}
        for i in [i for i in ids if i in entry.ended]:  # application spans that already ended
            ended, payloads = entry.ended.pop(i)
            live.context.append(context_span(span_record(ended, payloads), redactor))
        self._lives.setdefault(trace_id, []).append(live)
        _watch_for_exit(self)

    def _live_end(self, span: ReadableSpan, span_id: int, payloads: Mapping[str, Payload]) -> bool:
        """Write an ended span to the bundles of the runs it is in; True if it was in one. The
        conversion runs outside the processor's lock, under each run's own (taken before the
        processor's is released, so a run's end waits for its calls' events).

        Interruptible anywhere: a signal handler may raise in the main thread between two
        bytecodes (``KeyboardInterrupt``, a handler's ``sys.exit``; ``tests/test_interrupts.py``
        puts one at each such point). So each run's lock is listed before it is taken and
        released only by its owner; a call stays open in its run until its events are queued
        (cut off before, the run's end writes it as still open; cut off after, the writer does
        not write it twice); a run's end cut off before its trailer was queued queues it on the
        way out. What the bundle counts is what its writer wrote
        (:class:`~stepfork_otel.otel.writer.BundleAppender`)."""
        calls: list[tuple[_Live, tuple[str, int, str | None] | None]] = []
        runs: list[_Ending] = []
        record: SpanRecord | None = None
        try:
            with self._lock:
                trace_id = span.get_span_context().trace_id  # type: ignore[union-attr]
                lives = self._lives.get(trace_id)
                if not lives:
                    return False
                for live in list(lives):
                    if span_id == live.run_id:
                        ending = _Ending(live, span=span, payloads=payloads)
                        runs.append(ending)
                        self._endings.add(ending)
                        live.lock.acquire()  # (its calls ending elsewhere are queued first)
                        lives.remove(live)
                        entry = self._traces.get(live.trace_id)
                        ending.dropped = entry.dropped if entry is not None else 0
                        ending.still_open = self._open_calls(live, entry)
                        if entry is not None:  # ended: a call starting now cannot reach it
                            entry.open.pop(span_id, None)
                    elif span_id in live.scope:
                        call = live.calls.get(span_id)
                        calls.append((live, call))
                        live.lock.acquire()
                        if call is not None:  # an application span stays: a task it started
                            live.scope.pop(span_id, None)  # may make calls in its context later
                if not lives:
                    del self._lives[trace_id]
            for live, call in calls:
                written = False
                try:
                    with handle_internal_errors(
                        f"writing a call to the bundle {live.appender.path}"
                    ):
                        record = record or span_record(span, payloads, copy=False)
                        if call is not None:
                            self._append_call(live, record, span_id, call)
                        elif record.stepfork_kind is None:
                            redactor = self.config.settings.redactor
                            live.context.append(context_span(record, redactor))
                        written = True
                except BaseException as exc:  # interrupted: its run's end writes it as open
                    live.interrupted = live.interrupted or type(exc).__name__
                    written = True
                    raise
                finally:
                    if not written:  # (logged above) the bundle must not look whole without it
                        live.lost += 1
                        self.stats.write_errors += 1
            for ending in runs:
                with handle_internal_errors(f"ending the bundle {ending.live.appender.path}"):
                    record = record or span_record(span, payloads, copy=False)
                    self._close_live(ending, record)
        except BaseException as exc:
            for ending in runs:  # cut off before its trailer was queued: queue it now
                if not ending.live.appender.closing:
                    ending.live.interrupted = ending.live.interrupted or type(exc).__name__
                    with handle_internal_errors(f"ending the bundle {ending.live.appender.path}"):
                        self._close_live(ending, record or span_record(span, payloads))
            raise
        finally:
            for live, _ in calls:
                _release(live.lock)
            for ending in runs:
                self._endings.discard(ending)
                _release(ending.live.lock)
        return bool(calls or runs)

    def _append_call(
        self, live: _Live, record: SpanRecord, span_id: int, call: tuple[str, int, str | None]
    ) -> None:
        """Queue an ended call for its bundle -- the writer thread converts it to its events --
        and only then take it off the run's open calls (caller holds ``live.lock``)."""
        if live.replay_mode is None or call[1] < live.replay_mode[0]:
            mode = replay_mode_of(record)
            if mode is not None:
                live.replay_mode = (call[1], mode)
        extra = b""
        reads = record.attributes.get(k.CAPTURED)
        if reads is not None:  # kept for the trailer, and on disk at once
            live.captured.append(
                SpanRecord(
                    record.trace_id, record.span_id, None, "", attributes={k.CAPTURED: reads}
                )
            )
            live.captured_seq[record.span_id] = call[1]
            extra = live.encoder.captured(captured_reads(live.captured[-1:], live.captured_seq)[0])
        live.appender.append(QueuedCall(record, call), extra)
        live.calls.pop(span_id, None)

    def _open_calls(
        self, live: _Live, entry: _OpenTrace | None
    ) -> list[tuple[tuple[str, int, str | None], SpanRecord]]:
        """The calls of a run still open as it ends (caller holds the lock): calls without an
        outcome in its bundle."""
        found = []
        for span_id, call in list(live.calls.items()):  # (a snapshot: at exit, another thread
            # may be taking its call off meanwhile; the writer does not write a call twice)
            span = None if entry is None else entry.open.get(span_id)
            if span is not None:
                found.append((call, span_record(span, self._handoff.read(span_id))))
        live.calls.clear()
        return found

    def _close_live(
        self, ending: _Ending, run: SpanRecord, *, reason: str | None = None, timeout: float = -1
    ) -> None:
        """Write the calls still open and the trailer, and close the run's bundle (caller holds
        ``live.lock``). ``reason``: why it is incomplete though the run may not have ended."""
        live, still_open, dropped = ending.live, ending.still_open or [], ending.dropped
        rest = [live.encoder.encode(span_events(record, *call)[:1]) for call, record in still_open]
        if reason is None and run.end_time_unix_nano is None:
            reason = "the run span never ended"
        if reason is None and still_open:
            reason = f"{len(still_open)} call(s) had not ended when the bundle was written"
        if reason is None and dropped:
            reason = f"{dropped} span(s) of this trace were dropped (per-trace cap)"
        if reason is None and live.lost:
            reason = f"{live.lost} span(s) could not be written (internal error, logged)"
        if reason is None and live.interrupted:
            reason = f"{live.interrupted} interrupted the writing of a call: it may be missing"
        mode = None if live.replay_mode is None else live.replay_mode[1]
        context = live.context
        if live.outside:  # no run span: the local root is one of the application's spans
            context = [*context, context_span(run, self.config.settings.redactor)]
        captured, unreadable = captured_reads(
            live.captured if live.outside else [*live.captured, run], live.captured_seq
        )
        if reason is None and unreadable:
            reason = unreadable_reads_reason(unreadable)
        final = Trace(
            trace_id=run.trace_id,
            complete=reason is None,
            incomplete_reason=reason,
            dropped_spans=dropped,
            run=run_info(None if live.outside else run, mode),
            context=sorted(context, key=lambda c: (c.start_time_unix_nano, c.span_id)),
            captured=captured,
        )
        if live.appender.close(rest, final, timeout=timeout):
            self.stats.bundles_written += 1
        elif live.appender.failed:  # (logged by the writer)
            self.stats.write_errors += 1
        self.stats.write_errors += live.appender.lost  # calls the writer could not convert

    def _close_lives(self, reason: str, timeout: float) -> None:
        """Close every run's bundle with what it holds, marked incomplete (at exit, at
        shutdown), and the bundles of runs whose end was cut off before their trailer was
        queued. Gives up on a run rather than wait for a lock the interrupted code holds --
        ``timeout`` in all: what its bundle already holds stays on disk."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        if not self._lock.acquire(timeout=timeout):
            for lives in list(self._lives.values()):
                for live in lives:
                    live.appender.flush(timeout=left())
            return
        closing: list[tuple[_Ending, SpanRecord, str | None]] = []
        queued: list[BundleAppender] = []
        try:
            for trace_id, lives in self._lives.items():
                entry = self._traces.get(trace_id)
                for live in lives:
                    span = None if entry is None else entry.open.get(live.run_id)
                    if span is None:
                        continue
                    ending = _Ending(live)
                    closing.append(
                        (ending, span_record(span, self._handoff.read(live.run_id)), reason)
                    )
                    ending.still_open = self._open_calls(live, entry)
                    self._closed_early.add((trace_id, live.run_id))
            self._lives.clear()
            for ending in list(self._endings):  # (the run ended: its own reasons, if any)
                if ending.live.appender.closing:  # (queued: the process must not die first)
                    queued.append(ending.live.appender)
                elif ending.span is not None:
                    if ending.still_open is None:
                        ending.still_open = self._open_calls(
                            ending.live, self._traces.get(ending.live.trace_id)
                        )
                    closing.append((ending, span_record(ending.span, ending.payloads), None))
        finally:
            self._lock.release()
        for ending, run, why in closing:
            live = ending.live
            if not live.lock.acquire(timeout=left()):  # (reentrant: a handler of this thread's
                live.appender.flush(timeout=left())  # signal gets it)
                continue
            try:
                with handle_internal_errors(f"ending the bundle {live.appender.path}"):
                    self._close_live(ending, run, reason=why, timeout=left())
            finally:
                live.lock.release()
        for appender in queued:
            appender.wait_closed(timeout=left())

    def finalise(self, timeout: float = 1.0) -> None:
        """At exit (``SIGTERM``, interpreter exit): close the bundle of every run still being
        recorded with what it holds, marked incomplete (its open calls without an outcome)."""
        with handle_internal_errors("finalising runs at exit"):
            if self._lives or self._endings:
                self._close_lives("the process exited before the run ended", timeout)

    def _path_for(self, trace_id: int, span_id: int | None, *, final: bool) -> Path | None:
        """The bundle path of a run or of the trace (caller holds the lock); None: not written."""
        key = (trace_id, span_id)
        path = self._destinations.pop(key, None) if final else self._destinations.get(key)
        if path is not None:
            return path
        if self.directory is None:
            return None  # neither a record(...) destination nor a configured directory
        path = self._claim(self._default_path(trace_id, None), trace_id, span_id)
        if not final:
            self._destinations[key] = path
        return path

    # -- buffering -------------------------------------------------------------------------------

    def _entry(self, trace_id: int) -> _OpenTrace | None:
        """The buffer of ``trace_id``, created if the cap allows (caller holds the lock)."""
        entry = self._traces.get(trace_id)
        if entry is not None:
            return entry
        if trace_id in self._refused:
            return None  # its spans are counted as they end
        if len(self._traces) >= self.max_open_traces:
            self._evict_orphans()
        if len(self._traces) >= self.max_open_traces:
            self._refused[trace_id] = 0
            while len(self._refused) > 4 * self.max_open_traces + 16:
                self._refused.popitem(last=False)
            self.stats.dropped_traces += 1
            self._warn_dropped_trace(trace_id)
            return None
        entry = self._traces[trace_id] = _OpenTrace()
        return entry

    def _evict_orphans(self) -> None:
        orphans = {t for t, e in self._traces.items() if not e.open}
        for trace_id in orphans:
            del self._traces[trace_id]
            self.stats.evicted_traces += 1
        for key in [key for key in self._destinations if key[0] in orphans]:
            del self._destinations[key]

    def _passes_through(self, span: ReadableSpan) -> bool:
        """A boundary call made outside any span (a test replaying an agent, say) with no
        directory to write its trace to: nothing of it can end up in a bundle, so it is not
        buffered at all. (A call made inside its body still opens the trace's buffer, since a run
        could start there; its end then goes the usual way.)"""
        return self.directory is None and span.parent is None and _kind(span) in k.BOUNDARY_KINDS

    def _untracked(self, span: ReadableSpan) -> bool:
        """A span that is not stepfork's, in a trace the processor holds nothing of, with no
        directory for calls outside runs: nothing of it can reach a bundle (a run that starts
        under it later holds only its own subtree), so it costs one attribute lookup and one
        dict lookup -- the tax on every other span of the application."""
        try:
            if self.writer.directory is not None or (span.attributes or {}).get(k.KIND):
                return False
            trace_id = span.context.trace_id
            return trace_id not in self._traces and trace_id not in self._refused
        except Exception:  # (never on the SDK's spans: the slow path then says what is wrong)
            return False

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._untracked(span):
            return
        with handle_internal_errors("tracking a started span"):
            ctx = span.get_span_context()
            if ctx is None or self._shutdown:
                return
            if self._passes_through(span):
                return
            with self._lock:
                entry = self._entry(ctx.trace_id)
                if entry is None or entry.size() >= self.max_spans_per_trace:
                    if entry is not None:
                        entry.capped = True
                    return  # counted as dropped when it ends
                entry.open[ctx.span_id] = span
                lives = self._lives.get(ctx.trace_id)
                if _kind(span) in k.BOUNDARY_KINDS and not _in_scope(lives, span):
                    self._open_outside(entry, ctx.trace_id, ctx.span_id)
                    lives = self._lives.get(ctx.trace_id)
                if lives:
                    self._live_start(lives, span, ctx.span_id)

    def on_end(self, span: ReadableSpan) -> None:
        if self._untracked(span):
            return
        with handle_internal_errors("buffering a finished span"):
            ctx = span.get_span_context()
            if ctx is None:
                return
            # a copy: another bundle processor may read them too (see PayloadHandoff)
            payloads = self._handoff.read(ctx.span_id)
            if self._shutdown:
                return
            kind = _kind(span)
            is_local_root = _local_parent(span) is None
            is_run = kind == k.KIND_RUN
            # written to the bundles of the runs it is in (and then not buffered)
            live = bool(self._lives) and self._live_end(span, ctx.span_id, payloads)
            jobs: list[_Job] = []
            with self._lock:
                if (
                    self._passes_through(span)
                    and ctx.trace_id not in self._traces  # (unless a call inside it opened one)
                    and (ctx.trace_id, None) not in self._destinations
                ):
                    return
                jobs = self._buffer(
                    span, ctx.trace_id, ctx.span_id, payloads, is_run, is_local_root, live
                )
            self._write_all(jobs)

    def _buffer(
        self,
        span: ReadableSpan,
        trace_id: int,
        span_id: int,
        payloads: Mapping[str, Payload],
        is_run: bool,
        is_local_root: bool,
        live: bool = False,
    ) -> list[_Job]:
        """Buffer an ended span; the bundles its end completes (caller holds the lock).
        ``live``: it was written to the bundle of a run written as it goes, not buffered."""
        if (trace_id, span_id) in self._closed_early:
            self._closed_early.discard((trace_id, span_id))
            live = True  # its bundle was closed at exit (a SIGTERM handler): not once more
        entry = self._entry(trace_id)  # None: the trace is refused (now or earlier)
        if entry is None:
            self._refused[trace_id] += 1
            self.stats.dropped_spans += 1
            return self._refused_job(span, payloads, is_local_root)
        tracked = entry.open.pop(span_id, None) is not None
        if live:
            pass
        elif tracked or (not entry.capped and entry.size() < self.max_spans_per_trace):
            entry.ended[span_id] = (span, payloads)
        else:
            self._drop_span(entry, trace_id)
        jobs: list[_Job] = []
        if is_run and live:
            self._destinations.pop((trace_id, span_id), None)  # (its bundle is closed)
        elif is_run:
            jobs.extend(self._run_job(trace_id, entry, span_id))
        if is_local_root:
            # a run that is its own local root was written above, and a root whose calls were
            # written as they went has its bundle closed: only clean up
            jobs.extend(self._root_job(trace_id, entry, span_id, write=not is_run and not live))
        return jobs

    def _drop_span(self, entry: _OpenTrace, trace_id: int) -> None:
        entry.dropped += 1
        self.stats.dropped_spans += 1
        if entry.dropped == 1:
            logger.warning(
                "stepfork_otel: trace %032x exceeded %d buffered spans; further spans dropped "
                "(its bundle will say it is incomplete)",
                trace_id,
                self.max_spans_per_trace,
            )

    # -- what to write (caller holds the lock) ---------------------------------------------------

    def _spans_of(
        self, entry: _OpenTrace, ids: Iterable[int]
    ) -> list[tuple[ReadableSpan, Mapping[str, Payload]]]:
        ids = set(ids)
        spans = [entry.ended[i] for i in entry.ended if i in ids]
        for span_id, span in entry.open.items():
            if span_id in ids:  # still open: its payloads stay kept for when it ends
                spans.append((span, self._handoff.read(span_id)))
        return spans

    def _job(
        self,
        trace_id: int,
        entry: _OpenTrace,
        root: int | None,
        ids: Iterable[int],
        path: Path,
        *,
        final: bool,
    ) -> _Job:
        spans = self._spans_of(entry, ids)
        complete = final and entry.dropped == 0
        if not final:
            reason: str | None = "the run had not finished when the bundle was flushed"
        elif entry.dropped:
            reason = f"{entry.dropped} span(s) of this trace were dropped (per-trace cap)"
        else:
            reason = None
        return _Job(trace_id, root, spans, path, complete, reason, entry.dropped)

    def _run_job(self, trace_id: int, entry: _OpenTrace, run_id: int) -> list[_Job]:
        path = self._path_for(trace_id, run_id, final=True)
        parents = entry.parents()
        ids = grouping.subtree(parents, run_id)
        jobs = [] if path is None else [self._job(trace_id, entry, run_id, ids, path, final=True)]
        if grouping.enclosing_run(parents, entry.kinds(), run_id) is None:
            # a nested run's spans stay for the outer run's bundle
            for span_id in ids:
                entry.ended.pop(span_id, None)
        return jobs

    def _root_job(
        self, trace_id: int, entry: _OpenTrace, root_id: int, *, write: bool
    ) -> list[_Job]:
        if not entry.open and len(entry.ended) == 1 and root_id in entry.ended:
            ids = {root_id}  # a lone span (a call made outside any span): nothing to walk
        else:
            ids = grouping.subtree(entry.parents(), root_id)
        jobs: list[_Job] = []
        # the trace's own bundle goes to a destination set for it, or to the configured directory:
        # with neither (a boundary call outside any run, with no directory) nothing is written
        wanted = write and (self.directory is not None or (trace_id, None) in self._destinations)
        if wanted and grouping.holds_calls(entry.kinds(), ids):
            path = self._path_for(trace_id, None, final=True)
            if path is not None:
                jobs.append(self._job(trace_id, entry, root_id, ids, path, final=True))
        else:
            self._destinations.pop((trace_id, None), None)
        for span_id in ids:
            entry.ended.pop(span_id, None)
        if not entry.open:  # nothing else of this trace is running here
            self._warn_unplaced(entry, trace_id)
            del self._traces[trace_id]
            if self._destinations:
                for key in [key for key in self._destinations if key[0] == trace_id]:
                    del self._destinations[key]
        return jobs

    def _refused_job(
        self, span: ReadableSpan, payloads: Mapping[str, Payload], is_local_root: bool
    ) -> list[_Job]:
        ctx = span.get_span_context()
        assert ctx is not None
        dropped = self._refused[ctx.trace_id]
        if is_local_root:
            del self._refused[ctx.trace_id]
        if _kind(span) != k.KIND_RUN:
            return []
        path = self._path_for(ctx.trace_id, ctx.span_id, final=True)
        if path is None:
            return []
        reason = (
            f"trace not buffered: {self.max_open_traces} traces were already open "
            "(max_open_traces); only the run itself is recorded"
        )
        return [_Job(ctx.trace_id, ctx.span_id, [(span, payloads)], path, False, reason, dropped)]

    # -- flush / shutdown ------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write a snapshot of every open run (and, with a directory, of boundary spans outside
        runs), marked incomplete; the runs keep being recorded."""
        with handle_internal_errors("flushing open traces"):
            jobs: list[_Job] = []
            with self._lock:
                for trace_id, entry in self._traces.items():
                    jobs.extend(self._snapshot_jobs(trace_id, entry))
                appenders = [live.appender for lives in self._lives.values() for live in lives]
            deadline = time.monotonic() + timeout_millis / 1000
            for appender in appenders:  # (a bundle written as its run goes is its own snapshot)
                with handle_internal_errors(f"flushing the bundle {appender.path}"):
                    appender.flush(timeout=max(0.0, deadline - time.monotonic()))
            self._write_all(jobs)
        return True

    def _snapshot_jobs(self, trace_id: int, entry: _OpenTrace) -> list[_Job]:
        jobs: list[_Job] = []
        lives = self._lives.get(trace_id, ())
        live = {None if live.outside else live.run_id for live in lives}
        for group in grouping.groups(entry.parents(), entry.kinds()):
            if group.run in live:
                continue  # written as it goes: the file is already what it holds
            path = self._path_for(trace_id, group.run, final=False)
            if path is not None:
                jobs.append(self._job(trace_id, entry, group.run, group.members, path, final=False))
        return jobs

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self.force_flush()
        with handle_internal_errors("closing the bundles of runs still open"):
            self._close_lives("the tracer provider shut down before the run ended", 5.0)
        with self._lock:
            self._shutdown = True
            self._traces.clear()
            self._refused.clear()
            self._destinations.clear()
        self._handoff.detach()

    # -- writing ---------------------------------------------------------------------------------

    def _write_all(self, jobs: list[_Job]) -> None:
        for job in jobs:
            with handle_internal_errors(f"writing the bundle {job.path}"):
                self._write(job)

    def _write(self, job: _Job) -> None:
        try:
            records = [span_record(span, payloads) for span, payloads in job.spans]
            root = None if job.root_span_id is None else format(job.root_span_id, "016x")
            if root is not None and all(r.span_id != root for r in records):
                root = None  # the root itself was dropped at the per-trace cap
            trace = spans_to_trace(
                records,
                redactor=self.config.settings.redactor,
                complete=job.complete,
                incomplete_reason=job.reason,
                dropped_spans=job.dropped,
                root_span_id=root,
            )
            self.writer.write(trace, job.path)
            with self._lock:
                self.stats.bundles_written += 1
        except Exception:
            with self._lock:
                self.stats.write_errors += 1
            raise

    def _warn_unplaced(self, entry: _OpenTrace, trace_id: int) -> None:
        """Calls still buffered when the trace's last span here ended were under no root: each
        started after the call it was made in had ended and been written (a fire-and-forget
        task of a tool). Counted as dropped and said -- they are in no bundle."""
        lost = sum(1 for span, _ in entry.ended.values() if _kind(span) in k.BOUNDARY_KINDS)
        if lost:
            self.stats.dropped_spans += lost
            logger.warning(
                "stepfork_otel: %d call(s) of trace %032x started after the call they were made "
                "in had ended and are in no bundle",
                lost,
                trace_id,
            )

    def _warn_dropped_trace(self, trace_id: int) -> None:
        if self.stats.dropped_traces in (1, 10, 100) or self.stats.dropped_traces % 1000 == 0:
            logger.warning(
                "stepfork_otel: %d open traces already buffered; trace %032x not recorded "
                "(%d traces dropped so far)",
                self.max_open_traces,
                trace_id,
                self.stats.dropped_traces,
            )


# -- exit handling ---------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[SftraceSpanProcessor] = weakref.WeakSet()
_exit_lock = threading.Lock()
_exit_watched = False


def _finalise_all() -> None:
    for processor in list(_LIVE):
        processor.finalise()


def _on_sigterm(signum: int, frame: object) -> None:
    """Finalise the runs being recorded, then die of the signal as if nothing was installed."""
    _finalise_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _watch_for_exit(processor: SftraceSpanProcessor) -> None:
    """Finalise ``processor``'s runs at interpreter exit, and on ``SIGTERM`` -- only when nothing
    handles ``SIGTERM`` yet (the default action would kill the process without running exit
    handlers): a handler of the program's own is never replaced, and it usually exits through
    ``sys.exit``, which runs the exit handler. Installed from the main thread only (Python's
    rule for signal handlers); from another thread, exit is still covered."""
    global _exit_watched
    _LIVE.add(processor)
    with _exit_lock:
        if _exit_watched:
            return
        _exit_watched = True
        atexit.register(_finalise_all)
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                    signal.signal(signal.SIGTERM, _on_sigterm)
