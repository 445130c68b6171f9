"""The one bundle builder: a bundle built incrementally from the spans of its run as they start
and end.

Every bundle is made here, whoever feeds it. The bundle processor (``otel/``) feeds each open
bundle the spans of its process as they start and end, on its writer thread; the OTLP importer
feeds a finished trace's spans through :func:`spans_to_trace`: every start and end interleaved
by time, parents first (:func:`feed_order` orders the starts), as the processor met them. So "a local bundle loads equal to the one imported from the same spans"
rests on one rule in one place:

* **Which spans**: a bundle has a root -- the run span, the local root of the calls outside every
  run, or a lone call -- and takes a span when its parent is already in the bundle (the root, or a
  span it took). A bundle of calls outside runs does not take a run span (that run's calls are the
  run's bundle). A call ends the calls nested in it: a call that starts after the call it was made
  in ended is in no bundle (its parent left the bundle when it ended; the processor says so).
  An application span stays in the bundle when it ends: a task it started may call later.
* **Numbers**: a call is numbered when it starts, in the order the calls start. The boundaries
  take each call's start time and its number in the trace (``stepfork.call.seq``) together, under
  one lock held while the span starts, so the order the processor sees calls start is their
  order by start time and by number -- the order the importer sorts by (start time, number, span
  id; a call never before the call it is nested in).
* **Events**: a call's events are made when it ends (:func:`~stepfork_otel.trace.conversion.
  span_events`, the per-span step of the conversion), in whatever order calls end; a loaded
  bundle puts them in the conversion's order (:func:`~stepfork_otel.trace.conversion.
  order_events`). What only the end knows -- the run's outcome, the spans kept as context, the
  captured reads, whether it is complete -- is :meth:`BundleBuilder.finish`.

Pure data in, data out: no OpenTelemetry, no I/O. Span ids are the hex strings of
:class:`~stepfork_otel.trace.conversion.SpanRecord`; an open call carries an opaque ``handle``
(the processor's open span) so that a bundle closed early can read the calls still open.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stepfork_otel import constants as k
from stepfork_otel.trace import grouping
from stepfork_otel.trace.conversion import (
    SpanRecord,
    call_order,
    captured_reads,
    context_span,
    created_by_of,
    order_events,
    replay_mode_of,
    run_info,
    span_events,
    top_level_runs,
    unreadable_reads_reason,
)
from stepfork_otel.trace.models import CapturedRead, ContextSpan, Event, Trace
from stepfork_otel.trace.redaction import Redactor


class Ended(NamedTuple):
    """What a span's end adds to its bundle."""

    events: list[Event]
    """A call's event and its outcome (none for an application span)."""
    captured: list[CapturedRead]
    """The captured reads the call carried (written after its events, so that a bundle cut
    short keeps them)."""


_NOTHING = Ended([], [])


@dataclass(slots=True)
class _Call:
    call_id: str
    n: int
    parent: str | None
    """The id of the call it is nested in (None: at the run's level)."""
    handle: Any


