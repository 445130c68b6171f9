"""``ReplaySession``: re-run the agent's own code with every boundary call served from a bundle.

The session is consulted by the boundaries (the same code that records) through a context
variable, before any dependency body could run. It holds a strict cursor over the recorded calls
in the order they started, and the :class:`~stepfork_otel.replay.plan.Frontier`: the recorded
calls that may come next. For each call it checks, in order: position (and nesting), kind, tool
name, LLM provider and model, the redacted canonical input, the fingerprints (input, and the model
fingerprint that covers the operation); then the call's recorded replay policy and the session
mode decide whether the call is substituted from the recording, executed, or refused. Nothing
from the bundle is ever executed or imported: error types are strings, values are JSON.

Why strict order and not matching "by name" or "by input": an agent that calls the same tool
twice with the same arguments must get the two recorded answers in order, and an agent that skips
or reorders a call must be told so; matching by content alone silently serves the wrong answer.
Content is used to explain a divergence: when the call made is recorded *later*, the error says
the order differs instead of just "name differs".

Why concurrent calls are the one exception: calls that were open together in the recorded run
(siblings under one parent whose spans overlapped) have no order of their own -- which of them
started first was the scheduler's choice, and a replay schedules differently. So when the frontier
holds several such calls, the call made is matched against each, in recorded order, and takes the
first that passes every matcher (identical inputs are therefore served in recorded order); none
passing is a mismatch naming the nearest of them. Calls that did not overlap keep their order, and
a call recorded after a group waits for the whole group. Sequential code only ever has one call on
the frontier, the one under the cursor, and is matched exactly as before.

Why refusals never move the cursor: a refused call (policy, mismatch) has not consumed its
recorded answer, so an agent that catches the error and carries on is matched against the same
recorded call, and ``verify_complete()`` still sees it pending. Every error raised at a call is
also kept in :attr:`ReplaySession.errors`, so a divergence the agent swallowed still fails
``verify_complete()`` and the trajectory assertions.

Why the session is thin: the checks are :mod:`~stepfork_otel.replay.matching` (ordered matchers),
the rules :mod:`~stepfork_otel.replay.decisions`, the recorded outcome
:mod:`~stepfork_otel.replay.substitution` and the bookkeeping :mod:`~stepfork_otel.replay.results`
-- each a function of what it is given, consulted once per call, none changing any state. The
session owns what must be changed under one lock: the cursor, the recorded calls' states, the
calls reached and the errors raised. So a call's data flows down and back once, and every state
change is in this module, after every check that could refuse the call has passed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, Status, StatusCode, set_span_in_context

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors, internal_error
from stepfork_otel.config import CONFIG
from stepfork_otel.constants import ACTION_EXECUTED, ACTION_REJECTED, ACTION_SUBSTITUTED
from stepfork_otel.recording.contract import (
    BoundaryCall,
    ReplayDecision,
    Replayer,
    Site,
    current_session,
)
from stepfork_otel.replay import decisions, fork, matching, results
from stepfork_otel.replay.decisions import Approver, Verdict, parse_mode
from stepfork_otel.replay.errors import (
    BundleIntegrityError,
    RecordedDependencyError,
    ReplayError,
    ReplayMismatchError,
    ReplayPolicyError,
    ReplaySessionError,
)
from stepfork_otel.replay.network import GuardToken, LiveToken, NetworkGuard
from stepfork_otel.replay.plan import Frontier, RecordedCall, build_plan, descendants
from stepfork_otel.replay.reads import ReadServer, parse_policy
from stepfork_otel.replay.results import Action, LiveLlm, ReplayedCall, ReplayResult
from stepfork_otel.replay.substitution import Substitution, substitute
from stepfork_otel.trace.bundle import gc_paused, load_any, load_trace, save_trace
from stepfork_otel.trace.checks import raise_if_inconsistent, verify_integrity
from stepfork_otel.trace.errors import one_line
from stepfork_otel.trace.models import ForkOrigin, Trace
from stepfork_otel.trace.payload import Payload
from stepfork_otel.trace.policy import EffectivePolicy, ReplayMode

__all__ = [
    "Action",
    "Approver",
    "RecordedCall",
    "ReplayResult",
    "ReplaySession",
    "ReplayedCall",
    "parse_mode",
]

_SEALED = frozenset((ReplayMode.FROZEN, ReplayMode.FORBIDDEN, ReplayMode.MANUAL))
"""The modes that never run a body live: their network guard governs every thread."""


def _parse_mode(mode: ReplayMode | str | None, fork_at: object) -> ReplayMode:
    """The mode asked for: by default ``frozen``, and ``live`` for a fork (``fork_at``)."""
    if mode is None:
        return ReplayMode.FROZEN if fork_at is None else ReplayMode.LIVE
    return parse_mode(mode)


def _checked_plan(trace: Trace, source: str | None, structure_checked: bool) -> list[RecordedCall]:
    """The plan of a trace that passed every check (structure, then every stored fingerprint)."""
    if not structure_checked:
        raise_if_inconsistent(trace, source)
    problems = verify_integrity(trace)
    if problems:
        raise BundleIntegrityError(source, [str(p) for p in problems])
    return build_plan(trace)


def _open_root_span(session: ReplaySession) -> tuple[Span, object] | None:
    """A replay that no span encloses gets a root span of its own, ``replay <run name>``, so
    the replayed run is one trace (next to its original in a tracing UI) rather than a trace
    per call. Inside the user's span (or a ``record(...)``), the calls join that trace."""
    if trace_api.get_current_span().get_span_context().is_valid:
        return None
    with handle_internal_errors("opening the replay's root span"):
        name = session.trace.run.name or "agent"
        attributes: dict[str, str] = {
            k.REPLAY_OF: session.trace.trace_id,
            k.RUN_NAME: name,
            k.OPENINFERENCE_SPAN_KIND: k.OI_KIND_AGENT,
        }
        run_input = session.trace.run.input  # redacted when it was recorded
        settings = CONFIG.settings
        if (
            run_input is not None
            and settings.capture_content
            and len(run_input.encode()) <= settings.max_span_payload_bytes
        ):
            attributes[k.INPUT_VALUE] = run_input  # the recorded input the replay starts from
            attributes[k.INPUT_MIME_TYPE] = k.MIME_JSON  # (as a recorded run span says it)
        span = CONFIG.tracer().start_span(
            f"replay {name}", attributes=attributes, links=_links_to(session.trace)
        )
        try:
            return span, context_api.attach(set_span_in_context(span))
        except BaseException:
            span.end()
            raise
    return None


