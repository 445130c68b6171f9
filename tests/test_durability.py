"""Crash-durable recording (issue 13, item 1): real processes killed at random points.

Each child records one run of many tool calls and prints the index of every call that returned.
It is killed -- ``SIGKILL`` mostly, ``SIGTERM`` sometimes -- at a random moment: while starting,
mid-run, while writing the bundle, after it. Whatever the moment, what is left on disk must load,
say ``complete: false`` unless the run ended, hold every call the child saw return, and replay up
to there; the next start in that directory turns a leftover journal into the bundle and deletes
half-written temporary files.
"""

from __future__ import annotations

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
from stepfork_otel.otel.writer import journal_path, recover_directory
from stepfork_otel.trace.bundle import load_trace
from stepfork_otel.trace.models import Trace

KILLS = 104
CALLS = 300

CHILD = textwrap.dedent(
    """
    import random, signal, sys, time
    from pathlib import Path
    from stepfork_otel import configure, record, trace_tool

    out, seed, own_handler = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    if own_handler:
        def stop(signum, frame):
            print("own handler", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, stop)
    configure(directory=out.parent)
    rng = random.Random(seed)

    @trace_tool
    def step(i: int) -> dict:
        time.sleep(0.0005 if rng.random() < 0.9 else 0.003)
        return {"i": i, "pad": "x" * rng.randrange(10, 3000)}

    with record(out, input={"calls": CALLS}, name="durable") as run:
        print("started", signal.getsignal(signal.SIGTERM) is stop if own_handler else "", flush=True)
        for i in range(CALLS):
            step(i)
            print(i, flush=True)
        run.set_output("done")
    print("ended", flush=True)
    """
).replace("CALLS", str(CALLS))


@trace_tool
def step(i: int) -> dict[str, Any]:  # the child's tool, for replaying what it left
    raise AssertionError("a replay never runs the body")


@dataclass
class Killed:
    directory: Path
    signum: int
    returned: int
    """Calls the child saw return before the kill."""
    ended: bool
    lines: list[str]
    code: int