@dataclass(slots=True, eq=False)
class BundleBuilder:
    """One bundle, built as its spans start and end (see the module docstring).

    ``root``: the span whose subtree the bundle holds (None: every top-level span -- the calls
    outside runs of a whole trace given at once). ``outside``: a bundle of calls outside runs
    (its root, an application span, is kept as context; run spans stay out of it).
    ``open_spans``: spans of the root's subtree already open when the bundle starts (the
    processor opens the bundle of calls outside runs at the first such call), ``context``:
    those already ended."""

    trace_id: str
    root: str | None
    redactor: Redactor
    outside: bool = False
    created_by: str | None = None
    open_spans: Iterable[str] = ()
    context: list[ContextSpan] = field(default_factory=list)
    _scope: dict[str, str | None] = field(init=False, default_factory=dict)
    """Each span of the bundle that can still have children -> the call its children nest in."""
    _calls: dict[str, _Call] = field(init=False, default_factory=dict)
    """The calls that have started and not ended."""
    _next: int = field(init=False, default=1)
    _captured: list[SpanRecord] = field(init=False, default_factory=list)
    _captured_seq: dict[str, int] = field(init=False, default_factory=dict)
    _replay_mode: tuple[int, str] | None = field(init=False, default=None)
    lost: int = field(init=False, default=0)
    """Calls whose events could not be made (the caller counts them; the bundle says so)."""
    late: int = field(init=False, default=0)
    """Calls of the trace made after the call they were made in had ended (in no bundle: this
    one may lack them; the caller counts them)."""
    _unreplayable: list[str] = field(init=False, default_factory=list)
    """``"<call id> (<why>)"`` of each call whose span says it cannot be replayed."""

    def __post_init__(self) -> None:
        self._scope = dict.fromkeys(self.open_spans)
        self.open_spans = ()

    def started(
        self, span_id: str, parent: str | None, kind: str | None, handle: Any = None
    ) -> bool:
        """A span started: take it if it belongs here (numbering it if it is a call). False: it
        is not this bundle's."""
        if span_id == self.root or (self.root is None and parent is None):
            enclosing = None
        elif parent is None or parent not in self._scope or (self.outside and kind == k.KIND_RUN):
            return False
        else:
            enclosing = self._scope[parent]
        if kind in k.BOUNDARY_KINDS:
            n = self._next
            self._next = n + 1
            call_id = f"call-{n}"
            self._calls[span_id] = _Call(call_id, n, enclosing, handle)
            self._scope[span_id] = call_id
        else:
            self._scope[span_id] = enclosing
        return True

    def call_number(self, span_id: str) -> int | None:
        """The number of the open call ``span_id`` (None: not an open call of this bundle)."""
        call = self._calls.get(span_id)
        return None if call is None else call.n

    def holds(self, span_id: str) -> bool:
        """Whether ``span_id`` started in this bundle and can still have children here."""
        return span_id in self._scope

    def ended(self, span: SpanRecord) -> Ended | None:
        """A span of the bundle ended: its events (a call), or its place as context (an
        application span). None: not this bundle's (the root's end is :meth:`finish`)."""
        span_id = span.span_id
        call = self._calls.pop(span_id, None)
        if call is None:
            if span_id not in self._scope or span_id == self.root:
                return None
            if span.stepfork_kind is None:  # an application span (a nested run is neither)
                self.context.append(context_span(span, self.redactor))
            return _NOTHING
        del self._scope[span_id]
        self._note_unreplayable(call, span)
        if self._replay_mode is None or call.n < self._replay_mode[0]:
            mode = replay_mode_of(span)
            if mode is not None:
                self._replay_mode = (call.n, mode)
        reads: list[CapturedRead] = []
        text = span.attributes.get(k.CAPTURED)
        if text is not None:  # kept (small) for the trailer, which lists every read
            kept = SpanRecord(span.trace_id, span_id, None, "", attributes={k.CAPTURED: text})
            self._captured.append(kept)
            self._captured_seq[span_id] = call.n
            reads = captured_reads([kept], self._captured_seq)[0]
        event, outcome = span_events(span, call.call_id, call.n, call.parent)
        return Ended([event] if outcome is None else [event, outcome], reads)

    def _note_unreplayable(self, call: _Call, span: SpanRecord) -> None:
        """A call recorded with a payload that had no JSON form (``stepfork.unreplayable``)."""
        why = span.attributes.get(k.UNREPLAYABLE)
        if isinstance(why, str) and why:
            self._unreplayable.append(f"{call.call_id} ({why})")

    def open_calls(self) -> list[Any]:
        """The handles of the calls still open (in the order they started)."""
        return [call.handle for call in self._calls.values()]

    def finish(
        self,
        root: SpanRecord | None,
        still_open: Iterable[SpanRecord] = (),
        *,
        reason: str | None = None,
        dropped: int = 0,
    ) -> tuple[list[Event], Trace]:
        """Close the bundle: the call events of the calls still open (``still_open``: those of
        :meth:`open_calls` that could be read, without an outcome) and the bundle's header as the
        end knows it. ``root``: the root span as it ended (or as it is, still open); ``reason``:
        why the bundle is incomplete, if something outside it knows (None: it says whether it
        is, from what it holds)."""
        rest: list[Event] = []
        opened = 0
        for span in still_open:
            call = self._calls.get(span.span_id)
            if call is not None:
                opened += 1
                self._note_unreplayable(call, span)
                rest.append(span_events(span, call.call_id, call.n, call.parent)[0])
        self._calls.clear()
        run = None if self.outside or root is None or root.stepfork_kind != k.KIND_RUN else root
        context = self.context
        if root is not None and self.outside:  # an application span: kept as context too
            context = [*context, context_span(root, self.redactor)]
        captured, unreadable = captured_reads(
            [*self._captured, *([run] if run is not None else [])], self._captured_seq
        )
        if reason is None and run is not None and run.end_time_unix_nano is None:
            reason = "the run span never ended"
        if reason is None and opened:
            reason = f"{opened} call(s) had not ended when the bundle was written"
        if reason is None and dropped:
            reason = f"{dropped} span(s) of this trace were dropped (per-trace cap)"
        if reason is None and self.lost:
            reason = f"{self.lost} call(s) could not be written (internal error, logged)"
        if reason is None and self.late:
            reason = (
                f"{self.late} call(s) started after the call they were made in had ended "
                "and are not in it"
            )
        if reason is None and unreadable:
            reason = unreadable_reads_reason(unreadable)
        if reason is None and self._unreplayable:
            reason = unreplayable_reason(self._unreplayable)
        created_by = self.created_by
        if created_by is None and run is not None:
            created_by = created_by_of(run.attributes)
        final = Trace(
            trace_id=self.trace_id,
            complete=reason is None,
            incomplete_reason=reason,
            created_by=created_by,
            dropped_spans=dropped,
            run=run_info(run, None if self._replay_mode is None else self._replay_mode[1]),
            context=sorted(context, key=lambda c: (c.start_time_unix_nano, c.span_id)),
            captured=captured,
        )
        return rest, final


