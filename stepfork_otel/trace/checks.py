"""Checks of a loaded bundle: structure (:func:`validate_structure`), payloads replay needs
(:func:`missing_payloads`), calls recorded as unserialisable (:func:`unreplayable_calls`) and
integrity (:func:`verify_integrity`: every stored fingerprint, and the lines fingerprint of the
bundle's header and event lines; :func:`unverified_fields` says what an older bundle leaves
unchecked).

Loading runs the structure check (a bundle that loads is consistent); integrity is checked
separately, because replay and ``stepfork validate --verify-integrity`` want it and ``show`` does
not. The structure check first tries :func:`_plainly_consistent`, which proves the common case in
one pass; ``tests/test_shortcuts.py`` proves it never calls a bundle consistent that the full
check would not.
"""

from __future__ import annotations

import hashlib
import os
import weakref
from typing import NamedTuple

import orjson

from stepfork_otel import constants as k
from stepfork_otel.trace.canonical import (
    UNSERIALISABLE_MARKER,
    loads,
    model_fingerprint,
    sha256_hex,
    short_fingerprint,
)
from stepfork_otel.trace.captured import captured_problems
from stepfork_otel.trace.errors import BundleError, Problem, quote
from stepfork_otel.trace.models import (
    ErrorEvent,
    Event,
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
    call_label,
    error_output,
    pair_outcomes,
)

_CALL_CLASSES = frozenset((ToolCall, LlmRequest))
# What verify_integrity does with an event, by its class (a subclass is looked up once).
_TOOL_CALL, _LLM_CALL, _RESULT, _ERROR = 1, 2, 3, 4
_ROLES: dict[type, int] = {
    ToolCall: _TOOL_CALL,
    LlmRequest: _LLM_CALL,
    ToolResult: _RESULT,
    LlmResponse: _RESULT,
    ErrorEvent: _ERROR,
}
_BASE_ROLES = tuple(_ROLES.items())


def _role(event: Event) -> int:
    for cls, role in _BASE_ROLES:
        if isinstance(event, cls):
            _ROLES[type(event)] = role
            return role
    raise TypeError(f"not an event: {type(event).__name__}")


def raise_if_inconsistent(trace: Trace, path: str | os.PathLike[str] | None) -> None:
    """A :class:`BundleError` naming the first problem :func:`validate_structure` finds."""
    problems = validate_structure(trace)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BundleError(path, f"inconsistent bundle: {problems[0]}{more}")


def validate_structure(trace: Trace) -> list[Problem]:
    """Structural problems: duplicate ids, calls out of order, parents that are not earlier calls,
    outcomes without a call (or a second outcome for one), outcomes of the wrong kind.

    Outcomes without ``parent_id`` (legacy bundles) are paired as :func:`pair_outcomes` says.
    The captured reads are checked too (:func:`~stepfork_otel.trace.captured.captured_problems`),
    and so is a fork's prefix (:func:`fork_problems`)."""
    problems: list[Problem] = captured_problems(trace) if trace.captured else []
    if trace.forked_from is not None:
        problems += fork_problems(trace)
    problems += _form_problems(trace.events)
    if _plainly_consistent(trace.events):
        return problems
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


def fork_problems(trace: Trace) -> list[Problem]:
    """A fork's calls agree with its header: the calls before the fork point are the original
    run's (its trace id), numbered 1 to N-1 with none missing, and the calls from the fork point
    on are the fork's own (the bundle's trace id)."""
    origin = trace.forked_from
    if origin is None:
        return []
    at = origin.at_call
    if at < 1:
        return [Problem(None, f"forked_from.at_call is {at}: a fork point is a call, from 1")]
    problems: list[Problem] = []
    before = 0
    for call in trace.calls:
        if call.seq < at:
            before += 1
            if call.trace_id != origin.trace_id:
                problems.append(
                    Problem(
                        call.id,
                        f"before the fork point (call {at}) but not of the original run "
                        f"(trace {quote(call.trace_id)}, forked from {quote(origin.trace_id)})",
                    )
                )
        elif call.trace_id != trace.trace_id:
            problems.append(
                Problem(
                    call.id,
                    f"from the fork point (call {at}) on, calls are the fork's own (trace "
                    f"{quote(trace.trace_id)}), not {quote(call.trace_id)}",
                )
            )
    if before != at - 1:
        problems.append(
            Problem(
                None,
                f"forked at call {at}, so the {at - 1} calls before it are the original's; "
                f"the bundle holds {before}",
            )
        )
    return problems


