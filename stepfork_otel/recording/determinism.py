"""Determinism capture: the clock, randomness, uuids and the environment, recorded at their call
sites and served back in replay.

An agent reads nondeterministic values on the way to its calls -- ``"Today is {date}"`` in a
system prompt, a ``uuid4()`` as a tool-call id, a random jitter -- so a replay of unchanged code
would diverge at the first LLM call and blame the prompt. With ``record(..., capture=...)`` the
reads are recorded with their value and their call site; a replay of the bundle serves the values
back in the recorded order and checks that each read comes from the same place.

**What is intercepted.** The names the documented sources are reached by (the list is
``trace.captured.SOURCES``): the
module attributes (``time.time``, ``random.choice``, ``uuid.uuid4``, ``os.urandom``,
``secrets.token_hex``, ...) are replaced while a capturing run or a replay session is active, and
so are names the run's own modules imported from them (``from time import time``), and in those
modules ``datetime``/``date`` (classes or the module) become subclasses whose ``now``/``utcnow``/
``today`` are captured -- the ``datetime`` module itself is left alone, so nothing else in the
process sees another class. Environment variables are read through ``os._Environ.__getitem__``.
When no run captures and no session replays, nothing is replaced: ``time.time()`` costs exactly
what it did. The replacing and the putting back go through ``stepfork_otel/_patching.py`` (one
patcher for the sources, one for the run's own modules' names): what was there when the first
run or session started is put back when the last one ends -- a clock another library had set
before stays that library's.

**Whose reads.** Only reads made in the run's context (the run's context variable, so threads
started with a copied context and asyncio tasks are covered) by the run's *own* code: the caller's
file must not be the standard library, an installed package (``site-packages``/``dist-packages``)
or stepfork itself -- the SDK's retry jitter, the OTel SDK's clock and stepfork's call numbering
are never captured -- unless its module is in one of the packages named by
``configure(capture_packages=...)`` (an agent deployed as an installed package). Nor are reads
inside a boundary's body (a ``@trace_tool`` function, the body of an ``llm_request``): that body
is the dependency; frozen replay does not run it, and a body that runs live reads live. Monotonic clocks (``time.monotonic``, ``perf_counter``) are not sources, so
timeouts and durations keep working.

**Whose thread.** Each read also says which of the run's threads and asyncio tasks made it,
numbered in the order the run's own code started them (see "whose thread" below), so that
replay serves each thread its own values whatever order the threads read in.

**Where the values go.** Reads since the previous boundary call are written, as one JSON
attribute (:data:`~stepfork_otel.constants.CAPTURED`), on the span of the next boundary call when
it starts; the reads after the last call go on the run span when it ends. So they travel with the
spans -- written with the call, exported over OTLP, rebuilt by ``stepfork import`` -- and the
one span -> event conversion puts them in the bundle (``Trace.captured``). In a replay, a read the
session does not serve is read live -- and recorded, when a run records the replay (a fork's live
part, ``ReplaySession(..., fork_at=N, record_to=...)``).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as _dt
import functools
import itertools
import logging
import os
import random
import secrets
import site
import sys
import sysconfig
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from opentelemetry import context as context_api

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors, internal_error
from stepfork_otel._patching import Patcher
from stepfork_otel.config import CONFIG
from stepfork_otel.recording.contract import Replayer, Site, current_session
from stepfork_otel.trace.captured import RANDOM_FUNCTIONS, env_fingerprint, env_salting

logger = logging.getLogger("stepfork_otel")

__all__ = [
    "CaptureRun",
    "acquire",
    "capture_groups",
    "env_fingerprint",
    "in_body",
    "mark_body",
    "package_names",
    "release",
    "start_run",
    "take_pending",
]


# --- call sites ------------------------------------------------------------------------------------


def _library_roots() -> tuple[str, ...]:
    roots: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with handle_internal_errors("finding the library paths"):
            path = sysconfig.get_paths().get(key)
            if path:
                roots.add(os.path.realpath(path))
    with handle_internal_errors("finding the site-packages paths"):
        for path in [*site.getsitepackages(), site.getusersitepackages()]:
            roots.add(os.path.realpath(path))
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # stepfork_otel/
    return tuple(sorted(roots))


_LIBRARY_ROOTS = _library_roots()
_PACKAGE_DIRS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_user_frames: dict[tuple[str, Any], bool] = {}
#: The ``capture_packages`` the frame verdicts above were made with (cleared when they change).
_user_frames_packages: tuple[str, ...] = ()


def package_names(value: str | Iterable[str]) -> tuple[str, ...]:
    """``configure(capture_packages=...)`` checked: import names (``my_agent``, ``acme.agent``).
    Raises ``TypeError`` / ``ValueError`` naming what is wrong."""
    names = (value,) if isinstance(value, str) else tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"capture_packages takes package names (str), not {name!r}")
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"capture_packages: {name!r} is not a package's import name")
        if _in_packages("stepfork_otel", (name,)) or _in_packages(name, ("stepfork_otel",)):
            raise ValueError("capture_packages: stepfork_otel's own reads are never captured")
    return names


def _in_packages(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@functools.lru_cache(maxsize=8192)
def _is_user_file(filename: str) -> bool:
    """Whether code from ``filename`` is the run's own: not the standard library, an installed
    package or stepfork."""
    if any(part in filename for part in _PACKAGE_DIRS):
        return False
    real = os.path.realpath(filename)
    return not any(real == root or real.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


def _is_user_frame(filename: str, namespace: dict[str, Any], packages: tuple[str, ...]) -> bool:
    if packages:  # named as the run's own wherever it is installed
        name = namespace.get("__name__")
        if isinstance(name, str) and _in_packages(name, packages):
            return True
    if not filename.startswith("<"):
        return _is_user_file(filename)
    # Frozen, built-in or generated code (``<frozen os>``, a dataclass's ``__init__`` made by
    # ``exec``): it belongs to the module whose globals it runs in; a REPL's has no file.
    module_file = namespace.get("__file__")
    if isinstance(module_file, str):
        return _is_user_file(module_file)
    return not filename.startswith("<frozen")


def _is_own(frame: types.FrameType) -> bool:
    """Whether ``frame`` runs the run's own code (remembered per file and module)."""
    global _user_frames_packages
    code = frame.f_code
    namespace = frame.f_globals
    packages = CONFIG.settings.capture_packages
    if packages is not _user_frames_packages:
        _user_frames.clear()
        _user_frames_packages = packages
    key = (code.co_filename, namespace.get("__name__"))
    user = _user_frames.get(key)
    if user is None:
        user = _user_frames[key] = _is_user_frame(code.co_filename, namespace, packages)
    return user


