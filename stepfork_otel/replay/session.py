"""``ReplaySession``: re-run the agent's own code with every boundary call served from a bundle.

The session is consulted by the boundaries (the same code that records) through a context
variable, before any dependency body could run. It holds one strict cursor over the recorded calls
in the order they started. For each call it checks, in order: position (and nesting), kind, tool
name, LLM provider and model, the redacted canonical input, the recorded fingerprints; then the
session mode and the call's recorded replay policy decide whether the call is substituted from the
recording, executed, or refused. Nothing from the bundle is ever executed or imported.

Why a single cursor and not matching "by name" or "by input": an agent that calls the same tool
twice with the same arguments must get the two recorded answers in order, and an agent that skips
or reorders a call must be told so; matching by content alone silently serves the wrong answer.
The price is that the order of concurrent calls must also be reproduced (documented).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from pydantic import ConfigDict, PydanticUserError, TypeAdapter

from stepfork_otel.record.payload import Payload
from stepfork_otel.replay.context import BoundaryCall, ReplayDecision, current_session
from stepfork_otel.replay.errors import (
    BundleIntegrityError,
    CallDescription,
    RecordedDependencyError,
    ReplayError,
    ReplayExhaustedError,
    ReplayMismatchError,
    ReplayPolicyError,
)
from stepfork_otel.trace.bundle import load_any, verify_integrity
from stepfork_otel.trace.canonical import UNSERIALISABLE_MARKER, sha256_hex
from stepfork_otel.trace.models import (
    ErrorEvent,
    LlmRequest,
    LlmResponse,
    OutcomeEvent,
    ToolCall,
    ToolResult,
    Trace,
    payload_value,
)
from stepfork_otel.trace.policy import ReplayMode, ReplayPolicy

logger = logging.getLogger("stepfork_otel")

Action = Literal["substituted", "executed", "rejected"]
#: Approval callback of ``manual`` mode: gets the recorded call about to be replayed.
Approver = Callable[["RecordedCall"], bool]


@dataclass
class RecordedCall:
    """One recorded call in the replay plan."""

    index: int
    event: ToolCall | LlmRequest
    outcome: OutcomeEvent | None
    parent: int | None
    end: int = 0
    """Index just after this call's last recorded descendant."""
    input_sha256: str | None = None
    fingerprint_source: str = "stored"
    state: Literal["pending", "consumed", "skipped", "not_reached"] = "pending"

    @property
    def kind(self) -> str:
        return "tool" if isinstance(self.event, ToolCall) else "llm"

    @property
    def name(self) -> str:
        return self.event.name if isinstance(self.event, ToolCall) else self.event.model

    def describe(self) -> CallDescription:
        event = self.event
        return CallDescription(
            kind=self.kind,
            name=self.name,
            provider=event.provider if isinstance(event, LlmRequest) else None,
            model=event.model if isinstance(event, LlmRequest) else None,
            input_preview=event.input,
            input_sha256=self.input_sha256,
            model_fingerprint=event.model_fingerprint if isinstance(event, LlmRequest) else None,
            event_id=event.id,
            fingerprint_source=self.fingerprint_source,
        )