def unreplayable_reason(calls: list[str]) -> str:
    """The ``incomplete_reason`` of a bundle holding calls that cannot be replayed, a payload
    having had no JSON form: ``calls`` are ``"<call id> (<why>)"``, in any order (shown by call
    number, the first three)."""

    def number(said: str) -> int:
        digits = said.split(" ", 1)[0].rpartition("-")[2]
        return int(digits) if digits.isdigit() else 0

    calls = sorted(calls, key=number)
    shown = "; ".join(calls[:3]) + (f"; and {len(calls) - 3} more" if len(calls) > 3 else "")
    return f"{len(calls)} call(s) cannot be replayed, a payload having no JSON form: {shown}"


# --- a whole trace at once (the importer) --------------------------------------------------------


def feed_order(spans: Iterable[SpanRecord]) -> Iterator[tuple[SpanRecord, str | None]]:
    """Spans in the order they started (start time, call number, span id), each after its
    parent, with the parent to feed it under: None when the parent is not among ``spans``, or
    when hostile parent links form a cycle (the link is cut). Clocks of different machines may
    disagree with the nesting; the nesting wins."""
    by_id = {s.span_id: s for s in spans}
    placed: set[str] = set()
    waiting: dict[str, list[SpanRecord]] = {}

    def place(span: SpanRecord, parent: str | None) -> Iterator[tuple[SpanRecord, str | None]]:
        stack = [(span, parent)]
        while stack:
            current, link = stack.pop()
            if current.span_id in placed:
                continue
            placed.add(current.span_id)
            yield current, link
            children = waiting.pop(current.span_id, [])
            stack.extend((child, current.span_id) for child in reversed(children))

    for span in sorted(by_id.values(), key=call_order):
        parent = span.parent_span_id
        if parent is not None and parent in by_id:  # (itself: a cycle, held to the end)
            if parent not in placed:
                waiting.setdefault(parent, []).append(span)
                continue
        else:
            parent = None
        yield from place(span, parent)
    for held in sorted((s for group in waiting.values() for s in group), key=call_order):
        if held.span_id not in placed:  # its ancestors form a cycle: treat it as top level
            yield from place(held, None)


def _timeline_of(
    spans: Iterable[SpanRecord],
) -> list[tuple[bool, SpanRecord, str | None]]:
    """Every start (``False``, with the parent to feed it under) and end (``True``) of
    ``spans``, in the order the processor meets them: by time; at one time (a coarse clock),
    starts before ends and the span started later ends first. A span never starts before its
    parent, nor ends before it starts (the nesting wins over the clocks of different
    machines)."""
    stream: list[tuple[int, bool, int, SpanRecord, str | None]] = []
    start_of: dict[str, int] = {}
    for n, (span, parent) in enumerate(feed_order(spans)):
        start = span.start_time_unix_nano
        if parent is not None:
            start = max(start, start_of.get(parent, start))
        start_of[span.span_id] = start
        stream.append((start, False, n, span, parent))
        if span.end_time_unix_nano is not None:  # (at one time, the later started ends first)
            stream.append((max(span.end_time_unix_nano, start), True, -n, span, None))
    stream.sort(key=lambda item: item[:3])
    return [(is_end, span, parent) for _, is_end, _, span, parent in stream]


