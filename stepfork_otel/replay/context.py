"""Where the boundaries find the active replay session, and the contract between a boundary and a
session (``begin_call`` before the body could run, ``end_call`` after an executed body).

It lives in its own small module so that the boundaries (recording code) can consult it without
importing the replay machinery: an application that never replays pays one ``ContextVar.get()``
and one empty-list test per call.

The session is held in a context variable, so asyncio tasks and threads started with a copy of
the context (``asyncio.to_thread``, ``contextvars.copy_context().run``) see it, and two sessions
in two contexts do not see each other. A context variable alone has a hole, though: a thread
started *without* the context (``threading.Thread``, ``ThreadPoolExecutor.submit``) sees no
session, so its boundary calls would run their real bodies, unmatched -- exactly the silent live
fallback replay promises never to make. So :data:`current_session` also knows which sessions are
active in the process: a boundary that finds no session in its own context while one is active
is handed that session, which refuses the call (``ReplaySessionError``) and records the refusal.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stepfork_otel.trace.policy import ReplayPolicy

if TYPE_CHECKING:
    from stepfork_otel.recording.payload import Payload
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


class SessionSlot:
    """The active replay session: the one in this context, else (to be refused) one active in the
    process. Used like a ``ContextVar``: ``get()``, ``set()``, ``reset()``."""

    def __init__(self) -> None:
        self._var: ContextVar[ReplaySession | None] = ContextVar(
            "stepfork_replay_session", default=None
        )
        self._lock = threading.Lock()
        self._active: list[ReplaySession] = []

    def get(self) -> ReplaySession | None:
        """The session a boundary must consult (None: not replaying, record as usual)."""
        session = self._var.get()
        if session is not None or not self._active:
            return session
        with self._lock:  # a call from a context without the session: let a session refuse it
            return self._active[-1] if self._active else None

    def in_context(self) -> ReplaySession | None:
        """The session set in *this* context only."""
        return self._var.get()

    def set(self, session: ReplaySession) -> Token[ReplaySession | None]:
        """Make ``session`` the active one in this context and in the process."""
        with self._lock:
            self._active.append(session)
        return self._var.set(session)

    def reset(self, token: Token[ReplaySession | None], session: ReplaySession) -> None:
        """Undo :meth:`set` (same context) and mark ``session`` no longer active."""
        with self._lock:
            if session in self._active:
                self._active.remove(session)
        self._var.reset(token)


current_session = SessionSlot()
"""The active replay session (see the module docstring)."""
