"""``ReplaySession``: re-run the agent's own code with every boundary call served from a bundle.

The session is consulted by the boundaries (the same code that records) through a context
variable, before any dependency body could run. It holds one strict cursor over the recorded calls
in the order they started. For each call it checks, in order: position (and nesting), kind, tool
name, LLM provider and model, the redacted canonical input, the fingerprints (input, and the model
fingerprint that covers the operation); then the call's recorded replay policy and the session
mode decide whether the call is substituted from the recording, executed, or refused. Nothing
from the bundle is ever executed or imported: error types are strings, values are JSON.

Why a single cursor and not matching "by name" or "by input": an agent that calls the same tool
twice with the same arguments must get the two recorded answers in order, and an agent that skips
or reorders a call must be told so; matching by content alone silently serves the wrong answer.
The price is that the order of concurrent calls must also be reproduced (documented). Content is
still used, but only to explain a divergence: when the call made is recorded *later*, the error
says the order differs instead of just "name differs".

Why refusals never move the cursor: a refused call (policy, mismatch) has not consumed its
recorded answer, so an agent that catches the error and carries on is matched against the same
recorded call, and ``verify_complete()`` still sees it pending. Every error raised at a call is
also kept in :attr:`ReplaySession.errors`, so a divergence the agent swallowed still fails
``verify_complete()`` and the trajectory assertions.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from stepfork_otel.config import CONFIG
from stepfork_otel.recording.contract import (
    BoundaryCall,
    ReplayDecision,
    Replayer,
    current_session,
)
from stepfork_otel.replay.errors import (
    BundleIntegrityError,
    CallDescription,
    RecordedDependencyError,
    ReplayError,
    ReplayExhaustedError,
    ReplayMismatchError,
    ReplayModeError,
    ReplayPolicyError,
    ReplaySessionError,
    first_difference,
)
from stepfork_otel.replay.plan import (
    RecordedCall,
    build_plan,
    descendants,
)
from stepfork_otel.replay.values import rebuild
from stepfork_otel.trace.bundle import gc_paused, load_any
from stepfork_otel.trace.canonical import UNSERIALISABLE_MARKER, sha256_hex, short_fingerprint
from stepfork_otel.trace.checks import raise_if_inconsistent, verify_integrity
from stepfork_otel.trace.models import (
    ErrorEvent,
    LlmRequest,
    ToolCall,
    Trace,
    label,
    payload_value,
)
from stepfork_otel.trace.payload import Payload, exception_message
from stepfork_otel.trace.policy import ReplayMode, ReplayPolicy

__all__ = [
    "Action",
    "Approver",
    "RecordedCall",
    "ReplayResult",
    "ReplaySession",
    "ReplayedCall",
]

Action = Literal["substituted", "executed", "rejected"]
#: Approval callback (``manual`` mode, and calls recorded with policy ``manual``/``forbidden``):
#: gets the recorded call about to be replayed -- already matched, so it is the call being made.
Approver = Callable[[RecordedCall], bool]

_EXECUTE, _SUBSTITUTE, _DENY = "execute", "substitute", "deny"


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
    pending: tuple[RecordedCall, ...]
    """Recorded calls never matched (``verify_complete()`` fails on these)."""
    skipped: tuple[RecordedCall, ...]
    """Recorded calls inside substituted calls: not made, because those bodies did not run."""
    errors: tuple[ReplayError, ...]
    """Every replay error raised, including those the agent caught."""

    @property
    def ok(self) -> bool:
        return not self.errors and not self.pending

    @property
    def first_divergence(self) -> ReplayError | None:
        return self.errors[0] if self.errors else None

    def counts(self) -> dict[str, int]:
        out = {"substituted": 0, "executed": 0, "rejected": 0}
        for call in self.calls:
            out[call.action] += 1
        return out

    def __str__(self) -> str:
        c = self.counts()
        lines = [
            f"replay ({self.mode.value}): {len(self.calls)} call(s) reached - {c['substituted']} "
            f"substituted, {c['executed']} executed, {c['rejected']} rejected; "
            f"{len(self.pending)} recorded call(s) not reached, {len(self.skipped)} skipped "
            "inside substituted calls"
        ]
        for call in self.calls:
            rec = f" <- {call.recorded_id}" if call.recorded_id else ""
            err = f" [raised {call.error.split(':', 1)[0]}]" if call.error else ""
            lines.append(f"  {call.position:>3}. {call.action:<11} {call.label}{rec}{err}")
            lines.extend(f"       note: {n}" for n in call.notes)
        lines.extend(f"  not reached: {rc.event.id} {rc.describe().label()}" for rc in self.pending)
        return "\n".join(lines)


def _described(error: BaseException) -> str:
    """``Type: redacted message`` of an exception raised during replay."""
    return f"{type(error).__name__}: {exception_message(error, CONFIG.settings.redactor)}"


def parse_mode(mode: ReplayMode | str) -> ReplayMode:
    """The :class:`ReplayMode` named by ``mode``; :class:`ReplayModeError` if unknown or reserved."""
    try:
        parsed = ReplayMode(mode)
    except ValueError:
        allowed = ", ".join(m.value for m in ReplayMode if m is not ReplayMode.DERIVED)
        raise ReplayModeError(f"unknown replay mode {mode!r}; expected one of: {allowed}") from None
    if parsed is ReplayMode.DERIVED:
        raise ReplayModeError(
            "replay mode 'derived' is reserved and not supported in this version; use frozen, "
            "hybrid, live, forbidden or manual"
        )
    return parsed


def _names(names: Iterable[str], what: str) -> frozenset[str]:
    if isinstance(names, str):
        raise TypeError(f"{what} takes a collection of names, not a string")
    return frozenset(names)


def _check_options(
    mode: ReplayMode, allow_live_tools: frozenset[str], live_llms: frozenset[str]
) -> None:
    if allow_live_tools and mode is not ReplayMode.LIVE:
        raise ReplayModeError(
            f"allow_live_tools only applies to mode 'live' (this session is "
            f"{mode.value!r}): no tool runs for real in any other mode"
        )
    if live_llms and mode is not ReplayMode.HYBRID:
        raise ReplayModeError(
            f"live_llms only applies to mode 'hybrid' (this session is {mode.value!r})"
        )
    if mode is ReplayMode.HYBRID and not live_llms:
        raise ReplayModeError(
            "mode 'hybrid' needs live_llms: the LLMs to run again, as 'provider/model', "
            "'provider/*' or 'model' (without them it would be a frozen replay)"
        )


def _matches_llm(selector: str, provider: str | None, model: str | None) -> bool:
    if "/" in selector:
        sel_provider, sel_model = selector.split("/", 1)
        return sel_provider == provider and sel_model in ("*", model)
    return selector == model


def _a(kind: str) -> str:
    return "an llm" if kind == "llm" else f"a {kind}"


def _checked_plan(trace: Trace, source: str | None, structure_checked: bool) -> list[RecordedCall]:
    """The plan of a trace that passed every check (structure, then every stored fingerprint)."""
    if not structure_checked:
        raise_if_inconsistent(trace, source)
    problems = verify_integrity(trace)
    if problems:
        raise BundleIntegrityError(source, [str(p) for p in problems])
    return build_plan(trace)


@dataclass(slots=True, eq=False)
class _Decision(ReplayDecision):
    """A decision of this session: ``end``/``abandon`` report back to it."""

    session: ReplaySession | None = None
    replayed: ReplayedCall | None = None
    recorded: RecordedCall | None = None
    """The recorded call an executed body stands for (None: substituted)."""
    token: Token[int | None] | None = None

    def end(self, output: Payload | None, error: BaseException | None) -> None:
        if self.session is not None:
            self.session.end_call(self, output, error)

    def abandon(self, error: BaseException) -> None:
        if self.session is not None:
            self.session.abandon_call(self, error)


@dataclass
class _LiveLlm:
    """The last LLM call that ran live (hybrid/live), for naming it in later divergences."""

    description: CallDescription
    replayed: ReplayedCall


class ReplaySession:
    """Replays one bundle. Enter it (``with`` or ``async with``) around the agent's run.

    ``mode``: ``frozen`` (default), ``hybrid``, ``live``, ``forbidden``, ``manual``.
    ``allow_live_tools``: in ``live`` mode, the tool names that may run for real.
    ``live_llms``: in ``hybrid`` mode, the LLMs that run again: ``"provider/model"``,
    ``"provider/*"`` or ``"model"``. ``approve``: called with each :class:`RecordedCall` that
    needs an approval (every call in ``manual`` mode; calls recorded with policy ``manual`` or
    ``forbidden``); return True to allow it.

    Raises :class:`ReplayModeError` for an unknown/reserved mode or options that do not fit the
    mode, :class:`~stepfork_otel.trace.bundle.BundleError` for an inconsistent trace and
    :class:`BundleIntegrityError` when a stored fingerprint does not match its payload.
    """

    def __init__(
        self,
        trace: Trace,
        mode: ReplayMode | str = ReplayMode.FROZEN,
        *,
        allow_live_tools: Iterable[str] = (),
        live_llms: Iterable[str] = (),
        approve: Approver | None = None,
        source: str | None = None,
        _structure_checked: bool = False,
    ) -> None:
        if not isinstance(trace, Trace):
            raise TypeError(f"expected a Trace, got {type(trace).__name__}")
        self.mode = parse_mode(mode)
        self.allow_live_tools = _names(allow_live_tools, "allow_live_tools")
        self.live_llms = _names(live_llms, "live_llms")
        _check_options(self.mode, self.allow_live_tools, self.live_llms)
        self.trace = trace
        self.source = source
        self.approve = approve
        with gc_paused():
            self._plan = _checked_plan(trace, source, _structure_checked)
        self._cursor = 0
        self._calls: list[ReplayedCall] = []
        self._errors: list[ReplayError] = []
        self._divergences: list[ReplayError] = []  # raised at calls (not by verify_complete)
        self._lock = threading.RLock()
        self._executing: ContextVar[int | None] = ContextVar(
            "stepfork_replay_executing", default=None
        )
        self._last_live: _LiveLlm | None = None
        self._state: Literal["new", "active", "closed"] = "new"
        self._token: Token[Replayer | None] | None = None

    @classmethod
    def from_trace(
        cls,
        source: Trace | str | os.PathLike[str],
        mode: ReplayMode | str = ReplayMode.FROZEN,
        *,
        allow_live_tools: Iterable[str] = (),
        live_llms: Iterable[str] = (),
        approve: Approver | None = None,
    ) -> ReplaySession:
        """A session over a bundle path or an in-memory :class:`Trace`.

        Raises :class:`~stepfork_otel.trace.bundle.BundleError` for an unreadable or invalid
        bundle and :class:`BundleIntegrityError` when a stored fingerprint is wrong.
        """
        allow_live_tools = _names(allow_live_tools, "allow_live_tools")
        live_llms = _names(live_llms, "live_llms")
        _check_options(parse_mode(mode), allow_live_tools, live_llms)  # before reading anything
        trace = load_any(source)
        return cls(
            trace,
            mode,
            allow_live_tools=allow_live_tools,
            live_llms=live_llms,
            approve=approve,
            source=None if isinstance(source, Trace) else str(source),
            _structure_checked=not isinstance(source, Trace),  # load_trace checked it
        )

    # -- context management ----------------------------------------------------------------------

    def __enter__(self) -> ReplaySession:
        if self._state != "new":
            raise ReplaySessionError(
                "a ReplaySession can be entered only once; create a new one with "
                "ReplaySession.from_trace(...) for another run"
            )
        if current_session.in_context() is not None:
            raise ReplaySessionError(
                "another ReplaySession is already active in this context; sessions do not nest"
            )
        self._state = "active"
        self._token = current_session.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Completeness is not checked here: verify_complete() is explicit, so an exception from
        # the agent is never replaced by a completeness error.
        with self._lock:
            self._state = "closed"
        if self._token is not None:
            current_session.reset(self._token, self)
            self._token = None

    async def __aenter__(self) -> ReplaySession:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- what users look at ----------------------------------------------------------------------

    @property
    def calls(self) -> list[ReplayedCall]:
        """Every boundary call reached during replay, in order (including refused ones)."""
        return list(self._calls)

    @property
    def matched(self) -> list[ReplayedCall]:
        """The calls that matched the recording and were served (substituted or executed)."""
        return [c for c in self._calls if c.action != "rejected"]

    @property
    def pending(self) -> list[RecordedCall]:
        """Recorded calls not matched (neither consumed nor skipped inside a substituted call)."""
        return [rc for rc in self._plan if rc.state in ("pending", "not_reached")]

    @property
    def recorded_calls(self) -> list[RecordedCall]:
        """The replay plan: every recorded call, in the order the recorded run started them."""
        return list(self._plan)

    @property
    def errors(self) -> list[ReplayError]:
        """Replay errors raised so far, including those the agent caught."""
        return list(self._errors)

    @property
    def summary(self) -> ReplayResult:
        """A frozen :class:`ReplayResult` of what happened so far."""
        with self._lock:
            return ReplayResult(
                mode=self.mode,
                calls=tuple(dataclasses.replace(c, notes=list(c.notes)) for c in self._calls),
                pending=tuple(self.pending),
                skipped=tuple(rc for rc in self._plan if rc.state == "skipped"),
                errors=tuple(self._errors),
            )

    def verify_complete(self) -> None:
        """Raise :class:`ReplayMismatchError` if recorded calls were left unconsumed, or if the run
        diverged at a call and the agent caught the error."""
        with self._lock:
            pending = self.pending
            caught = list(self._divergences)
            if not pending and not caught:
                return
            details: list[str] = []
            if pending:
                reason = (
                    f"{len(pending)} recorded call(s) were never made: the agent skipped "
                    "recorded steps"
                )
                details.append(
                    "not reached: "
                    + ", ".join(f"{rc.event.id} ({rc.describe().label()})" for rc in pending)
                )
            else:
                reason = "the run diverged from the recording (the agent caught the error)"
            details.extend(
                f"raised during the run: {type(e).__name__} at call {e.position}: {e.reason}"
                for e in caught
            )
            error = ReplayMismatchError(
                reason, expected=pending[0].describe() if pending else None, details=details
            )
            self._errors.append(error)
        raise error

    # -- the boundary contract -------------------------------------------------------------------

    def begin_call(self, call: BoundaryCall) -> ReplayDecision:
        """Decide what happens to a call before its body could run (called by the boundaries)."""
        with self._lock:
            if self._state != "active" or current_session.in_context() is not self:
                actual = self._actual(call)
                if self._state != "active":
                    reason = (
                        f"{actual.label()} reached a ReplaySession that is not active (it "
                        f"{'was never entered' if self._state == 'new' else 'already exited'}); "
                        "boundaries must run inside `with ReplaySession...` -- a thread or task "
                        "started with a copy of the session's context must finish before it exits"
                    )
                else:
                    reason = (
                        f"{actual.label()} was called from a thread that does not carry the "
                        "replay session (started without copying the context, e.g. "
                        "threading.Thread or ThreadPoolExecutor.submit) while the session is "
                        "active: it is refused rather than run live and unmatched; start the "
                        "thread with contextvars.copy_context().run(...) or asyncio.to_thread(...)"
                    )
                error: ReplayError = ReplaySessionError(reason, actual=actual)
                self._errors.append(error)
                self._divergences.append(error)
                raise error
            replayed = ReplayedCall(
                len(self._calls) + 1,
                call.kind,
                call.name,
                call.input.text,
                call.input.sha256,
                "rejected",
                None,
                provider=call.provider,
                model=call.model,
            )
            self._calls.append(replayed)
            try:
                return self._begin(call, replayed)
            except ReplayError as exc:
                replayed.status = "error"
                replayed.error = f"{type(exc).__name__}: {exc.reason}"
                self._errors.append(exc)
                self._divergences.append(exc)
                raise

    def expected_input(self) -> tuple[str, str] | None:
        """The recorded input of the call the recording expects next -- its text and stored
        fingerprint (verified when the session started) -- or None. A hint for the boundary: a
        live input that redacts to exactly this text takes this fingerprint instead of being
        hashed again (see ``capture``); it is redacted as always. Read without the lock: a hint
        that went stale under a concurrent call is still a verified (text, fingerprint) pair, so
        it costs only the shortcut, never the match (made under the lock by :meth:`begin_call`)."""
        plan, cursor = self._plan, self._cursor
        if cursor >= len(plan):
            return None
        event = plan[cursor].event
        text, sha = event.input, event.input_sha256
        return None if text is None or sha is None else (text, sha)

    def abandon_call(self, decision: _Decision, error: BaseException) -> None:
        """Called by the boundary when stepfork itself failed after this session decided a call
        (its span could not be opened): the call raised ``error`` instead of delivering its
        recorded result or running its body. Recorded as the call's error and as a divergence,
        so ``verify_complete()`` fails rather than count the call as replayed."""
        with self._lock:  # re-entrant: end_call takes it too, and nobody sees a half update
            if decision.action == "executed":
                self.end_call(decision, None, error)  # the body never started: release nesting
            replayed = decision.replayed
            assert replayed is not None
            replayed.status = "error"
            replayed.error = _described(error)
            divergence = ReplaySessionError(
                f"{replayed.label} was {decision.action} by the session, but stepfork failed "
                f"before the call could go on ({type(error).__name__}), so its "
                + (
                    "recorded result was not delivered"
                    if decision.action == "substituted"
                    else "body did not run"
                ),
                position=replayed.position,
            )
            self._errors.append(divergence)
            self._divergences.append(divergence)

    def end_call(
        self, decision: _Decision, output: Payload | None, error: BaseException | None
    ) -> None:
        """Called by the boundary when an executed body returned or raised."""
        with self._lock:
            replayed, rc, token = decision.replayed, decision.recorded, decision.token
            assert replayed is not None
            if token is not None:
                decision.token = None
                self._executing.reset(token)
            replayed.status = "error" if error is not None else "ok"
            if error is not None:  # a live body's own exception: redacted like any recorded message
                replayed.error = _described(error)
            if output is not None:
                replayed.output_sha256 = output.sha256
            if rc is None:
                return
            for inner in descendants(self._plan, rc):  # recorded inner calls the body never made
                if inner.state == "pending":
                    inner.state = "not_reached"
            self._advance()
            recorded = rc.output_sha256
            live = output.sha256 if output is not None else None
            if error is None and recorded is not None and live is not None and live != recorded:
                replayed.notes.append(
                    f"live output differs from the recording (sha256 {short_fingerprint(live)} vs recorded "
                    f"{short_fingerprint(recorded)})"
                )

    # -- internals -------------------------------------------------------------------------------

    def _actual(self, call: BoundaryCall) -> CallDescription:
        return CallDescription(
            kind=call.kind,
            name=call.name,
            provider=call.provider,
            model=call.model,
            input_preview=call.input.text,
            input_sha256=call.input.sha256,
            model_fingerprint=call.model_fingerprint,
            fingerprint_source="live",
            operation=call.operation,
        )

    def _advance(self) -> None:
        plan, cursor = self._plan, self._cursor
        while cursor < len(plan) and plan[cursor].state != "pending":
            cursor += 1
        self._cursor = cursor

    def _after_live(self) -> tuple[CallDescription | None, list[str]]:
        live = self._last_live
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

    def _refuse(
        self,
        call: BoundaryCall,
        position: int,
        reason: str,
        expected: RecordedCall | None = None,
    ) -> ReplayPolicyError:
        # descriptions are built only on the way to an error: the hot path never pays for them
        return ReplayPolicyError(
            reason,
            position=position,
            expected=expected.describe() if expected is not None else None,
            actual=self._actual(call),
        )

    def _begin(self, call: BoundaryCall, replayed: ReplayedCall) -> ReplayDecision:
        position = replayed.position
        refuse = self._refuse
        # forbidden and manual-without-approver refuse before matching: nothing to match for
        if self.mode is ReplayMode.FORBIDDEN:
            raise refuse(call, position, "replay mode 'forbidden' rejects every dependency call")
        if self.mode is ReplayMode.MANUAL and self.approve is None:
            raise refuse(
                call,
                position,
                "replay mode 'manual' needs an explicit approval for every call and no approval "
                "callback was given (ReplaySession(..., approve=...))",
            )
        expected, plan = self._match(call, position)
        replayed.recorded_id = expected.event.id
        replayed.recorded_input_sha256 = expected.input_sha256
        replayed.recorded_output_sha256 = output_sha256 = expected.output_sha256
        policy = expected.policy
        if policy is ReplayPolicy.FORBIDDEN and self.mode is not ReplayMode.MANUAL:
            raise refuse(
                call,
                position,
                f"the recorded call {expected.event.id} has replay policy 'forbidden': it is never "
                "replayed automatically, whatever the mode or allowlist (replay it in manual mode "
                "with an explicit approval to substitute its recorded result)",
                expected,
            )
        if plan == _DENY:
            raise refuse(
                call,
                position,
                f"tool {call.name!r} may not run live: live mode executes a tool only when it is "
                f"named in allow_live_tools (--allow-live-tool {call.name}); its body did not run "
                "and its recorded response was not consumed",
                expected,
            )
        if self.mode is ReplayMode.MANUAL or policy in (
            ReplayPolicy.MANUAL,
            ReplayPolicy.FORBIDDEN,
        ):
            label = replayed.label
            why = (
                "manual mode"
                if self.mode is ReplayMode.MANUAL
                else f"recorded policy {policy.value!r}"
            )
            if self.approve is None:
                raise refuse(
                    call,
                    position,
                    f"{label} needs an explicit approval ({why}) and no approval callback was "
                    "given (ReplaySession(..., approve=...))",
                    expected,
                )
            if not self.approve(expected):
                raise refuse(
                    call,
                    position,
                    f"{label} needs an explicit approval ({why}) and was not approved",
                    expected,
                )
        if plan == _EXECUTE:
            return self._execute(replayed, expected)
        return self._substitute(call, replayed, expected, position, output_sha256)

    def _plan_for(self, call: BoundaryCall, expected: RecordedCall) -> str:
        """Execute, substitute or deny, from the mode, the allowlists and the recorded policy."""
        if self.mode in (ReplayMode.FROZEN, ReplayMode.MANUAL):
            return _SUBSTITUTE
        if expected.policy in (ReplayPolicy.FROZEN, ReplayPolicy.FORBIDDEN):
            return _SUBSTITUTE  # forbidden is refused by the caller before this matters
        if self.mode is ReplayMode.HYBRID:
            selected = call.kind == "llm" and any(
                _matches_llm(s, call.provider, call.model) for s in self.live_llms
            )
            return _EXECUTE if selected else _SUBSTITUTE
        if call.kind == "llm":  # live
            return _EXECUTE
        return _EXECUTE if call.name in self.allow_live_tools else _DENY

    def _mismatch(
        self,
        call: BoundaryCall,
        position: int,
        expected: RecordedCall,
        parent: int | None,
        reason: str,
        details: list[str] | None = None,
    ) -> ReplayMismatchError:
        after, after_details = self._after_live()
        exp = expected.describe()
        error_type: type[ReplayMismatchError] = ReplayMismatchError
        later = self._recorded_later(call, parent)
        earlier = None if later is not None else self._consumed_earlier(call, parent)
        if later is not None:
            reason = (
                f"call order differs: this call was recorded later, as {later.event.id}, but "
                f"the next recorded call is {exp.label()} ({expected.event.id}) [{reason}]"
            )
        elif earlier is not None:
            error_type = ReplayExhaustedError
            reason = (
                f"recorded call consumed twice: this call's recorded answer ({earlier.event.id})"
                f" was already consumed, and the recording has it once; the next recorded "
                f"call is {exp.label()} ({expected.event.id}) [{reason}]"
            )
        return error_type(
            reason,
            position=position,
            expected=exp,
            actual=self._actual(call),
            details=after_details + (details or []),
            after_live_call=after,
        )

    def _match(self, call: BoundaryCall, position: int) -> tuple[RecordedCall, str]:
        if self._cursor >= len(self._plan):
            after, after_details = self._after_live()
            actual = self._actual(call)
            again = next(
                (rc for rc in self._plan if rc.state == "consumed" and self._same_call(call, rc)),
                None,
            )
            details = (
                [f"its recorded answer ({again.event.id}) was already consumed"] if again else []
            )
            raise ReplayExhaustedError(
                f"{actual.label()} was made after the recording was used up "
                f"({len(self._plan)} recorded calls, all consumed or skipped)",
                position=position,
                actual=actual,
                details=after_details + details,
                after_live_call=after,
            )
        expected = self._plan[self._cursor]
        parent = self._executing.get()

        if expected.parent != parent:
            where = "at run level" if parent is None else f"inside {self._plan[parent].event.id}"
            rec_where = (
                "at run level"
                if expected.parent is None
                else f"inside {self._plan[expected.parent].event.id}"
            )
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                f"call made {where}, but the next recorded call was made {rec_where}",
            )
        if expected.kind != call.kind:
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                f"kind differs: recorded {_a(expected.kind)} call, this run made {_a(call.kind)} call",
            )
        event = expected.event
        if isinstance(event, ToolCall) and event.name != call.name:
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                f"tool name differs: recorded {event.name!r}, this run called {call.name!r}",
            )
        if isinstance(event, LlmRequest):
            if event.provider != call.provider:
                raise self._mismatch(
                    call,
                    position,
                    expected,
                    parent,
                    f"LLM provider differs: recorded {event.provider!r}, this run used "
                    f"{call.provider!r}",
                )
            if event.model != call.model:
                raise self._mismatch(
                    call,
                    position,
                    expected,
                    parent,
                    f"LLM model differs: recorded {event.model!r}, this run used {call.model!r}",
                )
        plan = self._plan_for(call, expected)
        drift_allowed = plan == _EXECUTE and self.mode is ReplayMode.HYBRID
        if call.input.unserialisable:
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                "the input of this call has no canonical JSON form, so it cannot be matched "
                f"against the recording ({call.input.text}); make the arguments JSON-encodable",
            )
        if event.input is None and expected.input_sha256 is None:
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                f"the recorded input of {event.id} is missing "
                f"({event.input_missing or 'not recorded'}) and has no fingerprint to match",
            )
        same_input = (
            event.input == call.input.text
            if event.input is not None
            else expected.input_sha256 == call.input.sha256
        )
        if not same_input and not drift_allowed:
            hint = (
                " (arguments are normalised with their defaults: a changed default counts)"
                if call.kind == "tool"
                else " (the prompt payload passed to llm_request is part of the input)"
            )
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                "input differs from the recording" + hint,
                [] if event.input is None else first_difference(event.input, call.input.text),
            )
        if same_input and expected.input_sha256 not in (None, call.input.sha256):
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                "input fingerprint differs from the recorded fingerprint",
            )
        if (
            isinstance(event, LlmRequest)
            and event.model_fingerprint is not None
            and call.model_fingerprint is not None
            and event.model_fingerprint != call.model_fingerprint
        ):
            raise self._mismatch(
                call,
                position,
                expected,
                parent,
                f"model fingerprint differs: recorded operation {event.operation!r}, this run "
                f"used {call.operation!r}",
            )
        return expected, plan

    def _same_call(self, call: BoundaryCall, rc: RecordedCall) -> bool:
        if rc.kind != call.kind or rc.input_sha256 != call.input.sha256:
            return False
        event = rc.event
        if isinstance(event, ToolCall):
            return event.name == call.name
        return event.provider == call.provider and event.model == call.model

    def _consumed_earlier(self, call: BoundaryCall, parent: int | None) -> RecordedCall | None:
        """The latest consumed recorded call before the cursor, at the same nesting, equal to
        ``call`` (the agent repeats a call, e.g. a retry, that was recorded once)."""
        for rc in reversed(self._plan[: self._cursor]):
            if rc.state == "consumed" and rc.parent == parent and self._same_call(call, rc):
                return rc
        return None

    def _recorded_later(self, call: BoundaryCall, parent: int | None) -> RecordedCall | None:
        """A pending recorded call after the cursor, at the same nesting, equal to ``call``."""
        for rc in self._plan[self._cursor + 1 :]:
            if rc.state == "pending" and rc.parent == parent and self._same_call(call, rc):
                return rc
        return None

    def _execute(self, replayed: ReplayedCall, expected: RecordedCall) -> ReplayDecision:
        replayed.action = "executed"
        if replayed.input_sha256 != expected.input_sha256:
            replayed.notes.append(
                f"input drift (hybrid): this run's input differs from the recording (sha256 "
                f"{short_fingerprint(replayed.input_sha256)} vs recorded {short_fingerprint(expected.input_sha256)})"
            )
        expected.state = "consumed"
        self._advance()
        token = self._executing.set(expected.index)
        if replayed.kind == "llm":
            self._last_live = _LiveLlm(
                CallDescription(
                    kind="llm",
                    name=replayed.name,
                    provider=replayed.provider,
                    model=replayed.model,
                    input_preview=replayed.input,
                    input_sha256=replayed.input_sha256,
                    event_id=expected.event.id,
                    fingerprint_source="live",
                ),
                replayed,
            )
        return _Decision(
            "executed", session=self, replayed=replayed, recorded=expected, token=token
        )

    def _missing(
        self, call: BoundaryCall, position: int, expected: RecordedCall, reason: str
    ) -> ReplayMismatchError:
        return ReplayMismatchError(
            f"missing result: {reason}",
            position=position,
            expected=expected.describe(),
            actual=self._actual(call),
        )

    def _substitute(
        self,
        call: BoundaryCall,
        replayed: ReplayedCall,
        expected: RecordedCall,
        position: int,
        output_sha256: str | None,
    ) -> ReplayDecision:
        outcome = expected.outcome
        recorded = expected.event.id

        if outcome is None:
            cut = (
                f" (the bundle is incomplete: {self.trace.incomplete_reason or 'the run did not finish'})"
                if not self.trace.complete
                else " (the run was cut short or the span was lost)"
            )
            raise self._missing(
                call,
                position,
                expected,
                f"the recorded call {recorded} has no recorded result{cut}, so it cannot be "
                "substituted",
            )
        if isinstance(outcome, ErrorEvent) and outcome.status == "skipped":
            raise self._missing(
                call,
                position,
                expected,
                f"the recorded call {recorded} was rejected before its body ran in the recorded "
                f"run (itself a replay: {outcome.error_type}), so it has no result to substitute",
            )
        if outcome.output is None and not isinstance(outcome, ErrorEvent):
            raise self._missing(
                call,
                position,
                expected,
                f"the recorded result of {recorded} is missing "
                f"({outcome.output_missing or 'not recorded'}): it was left off the span, so it "
                "cannot be substituted; replay the local bundle, or raise the span payload cap",
            )
        value: Any = None
        if not isinstance(outcome, ErrorEvent):
            try:
                value = payload_value(outcome.output)
            except ValueError:  # orjson.JSONDecodeError; a hand-built or damaged bundle
                raise self._missing(
                    call,
                    position,
                    expected,
                    f"the recorded result of {recorded} is not valid JSON, so replay cannot "
                    "substitute it",
                ) from None
            if isinstance(value, dict) and UNSERIALISABLE_MARKER in value and len(value) == 1:
                raise self._missing(
                    call,
                    position,
                    expected,
                    f"the recorded result of {recorded} could not be serialised when it was "
                    f"recorded ({value[UNSERIALISABLE_MARKER]}), so replay cannot substitute it",
                )
        expected.state = "consumed"
        if expected.children:
            for inner in descendants(self._plan, expected):
                inner.state = "skipped"
        self._advance()
        replayed.action = "substituted"
        text = outcome.output or ""
        output = Payload(
            text,
            output_sha256 or sha256_hex(text),
            outcome.output_size or len(text.encode("utf-8")),
        )
        replayed.output_sha256 = output.sha256
        if isinstance(outcome, ErrorEvent):
            # already redacted when recorded; redacted again in case the bundle was hand-built
            message = CONFIG.settings.redactor.redact_message(outcome.message)
            replayed.status = "error"
            replayed.error = f"{outcome.error_type}: {message}"
            error = RecordedDependencyError(
                outcome.error_type, message, position=position, expected=expected.describe()
            )
            return _Decision(
                "substituted", output=output, error=error, session=self, replayed=replayed
            )
        replayed.status = "ok"
        rebuilt, note = rebuild(value, text, call.output_type)
        if note is not None:
            replayed.notes.append(note)
        return _Decision(
            "substituted", value=rebuilt, output=output, session=self, replayed=replayed
        )