def _run_and_kill(script: Path, directory: Path, seed: int, own_handler: bool = False) -> Killed:
    """Start a child and kill it: before it printed anything (1 in 20), after its run ended
    (1 in 20), or -- mostly -- right after it reported call ``k`` returned, ``k`` at random (the
    child keeps calling while the signal is sent, so the kill lands anywhere after ``k``)."""
    rng = random.Random(seed)
    directory.mkdir()
    child = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(directory / "run.sftrace"),
            str(seed),
            str(int(own_handler)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    signum = signal.SIGTERM if own_handler or rng.random() < 0.2 else signal.SIGKILL
    moment = rng.random()
    seen: list[str] = []
    if moment >= 0.05:
        wanted = "ended" if moment >= 0.95 else str(rng.randrange(CALLS))
        for line in child.stdout:
            seen.append(line.strip())
            if seen[-1] == wanted:
                break
        time.sleep(rng.uniform(0, 0.005))
    child.send_signal(signum)
    rest, _ = child.communicate(timeout=60)
    lines = [*seen, *rest.splitlines()]
    returned = sum(1 for line in lines if line.isdigit())
    return Killed(directory, signum, returned, "ended" in lines, lines, child.returncode)


def _check(killed: Killed) -> str:
    """What the kill left must load and hold every call that returned; returns where it hit."""
    bundle = killed.directory / "run.sftrace"
    journal = journal_path(bundle)
    left = sorted(p.name for p in killed.directory.iterdir())
    if killed.ended:
        assert load_trace(bundle).complete
        return "after the run"
    if not left:
        assert killed.returned == 0  # killed before the run began
        return "before the run"
    seen: Trace | None = None
    if journal.exists():  # the file loads as it is, before any recovery
        seen = load_trace(journal)
        assert not seen.complete
    recover_directory(killed.directory)  # the next start in this directory
    left = sorted(p.name for p in killed.directory.iterdir())
    assert left == ["run.sftrace"], left  # no journal, no temporary file
    trace = load_trace(bundle)
    finished = [c for c in trace.calls if trace.outcome_of(c) is not None]
    if trace.complete:  # killed after the bundle was written, before the journal was removed
        assert len(finished) == CALLS
        return "after the run"
    assert trace.incomplete_reason
    assert len(finished) >= killed.returned, (killed, len(finished))
    assert len(trace.calls) - len(finished) <= 1  # at most the call under way had no outcome
    assert [c.name for c in trace.calls] == ["step"] * len(trace.calls)  # type: ignore[union-attr]
    if seen is not None:
        assert len(seen.calls) <= len(trace.calls)
    with ReplaySession.from_trace(trace):  # replays up to there
        for i in range(len(finished)):
            assert step(i)["i"] == i
    return "mid-run" if killed.signum == signal.SIGKILL else "mid-run, SIGTERM"


def test_runs_killed_at_random_points_leave_bundles_that_load(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with ThreadPoolExecutor(max_workers=4) as pool:
        kills = list(
            pool.map(lambda n: _run_and_kill(script, tmp_path / f"kill-{n}", seed=n), range(KILLS))
        )
    where: dict[str, int] = {}
    for killed in kills:
        hit = _check(killed)
        where[hit] = where.get(hit, 0) + 1
    assert len(kills) >= 100
    mid_run = where.get("mid-run", 0) + where.get("mid-run, SIGTERM", 0)
    assert mid_run >= 0.6 * len(kills), where  # most kills land while calls are made
    assert where.get("mid-run, SIGTERM", 0) >= 5, where


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
    assert not journal_path(killed.directory / "run.sftrace").exists()


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
    assert recover_directory(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


# --- in process: the journal while a run is recorded -----------------------------------------------


@trace_tool
def lookup(city: str) -> str:
    return city.upper()


def test_the_journal_holds_each_call_as_it_returns_and_goes_when_the_run_ends(
    recording: Any, tmp_path: Path
) -> None:
    from stepfork_otel import record

    bundle = tmp_path / "run.sftrace"
    with record(bundle, name="cities"):
        lookup("lisbon")
        journal = journal_path(bundle)
        mid = load_trace(journal)  # readable while the run goes on
        assert not mid.complete
        assert [c.name for c in mid.calls] == ["lookup"]  # type: ignore[union-attr]
        assert mid.outcome_of(mid.calls[0]) is not None
        lookup("porto")
        assert len(load_trace(journal).calls) == 2
    assert not journal.exists()
    final = load_trace(bundle)
    assert final.complete
    assert [c.input for c in final.calls] == ['{"city":"lisbon"}', '{"city":"porto"}']  # type: ignore[union-attr]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_fsync_policy_and_switching_the_journal_off(
    recording: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepfork_otel import record
    from stepfork_otel.otel import writer

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(".journal"):  # (the bundle's own atomic write fsyncs too)
            synced.append(name)
        real_fsync(fd)

    monkeypatch.setattr(writer.os, "fsync", fsync)
    recording.processor.fsync_interval = 0  # every append
    with record(tmp_path / "every.sftrace"):
        lookup("a")
        lookup("b")
    assert len(synced) >= 4  # two lines per call
    synced.clear()
    recording.processor.fsync_interval = None  # never
    with record(tmp_path / "never.sftrace"):
        lookup("a")
    assert synced == []
    recording.processor.journal = False
    with record(tmp_path / "off.sftrace"):
        lookup("a")
        assert not journal_path(tmp_path / "off.sftrace").exists()
    assert load_trace(tmp_path / "off.sftrace").complete


def test_a_journal_of_a_live_process_is_left_alone(recording: Any, tmp_path: Path) -> None:
    from stepfork_otel import record

    bundle = tmp_path / "run.sftrace"
    with record(bundle):
        lookup("a")
        assert recover_directory(tmp_path) == []  # (this process is alive)
        assert journal_path(bundle).exists()
        assert not bundle.exists()
