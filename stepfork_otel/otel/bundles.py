"""The bundles one processor is writing: which span goes to which bundle, on the writer thread.

The processor's ``on_start`` / ``on_end`` only queue the span (:meth:`Bundles.put`); the writer
thread takes the queue each round (:meth:`Bundles.round`), in order, and feeds each span to the
bundles of its trace -- one :class:`~stepfork_otel.trace.builder.BundleBuilder` each, the builder
the importer uses too -- and writes what they make with their
:class:`~stepfork_otel.otel.writer.BundleAppender`. What the recording threads pay for a call is
two deque appends and the hand-off read; the conversion, the encoding and the writes are here.

Which bundles there are (the builder decides which spans each holds):

* a **run** (``record(...)``): opened by :meth:`Bundles.open_run` when the run starts, its file
  created with the header on the run's thread, closed when the run span ends;
* with a directory configured, the **calls outside every run** under a local root (an
  application span): opened at the first such call, its application spans kept as context,
  closed when the local root ends; a second local root of the same trace gets a bundle of its
  own (``<trace_id>-outside-runs.sftrace``);
* with a directory configured, a **call outside any span**: a bundle of its own, the call and the
  calls it makes.

Memory is bounded: at most ``max_open_traces`` traces followed and ``max_spans_per_trace``
spans held per trace (open spans, and with a directory the application spans ended under an open
local root). Beyond that spans are dropped, counted, and said (the bundle is incomplete). A
trace's state goes when nothing of it is open here.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from stepfork_otel import constants as k
from stepfork_otel._internal import log_internal_error
from stepfork_otel.otel.writer import (
    WRITER,
    BundleAppender,
    BundleWriter,
    Wait,
    open_at_a_free_name,
)
from stepfork_otel.recording.handoff import PayloadHandoff
from stepfork_otel.trace import grouping
from stepfork_otel.trace.builder import BundleBuilder
from stepfork_otel.trace.bundle import BundleEncoder
from stepfork_otel.trace.conversion import SpanRecord, context_span, created_by_of, run_info
from stepfork_otel.trace.models import ContextSpan, Trace
from stepfork_otel.trace.payload import Payload
from stepfork_otel.trace.redaction import Redactor

logger = logging.getLogger("stepfork_otel")

#: Ended calls remembered per trace, to tell a call made after the call it was made in ended.
_RECENT_CALLS = 1024
#: Spans queued at which the writer is woken to take them at once, not at its next round.
_QUEUE_ITEMS = 8192


def attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    """A span's attributes: the SDK's own dict behind the read-only proxy (its lookups are C
    calls; the proxy's are the ``Mapping`` mixin's, in Python), else the proxy."""
    items = getattr(getattr(span, "_attributes", None), "_dict", None)
    return items if isinstance(items, dict) else (span.attributes or {})


def copied_attributes(span: ReadableSpan) -> dict[str, Any]:
    """A copy of a span's attributes, the span perhaps still open, without the SDK's lock on
    them (the exit handler reads open spans in whatever thread, perhaps while the SDK holds that
    non-reentrant lock). A torn copy of another SDK's mapping is retried."""
    items = getattr(getattr(span, "_attributes", None), "_dict", None)
    if isinstance(items, dict):
        return dict(items)  # (one C call under the GIL)
    for _ in range(3):
        try:
            return dict(span.attributes or {})
        except (RuntimeError, KeyError):
            continue
    return dict(span.attributes or {})


def span_record(
    span: ReadableSpan, payloads: Mapping[str, Payload] | None = None, *, copy: bool = True
) -> SpanRecord:
    """Describe an SDK span for the builder (the processor's side of the one conversion).
    ``copy=False``: the span's own attribute mapping, for a span that has ended."""
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
        attributes=copied_attributes(span) if copy else attributes_of(span),
        payloads=dict(payloads or {}),
    )


def _hex(span_id: int) -> str:
    return format(span_id, "016x")


