"""The contract between a boundary and a replay session, and where the boundaries find the session.

This is the only module of ``recording/`` that ``replay/`` imports, and the boundaries never
import ``replay/``: they talk to whatever sits in :data:`current_session` through the
:class:`Replayer` protocol. An application that never replays pays one ``ContextVar.get()`` and
one empty-list test per call.

The exchange, once per call:

1. the boundary builds a :class:`BoundaryCall` (everything known before the body could run) and
   asks :meth:`Replayer.begin_call`, which raises a replay error (mismatch, policy) or returns a
   :class:`ReplayDecision`;
2. ``substituted``: the boundary returns :attr:`ReplayDecision.value` (or raises
   :attr:`ReplayDecision.error`) and never runs the body; ``executed``: it runs the body and
   reports the outcome with :meth:`ReplayDecision.end`;
3. if stepfork itself fails after the decision (the span cannot be opened), the boundary calls
   :meth:`ReplayDecision.abandon`, so the session reports the call instead of counting it as
   replayed.

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
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from stepfork_otel.constants import ACTION_SUBSTITUTED, DecidedAction
from stepfork_otel.trace.payload import Payload
from stepfork_otel.trace.policy import ReplayMode, ReplayPolicy

CallKind = Literal["tool", "llm"]


@dataclass(slots=True)
class BoundaryCall:
    """Everything a boundary knows about a call before its body could run."""

    kind: CallKind
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
    input_hint: str | None = None
    """What the input is, said when it differs from the recording (an SDK integration: the
    request as sent); None: the boundary's usual wording."""


@dataclass(slots=True, eq=False)
class ReplayDecision:
    """What the session decided for one call. The session returns a subclass that implements
    :meth:`end` and :meth:`abandon`; the boundary only reads the fields and calls those two."""

    action: DecidedAction
    value: Any = None
    """The substituted value (when ``action == "substituted"`` and ``error`` is None)."""
    output: Payload | None = None
    """The recorded output that was substituted, as recorded."""
    error: BaseException | None = None
    """A recorded failure to raise instead of returning (``RecordedDependencyError``)."""

    @property
    def substituted(self) -> bool:
        return self.action == ACTION_SUBSTITUTED

    def end(self, output: Payload | None, error: BaseException | None) -> None:
        """An executed body returned (its recorded ``output``) or raised ``error``."""

    def abandon(self, error: BaseException) -> None:
        """stepfork failed after the decision: the call raised ``error`` instead of delivering
        its recorded result or running its body."""

    def note(self, text: str) -> None:
        """Say in the replay report how the boundary served the recorded value (a stream rebuilt
        from a recorded final message)."""

    def diverged(self, reason: str) -> BaseException:
        """The error to raise when the run departs from this call's recording *after* the
        decision (a substituted stream read past its recorded end); the session records it."""
        return RuntimeError(reason)

    def failure(self, error_type: str, message: str) -> BaseException:
        """The error a recorded failure ``(type, redacted message)`` is replayed as, when it
        comes after the decision (a stream that broke after its recorded chunks)."""
        return RuntimeError(f"{error_type}: {message}")


class Site(NamedTuple):
    """Where the run's code read the clock, randomness, a uuid or the environment: the module,
    the function (qualified name) and the line (``recording/determinism.py``)."""

    module: str
    function: str
    line: int
    offset: int = 0
    """Lines from the start of the function (what replay compares: an edit elsewhere in the file
    moves ``line``, not this)."""
    thread: str | None = None
    """Which of the run's threads and tasks read: None for the one the run started in, ``"2"``
    for the second its own code started, ``"2.1"`` for the first that one started (the numbering
    is ``recording/determinism.py``'s; replay serves each its own values)."""

    def __str__(self) -> str:
        return f"{self.module}:{self.function}:{self.line}"


class Replayer(Protocol):
    """What a boundary needs of a replay session."""

    @property
    def mode(self) -> ReplayMode: ...

    def expected_input(self) -> tuple[str, str] | None:
        """Text and verified fingerprint of the recorded input expected next (a hint that spares
        hashing an identical live input), or None."""
        ...

    def begin_call(self, call: BoundaryCall) -> ReplayDecision:
        """Decide a call before its body could run; raises a replay error to refuse it."""
        ...

    def serve_read(self, group: str, source: str, site: Site) -> tuple[bool, Any]:
        """A read of a captured source (``group`` ``time``, ``random``, ...) by the run's code at
        ``site``: ``(True, recorded JSON value)`` to serve it, ``(False, None)`` to read live (the
        recording did not capture the group, or a lenient session after a mismatch). Raises a
        replay error when the read departs from the recording."""
        ...

    @property
    def serves_reads(self) -> bool:
        """Whether the recording captured values this session serves."""
        ...

    def read_diverged(self, source: str, site: Site, reason: str) -> BaseException:
        """The error to raise when a served read could not be reproduced (a random function
        that drew differently); the session records it."""
        ...


class SessionSlot:
    """The active replay session: the one in this context, else (to be refused) one active in the
    process. Used like a ``ContextVar``: ``get()``, ``set()``, ``reset()``."""

    def __init__(self) -> None:
        self._var: ContextVar[Replayer | None] = ContextVar("stepfork_replay_session", default=None)
        self._lock = threading.Lock()
        self._active: list[Replayer] = []
        self._listeners: list[Callable[[Replayer, bool], None]] = []

    def add_listener(self, listener: Callable[[Replayer, bool], None]) -> None:
        """Call ``listener(session, True)`` when a session becomes active and
        ``listener(session, False)`` when it stops (the determinism capture installs its
        interception for a session's life)."""
        self._listeners.append(listener)

    def get(self) -> Replayer | None:
        """The session a boundary must consult (None: not replaying, record as usual)."""
        session = self._var.get()
        if session is not None or not self._active:
            return session
        with self._lock:  # a call from a context without the session: let a session refuse it
            return self._active[-1] if self._active else None

    def in_context(self) -> Replayer | None:
        """The session set in *this* context only."""
        return self._var.get()

    def set(self, session: Replayer) -> Token[Replayer | None]:
        """Make ``session`` the active one in this context and in the process."""
        with self._lock:
            self._active.append(session)
        token = self._var.set(session)
        for listener in self._listeners:
            listener(session, True)
        return token

    def reset(self, token: Token[Replayer | None], session: Replayer) -> None:
        """Undo :meth:`set` (same context) and mark ``session`` no longer active."""
        with self._lock:
            active = session in self._active
            if active:
                self._active.remove(session)
        self._var.reset(token)
        if active:
            for listener in self._listeners:
                listener(session, False)


current_session = SessionSlot()
"""The active replay session (see the module docstring)."""
