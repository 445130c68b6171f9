"""Crash-durable recording (issue 13, items 1 and 2): real processes killed at random points.

Each child records one run of many tool calls and prints the index of every call that returned.
It is killed -- ``SIGKILL`` mostly, ``SIGTERM`` sometimes -- at a random moment: while starting,
mid-run, while closing the bundle, after it. The bundle is written as the run goes (format 3: a
call's events are appended when it ends, buffered and flushed within ``flush_interval``), so
whatever the moment, the file at the bundle's path must load, say ``complete: false`` unless the
run ended, hold every call that returned more than the flush interval before the kill (with
``flush_interval=0``: every call the child saw return), and replay up to there. Nothing else is
left in the directory (no journal, no temporary file).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_support import ROOT

from stepfork_otel import ReplaySession, trace_tool
from stepfork_otel.otel.writer import recover_directory
from stepfork_otel.trace.bundle import load_trace

KILLS = 104
CALLS = 300
#: Added to the flush interval for what must be on disk: the parent reads a call's line after the
#: child printed it, and a loaded machine may run the child's flush thread late.
SLACK = 1.0

CHILD = textwrap.dedent(
    """
    import random, signal, sys, time
    from pathlib import Path
    from stepfork_otel import configure, record, trace_tool

    out, seed, own_handler = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    flush, calls, pause = float(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    if own_handler:
        def stop(signum, frame):
            print("own handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, stop)
    configure(directory=out.parent, flush_interval=flush)
    rng = random.Random(seed)

    @trace_tool
    def step(i: int) -> dict:
        time.sleep(pause if rng.random() < 0.9 else 6 * pause)
        return {"i": i, "pad": "x" * rng.randrange(10, 3000)}

    with record(out, input={"calls": calls}, name="durable") as run:
        print("started", signal.getsignal(signal.SIGTERM) is stop if own_handler else "", flush=True)
        for i in range(calls):
            step(i)
            print(i, flush=True)
        run.set_output("done")
    print("ended", flush=True)
    """
)


@trace_tool
def step(i: int) -> dict[str, Any]:  # the child's tool, for replaying what it left
    raise AssertionError("a replay never runs the body")


@dataclass
class Killed:
    directory: Path
    signum: int
    returned: int
    """Calls the child saw return before the kill."""
    durable: int
    """Calls read as returned more than ``flush + SLACK`` before the kill: they must be on disk."""
    flush: float
    ended: bool
    lines: list[str]
    code: int


def _run_and_kill(
    script: Path,
    directory: Path,
    seed: int,
    own_handler: bool = False,
    *,
    flush: float = 0.0,
    calls: int = CALLS,
    pause: float = 0.0005,
    at: float | None = None,
) -> Killed:
    """Start a child and kill it: before it printed anything (1 in 20), after its run ended
    (1 in 20), or -- mostly -- right after it reported call ``k`` returned, ``k`` at random (the
    child keeps calling while the signal is sent, so the kill lands anywhere after ``k``). ``at``:
    instead, kill it that many seconds after it started its run."""
    rng = random.Random(seed)
    directory.mkdir()
    child = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(directory / "run.sftrace"),
            str(seed),
            str(int(own_handler)),
            str(flush),
            str(calls),
            str(pause),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    signum = signal.SIGTERM if own_handler or rng.random() < 0.2 else signal.SIGKILL
    moment = rng.random()
    seen: list[tuple[str, float]] = []
    deadline = float("inf")
    if at is not None or moment >= 0.05:
        wanted = "ended" if moment >= 0.95 else str(rng.randrange(calls))
        for line in child.stdout:
            seen.append((line.strip(), time.monotonic()))
            if at is not None and seen[-1][0] == "started":
                deadline = time.monotonic() + at
            if at is not None and len(seen) > 1 and time.monotonic() >= deadline:
                break
            if at is None and seen[-1][0] == wanted:
                break
        time.sleep(rng.uniform(0, 0.005))
    killed_at = time.monotonic()
    child.send_signal(signum)
    rest, _ = child.communicate(timeout=60)
    lines = [*(line for line, _ in seen), *rest.splitlines()]
    returned = sum(1 for line in lines if line.isdigit())
    durable = sum(1 for line, t in seen if line.isdigit() and t < killed_at - flush - SLACK)
    return Killed(
        directory, signum, returned, durable, flush, "ended" in lines, lines, child.returncode
    )


def _check(killed: Killed) -> str:
    """What the kill left must load and hold every call that returned (with a flush interval:
    that returned more than the interval before the kill); returns where it hit."""
    bundle = killed.directory / "run.sftrace"
    recover_directory(killed.directory)  # (killed while a header was written: its temporary)
    left = sorted(p.name for p in killed.directory.iterdir())
    if killed.ended:
        assert load_trace(bundle).complete
        return "after the run"
    if not left:
        assert killed.returned == 0  # killed before the run began
        return "before the run"
    assert left == ["run.sftrace"], left  # no journal, no temporary file: the bundle itself
    trace = load_trace(bundle)  # loads as it is: no recovery step
    recover_directory(killed.directory)  # (nothing to recover: the bundle stays as it is)
    assert sorted(p.name for p in killed.directory.iterdir()) == left
    finished = [c for c in trace.calls if trace.outcome_of(c) is not None]
    if trace.complete:  # killed after the trailer was written
        assert len(finished) == CALLS
        return "after the run"
    assert trace.incomplete_reason
    must = killed.returned if killed.flush == 0 else killed.durable
    assert len(finished) >= must, (killed, len(finished))
    assert len(trace.calls) - len(finished) <= 1  # at most the call under way had no outcome
    assert [c.seq for c in trace.calls] == list(range(1, len(trace.calls) + 1))
    assert [c.name for c in trace.calls] == ["step"] * len(trace.calls)  # type: ignore[union-attr]
    with ReplaySession.from_trace(trace):  # replays up to there
        for i in range(len(finished)):
            assert step(i)["i"] == i
    return "mid-run" if killed.signum == signal.SIGKILL else "mid-run, SIGTERM"


def test_runs_killed_at_random_points_leave_bundles_that_load(tmp_path: Path) -> None:
    """Three kills in four with ``flush_interval=0`` (every call that returned is on disk), one
    in four with the default interval of 1 s."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with ThreadPoolExecutor(max_workers=4) as pool:
        kills = list(
            pool.map(
                lambda n: _run_and_kill(
                    script, tmp_path / f"kill-{n}", seed=n, flush=1.0 if n % 4 == 3 else 0.0
                ),
                range(KILLS),
            )
        )
    where: dict[str, int] = {}
    for killed in kills:
        hit = _check(killed)
        where[hit] = where.get(hit, 0) + 1
    assert len(kills) >= 100
    mid_run = where.get("mid-run", 0) + where.get("mid-run, SIGTERM", 0)
    assert mid_run >= 0.6 * len(kills), where  # most kills land while calls are made
    assert where.get("mid-run, SIGTERM", 0) >= 5, where


def test_a_run_killed_late_holds_every_call_older_than_the_flush_interval(tmp_path: Path) -> None:
    """Long runs with a short flush interval, killed seconds in: what returned more than the
    interval (plus slack) before the kill is on disk, and -- the buffer being flushed, not held
    to the end -- that is most of what returned."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for n in range(3):
        killed = _run_and_kill(
            script,
            tmp_path / f"late-{n}",
            seed=1000 + n,
            flush=0.2,
            calls=5000,
            pause=0.002,
            at=SLACK + 1.5,
        )
        assert killed.durable > 0, killed.lines[:5]
        assert _check(killed).startswith("mid-run")
        trace = load_trace(killed.directory / "run.sftrace")
        assert len(trace.calls) >= killed.durable


def test_sigterm_never_replaces_the_programs_own_handler(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    killed = _run_and_kill(script, tmp_path / "own", seed=7, own_handler=True)
    assert killed.lines[0] == "started True"  # still the program's handler while recording
    if killed.ended:
        pytest.skip("the run ended before the signal arrived")
    assert "own handler" in killed.lines
    assert killed.code == 3  # the program's handler decided how it exits ...
    trace = load_trace(killed.directory / "run.sftrace")  # ... and the run is on disk: the
    assert trace.run.status == "error"  # handler's sys.exit ended it, recorded as its outcome
    assert trace.run.error_type == "SystemExit"
    assert sorted(p.name for p in killed.directory.iterdir()) == ["run.sftrace"]


#: The zero-code shape: no ``record(...)``, a directory, and the application's own span around
#: the calls (a request handler); the trace's bundle is written as the calls go.
CHILD_OUTSIDE_RUNS = textwrap.dedent(
    """
    import random, sys, time
    from pathlib import Path
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from stepfork_otel import configure, trace_tool

    out, seed, flush = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[4])
    calls, pause = int(sys.argv[5]), float(sys.argv[6])
    provider = TracerProvider()
    trace.set_tracer_provider(provider)
    configure(directory=out.parent, tracer_provider=provider, flush_interval=flush)
    rng = random.Random(seed)

    @trace_tool
    def step(i: int) -> dict:
        time.sleep(pause if rng.random() < 0.9 else 6 * pause)
        return {"i": i, "pad": "x" * rng.randrange(10, 3000)}

    with trace.get_tracer("app").start_as_current_span("handle request"):
        print("started", flush=True)
        for i in range(calls):
            step(i)
            print(i, flush=True)
    print("ended", flush=True)
    """
)


def test_calls_outside_runs_killed_mid_request_are_on_disk(tmp_path: Path) -> None:
    """Killed while its request is handled, a process recording without ``record(...)`` leaves
    the trace's bundle holding every call that returned (``flush_interval=0``), loadable and
    replayable -- before, those calls were held in memory until the request's span ended."""
    script = tmp_path / "child.py"
    script.write_text(CHILD_OUTSIDE_RUNS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        kills = list(
            pool.map(
                lambda n: _run_and_kill(script, tmp_path / f"kill-{n}", seed=500 + n),
                range(16),
            )
        )
    mid_run = 0
    for killed in kills:
        left = sorted(killed.directory.iterdir())
        if not left or killed.ended:
            continue  # killed before the first call, or after the request
        (bundle,) = left
        assert bundle.name.endswith(".sftrace"), bundle.name
        assert "-" not in bundle.name, bundle.name  # <trace_id>.sftrace: the trace's own
        trace = load_trace(bundle)
        finished = [c for c in trace.calls if trace.outcome_of(c) is not None]
        if trace.complete:
            assert len(finished) == CALLS
            continue
        mid_run += 1
        assert trace.run.span_id is None  # the trace's own bundle: no run
        assert len(finished) >= killed.returned, (killed, len(finished))
        assert [c.seq for c in trace.calls] == list(range(1, len(trace.calls) + 1))
        with ReplaySession.from_trace(trace):
            for i in range(len(finished)):
                assert step(i)["i"] == i
    assert mid_run >= 8, [k.lines[-1:] for k in kills]


def test_leftover_temporary_files_of_dead_processes_are_deleted(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".run.sftrace.{dead_pid}.abc123.tmp"
    live = tmp_path / f".run.sftrace.{os.getpid()}.def456.tmp"  # a write under way here
    other = tmp_path / ".notes.tmp"  # not one of ours
    for path in (stale, live, other):
        path.write_bytes(b"x" * 1000)
    recover_directory(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


# --- in process: the bundle while a run is recorded ------------------------------------------------


@trace_tool
def lookup(city: str) -> str:
    return city.upper()


def test_the_bundle_holds_each_call_as_it_returns(recording: Any, tmp_path: Path) -> None:
    from stepfork_otel import record

    recording.processor.flush_interval = 0  # each call written as it ends
    bundle = tmp_path / "run.sftrace"
    with record(bundle, name="cities"):
        lookup("lisbon")
        mid = load_trace(bundle)  # readable while the run goes on
        assert not mid.complete
        assert [c.name for c in mid.calls] == ["lookup"]  # type: ignore[union-attr]
        assert mid.outcome_of(mid.calls[0]) is not None
        lookup("porto")
        assert len(load_trace(bundle).calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.sftrace"]
    final = load_trace(bundle)
    assert final.complete
    assert [c.input for c in final.calls] == ['{"city":"lisbon"}', '{"city":"porto"}']  # type: ignore[union-attr]


def test_the_background_flush_writes_within_the_interval(recording: Any, tmp_path: Path) -> None:
    from stepfork_otel import record

    recording.processor.flush_interval = 0.05
    bundle = tmp_path / "run.sftrace"
    with record(bundle):
        lookup("a")
        waited = 0.0
        while not load_trace(bundle).calls:  # (no fixed sleep: wait for the flush thread)
            assert waited < 30, "the background flush never wrote the call"
            time.sleep(0.01)
            waited += 0.01
    assert load_trace(bundle).complete


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_fsync_policy_and_switching_the_background_flush_off(
    recording: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepfork_otel import record
    from stepfork_otel.otel import writer

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(writer.os, "fsync", fsync)
    recording.processor.flush_interval = 0
    recording.processor.fsync_interval = 0  # every write
    with record(tmp_path / "every.sftrace"):
        lookup("a")
        lookup("b")
    assert len(synced) >= 4  # the header (before its rename over the path), each call, the trailer
    assert Path(synced[0]).name.startswith(f".every.sftrace.{os.getpid()}.")
    assert {Path(name).name for name in synced[1:]} == {"every.sftrace"}
    synced.clear()
    recording.processor.fsync_interval = None  # never
    with record(tmp_path / "never.sftrace"):
        lookup("a")
    assert synced == []
    recording.processor.background_flush = False  # no background flush: written when the run ends
    recording.processor.flush_interval = 1.0
    with record(tmp_path / "off.sftrace"):
        lookup("a")
        assert load_trace(tmp_path / "off.sftrace").calls == []
    assert len(load_trace(tmp_path / "off.sftrace").calls) == 1


#: A process that forks while its run is being written: the child makes a call in the inherited
#: run (the parent's bundle: the child must not write to it) and records a run of its own.
CHILD_FORKS = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from stepfork_otel import configure, record, trace_tool
    from stepfork_otel.trace.bundle import load_trace

    out = Path(sys.argv[1])
    configure(directory=out)

    @trace_tool
    def step(i: int) -> dict:
        return {"i": i}

    with record(out / "parent.sftrace", flush_interval=1.0):
        step(0)
        step(1)  # (queued, not yet written: the child inherits the queue)
        pid = os.fork()
        if pid == 0:
            step(100)  # in the parent's run: left to the parent
            with record(out / "child.sftrace", flush_interval=0):
                step(200)
            time.sleep(1.5)  # (a tick of the child's writer: the parent's queue is not its own)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        step(2)
    parent = load_trace(out / "parent.sftrace")
    child = load_trace(out / "child.sftrace")
    print(json.dumps({
        "status": status,
        "parent": [c.input for c in parent.calls],
        "parent_complete": parent.complete,
        "child": [c.input for c in child.calls],
        "child_complete": child.complete,
        "files": sorted(p.name for p in out.iterdir() if p.suffix != ".py"),
    }))
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_leaves_the_parents_bundle_to_the_parent(tmp_path: Path) -> None:
    from cli_support import run_for_json

    script = tmp_path / "forks.py"
    script.write_text(CHILD_FORKS)
    values, _ = run_for_json(
        [sys.executable, str(script), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,  # (the child hung waiting for a writer thread it does not have)
    )
    assert values["status"] == 0
    assert values["parent"] == ['{"i":0}', '{"i":1}', '{"i":2}']
    assert values["parent_complete"]
    assert values["child"] == ['{"i":200}']
    assert values["child_complete"]
    assert values["files"] == ["child.sftrace", "parent.sftrace"]  # (step(100): in no bundle)


# --- issue 28: a run started on an existing path, a call that returned on another thread ---------

#: Starts run after run on one path that already holds a bundle (each run short, so most kills
#: land while a run is being created or closed).
CHILD_RESTARTS = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from stepfork_otel import configure, record, trace_tool

    out = Path(sys.argv[1])
    configure(directory=out.parent, flush_interval=0)

    @trace_tool
    def step(i: int) -> dict:
        return {"i": i}

    print("started", flush=True)
    n = 0
    while True:
        with record(out, name="again"):
            step(n)
        n += 1
    """
)

RESTART_KILLS = 40


def test_a_run_started_on_an_existing_path_never_destroys_the_previous_bundle(
    tmp_path: Path,
) -> None:
    """Killed (SIGKILL) at random moments while it starts run after run on one path, a process
    leaves there the previous bundle or a new one that loads -- never an empty file (before, the
    file was truncated when a run started, before its new header was written: 9 kills in 60 left
    0 bytes). The temporary file a kill leaves while a header is written is the dead process's:
    the directory recovery deletes it."""
    script = tmp_path / "child.py"
    script.write_text(CHILD_RESTARTS)
    seed_bundle = tmp_path / "seed" / "run.sftrace"
    subprocess.run(  # the bundle already there: one complete run
        [
            sys.executable,
            "-c",
            CHILD_RESTARTS.replace("while True:", "for _ in range(1):"),
            str(seed_bundle),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    old = seed_bundle.read_bytes()
    assert load_trace(seed_bundle).complete

    def kill_one(n: int) -> tuple[Path, int]:
        rng = random.Random(2800 + n)
        directory = tmp_path / f"restart-{n}"
        directory.mkdir()
        (directory / "run.sftrace").write_bytes(old)
        child = subprocess.Popen(
            [sys.executable, str(script), str(directory / "run.sftrace")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
        return directory, child.pid

    with ThreadPoolExecutor(max_workers=2) as pool:
        killed = list(pool.map(kill_one, range(RESTART_KILLS)))
    new = 0
    for directory, _pid in killed:
        bundle = directory / "run.sftrace"
        data = bundle.read_bytes()
        assert data, f"{directory.name}: the kill left an empty file"
        trace = load_trace(bundle)  # the old bundle, or a new one: either loads
        new += data != old
        recover_directory(directory)  # (a header being written at the kill: its temporary)
        assert sorted(p.name for p in directory.iterdir()) == ["run.sftrace"]
        assert trace.calls or not trace.complete
    assert new >= RESTART_KILLS // 2  # (the kills landed while runs were started)


#: Threads making calls in one run, each call waiting until it is written (flush_interval=0); a
#: call is reported (its thread and number) after it returned.
CHILD_THREADS = textwrap.dedent(
    """
    import contextvars, random, sys, threading, time
    from pathlib import Path
    from stepfork_otel import configure, record, trace_tool

    out, seed = Path(sys.argv[1]), int(sys.argv[2])
    configure(directory=out.parent, flush_interval=0)
    lock = threading.Lock()

    @trace_tool
    def step(worker: int, i: int, pause: float) -> dict:
        time.sleep(pause)
        return {"worker": worker, "i": i}

    def work(worker: int) -> None:
        rng = random.Random(seed * 10 + worker)
        for i in range(100_000):
            step(worker, i, rng.choice((0.0, 0.001, 0.02)))
            with lock:
                print(f"{worker} {i}", flush=True)

    with record(out, name="threads"):
        threads = [  # (each with the run's context: its calls are the run's)
            threading.Thread(target=contextvars.copy_context().run, args=(work, w), daemon=True)
            for w in range(4)
        ]
        for thread in threads:
            thread.start()
        with lock:
            print("started", flush=True)
        for thread in threads:
            thread.join()
    """
)

THREAD_KILLS = 8


def test_every_call_that_returned_on_any_thread_is_in_the_bundle_after_a_kill(
    tmp_path: Path,
) -> None:
    """Four threads calling, ``flush_interval=0``, SIGKILL at a random moment: every call a
    thread saw return is in the loaded bundle. Before, loading cut the bundle at the first call
    number missing -- a call another thread had started and not yet ended -- and dropped the
    calls that returned after it (2 kills in 8)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD_THREADS)

    def kill_one(n: int) -> tuple[Path, set[tuple[int, int]]]:
        rng = random.Random(2810 + n)
        directory = tmp_path / f"threads-{n}"
        directory.mkdir()
        child = subprocess.Popen(
            [sys.executable, str(script), str(directory / "run.sftrace"), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert child.stdout is not None
        lines = [child.stdout.readline()]
        wanted = rng.randrange(50, 400)
        for line in child.stdout:
            lines.append(line)
            if len(lines) > wanted:
                break
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=60)
        returned = {
            (int(w), int(i))
            for w, i in (line.split() for line in [*lines, *rest.splitlines()] if " " in line)
        }
        return directory, returned

    with ThreadPoolExecutor(max_workers=2) as pool:
        killed = list(pool.map(kill_one, range(THREAD_KILLS)))
    for directory, returned in killed:
        trace = load_trace(directory / "run.sftrace")
        assert not trace.complete
        kept = {
            tuple(json.loads(c.input)[k] for k in ("worker", "i"))  # type: ignore[union-attr]
            for c in trace.calls
            if trace.outcome_of(c) is not None
        }
        assert returned, directory.name
        lost = returned - kept
        assert not lost, (directory.name, sorted(lost)[:5], trace.incomplete_reason)
        numbers = [c.seq for c in trace.calls]
        assert numbers == sorted(numbers)


def test_a_bundle_cut_by_a_full_disk_says_so(
    recording: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When a write fails (ENOSPC), the bundle said "the recording stopped before the run
    ended" although the run went on and ended: its header's reason is overwritten in place (no
    new block needed), so the file says why."""
    import errno

    from stepfork_otel import record
    from stepfork_otel.otel import writer

    recording.processor.flush_interval = 0
    bundle = tmp_path / "run.sftrace"
    real_write = os.write

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with record(bundle):
        lookup("a")
        monkeypatch.setattr(writer.os, "write", full)
        lookup("b")  # (recording never raises: logged)
        monkeypatch.setattr(writer.os, "write", real_write)
        lookup("c")
    trace = load_trace(bundle)
    assert not trace.complete
    assert [c.input for c in trace.calls] == ['{"city":"a"}']  # type: ignore[union-attr]
    assert trace.incomplete_reason is not None
    assert trace.incomplete_reason.startswith("writing the bundle failed: [Errno 28] No space")
    assert "stopped before the run ended" not in trace.incomplete_reason
