"""An interrupt may land anywhere in stepfork's own code (issue 13's crash durability).

A signal handler runs in the main thread between any two bytecodes: Ctrl-C raises
``KeyboardInterrupt`` there, and a program's ``SIGTERM`` handler often calls ``sys.exit``. So the
exception can come out of the middle of the processor converting a call or queueing it, of a
boundary finishing a call, of the SDK ending a span. These tests put it there on purpose, at
every line that runs while a call ends -- a trace function raises ``KeyboardInterrupt`` at the
N-th line executed in stepfork's or the SDK's code, for every N -- and check what is left:

* the bundle loads (what its trailer counts is what the file holds);
* nothing is left held: the calls after it, and the run's end, proceed;
* a bundle that says it is complete holds every call that returned, and one that does not says
  why.

``tests/test_durability.py`` does the same with real signals at random moments.
"""

from __future__ import annotations

import contextvars
import dis
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import opentelemetry.sdk.trace
import pytest

import stepfork_otel
from stepfork_otel import record, trace_tool
from stepfork_otel.trace.bundle import load_trace


@trace_tool
def step(i: int) -> dict[str, Any]:
    return {"i": i, "pad": "x" * 300}


#: Where an interrupt may land: stepfork's code, the OpenTelemetry SDK and API, and ``threading``
#: (whose locks the writer's queueing uses).
_WHERE = (
    str(Path(stepfork_otel.__file__).parent),
    str(Path(opentelemetry.sdk.trace.__file__).parents[2]),
    threading.__file__,
)


@functools.cache
def _points(code: CodeType) -> frozenset[int]:
    """The offsets in ``code`` where CPython runs a pending signal handler, as an interrupt
    lands there: right after a call returns (still inside the call's ``try``/``with``: the
    handler region of the call), and at a loop's jump back. (A function's entry is the trace's
    ``call`` event.) Not every line: the exit of a ``with`` block, say, runs no handler before
    the lock is released."""
    handlers = [(e.start, e.end, e.target) for e in dis.Bytecode(code).exception_entries]

    def handler(offset: int) -> int | None:
        inner = [t for start, end, t in handlers if start <= offset < end]
        return inner[-1] if inner else None

    found: set[int] = set()
    last_call: int | None = None
    for instruction in dis.get_instructions(code):
        if instruction.opname == "CACHE":
            continue
        if last_call is not None and handler(last_call) == handler(instruction.offset):
            found.add(instruction.offset)
        last_call = instruction.offset if instruction.opname.startswith("CALL") else None
        if instruction.opname == "JUMP_BACKWARD":
            found.add(instruction.offset)
    return frozenset(found)


class _Interrupt:
    """Run ``action`` (by default: raise ``KeyboardInterrupt``) at the ``at``-th point where a
    signal handler could run in this thread's code in :data:`_WHERE` (the writer thread is not
    traced: no signal handler runs there either)."""

    def __init__(self, at: int, action: Callable[[], None] | None = None) -> None:
        self.at = at
        self.points = 0
        self.fired = False
        self.where = ""
        self.action = action or _keyboard_interrupt

    def _hit(self, frame: FrameType) -> None:
        self.points += 1
        if self.points == self.at:
            self.fired = True
            self.where = (
                f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"
            )
            sys.settrace(None)
            self.action()

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if self.fired or not code.co_filename.startswith(_WHERE) or code.co_name == "<genexpr>":
            return None  # (a generator expression may be closed by the garbage collector, where
            # CPython prints an exception and drops it -- and a signal's with it)
        frame.f_trace_opcodes = True
        if event == "call":
            self._hit(frame)
        return self._opcode

    def _opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode" and not self.fired and frame.f_lasti in _points(frame.f_code):
            self._hit(frame)
        return self._opcode

    def __enter__(self) -> _Interrupt:
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def _keyboard_interrupt() -> None:
    raise KeyboardInterrupt