def spans_to_trace(
    spans: Iterable[SpanRecord],
    *,
    redactor: Redactor,
    complete: bool = True,
    incomplete_reason: str | None = None,
    dropped_spans: int = 0,
    root_span_id: str | None = None,
    until_root_ends: bool = True,
) -> Trace:
    """The bundle of one run from its spans (any order; all of one trace id), built by feeding
    a :class:`BundleBuilder` the spans' starts and ends in the order the processor meets them
    (:func:`feed_order`, by time), until the root ends: what ends later is written as still
    open, and a call that starts after the call it was made in ended is in no bundle (said).

    ``redactor``: the rules applied to what the conversion itself takes from the spans -- the
    names of the application's spans kept as context (boundary payloads were redacted when they
    were recorded). The processor uses the configured rules, the importer the rules it was
    given, so the same rules give the same bundle.

    ``root_span_id``: the span whose subtree is the bundle (a run span, or a local root). Without
    it, a trace with one top-level run span is cut to that run; with several, ``ValueError``;
    with none, the bundle holds the calls of every top-level span (calls outside runs).

    ``until_root_ends``: False for spans no stepfork processor wrote (another instrumentation's,
    whose root may end before work it started): every end the spans hold is taken.
    """
    by_id = {s.span_id: s for s in spans}
    if not by_id:
        raise ValueError("no spans")
    trace_ids = {s.trace_id for s in by_id.values()}
    if len(trace_ids) != 1:
        raise ValueError(f"spans of {len(trace_ids)} traces given; convert one trace at a time")
    if root_span_id is None:
        runs = top_level_runs(by_id.values())
        if len(runs) > 1:
            ids = ", ".join(r.span_id for r in runs)
            raise ValueError(
                f"the trace holds {len(runs)} runs (span ids {ids}); pass root_span_id to pick one"
            )
        if runs:
            root_span_id = runs[0].span_id
    root: SpanRecord | None = None
    if root_span_id is not None:
        if root_span_id not in by_id:
            raise ValueError(f"root span {root_span_id} is not among the spans given")
        keep = grouping.subtree({s.span_id: s.parent_span_id for s in by_id.values()}, root_span_id)
        by_id = {span_id: s for span_id, s in by_id.items() if span_id in keep}
        root = by_id[root_span_id]
    kind = None if root is None else root.stepfork_kind
    lone_call = kind in k.BOUNDARY_KINDS  # a call outside any span: its own bundle
    builder = BundleBuilder(
        trace_ids.pop(), root_span_id, redactor, outside=kind is None and not lone_call
    )
    events: list[Event] = []
    ended_calls: set[str] = set()
    for is_end, span, parent in _timeline_of(by_id.values()):
        if not is_end:
            taken = builder.started(span.span_id, parent, span.stepfork_kind, span)
            if not taken and span.stepfork_kind in k.BOUNDARY_KINDS and parent in ended_calls:
                builder.late += 1  # (made after the call it was made in ended: in no bundle)
            continue
        if span is root and not lone_call:
            if until_root_ends:
                break  # the bundle closes with its root: what ends later is still open then
            continue
        done = builder.ended(span)
        if done is not None:
            events += done.events
        if span.stepfork_kind in k.BOUNDARY_KINDS:
            ended_calls.add(span.span_id)
        if span is root:
            break
    reason = None if complete else incomplete_reason
    rest, final = builder.finish(
        None if lone_call else root, builder.open_calls(), reason=reason, dropped=dropped_spans
    )
    if not complete and final.complete:  # (a caller's reason always makes it incomplete)
        final = final.model_copy(update={"complete": False, "incomplete_reason": reason})
    ordered = order_events(events + rest)
    if ordered is None:  # (the builder gives each call one number and each outcome its call)
        raise ValueError("the spans do not make a consistent bundle")
    return final.model_copy(update={"events": ordered})