def _form_problems(events: list[Event]) -> list[Problem]:
    """A call imported at ``messages-only``/``truncated`` fidelity holds JSON that replay parses
    (its input is compared in its terms, not by fingerprint), and an LLM call's is a request form
    (``{"url", "model", "messages", ...}``): replay projects the live request onto it."""
    problems: list[Problem] = []
    imported: list[LlmRequest | ToolCall] = [
        e for e in events if isinstance(e, (LlmRequest, ToolCall)) and e.fidelity is not None
    ]  # (none in a bundle stepfork recorded)
    for event in imported:
        if event.fidelity not in k.SEMANTIC_FIDELITIES or event.input is None:
            continue
        try:
            form = loads(event.input)
        except (ValueError, TypeError, RecursionError) as exc:
            why = str(exc).split(": line 1 column", 1)[0]
            problems.append(
                Problem(
                    event.id,
                    f"fidelity {event.fidelity} but the input is not valid JSON ({quote(why)}), "
                    "so replay cannot compare a call with it",
                )
            )
            continue
        if isinstance(event, ToolCall):
            continue
        if not (
            isinstance(form, dict)
            and isinstance(form.get("messages"), list)
            and isinstance(form.get("url"), str)
            and isinstance(form.get("model"), str)
        ):
            problems.append(
                Problem(event.id, f"fidelity {event.fidelity} but the input is not a request form")
            )
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


def plainly_consistent(events: list[Event]) -> bool:
    """:func:`_plainly_consistent`, for the reader (events in the order the conversion gives them
    need no reordering)."""
    return _plainly_consistent(events)


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
    return None if actual == expected else _mismatch(what, event_id, expected, actual)


class LinesFingerprint(NamedTuple):
    """The lines fingerprint of a bundle as it was read: ``stored`` is the end line's
    ``lines_sha256`` (None: the bundle was written without one), ``actual`` what its header line,
    event lines and payload map hash to (see ``docs/bundle-format.md``)."""

    stored: str | None
    actual: str


# One entry per Trace read from a bundle (the reader notes it, :func:`verify_integrity` checks it).
# Keyed by id() with a weak reference, as the models' outcome index is: the models are frozen and
# have no field for it, and hashing a Trace would hash all of its events.
_lines_fingerprints: dict[int, tuple[weakref.ref[Trace], LinesFingerprint]] = {}


def note_lines_fingerprint(trace: Trace, stored: str | None, actual: str) -> None:
    """Remember the lines fingerprint of a trace just read from a bundle (the reader calls it)."""
    key = id(trace)

    def forget(_: weakref.ref[Trace]) -> None:
        _lines_fingerprints.pop(key, None)

    _lines_fingerprints[key] = (weakref.ref(trace, forget), LinesFingerprint(stored, actual))


def lines_fingerprint(trace: Trace) -> LinesFingerprint | None:
    """The lines fingerprint of a trace read from a bundle; None for one built in memory (or a
    copy of a loaded one: nothing was read, so there is no file to verify)."""
    entry = _lines_fingerprints.get(id(trace))
    return entry[1] if entry is not None and entry[0]() is trace else None