def _site_of(frame: types.FrameType | None, owner: object = None) -> Site | None:
    """The call site of ``frame`` when it is the run's own code, else None; with the number of
    the thread of the run or session ``owner`` this context is (None: the one it started in)."""
    if frame is None or not _is_own(frame):
        return None
    code = frame.f_code
    function = getattr(code, "co_qualname", code.co_name)
    line = frame.f_lineno
    lane = _lane.get()
    thread = lane.path if lane is not None and lane.owner is owner else None
    return Site(_module_name(frame.f_globals), function, line, line - code.co_firstlineno, thread)


def _module_name(namespace: dict[str, Any]) -> str:
    """The module's import name -- for ``python agent.py`` (``__main__``) the name it would be
    imported by, so a run recorded as a script replays from a test that imports it."""
    name = namespace.get("__name__")
    if name != "__main__":
        return name if isinstance(name, str) else "?"
    spec = namespace.get("__spec__")
    spec_name = getattr(spec, "name", None)
    if isinstance(spec_name, str) and spec_name != "__main__":
        return spec_name.removesuffix(".__main__")
    filename = namespace.get("__file__")
    if isinstance(filename, str):
        return os.path.splitext(os.path.basename(filename))[0]
    return "__main__"


# --- inside a boundary body ------------------------------------------------------------------------

_BODY_KEY = context_api.create_key("stepfork_in_boundary_body")


def mark_body(context: context_api.Context) -> context_api.Context:
    """``context`` marked as a boundary body's (the boundaries attach it while the body runs)."""
    return context_api.set_value(_BODY_KEY, True, context)


def in_body() -> bool:
    """Whether the current context is inside a boundary's body."""
    return context_api.get_value(_BODY_KEY) is True


# --- whose thread: the run's threads and tasks numbered as its own code starts them --------------
#
# Threads that read at one call site need not read in the recorded order in replay, so each read
# says which of the run's threads made it, and replay serves each thread its own values. An OS
# thread id is no name for that (a pool's workers take whichever task is free, and the ids differ
# in every process), nor is the order in which threads first read (that is the interleaving
# itself). What replays deterministically is the order in which the run's *own* code starts them:
# a context copied for a thread (``contextvars.copy_context()``, which ``asyncio.to_thread`` calls
# too) or for an asyncio task (``create_task``, ``gather``, a ``TaskGroup``) is the next child of
# the thread that copies it, numbered in that thread's program order. The thread the run started
# in is None; its children ``"1"``, ``"2"``; their children ``"2.1"``. A copy made by a library or
# inside a boundary body (which frozen replay does not run), or one whose caller waits for it
# (``asyncio.run``), is no new thread: it reads as its parent.


