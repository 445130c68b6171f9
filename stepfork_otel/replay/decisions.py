"""The decision rules: what the mode, the allowlists and the policy say about a call.

The policy is the *effective* one (:class:`~stepfork_otel.trace.policy.EffectivePolicy`): the
restrictions recorded with the call and those today's code declares at the boundary both hold, so
a bundle can never loosen the code; a disagreement is reported in the call's notes.

Two questions, asked of every call in a fixed order by the session:

1. :func:`verdict_for` -- once the call is known, would it be substituted from the recording,
   executed (its body runs live), or denied? Pure: it is asked before matching, because the
   input check lets a hybrid call that will run live drift from its recorded prompt.
2. the refusals, which raise :class:`ReplayPolicyError`: :func:`refuse_unmatched` before
   anything is matched (mode ``forbidden``, ``manual`` without an approver: no recorded call has
   a say), :func:`refuse_matched` once the call matched (policy ``forbidden``, a live
   tool not allow-listed, the approval callback); after the fork point of a fork, where no
   recorded call stands for a call, :func:`refuse_after_fork`.

Why refusals are raised here and not returned: a refusal is final for the call, the session only
records it (see the session's docstring for why a refusal never moves the cursor). Why the
session is passed in as :class:`Rules` rather than copied into a rules object: ``approve`` and
the allowlists are plain attributes of the session, read at the call, as they always were.

The options check (:func:`parse_mode`, :func:`check_options`) lives here too: it is the same
rules, refused when the session is built instead of at the first call; and so does
:func:`refuse_outside`, for a call that reaches a session outside its life or its context.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from stepfork_otel.recording.contract import BoundaryCall
from stepfork_otel.replay.errors import ReplayModeError, ReplayPolicyError, ReplaySessionError
from stepfork_otel.replay.fork import live_call
from stepfork_otel.replay.matching import describe_call
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.trace.models import LlmRequest, label
from stepfork_otel.trace.policy import EffectivePolicy, ReplayMode, ReplayPolicy

__all__ = [
    "Approver",
    "Rules",
    "Verdict",
    "check_options",
    "names",
    "parse_mode",
    "refuse_after_fork",
    "refuse_matched",
    "refuse_outside",
    "refuse_unmatched",
    "untraced_tool",
    "verdict_for",
]

#: Approval callback (``manual`` mode, and calls recorded with policy ``manual``/``forbidden``):
#: gets the recorded call about to be replayed -- already matched, so it is the call being made;
#: after a fork point, where nothing is matched, a call made of the live one (id ``live-N``).
Approver = Callable[[RecordedCall], bool]


class Verdict(enum.Enum):
    """What the mode, the allowlists and the recorded policy make of a matched call."""

    SUBSTITUTE = "substitute"
    """Return the recorded outcome; the body does not run."""
    EXECUTE = "execute"
    """Run the body live (a selected LLM in hybrid mode, an LLM or allow-listed tool in live)."""
    DENY = "deny"
    """Refuse: a tool in live mode that is not named in ``allow_live_tools``."""


class Rules(Protocol):
    """What the decisions read of a session."""

    @property
    def mode(self) -> ReplayMode: ...

    @property
    def allow_live_tools(self) -> frozenset[str]: ...

    @property
    def live_llms(self) -> frozenset[str]: ...

    @property
    def approve(self) -> Approver | None: ...


# --- the options, checked when a session is built -------------------------------------------------


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


def names(values: Iterable[str], what: str) -> frozenset[str]:
    """An allowlist option as a set of names (a bare string is refused, not split into letters)."""
    if isinstance(values, str):
        raise TypeError(f"{what} takes a collection of names, not a string")
    return frozenset(values)


def check_options(
    mode: ReplayMode, allow_live_tools: frozenset[str], live_llms: frozenset[str]
) -> None:
    """:class:`ReplayModeError` for allowlists that mean nothing in ``mode`` (or are missing)."""
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


def check_selectors(live_llms: frozenset[str], plan: Sequence[RecordedCall]) -> None:
    """:class:`ReplayModeError` for a hybrid selector that is malformed or selects no recorded
    LLM call: a typo would otherwise give a frozen replay that reports MATCHED."""
    recorded = sorted(
        {(rc.event.provider, rc.event.model) for rc in plan if isinstance(rc.event, LlmRequest)}
    )
    shown = ", ".join(f"{p}/{m}" for p, m in recorded) or "none"
    for selector in sorted(live_llms):
        parts = selector.split("/")
        if not selector or len(parts) > 2 or not all(parts):
            raise ReplayModeError(
                f"live_llms selector {selector!r} is not 'provider/model', 'provider/*' or "
                f"'model' (recorded LLMs: {shown})"
            )
        if not any(_matches_llm(selector, p, m) for p, m in recorded):
            raise ReplayModeError(
                f"live_llms selector {selector!r} matches no recorded LLM call, so nothing would "
                f"run live (recorded LLMs: {shown})"
            )


# --- per call --------------------------------------------------------------------------------------


def _matches_llm(selector: str, provider: str | None, model: str | None) -> bool:
    if "/" in selector:
        sel_provider, sel_model = selector.split("/", 1)
        return sel_provider == provider and sel_model in ("*", model)
    return selector == model


def effective_policy(call: BoundaryCall, expected: RecordedCall) -> EffectivePolicy:
    """The recorded policy and the one today's code declares at the boundary, together: a
    bundle can never loosen the code."""
    return EffectivePolicy(expected.policy, call.policy)


def policy_note(policy: EffectivePolicy) -> str | None:
    """Reported on the call (not raised) when the bundle and the code disagree."""
    if not policy.disagree:
        return None
    return (
        f"replay policy: recorded {policy.recorded.value!r}, this code declares "
        f"{policy.declared.value!r}; the restrictions of both apply"
    )


def verdict_for(rules: Rules, call: BoundaryCall, policy: EffectivePolicy) -> Verdict:
    """Execute, substitute or deny, from the mode, the allowlists and the effective policy."""
    mode = rules.mode
    if mode in (ReplayMode.FROZEN, ReplayMode.MANUAL):
        return Verdict.SUBSTITUTE
    if policy.never_live:
        return Verdict.SUBSTITUTE  # forbidden is refused by refuse_matched before this matters
    if mode is ReplayMode.HYBRID:
        selected = call.kind == "llm" and any(
            _matches_llm(s, call.provider, call.model) for s in rules.live_llms
        )
        return Verdict.EXECUTE if selected else Verdict.SUBSTITUTE
    if call.kind == "llm":  # live
        return Verdict.EXECUTE
    return Verdict.EXECUTE if call.name in rules.allow_live_tools else Verdict.DENY


def _refused(
    call: BoundaryCall, position: int, reason: str, expected: RecordedCall | None = None
) -> ReplayPolicyError:
    # descriptions are built only on the way to an error: the hot path never pays for them
    return ReplayPolicyError(
        reason,
        position=position,
        expected=expected.describe() if expected is not None else None,
        actual=describe_call(call),
    )


def refuse_unmatched(rules: Rules, call: BoundaryCall, position: int) -> None:
    """Refusals that come before matching, since no recorded call changes them: mode
    ``forbidden``, and mode ``manual`` without an approval callback."""
    if rules.mode is ReplayMode.FORBIDDEN:
        raise _refused(call, position, "replay mode 'forbidden' rejects every dependency call")
    if rules.mode is ReplayMode.MANUAL and rules.approve is None:
        raise _refused(
            call,
            position,
            "replay mode 'manual' needs an explicit approval for every call and no approval "
            "callback was given (ReplaySession(..., approve=...))",
        )


def refuse_matched(
    rules: Rules,
    call: BoundaryCall,
    expected: RecordedCall,
    policy: EffectivePolicy,
    verdict: Verdict,
    position: int,
) -> None:
    """Refusals of a matched call: policy ``forbidden`` (outside manual mode), a tool denied in
    live mode, and the approval a call needs (manual mode, policy ``manual`` or ``forbidden``)
    -- the approval callback is asked here, once, about the matched call. The policy is the
    effective one: what the bundle recorded and what today's code declares."""
    mode = rules.mode
    if policy.forbidden and mode is not ReplayMode.MANUAL:
        subject = (
            f"the recorded call {expected.event.id} has replay policy 'forbidden'"
            if policy.recorded is ReplayPolicy.FORBIDDEN
            else f"the call {expected.event.id} has {policy.who(ReplayPolicy.FORBIDDEN)}"
        )
        raise _refused(
            call,
            position,
            f"{subject}: it is never replayed automatically, whatever the mode or allowlist "
            "(replay it in manual mode with an explicit approval to substitute its recorded "
            "result)",
            expected,
        )
    if verdict is Verdict.DENY:
        raise _refused(
            call,
            position,
            f"tool {call.name!r} may not run live: live mode executes a tool only when it is "
            f"named in allow_live_tools (--allow-live-tool {call.name}); its body did not run "
            "and its recorded response was not consumed",
            expected,
        )
    if mode is not ReplayMode.MANUAL and not policy.needs_approval:
        return
    if mode is ReplayMode.MANUAL:
        why = "manual mode"
    elif policy.recorded in (ReplayPolicy.MANUAL, ReplayPolicy.FORBIDDEN):
        why = f"recorded policy {policy.recorded.value!r}"
    else:
        why = policy.who(policy.declared)
    _ask_approval(rules, call, expected, why, position, expected)