def _local_parent(span: ReadableSpan) -> str | None:
    parent = span.parent
    return None if parent is None or parent.is_remote else _hex(parent.span_id)


@dataclass
class ProcessorStats:
    """Counters, for health checks and tests."""

    bundles_written: int = 0
    dropped_spans: int = 0
    """Spans left out: over ``max_spans_per_trace``, of a trace refused as a whole, or calls
    made after the call they were made in had ended."""
    dropped_traces: int = 0
    """Traces refused as a whole because ``max_open_traces`` traces were followed."""
    write_errors: int = 0


@dataclass(slots=True, eq=False)
class _Bundle:
    builder: BundleBuilder
    appender: BundleAppender
    root: ReadableSpan | None = None
    """The root span as it started (read if the bundle closes before it ends)."""


@dataclass(slots=True, eq=False)
class _Trace:
    """What the writer follows of one trace."""

    trace_id: str
    bundles: list[_Bundle] = field(default_factory=list)
    spans: dict[str, tuple[str | None, str | None, ReadableSpan, bool]] = field(
        default_factory=dict
    )
    """Span id -> (local parent, stepfork kind, span, in a bundle): the open spans; with a
    directory also the application spans in no bundle that ended under a local root still open
    (for a later bundle of calls outside runs)."""
    ended: dict[str, ContextSpan] = field(default_factory=dict)
    """With a directory: the application spans in ``spans`` that ended, as context."""
    open: int = 0
    recent_calls: collections.OrderedDict[str, None] = field(
        default_factory=collections.OrderedDict
    )
    dropped: int = 0
    capped: bool = False
    """A span was refused at its start (``max_spans_per_trace``): a span that ends unknown is
    one of those, counted as dropped."""
    late: int = 0
    """Calls that started after the call they were made in had ended (in no bundle)."""
    reserved: Path | None = None
    """The name the program's thread took for the trace's first bundle of calls outside runs."""


