"""The one span -> event conversion: what a span says, as bundle events.

Both the live :class:`~stepfork_otel.otel.processor.SftraceSpanProcessor` and the OTLP importer
(spans a collector captured) describe each span as a :class:`SpanRecord`; the one bundle builder
(:mod:`stepfork_otel.trace.builder`) decides which spans make a bundle and numbers its calls, and
turns each call's span into its events with :func:`span_events` -- nothing else builds events, so
a bundle written locally and one rebuilt from a collector's file are the same for the same run
(same events, same fingerprints).

Here: the per-span step (:func:`span_events`: a call event and its outcome), the run's part of a
bundle (:func:`run_info`), spans kept as context (:func:`context_span`), captured reads
(:func:`captured_reads`) and the order of a bundle's events (:func:`timeline`,
:func:`order_events`): calls by number, and two structural rules that override timestamps,
because clocks of different machines (or a coarse clock) can disagree with the nesting -- a call
always comes after the call it is nested in, and a call's outcome comes after the call, after
everything nested in it, and before any call that started once it had ended.

It is pure data in, data out: no OpenTelemetry import, no process state. What it redacts (the
names of the application's spans kept as context) it redacts with the rules it is given.

Payloads are read with the span payload codec (:func:`~stepfork_otel.trace.payload.read_payload`):
a payload cut by an ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` is recorded as missing (``truncated``),
never as if it were whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from stepfork_otel import constants as k
from stepfork_otel.trace import grouping
from stepfork_otel.trace.canonical import sha256_hex
from stepfork_otel.trace.models import (
    CapturedRead,
    ContextSpan,
    ErrorEvent,
    Event,
    LlmRequest,
    LlmResponse,
    RunInfo,
    ToolCall,
    ToolResult,
    error_output,
)
from stepfork_otel.trace.payload import Payload, read_error_message, read_payload
from stepfork_otel.trace.policy import ReplayPolicy
from stepfork_otel.trace.redaction import Redactor


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """A finished (or, for incomplete runs, still open) span, independent of where it came from."""

    trace_id: str
    """32 lower-case hex digits."""
    span_id: str
    """16 lower-case hex digits."""
    parent_span_id: str | None
    name: str
    kind: str = "INTERNAL"
    start_time_unix_nano: int = 0
    end_time_unix_nano: int | None = None
    """None while the span is still open."""
    status: str = "unset"
    attributes: Mapping[str, Any] = field(default_factory=dict)
    payloads: Mapping[str, Payload] = field(default_factory=dict)
    """Full values handed over in-process (keys ``stepfork.input``/``stepfork.output`` and
    ``stepfork.error.message``); they replace the span attribute, which may have been left off
    or truncated."""

    @property
    def stepfork_kind(self) -> str | None:
        value = self.attributes.get(k.KIND)
        return value if isinstance(value, str) else None


def is_stepfork_span(span: SpanRecord) -> bool:
    return span.stepfork_kind is not None


def top_level_runs(spans: Iterable[SpanRecord]) -> list[SpanRecord]:
    """Run spans not nested in another run span of ``spans``, in start order."""
    by_id = {s.span_id: s for s in spans}
    parents = {i: s.parent_span_id for i, s in by_id.items()}
    kinds = {i: s.stepfork_kind for i, s in by_id.items()}
    return sorted((by_id[i] for i in grouping.top_level_runs(parents, kinds)), key=call_order)


def parents_and_kinds(
    spans: Iterable[SpanRecord],
) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """What the grouping rule (:mod:`stepfork_otel.trace.grouping`) needs of each span."""
    parents: dict[str, str | None] = {}
    kinds: dict[str, str | None] = {}
    for s in spans:
        parents[s.span_id] = s.parent_span_id
        kinds[s.span_id] = s.stepfork_kind
    return parents, kinds


def _str(attrs: Mapping[str, Any], key: str, default: str = "") -> str:
    value = attrs.get(key)
    return value if isinstance(value, str) else default


def _int(attrs: Mapping[str, Any], key: str) -> int:
    value = attrs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _policy(attrs: Mapping[str, Any]) -> ReplayPolicy:
    try:
        return ReplayPolicy(_str(attrs, k.REPLAY_POLICY, ReplayPolicy.REPLAYABLE.value))
    except ValueError:
        return ReplayPolicy.REPLAYABLE


def _action(attrs: Mapping[str, Any]) -> Any:
    action = attrs.get(k.REPLAY_ACTION)
    return action if action in k.REPLAY_ACTIONS else None


def _status(attrs: Mapping[str, Any]) -> str | None:
    value = attrs.get(k.STATUS)
    return value if value in (k.STATUS_OK, k.STATUS_ERROR, k.STATUS_SKIPPED) else None


def _usage(attrs: Mapping[str, Any]) -> dict[str, int] | None:
    usage: dict[str, int] = {}
    for name, keys in (
        ("input_tokens", (k.GEN_AI_USAGE_INPUT_TOKENS, k.USAGE_INPUT_TOKENS)),
        ("output_tokens", (k.GEN_AI_USAGE_OUTPUT_TOKENS, k.USAGE_OUTPUT_TOKENS)),
    ):
        for key in keys:  # the convention's key, else stepfork's (usage reported elsewhere)
            value = attrs.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                usage[name] = value
                break
    return usage or None


def _imported(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The fidelity of a call the importer built from another instrumentation's span
    (``trace/foreign.py``): nothing for stepfork's own spans."""
    fidelity = attrs.get(k.IMPORT_FIDELITY)
    if fidelity not in k.FIDELITIES:
        return {}
    unchecked = attrs.get(k.IMPORT_UNCHECKED)
    notes = [str(n) for n in unchecked] if isinstance(unchecked, (list, tuple)) else []
    return {"fidelity": fidelity, "unchecked": notes or None}