def _ask_approval(
    rules: Rules,
    call: BoundaryCall,
    subject: RecordedCall,
    why: str,
    position: int,
    expected: RecordedCall | None,
) -> None:
    """Ask the approval callback about ``subject``; refuse the call unless it says yes."""
    what = label(call.kind, call.name, call.provider, call.model)
    approve = rules.approve
    if approve is None:
        raise _refused(
            call,
            position,
            f"{what} needs an explicit approval ({why}) and no approval callback was "
            "given (ReplaySession(..., approve=...))",
            expected,
        )
    if not approve(subject):
        raise _refused(
            call,
            position,
            f"{what} needs an explicit approval ({why}) and was not approved",
            expected,
        )


def refuse_after_fork(rules: Rules, call: BoundaryCall, fork_at: int, position: int) -> None:
    """Refusals of a call after the fork point of a fork, where the run is live and no recorded
    call stands for the call: its policy (declared by today's code) and the allowlist decide as in
    ``live`` mode -- ``forbidden`` refused, ``frozen`` refused (there is nothing to substitute),
    a tool not allow-listed refused, ``manual`` asks the approval callback about the call about
    to run (:func:`~stepfork_otel.replay.fork.live_call`)."""
    policy = EffectivePolicy(call.policy, call.policy)
    after = f"after the fork point (call {fork_at}) the run is live"
    what = label(call.kind, call.name, call.provider, call.model)
    if policy.forbidden:
        raise _refused(
            call,
            position,
            f"{what} has replay policy 'forbidden': {after}, and a forbidden call never runs "
            "during a replay, allow-listed or not; its body did not run",
        )
    if policy.never_live:
        raise _refused(
            call,
            position,
            f"{what} has replay policy 'frozen': it is only ever substituted from a recording, "
            f"and {after}, with no recorded call to substitute; its body did not run",
        )
    if verdict_for(rules, call, policy) is Verdict.DENY:
        raise _refused(
            call,
            position,
            f"tool {call.name!r} may not run live: {after}, and a tool runs only when it is "
            f"named in allow_live_tools (--allow-live-tool {call.name}); its body did not run",
        )
    if policy.needs_approval:
        subject = live_call(call, position)
        _ask_approval(rules, call, subject, policy.who(ReplayPolicy.MANUAL), position, None)