@dataclass(eq=False, slots=True)
class _Lane:
    """One of the run's threads or tasks: its number, and the count of those it started."""

    owner: object
    """The capturing run or replay session it belongs to (a context left from another run's
    thread is not one of this run's)."""
    path: str | None
    started: Iterator[int] | None = None
    """Numbers the threads it starts (made by the first: most tasks start none)."""

    def child(self) -> _Lane:
        counter = self.started
        if counter is None:
            with _lanes_lock:
                if self.started is None:
                    self.started = itertools.count(1)
                counter = self.started
        number = next(counter)  # (atomic: a C iterator)
        return _Lane(self.owner, str(number) if self.path is None else f"{self.path}.{number}")


_lanes_lock = threading.Lock()


_lane: ContextVar[_Lane | None] = ContextVar("stepfork_capture_thread", default=None)
#: The thread each capturing run and replay session started in, by ``id`` of the run or session.
_roots: dict[int, _Lane] = {}


_ASYNCIO_DIR = os.path.dirname(asyncio.__file__) + os.sep
#: asyncio code that runs the task it creates while its caller waits for it: the task continues
#: its caller's thread (``asyncio.run(main())`` inside a run, and a replay that runs ``main``
#: itself, agree; and ``wait_for`` makes a task on some Python versions only).
_WAITED_FOR = frozenset(
    {
        asyncio.base_events.BaseEventLoop.run_until_complete.__code__,
        asyncio.tasks.wait_for.__code__,
        asyncio.tasks.shield.__code__,
    }
)
_TO_THREAD = asyncio.threads.to_thread.__code__
#: How many of asyncio's own frames a task's creation is traced through to the code that asked.
_ASYNCIO_DEPTH = 8


def _copied_by_own_code(frame: types.FrameType | None) -> bool:
    """Whether a context copied by ``frame`` starts a thread of the run's own: the run's own
    code copies it, or ``asyncio.to_thread`` does for it. (asyncio's callbacks -- a timer, a
    reader -- get a copy too; they are not threads the run started.)"""
    if frame is not None and frame.f_code is _TO_THREAD:
        frame = frame.f_back
    return frame is not None and _is_own(frame)


def _task_by_own_code(frame: types.FrameType | None) -> bool:
    """Whether a task created by ``frame`` is started by the run's own code: through asyncio's
    own frames (``create_task``, ``gather``, ``ensure_future``, a ``TaskGroup``), the code that
    asked is the run's, and no asyncio code on the way waits for the task."""
    for _ in range(_ASYNCIO_DEPTH):
        if frame is None or frame.f_code in _WAITED_FOR:
            return False
        if not frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
            return _is_own(frame)
        frame = frame.f_back
    return False


def _fork(
    frame: types.FrameType | None, started: Callable[[types.FrameType | None], bool]
) -> _Lane | None:
    """The thread a context copied now starts (``frame``: the copy's caller; ``started``: whether
    that is the run's own code starting a thread), or None when the copy is not a new thread of
    the run: nothing captures or replays here, or it is made inside a boundary body, or not for
    the run's own code."""
    session = current_session.in_context()
    owner: object = session if session is not None else _run.get()
    if owner is None or in_body() or not started(frame):
        return None
    lane = _lane.get()
    if lane is None or lane.owner is not owner:
        lane = _roots.get(id(owner))
        if lane is None or lane.owner is not owner:
            return None
    return lane.child()


_real_copy_context = contextvars.copy_context


def _copy_context() -> contextvars.Context:
    context = _real_copy_context()
    with handle_internal_errors("numbering a thread of the run"):
        lane = _fork(sys._getframe(1), _copied_by_own_code)
        if lane is not None:
            context.run(_lane.set, lane)
    return context


_real_create_task = asyncio.base_events.BaseEventLoop.create_task


def _create_task(
    self: asyncio.base_events.BaseEventLoop, coro: Any, *args: Any, **kwargs: Any
) -> Any:
    lane = None
    if kwargs.get("context") is None:
        try:
            lane = _fork(sys._getframe(1), _task_by_own_code)
        except Exception:  # (a try costs nothing until it fails: tasks can be many)
            internal_error("numbering a task of the run")
    if lane is None:
        return _real_create_task(self, coro, *args, **kwargs)
    # A task copies the context it is created in (a task factory's too; Python 3.10 takes no
    # ``context=``): for that moment, this context is the new thread's.
    token = _lane.set(lane)
    try:
        return _real_create_task(self, coro, *args, **kwargs)
    finally:
        _lane.reset(token)


# --- the recording side ----------------------------------------------------------------------------


def capture_label(groups: frozenset[str], audit: bool) -> str:
    """``stepfork.capture`` of a run: ``audit``, or its groups comma-separated."""
    return k.CAPTURE_AUDIT if audit else ",".join(sorted(groups))


