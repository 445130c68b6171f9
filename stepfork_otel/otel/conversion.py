"""The one span -> event conversion.

Both the live :class:`~stepfork_otel.otel.processor.SftraceSpanProcessor` and the OTLP importer
(spans a collector captured) describe each span as a :class:`SpanRecord` and call
:func:`spans_to_trace`. Nothing else builds events, so a bundle written locally and a bundle rebuilt
from a collector's file are the same for the same run (same events, same fingerprints).

Order: calls are numbered in the order they started -- start time, then the per-process call
number written on the span, then span id -- which is stable across batches, threads and processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.record.payload import Payload
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.models import (
    ContextSpan,
    ErrorEvent,
    Event,
    LlmRequest,
    LlmResponse,
    MissingReason,
    RunInfo,
    ToolCall,
    ToolResult,
    Trace,
)
from stepfork_otel.trace.policy import ReplayPolicy

_BOUNDARY_KINDS = (k.KIND_TOOL, k.KIND_LLM)


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
    """Full payloads handed over in-process (keys ``stepfork.input``/``stepfork.output``); they
    replace the span attribute, which may have been left off or truncated."""

    @property
    def stepfork_kind(self) -> str | None:
        value = self.attributes.get(k.KIND)
        return value if isinstance(value, str) else None


def is_stepfork_span(span: SpanRecord) -> bool:
    return span.stepfork_kind is not None


@dataclass(frozen=True, slots=True)
class _Extracted:
    text: str | None
    sha256: str | None
    size: int | None
    missing: MissingReason | None


def _extract(span: SpanRecord, is_input: bool) -> _Extracted:
    key, sha_key, size_key, omitted_key = (
        (k.INPUT, k.INPUT_SHA256, k.INPUT_SIZE, k.INPUT_OMITTED)
        if is_input
        else (k.OUTPUT, k.OUTPUT_SHA256, k.OUTPUT_SIZE, k.OUTPUT_OMITTED)
    )
    attrs = span.attributes
    sha = attrs.get(sha_key)
    sha = sha if isinstance(sha, str) else None
    size = attrs.get(size_key)
    size = size if isinstance(size, int) and not isinstance(size, bool) else None
    handed = span.payloads.get(key)
    if handed is not None:
        return _Extracted(handed.text, handed.sha256, handed.size, None)
    text = attrs.get(key)
    text = text if isinstance(text, str) else None
    if text is not None:
        if sha is not None and hashlib.sha256(text.encode("utf-8")).hexdigest() != sha:
            # An attribute length limit cut the payload: never keep it as if it were whole.
            return _Extracted(None, sha, size, "truncated")
        return _Extracted(text, sha, size, None)
    if sha is None:
        return _Extracted(None, None, None, None)  # nothing was recorded (e.g. no run output)
    omitted = attrs.get(omitted_key)
    missing: MissingReason = (
        omitted if omitted in (k.OMITTED_SIZE_CAP, k.OMITTED_CAPTURE_DISABLED) else "not_recorded"
    )
    return _Extracted(None, sha, size, missing)


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
    return action if action in ("substituted", "executed", "rejected") else None


def _status(attrs: Mapping[str, Any]) -> str | None:
    value = attrs.get(k.STATUS)
    return value if value in (k.STATUS_OK, k.STATUS_ERROR, k.STATUS_SKIPPED) else None


def _usage(attrs: Mapping[str, Any]) -> dict[str, int] | None:
    usage = {
        name: attrs[key]
        for name, key in (
            ("input_tokens", k.GEN_AI_USAGE_INPUT_TOKENS),
            ("output_tokens", k.GEN_AI_USAGE_OUTPUT_TOKENS),
        )
        if isinstance(attrs.get(key), int)
    }
    return usage or None


def _call_order(span: SpanRecord) -> tuple[int, int, str]:
    return (span.start_time_unix_nano, _int(span.attributes, k.CALL_SEQ), span.span_id)


def _outcome(span: SpanRecord, call_id: str, n: int, base: dict[str, Any]) -> Event | None:
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
        message = _str(attrs, k.ERROR_MESSAGE)
        text = canonical_json({"error_type": error_type, "message": message})
        return ErrorEvent(
            id=f"{call_id}.error",
            status="skipped" if status == k.STATUS_SKIPPED else "error",
            error_type=error_type,
            message=message,
            output=text,
            output_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
            output_size=len(text.encode("utf-8")),
            **_strip(common),
        )
    out = _extract(span, is_input=False)
    payload: dict[str, Any] = dict(
        output=out.text, output_sha256=out.sha256, output_size=out.size, output_missing=out.missing
    )
    if span.stepfork_kind == k.KIND_TOOL:
        return ToolResult(id=f"{call_id}.result", name=base["_name"], **payload, **_strip(common))
    return LlmResponse(
        id=f"{call_id}.result",
        provider=_str(attrs, k.GEN_AI_PROVIDER_NAME),
        model=_str(attrs, k.GEN_AI_RESPONSE_MODEL) or _str(attrs, k.GEN_AI_REQUEST_MODEL),
        usage=_usage(attrs),
        **payload,
        **_strip(common),
    )


def _strip(values: dict[str, Any]) -> dict[str, Any]:
    return {key: v for key, v in values.items() if not key.startswith("_")}


def _call_event(
    span: SpanRecord, call_id: str, n: int, parent_id: str | None
) -> tuple[Event, dict[str, Any]]:
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
    inp = _extract(span, is_input=True)
    call_fields = dict(
        base,
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
    if span.stepfork_kind == k.KIND_TOOL:
        name = _str(attrs, k.GEN_AI_TOOL_NAME, span.name)
        event = ToolCall(name=name, **call_fields)
        base["_name"] = name
    else:
        event = LlmRequest(
            provider=_str(attrs, k.GEN_AI_PROVIDER_NAME),
            model=_str(attrs, k.GEN_AI_REQUEST_MODEL),
            operation=_str(attrs, k.GEN_AI_OPERATION_NAME, k.OP_CHAT),
            model_fingerprint=_str(attrs, k.MODEL_FINGERPRINT) or None,
            **call_fields,
        )
    return event, base


def _run_info(run: SpanRecord | None, replay_mode: str | None) -> RunInfo:
    if run is None:
        return RunInfo(replay_mode=replay_mode)
    attrs = run.attributes
    inp = _extract(run, is_input=True)
    out = _extract(run, is_input=False)
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
        error_message=_str(attrs, k.ERROR_MESSAGE) if k.ERROR_MESSAGE in attrs else None,
        start_time_unix_nano=run.start_time_unix_nano,
        end_time_unix_nano=run.end_time_unix_nano or 0,
        replay_mode=_str(attrs, k.REPLAY_MODE) or replay_mode,
    )


def spans_to_trace(
    spans: Iterable[SpanRecord],
    *,
    complete: bool = True,
    incomplete_reason: str | None = None,
    dropped_spans: int = 0,
) -> Trace:
    """Build the trace of one run from its spans (any order; all of one trace id)."""
    by_id = {s.span_id: s for s in spans}
    if not by_id:
        raise ValueError("no spans")
    trace_ids = {s.trace_id for s in by_id.values()}
    if len(trace_ids) != 1:
        raise ValueError(f"spans of {len(trace_ids)} traces given; convert one trace at a time")
    runs = sorted((s for s in by_id.values() if s.stepfork_kind == k.KIND_RUN), key=_call_order)
    run = runs[0] if runs else None
    boundaries = sorted(
        (s for s in by_id.values() if s.stepfork_kind in _BOUNDARY_KINDS), key=_call_order
    )
    call_ids = {s.span_id: f"call-{n}" for n, s in enumerate(boundaries, start=1)}

    def enclosing_call(span: SpanRecord) -> str | None:
        seen = 0
        parent = span.parent_span_id
        while parent is not None and seen < len(by_id):
            if parent in call_ids:
                return call_ids[parent]
            parent_span = by_id.get(parent)
            parent = parent_span.parent_span_id if parent_span else None
            seen += 1
        return None

    timeline: list[tuple[tuple[int, int, int, int], Event]] = []
    replay_mode: str | None = None
    for n, span in enumerate(boundaries, start=1):
        call_id = call_ids[span.span_id]
        call, base = _call_event(span, call_id, n, enclosing_call(span))
        timeline.append(((span.start_time_unix_nano, 1, n, 0), call))
        outcome = _outcome(span, call_id, n, base)
        if outcome is not None:
            # at equal times, outcomes come before new calls, and inner calls end before outer ones
            timeline.append(((outcome.time_unix_nano, 0, -n, 1), outcome))
        replay_mode = replay_mode or (_str(span.attributes, k.REPLAY_MODE) or None)
    timeline.sort(key=lambda item: item[0])
    context = [
        ContextSpan(
            span_id=s.span_id,
            parent_span_id=s.parent_span_id,
            name=s.name,
            kind=s.kind,
            start_time_unix_nano=s.start_time_unix_nano,
            end_time_unix_nano=s.end_time_unix_nano or 0,
            status=s.status if s.status in ("unset", "ok", "error") else "unset",  # type: ignore[arg-type]
        )
        for s in sorted(by_id.values(), key=_call_order)
        if not is_stepfork_span(s)
    ]
    if run is not None and run.end_time_unix_nano is None and complete:
        complete, incomplete_reason = False, "the run span never ended"
    return Trace(
        trace_id=trace_ids.pop(),
        complete=complete,
        incomplete_reason=incomplete_reason,
        created_by=_str(run.attributes, k.SDK_VERSION) or None if run is not None else None,
        run=_run_info(run, replay_mode),
        events=[event for _, event in timeline],
        context=context,
        dropped_spans=dropped_spans,
    )