def _in_own_context(test: Callable[..., None]) -> Callable[..., None]:
    """Run ``test`` in a copy of the context: an interrupt inside the SDK's context handling may
    leave a context attached, which must not reach the tests after it."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        contextvars.copy_context().run(test, *args, **kwargs)

    return run


def _lines_of_one_call(tmp_path: Path) -> int:
    counter = _Interrupt(at=-1)
    with record(tmp_path / "count.sftrace"), counter:
        step(0)
    return counter.points


@pytest.fixture
def watchdog() -> Iterator[None]:
    """A lock left held would hang the test: fail it instead (the worker dies, with stacks)."""
    import faulthandler

    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _check(path: Path, returned: list[int], *, ended: bool) -> str:
    """The bundle loads; complete, it holds every call that returned, numbered without a gap;
    incomplete, it says why. Returns its state."""
    trace = load_trace(path)  # the count and fingerprint its trailer declares are the file's
    finished = [c for c in trace.calls if trace.outcome_of(c) is not None]
    inputs = {c.input for c in finished}
    if trace.complete:
        assert ended
        assert {f'{{"i":{i}}}' for i in returned} <= inputs, (returned, inputs)
        assert [c.seq for c in trace.calls] == list(range(1, len(trace.calls) + 1))
        assert all(c.parent_id is None for c in trace.calls)  # (no context left behind)
        return "complete"
    assert trace.incomplete_reason
    return trace.incomplete_reason.split(":")[0]


def _calls_catching(interrupt: _Interrupt, returned: list[int]) -> None:
    """Three calls, the second meeting ``interrupt``, which the program catches and goes on."""
    step(0)
    returned.append(0)
    try:
        with interrupt:
            step(1)
        returned.append(1)
    except KeyboardInterrupt:
        pass
    step(2)
    returned.append(2)


@pytest.mark.parametrize("flush", [0.0, 1.0], ids=["flush-at-once", "flush-1s"])
@_in_own_context
def test_an_interrupt_at_any_point_of_a_call_leaves_a_bundle_that_loads(
    recording: Any, tmp_path: Path, flush: float, watchdog: None
) -> None:
    """The program catches the interrupt inside its run and goes on (a REPL, a retry loop), so
    the calls after it and the run's end must proceed too."""
    lines = _lines_of_one_call(tmp_path)
    assert lines > 200
    seen: dict[str, int] = {}
    for at in range(1, lines + 40):
        path = tmp_path / f"caught-{at}.sftrace"
        returned: list[int] = []
        with record(path, flush_interval=flush) as run:
            interrupt = _Interrupt(at)
            _calls_catching(interrupt, returned)
            run.set_output("done")
        assert threading.active_count() < 10
        try:
            state = _check(path, returned, ended=True)
        except AssertionError as exc:
            raise AssertionError(f"interrupted at {interrupt.where}: {exc}") from None
        seen[state] = seen.get(state, 0) + 1
        if not interrupt.fired:
            assert state == "complete"
    assert seen.get("complete", 0) > 40, seen  # (the points past the call's end, at least)
    assert seen.get("1 call(s) had not ended when the bundle was written", 0) > 40, seen


@_in_own_context
def test_an_interrupt_in_calls_outside_any_run_leaves_a_bundle_that_loads(
    recording: Any, tmp_path: Path, watchdog: None
) -> None:
    """The same for the zero-code shape: no ``record(...)``, the application's span around the
    calls, the trace's bundle written as they go."""
    tracer = recording.provider.get_tracer("app")
    lines = _lines_of_one_call(tmp_path)
    seen: dict[str, int] = {}
    for at in range(1, lines + 1):
        returned: list[int] = []
        interrupt = _Interrupt(at)
        with tracer.start_as_current_span("request") as request:
            _calls_catching(interrupt, returned)
        path = recording.directory / f"{request.get_span_context().trace_id:032x}.sftrace"
        try:
            state = _check(path, returned, ended=True)
        except AssertionError as exc:
            raise AssertionError(f"interrupted at {interrupt.where}: {exc}") from None
        seen[state] = seen.get(state, 0) + 1
    assert seen.get("complete", 0) > 0, seen


def _run_cut_off(
    path: Path,
    returned: list[int],
    interrupt: _Interrupt,
    then: Callable[[], None],
    *,
    flush: float,
) -> None:
    """A run whose second call meets ``interrupt``; ``then`` happens right after it if the
    interrupt did not fire (it always raises)."""
    with record(path, flush_interval=flush):
        step(0)
        returned.append(0)
        with interrupt:
            step(1)
        returned.append(1)
        then()