def capture_groups(capture: str | Iterable[str] | None) -> tuple[frozenset[str], bool]:
    """``(groups, audit)`` of a ``capture=`` argument; raises ``ValueError`` for an unknown name.

    ``"all"`` is every group; ``"audit"`` records no values but tallies every read the run made;
    None or ``()`` captures nothing."""
    if capture is None:
        return frozenset(), False
    names = [capture] if isinstance(capture, str) else list(capture)
    groups: set[str] = set()
    audit = False
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"capture: expected source names, got {type(name).__name__}")
        if name == k.CAPTURE_ALL:
            groups.update(k.CAPTURE_SOURCES)
        elif name == k.CAPTURE_AUDIT:
            audit = True
        elif name in k.CAPTURE_SOURCES:
            groups.add(name)
        else:
            known = ", ".join(repr(s) for s in (*k.CAPTURE_SOURCES, k.CAPTURE_ALL, k.CAPTURE_AUDIT))
            raise ValueError(f"capture: unknown source {name!r} (known: {known})")
    if audit and groups:
        raise ValueError("capture: 'audit' records no values; it cannot be combined with sources")
    return frozenset(groups), audit


@dataclass(eq=False)
class CaptureRun:
    """The reads of one recorded run (shared by its nested runs and the tasks of its context)."""

    groups: frozenset[str]
    audit: bool
    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0
    pending: list[dict[str, Any]] = field(default_factory=list)
    tally: dict[tuple[str, Site], int] = field(default_factory=dict)
    env_seen: set[str] = field(default_factory=set)

    @property
    def label(self) -> str:
        """What the run span's ``stepfork.capture`` says."""
        return capture_label(self.groups, self.audit)

    def add(self, kind: str, source: str, site: Site, **fields: Any) -> None:
        with self.lock:
            self.count += 1
            read: dict[str, Any] = {
                "index": self.count,
                "kind": kind,
                "source": source,
                "module": site.module,
                "function": site.function,
                "line": site.line,
                "offset": site.offset,
            }
            if site.thread is not None:
                read["thread"] = site.thread
            read.update(fields)
            self.pending.append(read)

    def note(self, source: str, site: Site) -> None:
        with self.lock:
            key = (source, site._replace(thread=None))  # (a tally per site, whatever the thread)
            self.tally[key] = self.tally.get(key, 0) + 1

    def take(self) -> str | None:
        """The reads since the last call as the JSON of :data:`~stepfork_otel.constants.CAPTURED`
        (None: there were none), and forget them."""
        with self.lock:
            pending, self.pending = self.pending, []
        return orjson.dumps(pending).decode() if pending else None

    def audit_json(self) -> str | None:
        with self.lock:
            tally = sorted(self.tally.items(), key=lambda item: (item[0][1], item[0][0]))
        if not tally:
            return None
        return orjson.dumps(
            [
                {
                    "source": source,
                    "module": where.module,
                    "function": where.function,
                    "line": where.line,
                    "count": count,
                }
                for (source, where), count in tally
            ]
        ).decode()


_run: ContextVar[CaptureRun | None] = ContextVar("stepfork_capture_run", default=None)


def start_run(groups: frozenset[str], audit: bool) -> tuple[CaptureRun, object] | None:
    """Start capturing in this context (``record(...)`` does, when asked); None when nothing is
    captured. A run nested in a capturing run shares its reads (one order per recorded run)."""
    outer = _run.get()
    if outer is not None:
        if (groups or audit) and (groups != outer.groups or audit != outer.audit):
            logger.warning(
                "stepfork_otel: a run nested in a capturing run captures what the outer run "
                "does (%s), not %s",
                outer.label,
                capture_label(groups, audit) or "nothing",
            )
        return None
    if not groups and not audit:
        return None
    capture = CaptureRun(groups, audit)
    token = _run.set(capture)
    _roots[id(capture)] = _Lane(capture, None)
    acquire()
    return capture, token


def stop_run(started: tuple[CaptureRun, object]) -> None:
    capture, token = started
    try:
        _run.reset(token)  # type: ignore[arg-type]
    except ValueError:  # (left from another context: the run still ends)
        _run.set(None)
    _roots.pop(id(capture), None)
    release()


def take_pending() -> str | None:
    """At a boundary call's start: the reads made since the previous call (the JSON that goes
    on its span), or None -- one context-variable read when nothing is captured."""
    capture = _run.get()
    if capture is None or not capture.pending:
        return None
    return capture.take()


# --- the sources -----------------------------------------------------------------------------------

_REAL_DATETIME = _dt.datetime
_REAL_DATE = _dt.date
_REAL_TIME_NS = time.time_ns


def _uuid_decode(value: Any) -> uuid.UUID:
    return uuid.UUID(str(value))


def _bytes_decode(value: Any) -> bytes:
    return bytes.fromhex(str(value))


def _datetime_decode(value: Any) -> _dt.datetime:
    return _REAL_DATETIME.fromisoformat(str(value))


