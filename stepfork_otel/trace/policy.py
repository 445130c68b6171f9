"""Replay policies (recorded per call) and replay modes (chosen per session).

A *mode* is what the person replaying asks for; a *policy* is what the person who wrote the tool
allowed. When they disagree the stricter one wins, whatever the session mode.
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
