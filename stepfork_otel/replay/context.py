"""The context variable that holds the active replay session, and the contract between a boundary
and a session.

It lives in its own small module so that the boundaries (recording code) can consult it without
importing the replay machinery: an application that never replays pays one ``ContextVar.get()``
per call.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stepfork_otel.trace.policy import ReplayPolicy

if TYPE_CHECKING:
    from stepfork_otel.record.payload import Payload
    from stepfork_otel.replay.session import ReplaySession


@dataclass(slots=True)
class BoundaryCall:
    """Everything a boundary knows about a call before its body could run."""

    kind: Literal["tool", "llm"]
    name: str
    """Tool name, or the model for an LLM call."""
    input: Payload
    policy: ReplayPolicy
    provider: str | None = None
    model: str | None = None
    operation: str | None = None
    model_fingerprint: str | None = None
    output_type: Any = None
    """Type to rebuild a substituted value into (a tool's return annotation, ``response_type``)."""


@dataclass(slots=True)
class ReplayDecision:
    """What the session decided for one call."""

    action: Literal["substituted", "executed"]
    value: Any = None
    """The substituted value (when ``action == "substituted"`` and ``error`` is None)."""
    output: Payload | None = None
    """The recorded output that was substituted, as recorded."""
    error: BaseException | None = None
    """A recorded failure to raise instead of returning (``RecordedDependencyError``)."""
    handle: Any = field(default=None, repr=False)
    """Session-private state passed back to ``end_call``."""


current_session: ContextVar[ReplaySession | None] = ContextVar(
    "stepfork_replay_session", default=None
)