def verify_integrity(trace: Trace) -> list[Problem]:
    """Every stored fingerprint checked against what it fingerprints: payloads (one SHA-256
    each), error fields against their fingerprinted output, model fingerprints against the
    call's provider, model and operation, and -- for a trace read from a bundle that has one --
    the lines fingerprint, which covers every field of the header and of every event line (the
    run's status and error, each call's replay policy, each outcome's status, ...) and which
    payload lines there are. A run whose status is not ``error`` while it records an error is
    refused as contradictory (the recorder never writes one; an older bundle without a lines
    fingerprint would otherwise hide the edit). :func:`unverified_fields` says what a bundle
    without a lines fingerprint leaves unchecked."""
    run = trace.run
    checks: list[Problem | None] = [
        _lines_match(trace),
        _run_status_agrees(run.status, run.error_type, run.error_message),
        _check(run.input, run.input_sha256, "run input", None),
        _check(run.output, run.output_sha256, "run output", None),
    ]
    # One pass in event order, the hashing inline: the payloads lie in memory in that order, and
    # over the benchmark bundle this loop is faster than any split into passes per kind. The
    # event's role is looked up by its class (pydantic's isinstance is a Python-level hook:
    # 35 ms more over 200,000 events).
    sha256, add, roles = hashlib.sha256, checks.append, _ROLES
    models: dict[tuple[str, str, str], str] = {}  # a run uses few models
    for event in trace.events:
        role = roles.get(type(event)) or _role(event)
        if role <= _LLM_CALL:
            text, stored = event.input, event.input_sha256  # type: ignore[union-attr]
            if text is not None and stored is not None:
                actual = sha256(text.encode()).hexdigest()
                if actual != stored:
                    add(_mismatch("input", event.id, stored, actual))
            if role == _LLM_CALL and event.model_fingerprint is not None:  # type: ignore[union-attr]
                add(_model_fingerprint_matches(event, models))  # type: ignore[arg-type]
        else:
            text, stored = event.output, event.output_sha256  # type: ignore[union-attr]
            if text is not None and stored is not None:
                actual = sha256(text.encode()).hexdigest()
                if actual != stored:
                    add(_mismatch("output", event.id, stored, actual))
            if role == _ERROR and text is not None:
                add(_error_fields_match(event))  # type: ignore[arg-type]
    return [p for p in checks if p is not None]


def _mismatch(what: str, event_id: str | None, expected: str, actual: str) -> Problem:
    return Problem(
        event_id,
        f"{what} fingerprint mismatch: stored {short_fingerprint(expected)}, payload hashes "
        f"to {short_fingerprint(actual)}",
    )


def _lines_match(trace: Trace) -> Problem | None:
    seal = lines_fingerprint(trace)
    if seal is None or seal.stored is None or seal.stored == seal.actual:
        return None
    return Problem(
        None,
        f"lines fingerprint mismatch: stored {short_fingerprint(seal.stored)}, the header and "
        f"event lines hash to {short_fingerprint(seal.actual)} (a field outside the payloads "
        "was changed: a status, a replay policy, an error, a name, an id, ...; or a payload "
        "line was added or removed)",
    )


def _run_status_agrees(
    status: str, error_type: str | None, error_message: str | None
) -> Problem | None:
    if status == "error" or (error_type is None and error_message is None):
        return None
    what = f" ({quote(error_type)})" if error_type is not None else ""
    return Problem(
        None,
        f"run status is '{status}' but the run records an error{what}: contradictory "
        "(a recorded failure always has the status 'error')",
    )


def unverified_fields(trace: Trace) -> list[Problem]:
    """What :func:`verify_integrity` could not check in this trace, for ``stepfork validate`` to
    say (warnings, not problems: such a bundle stays loadable and replayable). A bundle written
    without a lines fingerprint (by an older stepfork_otel, or by hand, or cut short before its
    end line) leaves every field outside the payloads unverified; a payload without a
    fingerprint leaves its text unverified."""
    notes: list[Problem] = []
    seal = lines_fingerprint(trace)
    if seal is not None and seal.stored is None:
        why = (  # a bundle cut short has no end line, where the fingerprint is written
            "the bundle was cut short before it"
            if not trace.complete
            else "the bundle was written by an older stepfork_otel or by hand"
        )
        notes.append(
            Problem(
                None,
                f"no lines fingerprint (lines_sha256 in the end line: {why}): not verified: the "
                "run's status, error type and message; every event's replay_policy, status, "
                "name, provider, model, id, parent and seq; which payload lines there are "
                "(payload texts, error outcomes and model fingerprints were verified)",
            )
        )
    bare: list[str] = []
    run = trace.run
    for text, sha, name in (
        (run.input, run.input_sha256, "run input"),
        (run.output, run.output_sha256, "run output"),
    ):
        if text is not None and sha is None:
            bare.append(name)
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            if event.input is not None and event.input_sha256 is None:
                bare.append(event.id)
        elif event.output is not None and event.output_sha256 is None:
            bare.append(event.id)
    if bare:
        shown = ", ".join(quote(b) for b in bare[:3])
        more = f" and {len(bare) - 3} more" if len(bare) > 3 else ""
        notes.append(
            Problem(
                None,
                f"{len(bare)} payload{'s' if len(bare) != 1 else ''} without a fingerprint "
                f"({shown}{more}): their text is not verified",
            )
        )
    return notes