def call_order(span: SpanRecord) -> tuple[int, int, str]:
    """The order spans started in: start time, the call number on the span, span id."""
    return (span.start_time_unix_nano, _int(span.attributes, k.CALL_SEQ), span.span_id)


# --- events --------------------------------------------------------------------------------------


def _outcome(span: SpanRecord, call_id: str, base: dict[str, Any], name: str) -> Event | None:
    status = _status(span.attributes)
    if status is None or span.end_time_unix_nano is None:
        return None  # the span never recorded an outcome: a call with a missing result
    common = dict(
        base,
        parent_id=call_id,
        time_unix_nano=span.end_time_unix_nano,
        duration_ns=max(0, span.end_time_unix_nano - span.start_time_unix_nano),
    )
    attrs = span.attributes
    if status in (k.STATUS_ERROR, k.STATUS_SKIPPED):
        error_type = _str(attrs, k.ERROR_TYPE, "Exception")
        message = read_error_message(span.attributes, span.payloads) or ""
        text = error_output(error_type, message)
        return ErrorEvent(
            id=f"{call_id}.error",
            status="skipped" if status == k.STATUS_SKIPPED else "error",
            error_type=error_type,
            message=message,
            output=text,
            output_sha256=sha256_hex(text),
            output_size=len(text.encode("utf-8")),
            **common,
        )
    out = read_payload(span.attributes, span.payloads, is_input=False)
    payload: dict[str, Any] = dict(
        output=out.text,
        output_sha256=out.sha256,
        output_size=out.size,
        output_missing=out.missing,
    )
    result: Event
    if span.stepfork_kind == k.KIND_TOOL:
        result = ToolResult(id=f"{call_id}.result", name=name, **payload, **common)
    else:
        result = LlmResponse(
            id=f"{call_id}.result",
            provider=_str(attrs, k.GEN_AI_PROVIDER_NAME),
            model=_str(attrs, k.GEN_AI_RESPONSE_MODEL) or _str(attrs, k.GEN_AI_REQUEST_MODEL),
            usage=_usage(attrs),
            **payload,
            **common,
        )
    return result