@_in_own_context
def test_an_interrupt_that_ends_the_run_leaves_a_bundle_that_loads(
    recording: Any, tmp_path: Path, watchdog: None
) -> None:
    """The interrupt goes up through the run (Ctrl-C ending the program): the run's end, with
    the exception as its outcome, is in the bundle."""
    lines = _lines_of_one_call(tmp_path)
    seen: dict[str, int] = {}
    for at in range(1, lines + 1):
        path = tmp_path / f"ended-{at}.sftrace"
        returned: list[int] = []
        with pytest.raises(KeyboardInterrupt):
            _run_cut_off(path, returned, _Interrupt(at), _keyboard_interrupt, flush=0)
        state = _check(path, returned, ended=True)
        seen[state] = seen.get(state, 0) + 1
        trace = load_trace(path)
        assert trace.run.status == "error"
        assert trace.run.error_type == "KeyboardInterrupt"
    assert seen.get("complete", 0) > 40, seen


@pytest.mark.parametrize("flush", [0.0, 1.0], ids=["flush-at-once", "flush-1s"])
@_in_own_context
def test_the_sigterm_handler_finishes_wherever_it_lands(
    recording: Any, tmp_path: Path, flush: float, watchdog: None
) -> None:
    """stepfork's ``SIGTERM`` handler closes the bundles of the runs being recorded, in the main
    thread, in the middle of whatever it interrupted -- perhaps stepfork's own queueing, holding
    its locks. Run it at each point (then raise ``SystemExit``, as the process dies there): it
    returns, and the bundle it closed loads."""
    from stepfork_otel.otel.processor import _finalise_all

    left: list[bytes] = []

    def sigterm() -> None:
        _finalise_all()
        left.append(path.read_bytes())  # what the process leaves: it dies of the signal now
        raise SystemExit(143)

    lines = _lines_of_one_call(tmp_path)
    seen: dict[str, int] = {}
    for at in range(1, lines + 1):
        path = tmp_path / f"term-{at}.sftrace"
        left.clear()
        returned: list[int] = []
        interrupt = _Interrupt(at, sigterm)
        with pytest.raises(SystemExit):
            _run_cut_off(path, returned, interrupt, sigterm, flush=flush)
        path.write_bytes(left[0])
        try:
            state = _check(path, returned, ended=False)
        except AssertionError as exc:
            raise AssertionError(f"interrupted at {interrupt.where}: {exc}") from None
        seen[state] = seen.get(state, 0) + 1
    assert set(seen) <= {
        "the process exited before the run ended",
        "1 call(s) had not ended when the bundle was written",
    }, seen


@pytest.mark.parametrize("flush", [0.0, 1.0], ids=["flush-at-once", "flush-1s"])
@_in_own_context
def test_the_sigterm_handler_landing_in_a_runs_end_leaves_its_trailer(
    recording: Any, tmp_path: Path, flush: float, watchdog: None
) -> None:
    """Between the run leaving the runs being written and its trailer being queued, the run is
    still closed by the handler: the bundle left has its trailer, with both calls."""
    from stepfork_otel.otel.processor import _finalise_all

    left: list[bytes] = []

    def sigterm() -> None:
        _finalise_all()
        left.append(path.read_bytes())
        raise SystemExit(143)

    def run(interrupt: _Interrupt) -> None:
        with record(path, flush_interval=flush):
            step(0)
            step(1)
            sys.settrace(interrupt._trace)  # armed for the run's end only
        sys.settrace(None)

    path = tmp_path / "count.sftrace"
    counter = _Interrupt(at=-1)
    run(counter)
    seen: dict[str, int] = {}
    for at in range(1, counter.points + 1):
        path = tmp_path / f"end-{at}.sftrace"
        left.clear()
        interrupt = _Interrupt(at, sigterm)
        try:
            run(interrupt)
        except SystemExit:
            path.write_bytes(left[0])
        # (not fired: this run's end took fewer points than the one counted -- it varies)
        try:
            state = _check(path, [0, 1], ended=True)
            assert b'"end":"sftrace"' in path.read_bytes()  # the trailer
        except AssertionError as exc:
            raise AssertionError(f"interrupted at {interrupt.where}: {exc}") from None
        seen[state] = seen.get(state, 0) + 1
    assert counter.points > 50
    assert seen.get("complete", 0) > 0, seen
