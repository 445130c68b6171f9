"""The substituted outcome of a recorded call: what the agent gets instead of running the body.

:func:`substitute` reads the recorded outcome and gives back what the boundary needs -- the
recorded output as a payload, and either the value rebuilt from it or the recorded failure to
raise (:class:`RecordedDependencyError`). It changes nothing: the session marks the recorded call
consumed only once this returned, so a recorded call that cannot be substituted (missing,
skipped, cut off a span, not JSON, unserialisable when recorded) raises a
:class:`ReplayMismatchError` and stays pending, like any refusal.

Why a missing outcome raises instead of returning ``None``: an invented answer would let the run
go on down a path the recording never took; "missing result" names the reason instead (an
incomplete bundle, a span cut by a payload cap) so the user knows what to record again.

What is substituted is the recorded text as the call returned it (its key order kept, already
redacted); a recorded failure's message is redacted once more, in case the bundle was hand-built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepfork_otel.config import CONFIG
from stepfork_otel.recording.contract import BoundaryCall
from stepfork_otel.replay.errors import RecordedDependencyError, ReplayMismatchError
from stepfork_otel.replay.matching import describe_call
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.replay.values import rebuild
from stepfork_otel.trace.canonical import UNSERIALISABLE_MARKER, sha256_hex
from stepfork_otel.trace.models import ErrorEvent, OutcomeEvent, Trace, payload_value
from stepfork_otel.trace.payload import Payload

__all__ = ["Substitution", "substitute"]


@dataclass(frozen=True, slots=True)
class Substitution:
    """The recorded outcome of a call, ready to hand to the boundary."""

    output: Payload
    """The recorded output, as recorded (its fingerprint is what the agent got)."""
    value: Any = None
    """The value to return (rebuilt into the call's ``output_type`` when that round-trips)."""
    error: RecordedDependencyError | None = None
    """The recorded failure to raise instead of returning."""
    note: str | None = None
    """Why the value is returned as JSON rather than as ``output_type`` (reported, not raised)."""


def _missing(
    call: BoundaryCall, position: int, expected: RecordedCall, reason: str
) -> ReplayMismatchError:
    return ReplayMismatchError(
        f"missing result: {reason}",
        position=position,
        expected=expected.describe(),
        actual=describe_call(call),
    )


def _unusable(outcome: OutcomeEvent | None, trace: Trace, recorded: str) -> str | None:
    """Why the recorded outcome cannot be substituted at all (None: it has one to give)."""
    if outcome is None:
        cut = (
            f" (the bundle is incomplete: {trace.incomplete_reason or 'the run did not finish'})"
            if not trace.complete
            else " (the run was cut short or the span was lost)"
        )
        return (
            f"the recorded call {recorded} has no recorded result{cut}, so it cannot be substituted"
        )
    if isinstance(outcome, ErrorEvent) and outcome.status == "skipped":
        return (
            f"the recorded call {recorded} was rejected before its body ran in the recorded "
            f"run (itself a replay: {outcome.error_type}), so it has no result to substitute"
        )
    if outcome.output is None and not isinstance(outcome, ErrorEvent):
        return (
            f"the recorded result of {recorded} is missing "
            f"({outcome.output_missing or 'not recorded'}): it was left off the span, so it "
            "cannot be substituted; replay the local bundle, or raise the span payload cap"
        )
    return None


def _recorded_value(text: str | None, recorded: str) -> tuple[Any, str | None]:
    """The recorded output as a JSON value, or why it cannot be one."""
    try:
        value = payload_value(text)
    except ValueError:  # orjson.JSONDecodeError; a hand-built or damaged bundle
        return (
            None,
            f"the recorded result of {recorded} is not valid JSON, so replay cannot substitute it",
        )
    if isinstance(value, dict) and UNSERIALISABLE_MARKER in value and len(value) == 1:
        return None, (
            f"the recorded result of {recorded} could not be serialised when it was "
            f"recorded ({value[UNSERIALISABLE_MARKER]}), so replay cannot substitute it"
        )
    return value, None


def substitute(
    call: BoundaryCall,
    expected: RecordedCall,
    position: int,
    trace: Trace,
    output_sha256: str | None,
) -> Substitution:
    """The recorded outcome of ``expected`` for ``call`` (the ``position``-th call of the run);
    ``output_sha256`` is the recorded output's fingerprint (computed once by the session).
    Raises :class:`ReplayMismatchError` ("missing result: ...") when there is none to give."""
    outcome, recorded = expected.outcome, expected.event.id
    why = _unusable(outcome, trace, recorded)
    if why is not None:
        raise _missing(call, position, expected, why)
    assert outcome is not None  # _unusable said why otherwise
    value: Any = None
    if not isinstance(outcome, ErrorEvent):
        value, why = _recorded_value(outcome.output, recorded)
        if why is not None:
            raise _missing(call, position, expected, why)
    text = outcome.output or ""
    output = Payload(
        text,
        output_sha256 or sha256_hex(text),
        outcome.output_size or len(text.encode("utf-8")),
    )
    if isinstance(outcome, ErrorEvent):
        message = CONFIG.settings.redactor.redact_message(outcome.message)
        error = RecordedDependencyError(
            outcome.error_type, message, position=position, expected=expected.describe()
        )
        return Substitution(output, error=error)
    rebuilt, note = rebuild(value, text, call.output_type)
    return Substitution(output, value=rebuilt, note=note)