def untraced_tool(
    rules: Rules, call: BoundaryCall, position: int, untraced: frozenset[str]
) -> bool:
    """A tool the recording never traced (``run.untraced_tools`` of an imported trace: the model
    called it, no span shows it running): True -- run it live, unrecorded (mode ``live`` and
    named in ``allow_live_tools``); False -- not such a tool. Else the call is refused: there is
    no recorded result to serve."""
    if call.kind != "tool" or call.name not in untraced:
        return False
    if rules.mode is ReplayMode.LIVE and call.name in rules.allow_live_tools:
        return True
    raise _refused(
        call,
        position,
        f"tool {call.name!r} ran untraced in the recording: the imported trace holds no span "
        "of its runs (its instrumentation records the model's tool calls and the results sent "
        "back, not the tool: no execute_tool or TOOL span), so there is no recorded result to "
        f"serve; run it for real with mode 'live' and --allow-live-tool {call.name}, or trace "
        "the tool when recording (a framework instrumentation writes tool spans)",
    )


def refuse_outside(call: BoundaryCall, state: str) -> ReplaySessionError:
    """The refusal of a call that reached a session outside its life (``state`` ``new`` or
    ``closed``) or, while it is active, from a context that does not carry it."""
    actual = describe_call(call)
    if state != "active":
        reason = (
            f"{actual.label()} reached a ReplaySession that is not active (it "
            f"{'was never entered' if state == 'new' else 'already exited'}); "
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
    return ReplaySessionError(reason, actual=actual)
