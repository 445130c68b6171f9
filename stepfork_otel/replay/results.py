"""What a replay did: one :class:`ReplayedCall` per boundary call reached, and the frozen
:class:`ReplayResult` that the session hands out as its summary.

Why a frozen result object next to the raised errors: an error says where the run left the
recording, but a test (or the CLI report) also wants what happened around it -- which calls were
substituted or executed, which recorded calls were never reached, which errors the agent caught
and carried on past. The session keeps live, mutable :class:`ReplayedCall` records while the run
goes on; :func:`summarise` copies them into a :class:`ReplayResult` that later calls cannot change.

The notes and descriptions written on a call while it is replayed live here too, so the wording
of a report has one home: the session decides *when* a note is due, this module says it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stepfork_otel.config import CONFIG
from stepfork_otel.constants import (
    ACTION_EXECUTED,
    ACTION_REJECTED,
    ACTION_SUBSTITUTED,
    FIDELITY_EXACT,
    REPLAY_ACTIONS,
    ReplayAction,
)
from stepfork_otel.recording.contract import BoundaryCall
from stepfork_otel.replay.errors import (
    CallDescription,
    ReplayError,
    ReplayMismatchError,
    ReplaySessionError,
)
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.replay.reads import NO_READS, ReadsSummary
from stepfork_otel.trace.canonical import short_fingerprint
from stepfork_otel.trace.models import CallEvent, call_label, label, payload_value
from stepfork_otel.trace.payload import exception_message
from stepfork_otel.trace.policy import ReplayMode

__all__ = [
    "Action",
    "LiveLlm",
    "ReplayResult",
    "ReplayedCall",
    "abandoned_error",
    "after_live",
    "described_error",
    "fidelity_note",
    "incomplete_error",
    "input_drift_note",
    "live_output_note",
    "pending_calls",
    "replayed_call",
    "summarise",
]

Action = ReplayAction
"""What replay did with a call: ``substituted``, ``executed`` or ``rejected`` -- the
``stepfork.replay.action`` of its span. The one spelling is the trace format's (``trace.models``),
so the values written on spans and the values reported here cannot drift apart."""


@dataclass(slots=True)
class ReplayedCall:
    """A call the agent actually made during replay (what the assertions look at)."""

    position: int
    """1-based number of the call in this run."""
    kind: str
    """``tool`` or ``llm``."""
    name: str
    """Tool name, or the model of an LLM call."""
    input: str
    """Redacted canonical JSON of the call's input (a tool's normalised arguments)."""
    input_sha256: str
    action: Action
    """``substituted`` (recorded outcome returned), ``executed`` (body ran) or ``rejected``."""
    recorded_id: str | None
    """Id of the recorded call it matched (None: it matched none)."""
    provider: str | None = None
    model: str | None = None
    status: Literal["ok", "error", "pending"] = "pending"
    """``ok``; ``error`` (raised: a recorded failure, a live failure, or a replay error);
    ``pending`` while an executed body runs."""
    error: str | None = None
    """``Type: message`` of what the call raised."""
    recorded_input_sha256: str | None = None
    recorded_output_sha256: str | None = None
    output_sha256: str | None = None
    """Fingerprint of what the agent got (substituted: the recorded output; executed: the live one)."""
    notes: list[str] = field(default_factory=list)
    """Reported, not raised: hybrid input drift, live output drift, a value returned as JSON."""
    fidelity: str | None = None
    """The recorded call's fidelity, for a call imported from another instrumentation's spans
    (``exact``, ``messages-only``, ``truncated``); None: recorded by stepfork."""

    @property
    def arguments(self) -> Any:
        """The input as a JSON value (a tool's normalised, redacted arguments)."""
        return payload_value(self.input)

    @property
    def label(self) -> str:
        return label(self.kind, self.name, self.provider, self.model)


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did, frozen: the calls reached, the recorded calls left over, the errors."""

    mode: ReplayMode
    calls: tuple[ReplayedCall, ...]
    """Every boundary call reached, in order (copies: later calls do not change them)."""
    pending_calls: tuple[RecordedCall, ...]
    """Recorded calls never matched (``verify_complete()`` fails on these)."""
    skipped: tuple[RecordedCall, ...]
    """Recorded calls inside substituted calls: not made, because those bodies did not run."""
    errors: tuple[ReplayError, ...]
    """Every replay error raised, including those the agent caught."""
    reads: ReadsSummary = NO_READS
    """The captured clock/random/uuid reads: served, left over, and notes (environment)."""
    fork_at: int | None = None
    """A fork's fork point (``fork_at``): the recorded calls before it were replayed frozen."""
    forked_after: int | None = None
    """How many calls this run made before it reached the fork point (the calls after them ran
    live); None: not a fork, or the fork point was not reached."""
    after_fork: tuple[RecordedCall, ...] = ()
    """The recorded calls from the fork point on: not replayed, the fork ran live from there."""

    @property
    def pending(self) -> int:
        """How many recorded calls were never matched (:attr:`pending_calls`)."""
        return len(self.pending_calls)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.pending_calls and not self.reads.left_over

    @property
    def first_divergence(self) -> ReplayError | None:
        return self.errors[0] if self.errors else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(REPLAY_ACTIONS, 0)
        for call in self.calls:
            out[call.action] += 1
        return out

    def __str__(self) -> str:
        c = self.counts()
        mode = self.mode.value if self.fork_at is None else f"forked at call {self.fork_at}"
        lines = [
            f"replay ({mode}): {len(self.calls)} call(s) reached - "
            f"{c[ACTION_SUBSTITUTED]} substituted, {c[ACTION_EXECUTED]} executed, "
            f"{c[ACTION_REJECTED]} rejected; {self.pending} recorded call(s) not reached, "
            f"{len(self.skipped)} skipped inside substituted calls"
            + ("" if self.fork_at is None else f", {len(self.after_fork)} after the fork point")
        ]
        for call in self.calls:
            rec = f" <- {call.recorded_id}" if call.recorded_id else ""
            err = f" [raised {call.error.split(':', 1)[0]}]" if call.error else ""
            lines.append(f"  {call.position:>3}. {call.action:<11} {call.label}{rec}{err}")
            lines.extend(f"       note: {n}" for n in call.notes)
        lines.extend(
            f"  not reached: {rc.event.id} {call_label(rc.event)}" for rc in self.pending_calls
        )
        return "\n".join(lines)


def replayed_call(call: BoundaryCall, position: int) -> ReplayedCall:
    """The record of a call just reached: ``rejected`` until the session serves it."""
    return ReplayedCall(
        position,
        call.kind,
        call.name,
        call.input.text,
        call.input.sha256,
        ACTION_REJECTED,
        None,
        provider=call.provider,
        model=call.model,
    )


def pending_calls(plan: Sequence[RecordedCall]) -> list[RecordedCall]:
    """Recorded calls not matched (neither consumed nor skipped inside a substituted call)."""
    return [rc for rc in plan if rc.state in ("pending", "not_reached")]


def summarise(
    mode: ReplayMode,
    calls: Sequence[ReplayedCall],
    plan: Sequence[RecordedCall],
    errors: Sequence[ReplayError],
    reads: ReadsSummary | None = None,
    fork: tuple[int, int | None] | None = None,
) -> ReplayResult:
    """A frozen copy of the session's bookkeeping (the notes lists are copied too). ``fork``: a
    fork's point and how many calls were made before it was reached (None: not yet)."""
    return ReplayResult(
        mode=mode,
        calls=tuple(dataclasses.replace(c, notes=list(c.notes)) for c in calls),
        pending_calls=tuple(pending_calls(plan)),
        skipped=tuple(rc for rc in plan if rc.state == "skipped"),
        errors=tuple(errors),
        reads=reads if reads is not None else NO_READS,
        fork_at=None if fork is None else fork[0],
        forked_after=None if fork is None else fork[1],
        after_fork=tuple(rc for rc in plan if rc.state == "after_fork"),
    )


def described_error(error: BaseException) -> str:
    """``Type: redacted message`` of an exception raised during replay."""
    return f"{type(error).__name__}: {exception_message(error, CONFIG.settings.redactor)}"


def fidelity_note(event: CallEvent) -> str | None:
    """The note on a call imported from spans that did not hold the whole request: what replay
    could not compare (None: a call recorded whole)."""
    if event.fidelity in (None, FIDELITY_EXACT) or not event.unchecked:
        return None
    return f"imported ({event.fidelity}): not compared, the trace did not hold it -- " + "; ".join(
        event.unchecked
    )


def input_drift_note(live_sha256: str, recorded_sha256: str | None) -> str | None:
    """The note on a hybrid call that ran live with an input the recording does not have."""
    if live_sha256 == recorded_sha256:
        return None
    return (
        f"input drift (hybrid): this run's input differs from the recording (sha256 "
        f"{short_fingerprint(live_sha256)} vs recorded {short_fingerprint(recorded_sha256)})"
    )


def live_output_note(live: str | None, recorded: str | None) -> str | None:
    """The note on an executed call whose live output is not the recorded one."""
    if recorded is None or live is None or live == recorded:
        return None
    return (
        f"live output differs from the recording (sha256 {short_fingerprint(live)} vs recorded "
        f"{short_fingerprint(recorded)})"
    )


@dataclass
class LiveLlm:
    """The last LLM call that ran live (hybrid/live), for naming it in later divergences."""

    description: CallDescription
    replayed: ReplayedCall

    @classmethod
    def of(cls, replayed: ReplayedCall, recorded: RecordedCall) -> LiveLlm:
        description = CallDescription(
            kind="llm",
            name=replayed.name,
            provider=replayed.provider,
            model=replayed.model,
            input_preview=replayed.input,
            input_sha256=replayed.input_sha256,
            event_id=recorded.event.id,
            fingerprint_source="live",
        )
        return cls(description, replayed)


def after_live(live: LiveLlm | None) -> tuple[CallDescription | None, list[str]]:
    """The live LLM call a divergence followed, and a detail line on how its answer compared
    with the recorded one (nothing when no LLM call ran live)."""
    if live is None:
        return None, []
    replayed = live.replayed
    if replayed.status == "pending":
        note = "it is still running"
    elif replayed.output_sha256 is None or replayed.recorded_output_sha256 is None:
        note = "its live answer could not be compared with the recording"
    elif replayed.output_sha256 != replayed.recorded_output_sha256:
        note = (
            f"its live answer differs from the recorded one (sha256 "
            f"{replayed.output_sha256} vs recorded {replayed.recorded_output_sha256})"
        )
    else:
        note = "its live answer was the same as the recorded one"
    return live.description, [f"  (call {replayed.position} of this run: {note})"]


def incomplete_error(
    pending: Sequence[RecordedCall], caught: Sequence[ReplayError]
) -> ReplayMismatchError | None:
    """What ``verify_complete()`` raises: recorded calls never made, or divergences the agent
    caught and carried on past (None: the replay is complete)."""
    if not pending and not caught:
        return None
    details: list[str] = []
    if pending:
        reason = (
            f"{len(pending)} recorded call(s) were never made: the agent skipped recorded steps"
        )
        details.append(
            "not reached: " + ", ".join(f"{rc.event.id} ({call_label(rc.event)})" for rc in pending)
        )
    else:
        reason = "the run diverged from the recording (the agent caught the error)"
    details.extend(
        f"raised during the run: {type(e).__name__}"
        + (f" at call {e.position}" if e.position is not None else "")
        + f": {e.reason}"
        for e in caught
    )
    return ReplayMismatchError(
        reason, expected=pending[0].describe() if pending else None, details=details
    )


def abandoned_error(
    replayed: ReplayedCall, action: Action, error: BaseException
) -> ReplaySessionError:
    """The divergence of a call the session decided but stepfork failed to carry on with."""
    lost = (
        "recorded result was not delivered" if action == ACTION_SUBSTITUTED else "body did not run"
    )
    return ReplaySessionError(
        f"{replayed.label} was {action} by the session, but stepfork failed before the call "
        f"could go on ({type(error).__name__}), so its {lost}",
        position=replayed.position,
    )