def _links_to(trace: Trace) -> list[trace_api.Link]:
    """An OpenTelemetry link to the recorded run's span (none when the bundle names none)."""
    span_id = trace.run.span_id
    try:
        recorded = trace_api.SpanContext(
            int(trace.trace_id, 16),
            int(span_id or "", 16),
            is_remote=True,
            trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED),
        )
    except ValueError:  # no run span, or ids that are not hex (a hand-built bundle)
        return []
    return [trace_api.Link(recorded)]


def _close_root_span(
    root: tuple[Span, object], exc: BaseException | None, diverged: ReplayError | None
) -> None:
    """End the root span: ``ERROR`` when the replayed run raised or the replay diverged (an error
    the agent caught included), else ``OK``, as a recorded run's span ends."""
    span, token = root
    with handle_internal_errors("closing the replay's root span"):
        context_api.detach(token)  # type: ignore[arg-type]
        if exc is not None:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        elif diverged is not None:
            span.set_status(Status(StatusCode.ERROR, type(diverged).__name__))
        else:
            span.set_status(Status(StatusCode.OK))
        span.end()


@dataclass(slots=True, eq=False)
class _Decision(ReplayDecision):
    """A decision of this session: ``end``/``abandon`` report back to it."""

    session: ReplaySession | None = None
    replayed: ReplayedCall | None = None
    recorded: RecordedCall | None = None
    """The recorded call an executed body stands for (None: substituted)."""
    expected: RecordedCall | None = None
    """The recorded call this decision replays (substituted or executed)."""
    token: Token[int | None] | None = None
    live: LiveToken | None = None
    """The network guard's opening for an executed body (closed when it ends)."""

    def end(self, output: Payload | None, error: BaseException | None) -> None:
        if self.session is not None:
            self.session.end_call(self, output, error)

    def abandon(self, error: BaseException) -> None:
        if self.session is not None:
            self.session.abandon_call(self, error)

    def note(self, text: str) -> None:
        if self.session is not None and self.replayed is not None:
            self.session.note_call(self.replayed, text)

    def diverged(self, reason: str) -> BaseException:
        error = ReplayMismatchError(
            reason,
            position=None if self.replayed is None else self.replayed.position,
            expected=None if self.expected is None else self.expected.describe(),
        )
        if self.session is not None:
            self.session.diverged_after(self, error)
        return error

    def failure(self, error_type: str, message: str) -> BaseException:
        return RecordedDependencyError(
            error_type,
            CONFIG.settings.redactor.redact_message(message),
            position=None if self.replayed is None else self.replayed.position,
            expected=None if self.expected is None else self.expected.describe(),
        )