class Bundles:
    """The bundles of one processor (see the module docstring). :meth:`put`, :meth:`open_run`
    and :meth:`wait` are for any thread; everything else runs on the writer thread."""

    def __init__(
        self,
        writer: BundleWriter,
        *,
        redactor: Callable[[], Redactor],
        handoff: PayloadHandoff,
        stats: ProcessorStats,
        open_file: Callable[[Path, BundleEncoder], BundleAppender],
        claim: Callable[[Path, int, int | None], Path],
        interval: Callable[[], float | None],
        max_open_traces: int,
        max_spans_per_trace: int,
    ) -> None:
        self.writer = writer
        self._redactor = redactor
        self._handoff = handoff
        self.stats = stats
        self._open_file = open_file
        self._claim = claim
        self._interval = interval
        self.max_open_traces = max_open_traces
        self.max_spans_per_trace = max_spans_per_trace
        self._queue: deque[Any] = deque()
        self._armed = False
        """The writer knows the queue has work (its periodic rounds are running)."""
        self.queued = 0
        """Payload bytes queued since the writer last took the queue (approximate: a trigger)."""
        # the writer thread's own
        self._traces: dict[str, _Trace] = {}
        self._refused: OrderedDict[str, int] = OrderedDict()
        """Traces refused as a whole (at the open-trace cap) -> spans dropped so far."""
        self._refused_runs: dict[str, tuple[str, _Bundle]] = {}
        """Run span id -> (trace id, its bundle) of the runs of refused traces."""
        self._appenders: set[BundleAppender] = set()
        WRITER.add(self)

    # -- any thread ------------------------------------------------------------------------------

    def put(self, item: Any) -> None:
        """Queue a span's start (``(span,)``, or ``("name", span, path)``: with the name its
        trace's first bundle of calls outside runs is to have) or end (``(span, payloads)``)."""
        queue = self._queue
        queue.append(item)
        if not self._armed:  # (the first item since the writer's last round: its rounds start)
            self._armed = True
            WRITER.arm()
        elif len(queue) >= _QUEUE_ITEMS:  # a flood of spans: the writer takes them now
            WRITER.wake()

    def open_run(self, span: ReadableSpan, appender: BundleAppender) -> None:
        """Queue the start of a run's bundle, its file already created with its header."""
        self.put(("open", span, appender))

    def busy(self) -> bool:
        """Something is queued, or a bundle is open (for the exit handler)."""
        return bool(self._queue or self._appenders or self._refused_runs)

    def wait(self, timeout: float = -1, *, close: str | None = None) -> bool:
        """Wait until the writer has taken and written everything queued before (``close``:
        and closed every open bundle with this reason). False: not within ``timeout``."""
        marker = Wait(close)
        self._queue.append(marker)
        if threading.current_thread() is WRITER.thread:  # (a span ended on the writer thread,
            return True  # whose spans are suppressed: it cannot wait for itself)
        WRITER.wake()
        return marker.wait(timeout)

    @property
    def open_traces(self) -> int:
        """Traces followed now (for tests and health checks; read after a flush)."""
        return len(self._traces)

    # -- the writer thread -----------------------------------------------------------------------

    def flush_interval(self) -> float | None:
        """The shortest flush interval of the open bundles, and of the queue while it has work."""
        intervals = [a.flush_interval for a in self._appenders if a.flush_interval]
        if self._queue:
            interval = self._interval()
            if interval:
                intervals.append(interval)
        return min(intervals) if intervals else None

    def round(self, tick: bool) -> None:
        """Take what is queued, route it, and write what is due. Every marker taken is set,
        whatever fails (a thread waits on it)."""
        self._armed = False  # (before taking: an item queued from now on arms the writer again)
        queue = self._queue
        items = [queue.popleft() for _ in range(len(queue))]  # (what was queued by now)
        self.queued = 0
        try:
            for item in items:
                try:
                    if isinstance(item, Wait):
                        if item.close is not None:
                            self._close_all(item.close)
                    else:
                        self._take(item)
                except Exception:
                    log_internal_error("writing a span to its bundle")
                    if not isinstance(item, Wait):
                        self._lost(item)
            force = any(isinstance(item, Wait) for item in items)
            for appender in list(self._appenders):
                appender.write_pending(force=force, tick=tick)
                if appender.closed:
                    self._appenders.discard(appender)
        finally:
            for item in items:
                if isinstance(item, Wait):
                    item.set()

    def leave_to_parent(self) -> None:
        self._armed = False  # (the child's writer thread is not running: its first put arms it)
        self.queued = 0
        self._queue.clear()
        self._traces.clear()
        self._refused_runs.clear()
        self._appenders.clear()

    def _lost(self, item: tuple[Any, ...]) -> None:
        """A span could not be taken: the open bundles of its trace say they may lack a call."""
        try:
            span = item[1] if item[0] in ("open", "name") else item[0]
            state = self._traces.get(format(span.get_span_context().trace_id, "032x"))
            for bundle in state.bundles if state is not None else ():
                bundle.builder.lost += 1
            self.stats.write_errors += 1
        except Exception:  # (an item that is not a span at all: nothing more to say)
            pass

    def _take(self, item: tuple[Any, ...]) -> None:
        if item[0] == "open":
            self._open_run(item[1], item[2])
        elif item[0] == "name":
            self._started(item[1], item[2])
        elif len(item) == 1:
            self._started(item[0])
        else:
            self._ended(item[0], item[1])

    # -- following traces -------------------------------------------------------------------------

    def _trace(self, trace_id: str) -> _Trace | None:
        """The state of ``trace_id``, made if the cap allows (None: the trace is refused)."""
        state = self._traces.get(trace_id)
        if state is not None:
            return state
        if trace_id in self._refused:
            return None
        if len(self._traces) >= self.max_open_traces:
            self._refused[trace_id] = 0
            while len(self._refused) > 4 * self.max_open_traces + 16:
                self._refused.popitem(last=False)
            self.stats.dropped_traces += 1
            if self.stats.dropped_traces in (1, 10, 100) or self.stats.dropped_traces % 1000 == 0:
                logger.warning(
                    "stepfork_otel: %d open traces already followed; trace %s not recorded "
                    "(%d traces dropped so far)",
                    self.max_open_traces,
                    trace_id,
                    self.stats.dropped_traces,
                )
            return None
        state = self._traces[trace_id] = _Trace(trace_id)
        return state

    def _forget(self, state: _Trace) -> None:
        """Nothing of the trace is open here any more."""
        if state.late:
            self.stats.dropped_spans += state.late
            logger.warning(
                "stepfork_otel: %d call(s) of trace %s started after the call they were made "
                "in had ended and are in no bundle",
                state.late,
                state.trace_id,
            )
        del self._traces[state.trace_id]

    # -- starts --------------------------------------------------------------------------------------

    def _started(self, span: ReadableSpan, name: Path | None = None) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        trace_id = format(ctx.trace_id, "032x")
        state = self._trace(trace_id)
        if state is None:
            return  # (a refused trace: counted as its spans end)
        if name is not None:
            state.reserved = name
        span_id = _hex(ctx.span_id)
        if len(state.spans) >= self.max_spans_per_trace:
            if not state.capped:
                logger.warning(
                    "stepfork_otel: trace %s exceeded %d spans held; further spans dropped "
                    "(its bundles will say they are incomplete)",
                    trace_id,
                    self.max_spans_per_trace,
                )
            state.capped = True
            return
        parent = _local_parent(span)
        kind = attributes_of(span).get(k.KIND)
        kind = kind if isinstance(kind, str) else None
        taken = False
        for bundle in state.bundles:
            taken = bundle.builder.started(span_id, parent, kind, span) or taken
        state.spans[span_id] = (parent, kind, span, taken)
        state.open += 1
        if not taken and kind in k.BOUNDARY_KINDS:
            self._unplaced_call(state, span, span_id, parent, kind)

    def _unplaced_call(
        self, state: _Trace, span: ReadableSpan, span_id: str, parent: str | None, kind: str
    ) -> None:
        """A call no open bundle took: made after the call it was made in ended (said when the
        trace ends), in a run that has no bundle, or outside every run -- then, with a
        directory, the first call of a bundle of calls outside runs."""
        if parent is not None and parent in state.recent_calls:
            state.late += 1  # (said when the trace is let go; its open bundles may lack it)
            for bundle in state.bundles:
                bundle.builder.late += 1
            return
        if self.writer.directory is None:
            return
        root = span_id
        steps = 0
        while True:  # up to the local root, through the spans known here
            up = state.spans.get(root)
            link = None if up is None else up[0]
            if link is None or link not in state.spans or steps > len(state.spans):
                break
            root, steps = link, steps + 1
            if state.spans[root][1] == k.KIND_RUN:
                return  # inside a run whose bundle is not written (not sampled, refused)
        if root == span_id:
            if parent is not None and parent not in state.spans:
                return  # made in a span never seen here (a forked child's inherited run)
            builder = BundleBuilder(state.trace_id, span_id, self._redactor())  # a call outside
            # any span: the call and the calls it makes
            if self._open(state, builder, None) is not None:
                builder.started(span_id, None, kind, span)
            return
        parents = {i: v[0] for i, v in state.spans.items()}
        kinds = {i: v[1] for i, v in state.spans.items()}
        in_runs = grouping.local_roots(
            parents, {i for i, kind in kinds.items() if kind == k.KIND_RUN}
        )
        members = {i for i in grouping.subtree(parents, root) if i not in in_runs}
        members.discard(span_id)
        builder = BundleBuilder(
            state.trace_id,
            root,
            self._redactor(),
            outside=True,
            open_spans=members - {root},
            context=[state.ended[i] for i in members if i in state.ended],
        )
        builder.started(root, None, None)
        if self._open(state, builder, state.spans[root][2]) is not None:
            builder.started(span_id, parent, kind, span)
            for i in members:
                if i in state.spans:
                    state.spans[i] = (*state.spans[i][:3], True)
            state.spans[span_id] = (*state.spans[span_id][:3], True)

    def _open(
        self, state: _Trace, builder: BundleBuilder, root: ReadableSpan | None
    ) -> _Bundle | None:
        """Open a bundle of calls outside runs (or of a lone call) at its default path."""
        trace_id = int(state.trace_id, 16)
        path, state.reserved = state.reserved, None
        header = Trace(trace_id=state.trace_id, run=run_info(None, None))
        try:
            appender = open_at_a_free_name(
                lambda: self._claim(self.writer.default_path(state.trace_id), trace_id, None),
                lambda at: self._open_file(at, BundleEncoder(header)),
                state.trace_id,
                path,
            )
        except Exception:
            self.stats.write_errors += 1
            log_internal_error(f"writing the bundle {path}")
            return None
        bundle = _Bundle(builder, appender, root)
        state.bundles.append(bundle)
        self._appenders.add(appender)
        return bundle

    def _open_run(self, span: ReadableSpan, appender: BundleAppender) -> None:
        ctx = span.get_span_context()
        assert ctx is not None  # (a run span that started)
        trace_id = format(ctx.trace_id, "032x")
        run_id = _hex(ctx.span_id)
        builder = BundleBuilder(
            trace_id, run_id, self._redactor(), created_by=created_by_of(attributes_of(span))
        )
        state = self._trace(trace_id)
        if state is None:  # refused: the bundle holds the run only, with the reason
            self._refused_runs[run_id] = (trace_id, _Bundle(builder, appender, span))
            self._appenders.add(appender)
            return
        builder.started(run_id, None, k.KIND_RUN)
        if run_id not in state.spans:  # (its start was a span not stepfork's: a sampler that
            state.spans[run_id] = (_local_parent(span), k.KIND_RUN, span, True)  # dropped its
            state.open += 1  # attributes)
        state.bundles.append(_Bundle(builder, appender, span))
        self._appenders.add(appender)

    # -- ends ----------------------------------------------------------------------------------------

    def _ended(self, span: ReadableSpan, payloads: Mapping[str, Payload]) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        trace_id = format(ctx.trace_id, "032x")
        span_id = _hex(ctx.span_id)
        state = self._traces.get(trace_id)
        # (a refused run's bundle closes whatever became of its trace since: forgotten among
        # the refused ones, a later span may have made it a state of its own)
        refused = self._refused_runs.pop(span_id, None)
        if state is None or refused is not None:
            if state is None and trace_id in self._refused:
                self._refused[trace_id] += 1
                self.stats.dropped_spans += 1
            if refused is not None:  # (looked up whatever became of the trace's count)
                dropped = self._refused.get(trace_id, 0)
                self._close_refused(refused[1], span, payloads, max(dropped, 1))
            if (
                state is None
                and _local_parent(span) is None
                and not any(t == trace_id for t, _ in self._refused_runs.values())
            ):
                self._refused.pop(trace_id, None)
            return
        known = state.spans.get(span_id)
        if known is None:
            if state.capped:  # refused at its start
                state.dropped += 1
                self.stats.dropped_spans += 1
            return
        parent, kind, _, taken = known
        record: SpanRecord | None = None
        for bundle in list(state.bundles):
            builder = bundle.builder
            if span_id == builder.root and kind not in k.BOUNDARY_KINDS:
                record = record or span_record(span, payloads, copy=False)
                state.bundles.remove(bundle)
                self._close(bundle, record, state.dropped)
            elif builder.holds(span_id):
                record = record or span_record(span, payloads, copy=False)
                self._add(bundle, record)
                if span_id == builder.root:  # a lone call: its own bundle ends with it
                    state.bundles.remove(bundle)
                    self._close(bundle, None, state.dropped)
        state.open -= 1
        if kind in k.BOUNDARY_KINDS:
            recent = state.recent_calls
            recent[span_id] = None
            if len(recent) > _RECENT_CALLS:
                recent.popitem(last=False)
        if self.writer.directory is not None and kind is None and not taken and parent:
            record = record or span_record(span, payloads, copy=False)
            state.ended[span_id] = context_span(record, self._redactor())  # (for a later
            # bundle of calls outside runs under the same local root)
        else:
            del state.spans[span_id]
        if parent is None:  # a local root: what ended under it has no later use
            for i in grouping.subtree({i: v[0] for i, v in state.spans.items()}, span_id):
                if i in state.ended:
                    del state.ended[i], state.spans[i]
        if not state.bundles and (state.open <= 0 or self.writer.directory is None):
            self._forget(state)  # (without a directory, what is left of it makes no bundle)

    def _add(self, bundle: _Bundle, record: SpanRecord) -> None:
        """A span of the bundle ended: its events, written at the next write."""
        builder = bundle.builder
        n = builder.call_number(record.span_id)
        try:
            done = builder.ended(record)
        except Exception:
            builder.lost += 1
            self.stats.write_errors += 1
            log_internal_error(f"converting call {n} for the bundle {bundle.appender.path}")
            return
        if done is not None and (done.events or done.captured):
            encoder = bundle.appender.encoder
            bundle.appender.add(done.events, encoder.captured(done.captured))

    def _close(
        self,
        bundle: _Bundle,
        root: SpanRecord | None,
        dropped: int,
        reason: str | None = None,
    ) -> None:
        """Write the calls still open and the trailer, and close the bundle's file. (The
        hand-off is read without its lock, here as everywhere on the writer thread: an exit
        handler waiting for the writer may have interrupted a thread that holds it.)"""
        appender = bundle.appender
        try:
            still_open = [
                span_record(handle, self._handoff.peek(handle.get_span_context().span_id))
                for handle in bundle.builder.open_calls()
                if handle is not None
            ]
            rest, final = bundle.builder.finish(root, still_open, reason=reason, dropped=dropped)
        except Exception:  # the file keeps what it holds, without a trailer (it loads so)
            self.stats.write_errors += 1
            log_internal_error(f"closing the bundle {appender.path}")
            appender.abandon()
            self._appenders.discard(appender)
            return
        if appender.finish(rest, final):
            self.stats.bundles_written += 1
        elif appender.failed:  # (logged by the appender)
            self.stats.write_errors += 1
        self._appenders.discard(appender)

    def _close_refused(
        self,
        bundle: _Bundle,
        span: ReadableSpan,
        payloads: Mapping[str, Payload],
        dropped: int,
    ) -> None:
        reason = (
            f"trace not followed: {self.max_open_traces} traces were already open "
            "(max_open_traces); only the run itself is recorded"
        )
        self._close(bundle, span_record(span, payloads, copy=False), dropped, reason)

    def _close_all(self, reason: str) -> None:
        """Close every open bundle with what it holds (at exit, at shutdown): the calls still
        open without an outcome, the root as it is now."""
        for state in list(self._traces.values()):
            for bundle in state.bundles:
                handle = bundle.root  # (None: a lone call, written as a call still open)
                try:
                    root = None
                    if handle is not None:
                        span_id = handle.get_span_context().span_id  # type: ignore[union-attr]
                        root = span_record(handle, self._handoff.peek(span_id))
                except Exception:
                    log_internal_error("reading a bundle's root span at its close")
                    root = None
                self._close(bundle, root, state.dropped, reason)
            state.bundles.clear()
        for _, bundle in self._refused_runs.values():
            root = None if bundle.root is None else span_record(bundle.root)
            self._close(bundle, root, 0, reason)
        self._traces.clear()
        self._refused_runs.clear()