def _identity(value: Any) -> Any:
    return value


class _Serve(NamedTuple):
    """How a read of one source is recorded and served: the JSON form of its value and back."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


_PLAIN = _Serve(_identity, _identity)
_UUID = _Serve(str, _uuid_decode)
_BYTES = _Serve(bytes.hex, _bytes_decode)
_DATETIME = _Serve(_REAL_DATETIME.isoformat, _datetime_decode)


def _whose(depth: int) -> tuple[CaptureRun | None, Replayer | None, Site] | None:
    """Who a read is for -- the capturing run or the replay session of this context -- and its
    call site; None when it is read live: nothing captures or replays here, it is made inside a
    boundary's body, or its caller is not the run's own code. ``depth``: frames from the caller
    of this function up to the caller whose site counts."""
    capture = _run.get()
    session = current_session.in_context()
    if (capture is None and session is None) or in_body():
        return None
    where = _site_of(sys._getframe(depth + 1), capture if session is None else session)
    return None if where is None else (capture, session, where)


def _records(capture: CaptureRun, group: str, source: str, where: Site) -> bool:
    """Whether the run records this read's value (an audit only counts it)."""
    if capture.audit:
        capture.note(source, where)
        return False
    return group in capture.groups


def _read(group: str, source: str, serve: _Serve, live: Callable[[], Any], depth: int = 2) -> Any:
    """One read of ``source``: served by a replay session, recorded by a capturing run, or live.
    ``depth``: frames from here up to the caller whose site counts."""
    whose = _whose(depth)
    if whose is None:
        return live()
    capture, session, where = whose
    if session is not None:
        served, value = session.serve_read(group, source, where)
        if served:
            return serve.decode(value)
        if capture is None:
            return live()
    assert capture is not None  # (a read live in a replay that a run records: recorded)
    if not _records(capture, group, source, where):
        return live()
    result = live()
    with handle_internal_errors("capturing a read"):
        capture.add("value", source, where, value=serve.encode(result))
    return result


def _stand_in(
    captured: Callable[..., Any], real: Callable[..., Any], source: str
) -> Callable[..., Any]:
    """``captured`` dressed as ``real`` (name, docstring, ``__wrapped__``), naming its source."""
    captured.__name__ = getattr(real, "__name__", source)
    captured.__qualname__ = getattr(real, "__qualname__", source)
    captured.__doc__ = getattr(real, "__doc__", None)
    captured.__wrapped__ = real  # type: ignore[attr-defined]
    captured._stepfork_source = source  # type: ignore[attr-defined]
    return captured


def _wrap(group: str, source: str, real: Callable[..., Any], serve: _Serve) -> Callable[..., Any]:
    def captured(*args: Any, **kwargs: Any) -> Any:
        return _read(group, source, serve, lambda: real(*args, **kwargs))

    return _stand_in(captured, real, source)


def _wrap_clock(
    source: str, real: Callable[..., Any], pure_from: int, serve: _Serve
) -> Callable[..., Any]:
    """``time.strftime`` / ``ctime`` / ``localtime`` / ``gmtime``: a read of the clock only when
    the time argument is left out (``pure_from``: the position of that argument); given one,
    they are plain functions of it and are not captured."""

    def captured(*args: Any, **kwargs: Any) -> Any:
        if kwargs or (len(args) > pure_from and args[pure_from] is not None):
            return real(*args, **kwargs)
        return _read(k.CAPTURE_TIME, source, serve, lambda: real(*args))

    return _stand_in(captured, real, source)


def _struct_time_decode(value: Any) -> time.struct_time:
    return time.struct_time(tuple(int(v) for v in value))


_STRUCT_TIME = _Serve(lambda t: list(t), _struct_time_decode)


class _Tape(random.Random):
    """A ``random.Random`` whose two primitives (``random()`` and ``getrandbits()``) are drawn
    from the process's global generator and written down while recording, or read back from a
    recorded list in replay. Every other method (``choice``, ``shuffle``, ``sample``, ...) is the
    standard library's own, built on those two: the same draws give the same result, and the
    global generator advances exactly as it would without capture."""

    def __init__(self, draws: list[Any] | None = None) -> None:
        # Not ``super().__init__()``: seeding the generator, which the tape never draws from,
        # was more than half of a captured read (3.5 us).
        self.gauss_next = None
        self.replaying = draws is not None
        self.draws: list[Any] = [] if draws is None else list(draws)
        self.position = 0

    def random(self) -> float:
        if not self.replaying:
            value = _GLOBAL_RANDOM.random()
            self.draws.append(value)
            return value
        value = self._next()
        if not isinstance(value, float):
            raise _TapeMismatch("the run drew a float where the recording drew random bits")
        return value

    def getrandbits(self, k_bits: int, /) -> int:
        if not self.replaying:
            value = _GLOBAL_RANDOM.getrandbits(k_bits)
            self.draws.append(f"{k_bits}:{value:x}")
            return value
        value = self._next()
        bits, _, digits = str(value).partition(":") if isinstance(value, str) else ("", "", "")
        if bits != str(k_bits):
            raise _TapeMismatch(
                f"the run drew {k_bits} random bits where the recording drew "
                + ("a float" if isinstance(value, float) else f"{bits or '?'} bits")
            )
        return int(digits, 16)

    def _next(self) -> Any:
        if self.position >= len(self.draws):
            raise _TapeMismatch("the run drew more random numbers here than the recording")
        value = self.draws[self.position]
        self.position += 1
        return value