@dataclass
class ReplayedCall:
    """A call the agent actually made during replay (what the assertions look at)."""

    position: int
    kind: str
    name: str
    input: str
    """Redacted canonical JSON of the call's input (a tool's normalised arguments)."""
    input_sha256: str
    action: Action
    recorded_id: str | None
    provider: str | None = None
    model: str | None = None
    status: Literal["ok", "error", "pending"] = "pending"
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    """Reported, not raised: hybrid input drift, live output drift."""

    @property
    def arguments(self) -> Any:
        return payload_value(self.input)


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did, frozen: the calls reached, the recorded calls left over, the error."""

    mode: ReplayMode
    calls: tuple[ReplayedCall, ...]
    pending: tuple[RecordedCall, ...]
    skipped: tuple[RecordedCall, ...]
    errors: tuple[ReplayError, ...]

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
            f"replay ({self.mode.value}): {len(self.calls)} calls reached - {c['substituted']} "
            f"substituted, {c['executed']} executed, {c['rejected']} rejected; "
            f"{len(self.pending)} recorded calls not reached, {len(self.skipped)} skipped "
            "inside substituted calls"
        ]
        for call in self.calls:
            rec = f" <- {call.recorded_id}" if call.recorded_id else ""
            lines.append(f"  {call.position:>3}. {call.action:<11} {call.kind} {call.name}{rec}")
            lines.extend(f"       note: {n}" for n in call.notes)
        for rc in self.pending:
            lines.append(f"  not reached: {rc.event.id} {rc.kind} {rc.name}")
        return "\n".join(lines)


def _parse_mode(mode: ReplayMode | str) -> ReplayMode:
    try:
        parsed = ReplayMode(mode)
    except ValueError:
        allowed = ", ".join(m.value for m in ReplayMode if m is not ReplayMode.DERIVED)
        raise ValueError(f"unknown replay mode {mode!r}; expected one of: {allowed}") from None
    if parsed is ReplayMode.DERIVED:
        raise ReplayPolicyError("replay mode 'derived' is reserved and not supported")
    return parsed


def _build_plan(trace: Trace) -> list[RecordedCall]:
    calls: list[RecordedCall] = []
    by_id: dict[str, RecordedCall] = {}
    unpaired: list[RecordedCall] = []
    for event in trace.events:
        if isinstance(event, (ToolCall, LlmRequest)):
            parent = by_id[event.parent_id].index if event.parent_id in by_id else None
            rc = RecordedCall(len(calls), event, None, parent)
            if event.input_sha256 is None and event.input is not None:
                rc.input_sha256 = sha256_hex(event.input)
                rc.fingerprint_source = "computed from the loaded trace"
            else:
                rc.input_sha256 = event.input_sha256
            calls.append(rc)
            by_id[event.id] = rc
            unpaired.append(rc)
            continue
        target = by_id.get(event.parent_id or "")
        if target is None:  # legacy bundle without parent links: pair by name (see DESIGN.md)
            target = _legacy_pair(event, unpaired)
        if target is not None and target.outcome is None:
            target.outcome = event
            if target in unpaired:
                unpaired.remove(target)
    for rc in calls:  # descendants are contiguous after their ancestor (calls are in start order)
        end = rc.index + 1
        while end < len(calls) and _descends(calls, calls[end], rc.index):
            end += 1
        rc.end = end
    return calls


def _legacy_pair(event: OutcomeEvent, unpaired: list[RecordedCall]) -> RecordedCall | None:
    for rc in unpaired:
        if (
            isinstance(event, ToolResult)
            and isinstance(rc.event, ToolCall)
            and rc.event.name == event.name
        ):
            return rc
        if (
            isinstance(event, LlmResponse)
            and isinstance(rc.event, LlmRequest)
            and rc.event.model == event.model
        ):
            return rc
    return unpaired[-1] if isinstance(event, ErrorEvent) and unpaired else None


def _descends(calls: list[RecordedCall], rc: RecordedCall, ancestor: int) -> bool:
    parent = rc.parent
    while parent is not None:
        if parent == ancestor:
            return True
        parent = calls[parent].parent
    return False


def _first_difference(recorded: str | None, actual: str) -> list[str]:
    """Where two canonical inputs first differ, with a little context (both already redacted)."""
    if recorded is None:
        return []
    i = next(
        (n for n, (a, b) in enumerate(zip(recorded, actual, strict=False)) if a != b),
        min(len(recorded), len(actual)),
    )
    start = max(0, i - 30)
    return [
        f"first difference at character {i}:",
        f"  recorded: …{recorded[start : i + 50]}…",
        f"  this run: …{actual[start : i + 50]}…",
    ]


def _matches_llm(selector: str, provider: str | None, model: str | None) -> bool:
    if "/" in selector:
        sel_provider, sel_model = selector.split("/", 1)
        return sel_provider == provider and sel_model in ("*", model)
    return selector == model


class ReplaySession:
    """Replays one bundle. Enter it (``with`` or ``async with``) around the agent's run.

    ``mode``: ``frozen`` (default), ``hybrid``, ``live``, ``forbidden``, ``manual``.
    ``allow_live_tools``: in ``live`` mode, the tool names that may run for real.
    ``live_llms``: in ``hybrid`` mode, the LLMs that run again: ``"provider/model"``,
    ``"provider/*"`` or ``"model"``. ``approve``: in ``manual`` mode, called with each
    :class:`RecordedCall`; return True to let it be substituted.
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
    ) -> None:
        if isinstance(allow_live_tools, str) or isinstance(live_llms, str):
            raise TypeError(
                "allow_live_tools and live_llms take a collection of names, not a string"
            )
        self.mode = _parse_mode(mode)
        self.trace = trace
        self.source = source
        self.allow_live_tools = frozenset(allow_live_tools)
        self.live_llms = frozenset(live_llms)
        self.approve = approve
        problems = verify_integrity(trace)
        if problems:
            raise BundleIntegrityError(source, [str(p) for p in problems])
        self._plan = _build_plan(trace)
        self._cursor = 0
        self._calls: list[ReplayedCall] = []
        self._errors: list[ReplayError] = []
        self._lock = threading.RLock()
        self._executing: ContextVar[int | None] = ContextVar(
            "stepfork_replay_executing", default=None
        )
        self._last_live_llm: CallDescription | None = None
        self._state: Literal["new", "active", "closed"] = "new"
        self._token: Token[ReplaySession | None] | None = None

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
        trace = load_any(source)
        return cls(
            trace,
            mode,
            allow_live_tools=allow_live_tools,
            live_llms=live_llms,
            approve=approve,
            source=None if isinstance(source, Trace) else str(source),
        )

    # -- context management ----------------------------------------------------------------------

    def __enter__(self) -> ReplaySession:
        if self._state != "new":
            raise ReplayError(
                "a ReplaySession can be entered only once; create a new one with "
                "ReplaySession.from_trace(...) for another run"
            )
        active = current_session.get()
        if active is not None:
            raise ReplayError("another ReplaySession is already active in this context")
        self._state = "active"
        self._token = current_session.set(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = "closed"
        if self._token is not None:
            current_session.reset(self._token)
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
        """The calls that matched the recording (substituted or executed)."""
        return [c for c in self._calls if c.action != "rejected"]

    @property
    def pending(self) -> list[RecordedCall]:
        """Recorded calls not consumed (neither matched nor skipped inside a substituted call)."""
        return [rc for rc in self._plan if rc.state in ("pending", "not_reached")]

    @property
    def errors(self) -> list[ReplayError]:
        """Replay errors raised so far (also those the agent caught)."""
        return list(self._errors)

    @property
    def summary(self) -> ReplayResult:
        """A frozen :class:`ReplayResult` of what happened so far."""
        return ReplayResult(
            mode=self.mode,
            calls=tuple(self._calls),
            pending=tuple(self.pending),
            skipped=tuple(rc for rc in self._plan if rc.state == "skipped"),
            errors=tuple(self._errors),
        )

    def verify_complete(self) -> None:
        """Raise :class:`ReplayMismatchError` if recorded calls were left unconsumed."""
        pending = self.pending
        if pending:
            listed = [f"{rc.event.id}: {rc.describe().label()}" for rc in pending]
            error = ReplayMismatchError(
                f"{len(pending)} recorded call(s) were never made: the agent skipped recorded steps",
                expected=pending[0].describe(),
                details=["not reached: " + ", ".join(listed)],
            )
            self._errors.append(error)
            raise error

    # -- the boundary contract -------------------------------------------------------------------

    def begin_call(self, call: BoundaryCall) -> ReplayDecision:
        """Decide what happens to a call before its body could run (called by the boundaries)."""
        with self._lock:
            try:
                return self._begin(call)
            except ReplayError as error:
                self._errors.append(error)
                raise

    def end_call(
        self, decision: ReplayDecision, output: Payload | None, error: BaseException | None
    ) -> None:
        """Called by the boundary when an executed body returned or raised."""
        with self._lock:
            replayed, rc, token = decision.handle
            if token is not None:
                self._executing.reset(token)
            replayed.status = "error" if error is not None else "ok"
            if error is not None:
                replayed.error = f"{type(error).__name__}: {error}"
            if rc is None:
                return
            for inner in self._plan[rc.index + 1 : rc.end]:  # recorded inner calls never reached
                if inner.state == "pending":
                    inner.state = "not_reached"
            self._cursor = max(self._cursor, rc.end)
            recorded = rc.outcome
            if (
                output is not None
                and recorded is not None
                and recorded.output_sha256 not in (None, output.sha256)
            ):
                replayed.notes.append(
                    f"live output differs from the recording (sha256 {output.sha256[:12]}… vs "
                    f"{recorded.output_sha256[:12]}…)"
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
        )

    def _begin(self, call: BoundaryCall) -> ReplayDecision:
        position = len(self._calls) + 1
        replayed = ReplayedCall(
            position,
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
        actual = self._actual(call)
        if self._state != "active":
            raise ReplayError(
                f"{actual.label()} reached a ReplaySession that is not active (it was "
                f"{'never entered' if self._state == 'new' else 'already exited'}); boundaries "
                "must run inside `with ReplaySession...`",
                position=position,
                actual=actual,
            )
        if self.mode is ReplayMode.FORBIDDEN:
            raise ReplayPolicyError(
                "replay mode 'forbidden' rejects every dependency call",
                position=position,
                actual=actual,
            )
        expected = self._expect(call, actual, position)
        replayed.recorded_id = expected.event.id
        policy = expected.event.replay_policy
        approved: bool | None = None
        if self.mode is ReplayMode.MANUAL or policy in (
            ReplayPolicy.MANUAL,
            ReplayPolicy.FORBIDDEN,
        ):
            if policy is ReplayPolicy.FORBIDDEN and self.mode is not ReplayMode.MANUAL:
                raise ReplayPolicyError(
                    f"the recorded call {expected.event.id} has replay policy 'forbidden' (a call "
                    "that must never be replayed automatically); replay it in manual mode with an "
                    "explicit approval",
                    position=position,
                    expected=expected.describe(),
                    actual=actual,
                )
            approved = bool(self.approve(expected)) if self.approve is not None else False
            if not approved:
                raise ReplayPolicyError(
                    f"{actual.label()} needs an explicit approval "
                    f"({'manual mode' if self.mode is ReplayMode.MANUAL else 'recorded policy manual'})"
                    " and was not approved",
                    position=position,
                    expected=expected.describe(),
                    actual=actual,
                )
        execute = self._should_execute(call, expected, actual, position, approved)
        if execute:
            return self._execute(replayed, expected)
        return self._substitute(call, replayed, expected, position)

    def _expect(self, call: BoundaryCall, actual: CallDescription, position: int) -> RecordedCall:
        if self._cursor >= len(self._plan):
            consumed_twice = any(
                rc.state == "consumed"
                and rc.input_sha256 == call.input.sha256
                and rc.name == call.name
                for rc in self._plan
            )
            raise ReplayExhaustedError(
                f"{actual.label()} was made after the recording was used up "
                f"({len(self._plan)} recorded calls)"
                + ("; its recorded answer was already consumed" if consumed_twice else ""),
                position=position,
                actual=actual,
                after_live_call=self._last_live_llm,
            )
        expected = self._plan[self._cursor]
        parent = self._executing.get()
        exp = expected.describe()

        def mismatch(reason: str, details: list[str] | None = None) -> ReplayMismatchError:
            return ReplayMismatchError(
                reason,
                position=position,
                expected=exp,
                actual=actual,
                details=details,
                after_live_call=self._last_live_llm,
            )

        if expected.parent != parent:
            where = "at run level" if parent is None else f"inside {self._plan[parent].event.id}"
            rec_where = (
                "at run level"
                if expected.parent is None
                else f"inside {self._plan[expected.parent].event.id}"
            )
            raise mismatch(f"call made {where}, but the next recorded call was made {rec_where}")
        if expected.kind != call.kind:
            raise mismatch(
                f"kind differs: recorded a {expected.kind} call, this run made a {call.kind} call"
            )
        event = expected.event
        if isinstance(event, ToolCall) and event.name != call.name:
            raise mismatch(
                f"tool name differs: recorded {event.name!r}, this run called {call.name!r}"
            )
        if isinstance(event, LlmRequest):
            if event.provider != call.provider:
                raise mismatch(
                    f"LLM provider differs: recorded {event.provider!r}, this run used {call.provider!r}"
                )
            if event.model != call.model:
                raise mismatch(
                    f"LLM model differs: recorded {event.model!r}, this run used {call.model!r}"
                )
        if event.input is None and expected.input_sha256 is None:
            raise mismatch(
                f"the recorded input of {event.id} is missing ({event.input_missing or 'not recorded'}) and has no fingerprint to match"
            )
        same_input = (
            event.input == call.input.text
            if event.input is not None
            else expected.input_sha256 == call.input.sha256
        )
        if not same_input:
            if self._selected_live_llm(call):
                return expected  # hybrid: a changed prompt is the point; reported in _execute
            raise mismatch(
                "input differs from the recording"
                + (
                    " (arguments are normalised with their defaults: a changed default counts)"
                    if call.kind == "tool"
                    else ""
                ),
                _first_difference(event.input, call.input.text),
            )
        if expected.input_sha256 is not None and expected.input_sha256 != call.input.sha256:
            raise mismatch("input fingerprint differs from the recorded fingerprint")
        return expected

    def _selected_live_llm(self, call: BoundaryCall) -> bool:
        return (
            self.mode is ReplayMode.HYBRID
            and call.kind == "llm"
            and any(_matches_llm(s, call.provider, call.model) for s in self.live_llms)
        )

    def _should_execute(
        self,
        call: BoundaryCall,
        expected: RecordedCall,
        actual: CallDescription,
        position: int,
        approved: bool | None,
    ) -> bool:
        policy = expected.event.replay_policy
        if self.mode in (ReplayMode.FROZEN, ReplayMode.MANUAL) or policy in (
            ReplayPolicy.FROZEN,
            ReplayPolicy.FORBIDDEN,
        ):
            return False
        if self.mode is ReplayMode.HYBRID:
            return self._selected_live_llm(call)
        # live
        if call.kind == "llm":
            return True
        if call.name in self.allow_live_tools:
            return True
        raise ReplayPolicyError(
            f"tool {call.name!r} may not run live: live mode executes a tool only when it is named "
            f"in allow_live_tools (--allow-live-tool {call.name}); its recorded response was not used",
            position=position,
            expected=expected.describe(),
            actual=actual,
        )

    def _execute(self, replayed: ReplayedCall, expected: RecordedCall) -> ReplayDecision:
        replayed.action = "executed"
        if expected.event.input is not None and replayed.input != expected.event.input:
            replayed.notes.append(
                f"input drift (hybrid): sha256 {replayed.input_sha256[:12]}… vs recorded "
                f"{(expected.input_sha256 or '')[:12]}…"
            )
        expected.state = "consumed"
        self._cursor = expected.index + 1
        token = self._executing.set(expected.index)
        if replayed.kind == "llm":
            self._last_live_llm = CallDescription(
                kind="llm",
                name=replayed.name,
                provider=replayed.provider,
                model=replayed.model,
                input_preview=replayed.input,
                input_sha256=replayed.input_sha256,
                event_id=expected.event.id,
                fingerprint_source="live",
            )
        return ReplayDecision("executed", handle=(replayed, expected, token))

    def _substitute(
        self, call: BoundaryCall, replayed: ReplayedCall, expected: RecordedCall, position: int
    ) -> ReplayDecision:
        outcome = expected.outcome
        exp = expected.describe()
        if outcome is None:
            raise ReplayMismatchError(
                f"the recorded call {expected.event.id} has no recorded result (the run was cut "
                "short or the span was lost), so it cannot be substituted",
                position=position,
                expected=exp,
                actual=self._actual(call),
            )
        if outcome.output is None and not isinstance(outcome, ErrorEvent):
            raise ReplayMismatchError(
                f"the recorded result of {expected.event.id} is missing "
                f"({outcome.output_missing or 'not recorded'}): it was left off the span, so it "
                "cannot be substituted; replay the local bundle, or raise the span payload cap",
                position=position,
                expected=exp,
                actual=self._actual(call),
            )
        expected.state = "consumed"
        for inner in self._plan[expected.index + 1 : expected.end]:
            inner.state = "skipped"
        self._cursor = expected.end
        replayed.action = "substituted"
        output = Payload(
            outcome.output or "",
            outcome.output_sha256 or sha256_hex(outcome.output or ""),
            outcome.output_size or len((outcome.output or "").encode()),
        )
        if isinstance(outcome, ErrorEvent):
            replayed.status = "error"
            replayed.error = f"{outcome.error_type}: {outcome.message}"
            error = RecordedDependencyError(
                outcome.error_type, outcome.message, position=position, expected=exp
            )
            return ReplayDecision(
                "substituted", output=output, error=error, handle=(replayed, None, None)
            )
        replayed.status = "ok"
        value = payload_value(outcome.output)
        if isinstance(value, dict) and UNSERIALISABLE_MARKER in value and len(value) == 1:
            replayed.status = "error"
            error_u = ReplayError(
                f"the recorded result of {expected.event.id} could not be serialised when it was "
                f"recorded ({value[UNSERIALISABLE_MARKER]}); replay cannot substitute it",
                position=position,
                expected=exp,
            )
            self._errors.append(error_u)
            raise error_u
        return ReplayDecision(
            "substituted",
            value=_rebuild(value, outcome.output or "null", call.output_type),
            output=output,
            handle=(replayed, None, None),
        )


_adapters: dict[Any, TypeAdapter[Any] | None] = {}


def _adapter(output_type: Any) -> TypeAdapter[Any] | None:
    if output_type in _adapters:
        return _adapters[output_type]
    adapter: TypeAdapter[Any] | None
    try:
        try:
            adapter = TypeAdapter(output_type, config=ConfigDict(val_json_bytes="base64"))
        except PydanticUserError:  # models carry their own config
            adapter = TypeAdapter(output_type)
    except Exception:  # not a type pydantic understands: replay returns the JSON value
        adapter = None
    _adapters[output_type] = adapter
    return adapter


def _rebuild(value: Any, text: str, output_type: Any) -> Any:
    """The recorded value as ``output_type`` when pydantic can rebuild it from the recorded JSON
    (so the agent gets the type it got while recording), else the JSON value as recorded."""
    if output_type is None or output_type is Any:
        return value
    try:
        adapter = _adapter(output_type)
    except TypeError:  # unhashable annotation
        adapter = None
    if adapter is None:
        return value
    try:
        return adapter.validate_json(text)
    except Exception:
        logger.debug(
            "stepfork_otel: replayed value does not fit %r; returning the JSON value", output_type
        )
        return value