class ReplaySession:
    """Replays one bundle. Enter it (``with`` or ``async with``) around the agent's run.

    ``mode``: ``frozen`` (default), ``hybrid``, ``live``, ``forbidden``, ``manual``.
    ``allow_live_tools``: in ``live`` mode, the tool names that may run for real.
    ``live_llms``: in ``hybrid`` mode, the LLMs that run again: ``"provider/model"``,
    ``"provider/*"`` or ``"model"``. ``approve``: called with each :class:`RecordedCall` that
    needs an approval (every call in ``manual`` mode; calls recorded with policy ``manual`` or
    ``forbidden``); return True to allow it. ``allow_network``: ``"host"`` or ``"host:port"``
    entries that code outside the boundaries may still connect to while the session is active
    (everything else is refused -- in ``frozen``, ``forbidden`` and ``manual`` mode from every
    thread of the process: see :mod:`stepfork_otel.replay.network`). ``captured``: what a
    read of the clock, randomness or a uuid that departs from the recording does -- ``strict``
    (default) raises :class:`ReplayMismatchError` naming both call sites, ``lenient`` reads live
    and notes it (see :mod:`stepfork_otel.replay.reads`).

    ``fork_at``: fork the recorded run at call N (as ``stepfork show`` numbers it): the calls
    before it are replayed frozen and matched strictly, and from it on the run is live, as in
    ``live`` mode but matched against nothing (LLM calls run; a tool runs when named in
    ``allow_live_tools``; the policies hold). ``record_to``: a path where the fork is kept as a
    bundle of its own, written when the session exits (see :mod:`stepfork_otel.replay.fork`);
    :meth:`set_output` records its output. ``mode`` is ``frozen`` by default, ``live`` (the only
    one) with ``fork_at``.

    Raises :class:`ReplayModeError` for an unknown/reserved mode or options that do not fit the
    mode, :class:`~stepfork_otel.trace.bundle.BundleError` for an inconsistent trace and
    :class:`BundleIntegrityError` when a stored fingerprint does not match its payload.
    """

    def __init__(
        self,
        trace: Trace,
        mode: ReplayMode | str | None = None,
        *,
        allow_live_tools: Iterable[str] = (),
        live_llms: Iterable[str] = (),
        approve: Approver | None = None,
        allow_network: Iterable[str] = (),
        captured: str = "strict",
        fork_at: int | None = None,
        record_to: str | os.PathLike[str] | None = None,
        source: str | None = None,
        _structure_checked: bool = False,
    ) -> None:
        if not isinstance(trace, Trace):
            raise TypeError(f"expected a Trace, got {type(trace).__name__}")
        self._mode = _parse_mode(mode, fork_at)
        captured_policy = parse_policy(captured)
        self.allow_live_tools = decisions.names(allow_live_tools, "allow_live_tools")
        self.live_llms = decisions.names(live_llms, "live_llms")
        decisions.check_options(self._mode, self.allow_live_tools, self.live_llms)
        fork.check_options(self._mode, fork_at, record_to)
        self.fork_at = fork_at
        """The fork point of a fork (None: not a fork)."""
        self._in_prefix = fork_at is not None
        self._network = NetworkGuard(  # nothing runs live (before a fork point): no thread may
            allow_network,
            on_refusal=self._network_refused,
            whole_process=self._mode in _SEALED or self._in_prefix,
        )
        self.allow_network = self._network.allow
        self._network_token: GuardToken | None = None
        self.trace = trace
        self._untraced_tools = frozenset(trace.run.untraced_tools or ())
        self.source = source
        self.approve = approve
        with gc_paused():
            self._plan = _checked_plan(trace, source, _structure_checked)
        decisions.check_selectors(self.live_llms, self._plan)
        self._reads = ReadServer(trace, captured_policy)
        self._cursor = 0
        self._frontier = Frontier(self._plan)
        self._fork_index = None if fork_at is None else fork.fork_point(self._plan, fork_at)
        self._forked_after: int | None = None
        self._clean_prefix = False
        self.record_to = None if record_to is None else Path(record_to)
        """Where a fork is kept as a bundle (``record_to``)."""
        self.fork_bundle: Path | None = None
        """The fork's bundle, once the session exited and wrote it (None: not written -- no
        ``record_to``, or :attr:`fork_bundle_missing` says why)."""
        self.fork_bundle_missing: str | None = None
        """Why a fork with ``record_to`` wrote no bundle, once the session exited (None: it
        wrote one, or there is no ``record_to``)."""
        self._recording: fork.Recording | None = None
        self._origin: ForkOrigin | None = None
        if self._fork_index is not None:
            for rc in self._plan[self._fork_index :]:
                rc.state = "after_fork"  # never replayed: the fork runs live from here
                self._frontier.settle(rc)
            self._advance()
        self._calls: list[ReplayedCall] = []
        self._errors: list[ReplayError] = []
        self._divergences: list[ReplayError] = []  # raised at calls (not by verify_complete)
        self._lock = threading.RLock()
        self._executing: ContextVar[int | None] = ContextVar(
            "stepfork_replay_executing", default=None
        )
        self._last_live: LiveLlm | None = None
        self._state: Literal["new", "active", "closed"] = "new"
        self._token: Token[Replayer | None] | None = None
        self._root: tuple[Span, object] | None = None

    @classmethod
    def from_trace(
        cls,
        source: Trace | str | os.PathLike[str],
        mode: ReplayMode | str | None = None,
        *,
        allow_live_tools: Iterable[str] = (),
        live_llms: Iterable[str] = (),
        approve: Approver | None = None,
        allow_network: Iterable[str] = (),
        captured: str = "strict",
        fork_at: int | None = None,
        record_to: str | os.PathLike[str] | None = None,
    ) -> ReplaySession:
        """A session over a bundle path or an in-memory :class:`Trace`.

        Raises :class:`~stepfork_otel.trace.bundle.BundleError` for an unreadable or invalid
        bundle and :class:`BundleIntegrityError` when a stored fingerprint is wrong.
        """
        allow_live_tools = decisions.names(allow_live_tools, "allow_live_tools")
        live_llms = decisions.names(live_llms, "live_llms")
        parsed = _parse_mode(mode, fork_at)
        decisions.check_options(parsed, allow_live_tools, live_llms)  # before reading anything
        fork.check_options(parsed, fork_at, record_to, source)
        allow_network = NetworkGuard(allow_network).allow  # validated before reading, too
        parse_policy(captured)
        trace = load_any(source)
        return cls(
            trace,
            mode,
            allow_live_tools=allow_live_tools,
            live_llms=live_llms,
            approve=approve,
            allow_network=allow_network,
            captured=captured,
            fork_at=fork_at,
            record_to=record_to,
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
        self._network_token = self._network.activate()  # first: if it fails, nothing is active
        try:
            self._start_recording()  # the fork's run span, under which the calls are made
            self._root = _open_root_span(self)
        except BaseException:  # (tests raise stepfork's own errors): leave nothing active
            self._network.deactivate(self._network_token)
            self._network_token = None
            recording, self._recording = self._recording, None
            if recording is not None:
                recording.__exit__(None, None, None)
            raise
        self._state = "active"
        with self._lock:
            self._reads.environment_notes()
            self._check_fork()  # (fork_at=1: live from the start)
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
        try:
            if self._network_token is not None:
                self._network.deactivate(self._network_token)
                self._network_token = None
            if self._token is not None:
                current_session.reset(self._token, self)
                self._token = None
        finally:  # last, so that a failure to end it leaves no session active
            root, self._root = self._root, None
            if root is not None:
                _close_root_span(root, exc, self._errors[0] if self._errors else None)
            self._finish_recording(exc_type, exc, tb)

    async def __aenter__(self) -> ReplaySession:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- a fork ------------------------------------------------------------------------------------

    @property
    def mode(self) -> ReplayMode:
        """The mode calls are decided in: the session's, but ``frozen`` in a fork until its fork
        point is reached (``live`` from there)."""
        return ReplayMode.FROZEN if self._in_prefix else self._mode

    def set_output(self, output: Any) -> None:
        """Record the output of a fork's run in its bundle (``record_to``), as
        ``record(...).set_output`` does for a run. Call it inside the ``with`` block."""
        if self.record_to is None:
            raise ReplaySessionError(
                "set_output records the output of a fork in its bundle: this session has no "
                "record_to"
            )
        if self._recording is None:
            raise ReplaySessionError("set_output is called inside the session's with block")
        self._recording.set_output(output)

    def _start_recording(self) -> None:
        if self.record_to is None or self.fork_at is None:
            return
        origin = fork.origin_of(self.trace, self.fork_at, self.source)
        recording = fork.start_recording(fork.partial_path(self.record_to), origin, self.trace.run)
        recording.__enter__()
        self._recording = recording
        self._origin = origin

    def _check_fork(self) -> None:
        """Past the last call before the fork point, the run is live: no call is matched, no read
        served, and the network guard keeps to the session's own context."""
        if not self._in_prefix or self._fork_index is None or self._cursor < self._fork_index:
            return
        self._in_prefix = False
        self._forked_after = len(self._calls)
        self._clean_prefix = not self._divergences
        assert self.fork_at is not None
        self._reads.fork(self.fork_at)
        self._network.narrow()  # (a fork's mode is live: the guard was the whole process's)

    def _finish_recording(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """The fork's run ends (its bundle is written as any run's); then the fork's bundle is
        made from it and the original (:func:`~stepfork_otel.replay.fork.fork_trace`) -- when the
        fork point was reached with every call before it replayed as recorded."""
        recording, self._recording = self._recording, None
        if recording is None or self.record_to is None:
            return
        recording.__exit__(exc_type, exc, tb)
        partial = recording.path
        made_before, origin = self._forked_after, self._origin
        if partial is None:  # (logged already)
            self.fork_bundle_missing = "its run could not be recorded (see the log)"
            return
        if made_before is None or origin is None:
            self.fork_bundle_missing = f"the run ended before call {self.fork_at}, the fork point"
        elif not self._clean_prefix:
            self.fork_bundle_missing = (
                "a call before the fork point diverged: the run is no fork of the recorded one"
            )
        else:
            try:
                run = load_trace(partial)
                bundle = fork.fork_trace(self.trace, origin, run, made_before)
                raise_if_inconsistent(bundle, self.record_to)
                self.fork_bundle = save_trace(bundle, self.record_to)
            except Exception as exc:  # (the replay itself went as it went: said, not raised)
                self.fork_bundle_missing = (
                    f"writing it failed: {one_line(str(exc))} (the run is in {partial})"
                )
                internal_error(f"writing the fork's bundle {self.record_to}")
                return
        partial.unlink(missing_ok=True)

    # -- what users look at ----------------------------------------------------------------------

    @property
    def calls(self) -> list[ReplayedCall]:
        """Every boundary call reached during replay, in order (including refused ones)."""
        return list(self._calls)

    @property
    def matched(self) -> list[ReplayedCall]:
        """The calls that matched the recording and were served (substituted or executed)."""
        return [c for c in self._calls if c.action != ACTION_REJECTED]

    @property
    def pending(self) -> int:
        """How many recorded calls are not consumed yet (neither matched nor skipped inside a
        substituted call): the recorded calls still ahead during the run, the ones the agent
        skipped after it. ``verify_complete()`` fails unless it is 0."""
        return len(results.pending_calls(self._plan))

    @property
    def pending_calls(self) -> list[RecordedCall]:
        """The recorded calls :attr:`pending` counts, in recorded order."""
        return results.pending_calls(self._plan)

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
            return results.summarise(
                self.mode,
                self._calls,
                self._plan,
                self._errors,
                self._reads.summary(),
                None if self.fork_at is None else (self.fork_at, self._forked_after),
            )

    def verify_complete(self) -> None:
        """Raise :class:`ReplayMismatchError` if recorded calls or captured reads were left
        unconsumed, or if the run diverged (at a call or a read) and the agent caught the error."""
        with self._lock:
            error = results.incomplete_error(self.pending_calls, self._divergences)
            reads = self._reads.leftover_error()
            if error is None:
                error = reads
            elif reads is not None:
                error.add_details([reads.reason, *reads.details])
            if error is None:
                return
            if self.fork_at is not None and self._in_prefix:
                error.add_details([fork.not_reached(self.fork_at)])
            self._errors.append(error)
        raise error

    # -- captured reads (recording/determinism.py asks) ---------------------------------------------

    def serve_read(self, group: str, source: str, site: Site) -> tuple[bool, Any]:
        """A read of the clock, randomness, a uuid or random bytes by the run's code: the
        recorded value, or live (see :class:`~stepfork_otel.replay.reads.ReadServer`)."""
        with self._lock:
            if self._state != "active":
                return False, None
            try:
                return self._reads.serve(group, source, site, len(self._calls) + 1)
            except ReplayError as exc:
                if self.fork_at is not None and self._in_prefix:
                    exc.add_details([fork.not_reached(self.fork_at)])
                self._errors.append(exc)
                self._divergences.append(exc)
                raise

    @property
    def serves_reads(self) -> bool:
        """Whether the bundle captured clock/random/uuid values (the session then serves them)."""
        return bool(self._reads.values)

    def read_diverged(self, source: str, site: Site, reason: str) -> BaseException:
        """A served read could not be reproduced (a random function drew differently)."""
        error = ReplayMismatchError(
            f"{source} at {site} drew differently from the recording: {reason} "
            "(its arguments changed?)"
        )
        with self._lock:
            self._errors.append(error)
            self._divergences.append(error)
        return error

    # -- the boundary contract -------------------------------------------------------------------

    def begin_call(self, call: BoundaryCall) -> ReplayDecision:
        """Decide what happens to a call before its body could run (called by the boundaries)."""
        with self._lock:
            if self._state != "active" or current_session.in_context() is not self:
                error: ReplayError = decisions.refuse_outside(call, self._state)
                self._errors.append(error)
                self._divergences.append(error)
                raise error
            replayed = results.replayed_call(call, len(self._calls) + 1)
            self._calls.append(replayed)
            try:
                return self._begin(call, replayed)
            except ReplayError as exc:
                if self.fork_at is not None and self._in_prefix:
                    exc.add_details([fork.not_reached(self.fork_at)])
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
            if decision.action == ACTION_EXECUTED:
                self.end_call(decision, None, error)  # the body never started: release nesting
            replayed = decision.replayed
            assert replayed is not None
            replayed.status = "error"
            replayed.error = results.described_error(error)
            divergence = results.abandoned_error(replayed, decision.action, error)
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
            if decision.live is not None:
                opening, decision.live = decision.live, None
                self._network.exit_live(opening)
            replayed.status = "error" if error is not None else "ok"
            if error is not None:  # a live body's own exception: redacted like any recorded message
                replayed.error = results.described_error(error)
            if output is not None:
                replayed.output_sha256 = output.sha256
            if rc is None:
                return
            for inner in descendants(self._plan, rc):  # recorded inner calls the body never made
                if inner.state == "pending":
                    inner.state = "not_reached"
                    self._frontier.settle(inner)
            self._frontier.settle(rc)  # its later siblings may come now
            self._advance()
            live = output.sha256 if output is not None else None
            note = None if error is not None else results.live_output_note(live, rc.output_sha256)
            if note is not None:
                replayed.notes.append(note)

    # -- one call: refuse, match, decide, then change state ----------------------------------------

    def _begin(self, call: BoundaryCall, replayed: ReplayedCall) -> ReplayDecision:
        position = replayed.position
        decisions.refuse_unmatched(self, call, position)  # nothing to match for these
        if self.fork_at is not None and not self._in_prefix:
            return self._begin_live(call, replayed)
        if decisions.untraced_tool(self, call, position, self._untraced_tools):
            return self._execute_untraced(replayed)
        cursor = self._cursor
        if cursor >= len(self._plan):  # no recorded call left: nothing to match against
            raise matching.exhausted_error(
                call, position, self._plan, results.after_live(self._last_live)
            )
        parent = self._executing.get()
        ready = self._frontier.ready(parent)
        if len(ready) > 1 or (ready and ready[0].concurrent):
            expected, policy, verdict = self._match_concurrent(call, position, ready, parent)
        else:  # sequential: the call under the cursor (or the one call that may come here)
            expected = ready[0] if ready else self._plan[cursor]
            policy = decisions.effective_policy(call, expected)
            verdict = decisions.verdict_for(self, call, policy)
            drift_allowed = verdict is Verdict.EXECUTE and self.mode is ReplayMode.HYBRID
            ctx = matching.MatchContext(self._plan, expected.index, parent, drift_allowed)
            miss = matching.first_miss(call, expected, ctx)
            if miss is not None:
                after = results.after_live(self._last_live)
                error = matching.mismatch_error(call, position, expected, miss, ctx, after)
                error.add_details(self._reads.hint())  # uncaptured clock/random reads may explain
                raise error
        replayed.recorded_id = expected.event.id
        replayed.recorded_input_sha256 = expected.input_sha256
        replayed.recorded_output_sha256 = output_sha256 = expected.output_sha256
        replayed.fidelity = expected.event.fidelity
        for note in (decisions.policy_note(policy), results.fidelity_note(expected.event)):
            if note is not None:
                replayed.notes.append(note)
        decisions.refuse_matched(self, call, expected, policy, verdict, position)
        if verdict is Verdict.EXECUTE:
            return self._execute(replayed, expected)
        outcome = substitute(call, expected, position, self.trace, output_sha256)
        return self._substitute(replayed, expected, outcome)

    def _match_concurrent(
        self, call: BoundaryCall, position: int, ready: list[RecordedCall], parent: int | None
    ) -> tuple[RecordedCall, EffectivePolicy, Verdict]:
        """The recorded call, among the concurrent ones in flight, that this call is: the first
        in recorded order that passes every matcher (identical inputs are served in recorded
        order). A hybrid call that runs live may drift only when no recorded call has its exact
        input. None matching: the error names the nearest."""
        plan = self._plan
        for rc in ready:  # the call's own recorded twin first: a cheap look at each
            if matching.same_call(call, rc):
                policy = decisions.effective_policy(call, rc)
                ctx = matching.MatchContext(plan, rc.index, parent)
                if matching.first_miss(call, rc, ctx) is None:
                    return rc, policy, decisions.verdict_for(self, call, policy)
                break
        misses: list[tuple[RecordedCall, matching.Miss]] = []
        verdicts = []
        for rc in ready:
            policy = decisions.effective_policy(call, rc)
            verdict = decisions.verdict_for(self, call, policy)
            verdicts.append((rc, policy, verdict))
            miss = matching.first_miss(call, rc, matching.MatchContext(plan, rc.index, parent))
            if miss is None:
                return rc, policy, verdict
            misses.append((rc, miss))
        if self.mode is ReplayMode.HYBRID:
            for rc, policy, verdict in verdicts:
                if verdict is Verdict.EXECUTE:
                    ctx = matching.MatchContext(plan, rc.index, parent, drift_allowed=True)
                    if matching.first_miss(call, rc, ctx) is None:
                        return rc, policy, verdict
        after = results.after_live(self._last_live)
        error = matching.concurrent_mismatch_error(call, position, plan, misses, parent, after)
        error.add_details(self._reads.hint())
        raise error

    def _begin_live(self, call: BoundaryCall, replayed: ReplayedCall) -> ReplayDecision:
        """A call after the fork point: matched against nothing, decided as in ``live`` mode by
        today's code's policy and the allowlist."""
        assert self.fork_at is not None
        decisions.refuse_after_fork(self, call, self.fork_at, replayed.position)
        replayed.action = ACTION_EXECUTED
        return _Decision(
            ACTION_EXECUTED, session=self, replayed=replayed, live=self._network.enter_live()
        )

    def _advance(self) -> None:
        plan, cursor = self._plan, self._cursor
        while cursor < len(plan) and plan[cursor].state != "pending":
            cursor += 1
        self._cursor = cursor

    def _execute_untraced(self, replayed: ReplayedCall) -> ReplayDecision:
        """A tool the recording never traced, allowed to run live: no recorded call stands for
        it, so nothing is consumed and its outcome is not compared."""
        replayed.action = ACTION_EXECUTED
        replayed.notes.append(
            "ran live, unrecorded: the imported trace holds no span of this tool's runs"
        )
        return _Decision(
            ACTION_EXECUTED, session=self, replayed=replayed, live=self._network.enter_live()
        )

    def _execute(self, replayed: ReplayedCall, expected: RecordedCall) -> ReplayDecision:
        replayed.action = ACTION_EXECUTED
        note = results.input_drift_note(replayed.input_sha256, expected.input_sha256)
        if note is not None:
            replayed.notes.append(note)
        expected.state = "consumed"
        self._advance()
        token = self._executing.set(expected.index)
        if replayed.kind == "llm":
            self._last_live = LiveLlm.of(replayed, expected)
        return _Decision(
            ACTION_EXECUTED,
            session=self,
            replayed=replayed,
            recorded=expected,
            expected=expected,
            token=token,
            live=self._network.enter_live(),  # the body may reach its service
        )

    def note_call(self, replayed: ReplayedCall, text: str) -> None:
        """A note the boundary made on how it served a call (``ReplayDecision.note``)."""
        with self._lock:
            replayed.notes.append(text)

    def diverged_after(self, decision: _Decision, error: ReplayMismatchError) -> None:
        """A call departed from its recording after it was decided (a replayed stream read past
        its recorded end): a divergence, raised into the agent and kept for the result."""
        with self._lock:
            if decision.replayed is not None:
                decision.replayed.status = "error"
                decision.replayed.error = f"{type(error).__name__}: {error.reason}"
            self._errors.append(error)
            self._divergences.append(error)

    def _network_refused(self, error: ReplayPolicyError) -> None:
        """A connection no boundary serves was refused: a divergence, even if the agent swallows
        the error, so ``verify_complete()`` fails."""
        with self._lock:
            self._errors.append(error)
            self._divergences.append(error)

    def _substitute(
        self, replayed: ReplayedCall, expected: RecordedCall, outcome: Substitution
    ) -> ReplayDecision:
        expected.state = "consumed"
        frontier = self._frontier
        frontier.settle(expected)
        if expected.children:
            for inner in descendants(self._plan, expected):
                inner.state = "skipped"
                frontier.settle(inner)
        self._advance()
        self._check_fork()
        replayed.action = ACTION_SUBSTITUTED
        replayed.output_sha256 = outcome.output.sha256
        error = outcome.error
        if error is not None:
            replayed.status = "error"
            replayed.error = f"{error.error_type}: {error.message}"
        else:
            replayed.status = "ok"
            if outcome.note is not None:
                replayed.notes.append(outcome.note)
        return _Decision(
            ACTION_SUBSTITUTED,
            value=outcome.value,
            output=outcome.output,
            error=error,
            session=self,
            replayed=replayed,
            expected=expected,
        )