class _TapeMismatch(Exception):
    """A replayed random function drew differently from its recording (its arguments changed)."""


_GLOBAL_RANDOM: random.Random = random._inst


def _wrap_random(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    """A global ``random`` function: the read's value is the list of primitive draws it made."""
    source = f"random.{name}"

    def captured(*args: Any, **kwargs: Any) -> Any:
        whose = _whose(1)
        if whose is None:
            return real(*args, **kwargs)
        capture, session, where = whose
        served, draws = (
            (False, None)
            if session is None
            else session.serve_read(k.CAPTURE_RANDOM, source, where)
        )
        if served:
            assert session is not None
            tape = _Tape(draws if isinstance(draws, list) else [])
            try:
                result = getattr(tape, name)(*args, **kwargs)
            except _TapeMismatch as exc:
                raise session.read_diverged(source, where, str(exc)) from None
            if tape.position != len(tape.draws):
                raise session.read_diverged(
                    source, where, "the run drew fewer random numbers here than the recording"
                )
            return result
        if capture is None or not _records(capture, k.CAPTURE_RANDOM, source, where):
            return real(*args, **kwargs)
        tape = _Tape()
        result = getattr(tape, name)(*args, **kwargs)
        with handle_internal_errors("capturing a read"):
            capture.add("value", source, where, value=tape.draws)
        return result

    return _stand_in(captured, real, source)


def _gauss_wrapper(real: Callable[..., Any]) -> Callable[..., Any]:
    # gauss() keeps half of each pair it draws on the generator: its value is recorded as is.
    return _wrap(k.CAPTURE_RANDOM, "random.gauss", real, _PLAIN)


class _ClassType(type):
    """The metaclass of the capturing ``datetime``/``date``: instances of the real classes are
    instances of these (``isinstance(value, datetime)`` keeps working in the run's modules)."""

    _real: type

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls._real)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls._real)


class _StandIn:
    """What the capturing ``datetime``/``date`` share: constructors return the real class, and
    pydantic validates the real class (a model defined while capture is on)."""

    _real: type

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real(*args, **kwargs)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Callable[[Any], Any]) -> Any:
        return handler(cls._real)


