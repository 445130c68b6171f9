"""Checks of a loaded bundle: structure (:func:`validate_structure`), payloads replay needs
(:func:`missing_payloads`) and integrity (:func:`verify_integrity`: every stored fingerprint).

Loading runs the structure check (a bundle that loads is consistent); integrity is checked
separately, because replay and ``stepfork validate --verify-integrity`` want it and ``show`` does
not. The structure check first tries :func:`_plainly_consistent`, which proves the common case in
one pass; ``tests/test_shortcuts.py`` proves it never calls a bundle consistent that the full
check would not.
"""

from __future__ import annotations

import os

from stepfork_otel.trace.canonical import model_fingerprint, sha256_hex, short_fingerprint
from stepfork_otel.trace.errors import BundleError, Problem, quote
from stepfork_otel.trace.models import (
    ErrorEvent,
    Event,
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
    error_output,
    pair_outcomes,
)

_CALL_CLASSES = frozenset((ToolCall, LlmRequest))


def raise_if_inconsistent(trace: Trace, path: str | os.PathLike[str] | None) -> None:
    """A :class:`BundleError` naming the first problem :func:`validate_structure` finds."""
    problems = validate_structure(trace)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BundleError(path, f"inconsistent bundle: {problems[0]}{more}")


def validate_structure(trace: Trace) -> list[Problem]:
    """Structural problems: duplicate ids, calls out of order, parents that are not earlier calls,
    outcomes without a call (or a second outcome for one), outcomes of the wrong kind.

    Outcomes without ``parent_id`` (legacy bundles) are paired as :func:`pair_outcomes` says."""
    if _plainly_consistent(trace.events):
        return []
    problems: list[Problem] = []
    ids: set[str] = set()
    calls: set[str] = set()
    last_seq = 0
    for event in trace.events:
        if event.id in ids:
            problems.append(Problem(event.id, "duplicate event id"))
        ids.add(event.id)
        if isinstance(event, (ToolCall, LlmRequest)):
            if event.seq <= last_seq:
                problems.append(Problem(event.id, f"call number {event.seq} out of order"))
            last_seq = event.seq
            if event.parent_id is not None and event.parent_id not in calls:
                problems.append(
                    Problem(event.id, f"parent '{quote(event.parent_id)}' is not an earlier call")
                )
            calls.add(event.id)
    with_outcome: set[str] = set()
    for outcome, call in pair_outcomes(trace.events):
        if call is None:
            if outcome.parent_id is None:
                what = "tool" if isinstance(outcome, ToolResult) else "call"
                problems.append(
                    Problem(outcome.id, f"outcome without parent_id matches no earlier {what}")
                )
            else:
                problems.append(
                    Problem(outcome.id, f"outcome of unknown call '{quote(outcome.parent_id)}'")
                )
            continue
        if call.id in with_outcome:
            problems.append(Problem(outcome.id, f"second outcome for {quote(call.id)}"))
        with_outcome.add(call.id)
        if isinstance(outcome, ToolResult) and not isinstance(call, ToolCall):
            problems.append(Problem(outcome.id, "tool_result paired with a non-tool call"))
        if isinstance(outcome, LlmResponse) and not isinstance(call, LlmRequest):
            problems.append(Problem(outcome.id, "llm_response paired with a non-LLM call"))
    return problems


_PAIRS: dict[type, tuple[type, ...]] = {
    ToolResult: (ToolCall,),
    LlmResponse: (LlmRequest,),
    ErrorEvent: (ToolCall, LlmRequest),
}


def _plainly_consistent(events: list[Event]) -> bool:
    """The common case proved quickly: unique ids, calls in order with earlier parents, every
    outcome naming its own earlier call of the right kind, once. False means "look closer"
    (legacy pairing or a problem), not "inconsistent"."""
    ids: set[str] = set()
    calls: dict[str, type] = {}
    answered: set[str] = set()
    last = 0
    pairs = _PAIRS
    for event in events:
        kind = type(event)
        event_id = event.id
        if event_id in ids:
            return False
        ids.add(event_id)
        parent = event.parent_id
        if kind in _CALL_CLASSES:
            if event.seq <= last or (parent is not None and parent not in calls):
                return False
            last = event.seq
            calls[event_id] = kind
        else:
            call = calls.get(parent) if parent is not None else None
            if call is None or parent in answered or call not in pairs[kind]:
                return False
            answered.add(parent)  # type: ignore[arg-type]
    return True


def missing_payloads(trace: Trace) -> list[Problem]:
    """Calls that replay cannot serve: no outcome recorded, or a payload left off the span."""
    problems: list[Problem] = []
    paired = {call.id for _, call in pair_outcomes(trace.events) if call is not None}
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            if event.input is None:
                problems.append(
                    Problem(event.id, f"input missing ({event.input_missing or 'not_recorded'})")
                )
            if event.id not in paired and trace.complete:
                problems.append(Problem(event.id, "no recorded result"))
        elif isinstance(event, (ToolResult, LlmResponse)) and event.output is None:
            problems.append(
                Problem(event.id, f"output missing ({event.output_missing or 'not_recorded'})")
            )
    return problems


def _check(
    text: str | None, expected: str | None, what: str, event_id: str | None
) -> Problem | None:
    if text is None or expected is None:
        return None
    actual = sha256_hex(text)
    if actual != expected:
        return Problem(
            event_id,
            f"{what} fingerprint mismatch: stored {short_fingerprint(expected)}, payload hashes "
            f"to {short_fingerprint(actual)}",
        )
    return None


def verify_integrity(trace: Trace) -> list[Problem]:
    """Every stored fingerprint checked against what it fingerprints: payloads (one SHA-256
    each), error fields against their fingerprinted output, model fingerprints against the
    call's provider, model and operation."""
    checks: list[Problem | None] = [
        _check(trace.run.input, trace.run.input_sha256, "run input", None),
        _check(trace.run.output, trace.run.output_sha256, "run output", None),
    ]
    models: dict[tuple[str, str, str], str] = {}  # a run uses few models
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            checks.append(_check(event.input, event.input_sha256, "input", event.id))
            if isinstance(event, LlmRequest) and event.model_fingerprint is not None:
                checks.append(_model_fingerprint_matches(event, models))
        else:
            checks.append(_check(event.output, event.output_sha256, "output", event.id))
            if isinstance(event, ErrorEvent) and event.output is not None:
                checks.append(_error_fields_match(event))
    return [p for p in checks if p is not None]


def _model_fingerprint_matches(
    event: LlmRequest, models: dict[tuple[str, str, str], str]
) -> Problem | None:
    key = (event.provider, event.model, event.operation)
    computed = models.get(key)
    if computed is None:
        computed = models[key] = model_fingerprint(*key)
    if computed == event.model_fingerprint:
        return None
    return Problem(
        event.id,
        f"model fingerprint mismatch: stored {short_fingerprint(event.model_fingerprint)}, "
        f"{event.provider}/{event.model} ({event.operation}) hashes to "
        f"{short_fingerprint(computed)}",
    )


def _error_fields_match(event: ErrorEvent) -> Problem | None:
    """Replay and the CLI read ``error_type``/``message``; the fingerprint covers ``output``. The
    two must say the same, or an edit to the readable fields would pass verification."""
    expected = error_output(event.error_type, event.message)
    if event.output != expected:
        return Problem(
            event.id, "error_type/message differ from the fingerprinted output of this error"
        )
    return None