def _call_event(
    span: SpanRecord, call_id: str, n: int, parent_id: str | None
) -> tuple[Event, dict[str, Any], str]:
    attrs = span.attributes
    status = _status(attrs)
    base: dict[str, Any] = dict(
        trace_id=span.trace_id,
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        seq=n,
        replay_policy=_policy(attrs),
        replay_action=_action(attrs),
    )
    inp = read_payload(span.attributes, span.payloads, is_input=True)
    imported = _imported(attrs)
    call_fields = dict(
        base,
        **imported,
        id=call_id,
        parent_id=parent_id,
        status="skipped"
        if status == k.STATUS_SKIPPED
        else ("error" if status == k.STATUS_ERROR else "ok"),
        time_unix_nano=span.start_time_unix_nano,
        input=inp.text,
        input_sha256=inp.sha256,
        input_size=inp.size,
        input_missing=inp.missing,
    )
    event: Event
    name = ""
    if span.stepfork_kind == k.KIND_TOOL:
        name = _str(attrs, k.GEN_AI_TOOL_NAME, span.name)
        event = ToolCall(name=name, **call_fields)
    else:
        event = LlmRequest(
            provider=_str(attrs, k.GEN_AI_PROVIDER_NAME),
            model=_str(attrs, k.GEN_AI_REQUEST_MODEL),
            operation=_str(attrs, k.GEN_AI_OPERATION_NAME, k.OP_CHAT),
            model_fingerprint=_str(attrs, k.MODEL_FINGERPRINT) or None,
            **call_fields,
        )
    return event, base, name


def created_by_of(attributes: Mapping[str, Any]) -> str | None:
    """A bundle's ``created_by``: what its run span says recorded it (``SDK_VERSION``)."""
    value = attributes.get(k.SDK_VERSION)
    return value if isinstance(value, str) and value else None


def run_info(run: SpanRecord | None, replay_mode: str | None) -> RunInfo:
    """The run's part of a bundle, from its span (None: a bundle of calls outside runs)."""
    if run is None:
        return RunInfo(replay_mode=replay_mode)
    attrs = run.attributes
    inp = read_payload(run.attributes, run.payloads, is_input=True)
    out = read_payload(run.attributes, run.payloads, is_input=False)
    status = _status(attrs)
    return RunInfo(
        name=_str(attrs, k.RUN_NAME) or run.name,
        span_id=run.span_id,
        entrypoint=_str(attrs, k.RUN_ENTRYPOINT) or None,
        input=inp.text,
        input_sha256=inp.sha256,
        input_missing=inp.missing,
        output=out.text,
        output_sha256=out.sha256,
        output_missing=out.missing,
        status="ok"
        if status == k.STATUS_OK
        else ("error" if status == k.STATUS_ERROR else "unset"),
        error_type=_str(attrs, k.ERROR_TYPE) or None,
        error_message=read_error_message(run.attributes, run.payloads),
        start_time_unix_nano=run.start_time_unix_nano,
        end_time_unix_nano=run.end_time_unix_nano or 0,
        replay_mode=_str(attrs, k.REPLAY_MODE) or replay_mode,
        capture=[name for name in _str(attrs, k.CAPTURE).split(",") if name] or None,
        untraced_tools=[str(n) for n in untraced]
        if isinstance(untraced := attrs.get(k.IMPORT_UNTRACED_TOOLS), (list, tuple)) and untraced
        else None,
    )


def captured_reads(
    spans: Iterable[SpanRecord], seq_of: Mapping[str, int]
) -> tuple[list[CapturedRead], int]:
    """The captured reads carried by ``spans`` (``stepfork.captured`` on the span of the call
    each preceded, or on a run span; an audit's tally on the run span), in their recorded order,
    and how many could not be read (an attribute cut by a length limit, a hostile file). Used by
    the bundle builder, for each call as it ends and for the whole bundle when it closes."""
    reads: list[CapturedRead] = []
    unreadable = 0
    audit: list[Any] = []
    for span in spans:
        for key in (k.CAPTURED, k.CAPTURED_AUDIT):
            text = span.attributes.get(key)
            if text is None:
                continue
            try:
                items = orjson.loads(text) if isinstance(text, str) else None
            except orjson.JSONDecodeError:
                items = None
            if not isinstance(items, list):
                unreadable += 1
                continue
            if key == k.CAPTURED_AUDIT:
                audit.extend(items)
                continue
            for item in items:
                try:
                    item = dict(item, before_call=seq_of.get(span.span_id))
                    reads.append(CapturedRead.model_validate(item, strict=True))
                except (TypeError, ValueError):
                    unreadable += 1
    reads.sort(key=lambda r: r.index)
    for item in audit:
        try:
            reads.append(
                CapturedRead.model_validate(
                    dict(item, index=len(reads) + 1, kind="audit"), strict=True
                )
            )
        except (TypeError, ValueError):
            unreadable += 1
    return reads, unreadable


def unreadable_reads_reason(count: int) -> str:
    """The ``incomplete_reason`` of a bundle whose spans carried reads that could not be read."""
    return f"{count} captured read(s) could not be read from their spans"