def _constructor(method: Callable[..., Any]) -> Any:
    def delegated(cls: type, /, *args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    delegated.__name__ = getattr(method, "__name__", "constructor")
    return classmethod(delegated)


def _delegate(real: type, names: tuple[str, ...], stand_in: type) -> None:
    """The alternative constructors of ``stand_in`` (``fromisoformat``, ...) are the real
    class's, so they return real objects too."""
    for name in names:
        setattr(stand_in, name, _constructor(getattr(real, name)))


class CapturedDatetime(_StandIn, _REAL_DATETIME, metaclass=_ClassType):
    """``datetime.datetime`` as the run's own modules see it while capture is on: ``now``,
    ``utcnow`` and ``today`` are captured; every constructor returns a real ``datetime``."""

    _real = _REAL_DATETIME

    @classmethod
    def now(cls, tz: _dt.tzinfo | None = None) -> Any:
        def live() -> _dt.datetime:
            return _REAL_DATETIME.now(tz)

        value = _read(k.CAPTURE_TIME, "datetime.now", _DATETIME, live)
        if tz is not None and value.tzinfo is not None:
            return value.astimezone(tz)  # the recorded instant, in the zone asked for
        return value

    @classmethod
    def utcnow(cls) -> Any:
        return _read(k.CAPTURE_TIME, "datetime.utcnow", _DATETIME, _REAL_DATETIME.utcnow)

    @classmethod
    def today(cls) -> Any:
        return _read(k.CAPTURE_TIME, "datetime.today", _DATETIME, _REAL_DATETIME.today)


class CapturedDate(_StandIn, _REAL_DATE, metaclass=_ClassType):
    """``datetime.date`` as the run's own modules see it while capture is on (``today``)."""

    _real = _REAL_DATE

    @classmethod
    def today(cls) -> Any:
        return _read(
            k.CAPTURE_TIME,
            "date.today",
            _Serve(_REAL_DATE.isoformat, lambda v: _REAL_DATE.fromisoformat(str(v))),
            _REAL_DATE.today,
        )


_CONSTRUCTORS = ("fromtimestamp", "fromisoformat", "fromordinal", "fromisocalendar")
_delegate(
    _REAL_DATETIME,
    (*_CONSTRUCTORS, "utcfromtimestamp", "strptime", "combine"),
    CapturedDatetime,
)
_delegate(_REAL_DATE, _CONSTRUCTORS, CapturedDate)


def _datetime_module() -> types.ModuleType:
    """The ``datetime`` module as the run's own modules see it (``import datetime``)."""
    proxy = types.ModuleType(_dt.__name__, _dt.__doc__)
    proxy.__dict__.update({k_: v for k_, v in vars(_dt).items() if not k_.startswith("__")})
    proxy.__dict__.update(datetime=CapturedDatetime, date=CapturedDate)
    proxy.__file__ = getattr(_dt, "__file__", None)
    return proxy


_DATETIME_PROXY = _datetime_module()


# --- environment variables ----------------------------------------------------------------------

#: The standard library frames between the run's code and ``os._Environ.__getitem__``
#: (``os.getenv``, ``Mapping.get``, ``Mapping.__contains__``), by file and as frozen modules.
_ENV_FRAMES = frozenset(
    {
        os.__file__,
        getattr(sys.modules.get("_collections_abc"), "__file__", "") or "",
        "<frozen os>",
        "<frozen _collections_abc>",
    }
)
_real_env_getitem: Callable[[Any, str], str] = os._Environ.__getitem__


def _env_getitem(self: Any, key: str) -> str:
    """``os.environ[key]`` (and so ``os.environ.get``, ``os.getenv``, ``in``): the name and a
    fingerprint of the value are recorded once per run, for a read by the run's own code."""
    capture = _run.get()
    if capture is None or (k.CAPTURE_ENV not in capture.groups and not capture.audit):
        return _real_env_getitem(self, key)
    if in_body() or self is not os.environ or key in capture.env_seen:
        return _real_env_getitem(self, key)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _ENV_FRAMES:
        frame = frame.f_back  # type: ignore[assignment]
    where = _site_of(frame, capture)
    if where is None:
        return _real_env_getitem(self, key)
    if capture.audit:
        capture.note("os.environ", where)
        return _real_env_getitem(self, key)
    try:
        value: str | None = _real_env_getitem(self, key)
    except KeyError:
        value = None
    with handle_internal_errors("capturing an environment read"):
        with capture.lock:
            first = key not in capture.env_seen
            capture.env_seen.add(key)
        if first:
            salting = None if value is None else env_salting()  # (unset: nothing to hide)
            fingerprint = env_fingerprint(value, salting)
            capture.add("env", "os.environ", where, name=key, sha256=fingerprint, value=salting)
    if value is None:
        raise KeyError(key)
    return value


# --- installing and removing the interception --------------------------------------------------


class _Patch(NamedTuple):
    """One name replaced while capture or replay is active (by a :data:`_PATCHERS` patcher,
    which also remembers what it replaced and puts it back)."""

    owner: Any
    name: str
    original: Any
    """The real source the replacement stands in for (how the run's own names are found)."""
    replacement: Any


def _source_patches() -> list[_Patch]:
    """Every module attribute that is replaced while capture or replay is active."""
    patches = [
        _Patch(time, "time", time.time, _wrap(k.CAPTURE_TIME, "time.time", time.time, _PLAIN)),
        _Patch(
            time, "strftime", time.strftime, _wrap_clock("time.strftime", time.strftime, 1, _PLAIN)
        ),
        _Patch(time, "ctime", time.ctime, _wrap_clock("time.ctime", time.ctime, 0, _PLAIN)),
        _Patch(
            time,
            "localtime",
            time.localtime,
            _wrap_clock("time.localtime", time.localtime, 0, _STRUCT_TIME),
        ),
        _Patch(
            time, "gmtime", time.gmtime, _wrap_clock("time.gmtime", time.gmtime, 0, _STRUCT_TIME)
        ),
        _Patch(
            time,
            "time_ns",
            time.time_ns,
            _wrap(k.CAPTURE_TIME, "time.time_ns", time.time_ns, _PLAIN),
        ),
        _Patch(uuid, "uuid4", uuid.uuid4, _wrap(k.CAPTURE_UUID, "uuid.uuid4", uuid.uuid4, _UUID)),
        _Patch(uuid, "uuid1", uuid.uuid1, _wrap(k.CAPTURE_UUID, "uuid.uuid1", uuid.uuid1, _UUID)),
        _Patch(
            os, "urandom", os.urandom, _wrap(k.CAPTURE_SECRETS, "os.urandom", os.urandom, _BYTES)
        ),
        _Patch(os._Environ, "__getitem__", _real_env_getitem, _env_getitem),
    ]
    for name, serve in (("token_bytes", _BYTES), ("token_hex", _PLAIN), ("token_urlsafe", _PLAIN)):
        real = getattr(secrets, name)
        patches.append(
            _Patch(secrets, name, real, _wrap(k.CAPTURE_SECRETS, f"secrets.{name}", real, serve))
        )
    for name in RANDOM_FUNCTIONS:
        real = getattr(random, name, None)
        if real is not None:
            patches.append(_Patch(random, name, real, _wrap_random(name, real)))
    patches.append(_Patch(random, "gauss", random.gauss, _gauss_wrapper(random.gauss)))
    return patches


#: Made once, at import, from the real functions (never from what is installed at the time).
_SOURCE_PATCHES = tuple(_source_patches())
#: Where the run's threads and tasks get their context: numbered while values are captured or
#: served (with the run's own modules' names).
_THREAD_PATCHES = (
    _Patch(contextvars, "copy_context", _real_copy_context, _copy_context),
    _Patch(asyncio.base_events.BaseEventLoop, "create_task", _real_create_task, _create_task),
)
_lock = threading.Lock()
_users = [0, 0]  # [holders of the source patches, holders of the module patches]
_SOURCES, _MODULES = 0, 1
#: One patcher per level: each level's patches are undone by the object that applied them.
_PATCHERS = (
    Patcher("the determinism capture's sources"),
    Patcher("the run's own modules' names of the sources"),
)


def _module_patches() -> list[_Patch]:
    """What starts the run's threads (:data:`_THREAD_PATCHES`), and the run's own modules' names
    for the sources (``from time import time``, ``import datetime``, ``from datetime import
    datetime``) and for ``copy_context``, replaced too."""
    sources = _SOURCE_PATCHES
    by_id: dict[int, Any] = {
        id(p.original): p.replacement for p in sources if p.owner is not os._Environ
    }
    by_id[id(_dt)] = _DATETIME_PROXY
    by_id[id(_REAL_DATETIME)] = CapturedDatetime
    by_id[id(_REAL_DATE)] = CapturedDate
    by_id[id(_real_copy_context)] = _copy_context
    patches: list[_Patch] = list(_THREAD_PATCHES)
    packages = CONFIG.settings.capture_packages
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if not isinstance(filename, str) or filename.startswith("<"):
            continue
        name = getattr(module, "__name__", None)
        own = bool(packages) and isinstance(name, str) and _in_packages(name, packages)
        if not own and not _is_user_file(filename):
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            replacement = by_id.get(id(value))
            if replacement is not None and not name.startswith("__"):
                patches.append(_Patch(module, name, value, replacement))
    return patches


def acquire(*, modules: bool = True) -> None:
    """Install the interception: the sources' module attributes and, with ``modules``, the run's
    own modules' names for them (``datetime`` among them). A capturing run takes both; a replay
    session over a bundle that captured nothing takes only the first, to notice uncaptured reads
    (a mismatch then names them) without touching the run's modules."""
    with _lock:
        for level in (_SOURCES, _MODULES) if modules else (_SOURCES,):
            _users[level] += 1
            if _users[level] > 1:
                continue
            with handle_internal_errors("installing the determinism capture"):
                patches = _SOURCE_PATCHES if level == _SOURCES else _module_patches()
                _PATCHERS[level].replace_many((p.owner, p.name, p.replacement) for p in patches)


def release(*, modules: bool = True) -> None:
    """Undo one :func:`acquire`: what was there is put back (a name someone rebound meanwhile is
    left as is)."""
    with _lock:
        for level in (_MODULES, _SOURCES) if modules else (_SOURCES,):
            _users[level] = max(0, _users[level] - 1)
            if _users[level]:
                continue
            with handle_internal_errors("removing the determinism capture"):
                _PATCHERS[level].restore_all()


def intercepted_sources() -> set[str]:
    """The source names the interception records (each one listed in ``trace.captured``)."""
    names = {getattr(p.replacement, "_stepfork_source", None) for p in _SOURCE_PATCHES}
    names.update(("datetime.now", "datetime.utcnow", "datetime.today", "date.today", "os.environ"))
    return {name for name in names if isinstance(name, str)}


def installed() -> bool:
    """Whether any of the interception is in place (tests, benchmarks)."""
    return any(len(patcher) for patcher in _PATCHERS)


def _on_session(session: Any, active: bool) -> None:
    """Replay sessions serve captured reads (and explain uncaptured ones): the interception is
    in place while one is active -- all of it when its bundle captured values."""
    modules = bool(getattr(session, "serves_reads", False))
    if active:
        _roots[id(session)] = _Lane(session, None)
        acquire(modules=modules)
    else:
        _roots.pop(id(session), None)
        release(modules=modules)


current_session.add_listener(_on_session)
