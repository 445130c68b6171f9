"""Replay policies (recorded per call) and replay modes (chosen per session).

A *mode* is what the person replaying asks for; a *policy* is what the person who wrote the tool
allowed. When they disagree the stricter one wins, whatever the session mode.

A call's policy is said twice: by the bundle (recorded with the call) and by today's code (the
``replay_policy=`` of the boundary the replayed call goes through). Both hold: a bundle can never
loosen the code -- an old bundle, one edited by a word, or one rebuilt from spans that lost the
attribute -- and code can only tighten what was recorded (:class:`EffectivePolicy`).
"""

from __future__ import annotations

import enum


class ReplayPolicy(str, enum.Enum):
    """How a recorded call may be replayed. Set with ``@trace_tool(replay_policy=...)``."""

    REPLAYABLE = "replayable"
    """Default. The session mode decides: substituted when frozen, run when live and allowed."""
    FROZEN = "frozen"
    """Only ever substituted from the recording; never executed, not even in ``live`` mode or
    when allow-listed (a read from a production system whose result is fine to reuse)."""
    MANUAL = "manual"
    """Needs an explicit approval in every mode; once approved the session mode decides."""
    FORBIDDEN = "forbidden"
    """Never replayed automatically (a side-effecting tool such as a payment): every mode raises
    ``ReplayPolicyError`` at this call. In ``manual`` mode an approval lets the recorded result be
    substituted; the body is never executed during replay."""

    @classmethod
    def parse(cls, value: ReplayPolicy | str) -> ReplayPolicy:
        if isinstance(value, cls):  # the common case (every llm_request call): no lookup
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(p.value for p in cls)
            raise ValueError(
                f"unknown replay_policy {value!r}; expected one of: {allowed}"
            ) from None


class EffectivePolicy:
    """What the recorded and the declared policy of a call say together: every restriction of
    either holds. ``frozen`` with ``manual`` is an approval *and* never a live run."""

    __slots__ = ("declared", "recorded")

    def __init__(self, recorded: ReplayPolicy, declared: ReplayPolicy) -> None:
        self.recorded = recorded
        self.declared = declared

    def _says(self, *policies: ReplayPolicy) -> bool:
        return self.recorded in policies or self.declared in policies

    @property
    def forbidden(self) -> bool:
        """Never replayed automatically (only an approval in manual mode substitutes it)."""
        return self._says(ReplayPolicy.FORBIDDEN)

    @property
    def never_live(self) -> bool:
        """Only ever substituted: ``frozen`` or ``forbidden``."""
        return self._says(ReplayPolicy.FROZEN, ReplayPolicy.FORBIDDEN)

    @property
    def needs_approval(self) -> bool:
        """An explicit approval in every mode: ``manual`` or ``forbidden``."""
        return self._says(ReplayPolicy.MANUAL, ReplayPolicy.FORBIDDEN)

    @property
    def disagree(self) -> bool:
        return self.recorded is not self.declared

    def who(self, policy: ReplayPolicy) -> str:
        """Who says ``policy``: the recording, this code, or both."""
        if self.recorded is policy and self.declared is policy:
            return f"replay policy {policy.value!r}"
        if self.declared is policy:
            return (
                f"replay policy {policy.value!r} declared by this code (recorded: "
                f"{self.recorded.value!r})"
            )
        return f"recorded replay policy {policy.value!r}"


class ReplayMode(str, enum.Enum):
    """What a replay session does with each boundary call."""

    FROZEN = "frozen"
    """Return the recorded result; never execute a dependency body."""
    HYBRID = "hybrid"
    """Run the selected LLMs (by provider/model) again; keep every tool frozen."""
    LIVE = "live"
    """Match, then execute LLMs; execute a tool only when named in ``allow_live_tools``."""
    FORBIDDEN = "forbidden"
    """Reject every dependency call with ``ReplayPolicyError``."""
    MANUAL = "manual"
    """Reject every call that the approval callback has not approved; approved calls are
    substituted from the recording."""
    DERIVED = "derived"
    """Reserved; rejected."""