def _unserialisable(text: str | None) -> str | None:
    """Why a payload was recorded as the unserialisable marker (None: it is a value)."""
    if text is None or UNSERIALISABLE_MARKER not in text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, dict) and len(value) == 1:
        reason = value.get(UNSERIALISABLE_MARKER)
        if isinstance(reason, str):
            return reason
    return None


def unreplayable_calls(trace: Trace) -> list[Problem]:
    """Each call replay cannot serve because a payload was recorded as the unserialisable
    marker (``{"$unserialisable": "<type>: <reason>"}``): an output replay cannot substitute, an
    input it cannot check a call against; and a run input (replay cannot pass it to the
    entrypoint) or run output (replay cannot compare the return value) recorded that way."""
    problems: list[Problem] = []
    run = trace.run
    for text, what, why in (
        (run.input, "run input", "replay cannot pass it to the entrypoint"),
        (run.output, "run output", "replay cannot compare the run's return value with it"),
    ):
        reason = _unserialisable(text)
        if reason is not None:
            problems.append(
                Problem(
                    None, f"{what} could not be serialised when recorded ({quote(reason)}): {why}"
                )
            )
    calls = {outcome.id: call for outcome, call in pair_outcomes(trace.events)}
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            reason = _unserialisable(event.input)
            if reason is not None:
                problems.append(
                    Problem(
                        event.id,
                        f"{call_label(event)}: its input could not be serialised when recorded "
                        f"({quote(reason)}), so replay cannot check a call against it",
                    )
                )
            continue
        reason = None if isinstance(event, ErrorEvent) else _unserialisable(event.output)
        if reason is None:
            continue
        call = calls.get(event.id)
        problems.append(
            Problem(
                event.id if call is None else call.id,
                f"{'its' if call is None else call_label(call) + ': its'} output could not be "
                f"serialised when recorded ({quote(reason)}), so replay cannot substitute it",
            )
        )
    return problems


def unreadable_payloads(trace: Trace) -> list[Problem]:
    """Each payload replay reads as a value -- a call's recorded result (substituted), the run's
    input (passed to the entrypoint) -- that is not JSON it can read: ``NaN``, a number beyond
    a double (``1e400``), an integer of more than 4,300 digits, malformed text. Its fingerprint
    may match (a bundle built or edited by hand): the fingerprint says the text is what was
    recorded, not that it is JSON. Parsed as replay parses them (:func:`~stepfork_otel.trace.
    canonical.loads`); a call's input is compared by its fingerprint, never parsed, so it is not
    looked at here (an imported call compared in the terms of its input: the structure checks)."""
    problems: list[Problem] = []
    texts: list[tuple[str | None, str, str]] = []
    if trace.run.input is not None:
        texts.append((None, "run input", trace.run.input))
    for event in trace.events:
        if type(event) in (ToolResult, LlmResponse) and event.output is not None:  # type: ignore[union-attr]
            texts.append((event.id, "output", event.output))  # type: ignore[union-attr]
    for event_id, what, text in texts:
        try:
            loads(text)
        except (ValueError, RecursionError) as exc:
            why = str(exc).split(": line 1 column", 1)[0]
            problems.append(
                Problem(
                    event_id,
                    f"{what} is not valid JSON ({quote(why)}), so replay cannot "
                    + ("substitute it" if event_id is not None else "pass it to the entrypoint"),
                )
            )
    return problems


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
        f"{quote(f'{event.provider}/{event.model}')} ({quote(event.operation)}) hashes to "
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