# --- order ---------------------------------------------------------------------------------------


def timeline(
    ordered: list[str],
    enclosing: Mapping[str, str | None],
    starts: Mapping[str, int],
    ends: Mapping[str, int],
    calls: Mapping[str, Event],
    outcomes: Mapping[str, Event],
) -> list[Event]:
    """Merge calls (in ``ordered`` order, keyed by any id) with their outcomes (see the module
    docstring). ``ends``: when each call ended (0: never). :func:`order_events` (the loader of a
    bundle written as its run went, events in the order calls ended, and the importer's
    ``spans_to_trace``) keys by call id, with the times its events carry."""
    n_of = {c: n for n, c in enumerate(ordered, start=1)}
    # effective end: a call is over once it and everything nested in it are over
    eff_end = {c: max(starts[c], ends[c]) for c in ordered}
    remaining = dict.fromkeys(n_of, 0)  # nested calls not yet placed
    for c in reversed(ordered):
        parent = enclosing[c]
        if parent is not None:
            eff_end[parent] = max(eff_end[parent], eff_end[c])
            remaining[parent] += remaining[c] + 1
    events: list[Event] = []
    pending: list[str] = []

    def flush(limit: int | None) -> None:
        while pending:
            ready = [
                c for c in pending if remaining[c] == 0 and (limit is None or eff_end[c] <= limit)
            ]
            if not ready:
                return
            best = min(ready, key=lambda c: (eff_end[c], -n_of[c]))
            pending.remove(best)
            events.append(outcomes[best])

    for c in ordered:
        flush(starts[c])
        events.append(calls[c])
        parent = enclosing[c]
        while parent is not None:
            remaining[parent] -= 1
            parent = enclosing[parent]
        if c in outcomes:
            pending.append(c)
    flush(None)
    return events


def order_events(events: list[Event]) -> list[Event] | None:
    """The events of a bundle in the order the conversion gives them: calls by number, each
    outcome placed by :func:`timeline`. For bundles written as their run went (a call
    and its outcome are written when the call ends, so a nested call comes before the call it is
    nested in). None: the events are not what that needs (an outcome without ``parent_id``, a
    duplicate id or number, an outcome of no call) -- the structure check says what is wrong."""
    calls: dict[str, Event] = {}
    outcomes: dict[str, Event] = {}
    for event in events:
        if isinstance(event, (ToolCall, LlmRequest)):
            if event.id in calls:
                return None
            calls[event.id] = event
        elif event.parent_id is None or event.parent_id in outcomes:
            return None
        else:
            outcomes[event.parent_id] = event
    if not outcomes.keys() <= calls.keys():
        return None
    ordered = sorted(calls, key=lambda c: calls[c].seq)
    if len({calls[c].seq for c in ordered}) != len(ordered):
        return None
    enclosing: dict[str, str | None] = {}
    for c in ordered:
        parent = calls[c].parent_id
        enclosing[c] = parent if parent in calls and calls[parent].seq < calls[c].seq else None
        if parent is not None and enclosing[c] is None:
            return None  # (a parent that is not an earlier call)
    starts = {c: calls[c].time_unix_nano for c in ordered}
    ends = {c: outcomes[c].time_unix_nano if c in outcomes else 0 for c in ordered}
    return timeline(ordered, enclosing, starts, ends, calls, outcomes)


def span_events(
    span: SpanRecord, call_id: str, n: int, parent_call_id: str | None
) -> tuple[Event, Event | None]:
    """The per-span step of the conversion: the call event of one boundary span (numbered ``n``,
    nested in ``parent_call_id``) and its outcome (None: the span recorded none). The bundle
    builder makes each call's events with it when the call ends."""
    call, base, name = _call_event(span, call_id, n, parent_call_id)
    return call, _outcome(span, call_id, base, name)


def context_span(span: SpanRecord, redactor: Redactor) -> ContextSpan:
    """An application span kept as context (its name redacted: span names may embed
    credentials)."""
    return ContextSpan(
        span_id=span.span_id,
        parent_span_id=span.parent_span_id,
        name=redactor.redact_text(span.name),
        kind=span.kind,
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano or 0,
        status=span.status if span.status in ("unset", "ok", "error") else "unset",  # type: ignore[arg-type]
    )


def replay_mode_of(span: SpanRecord) -> str | None:
    return _str(span.attributes, k.REPLAY_MODE) or None
