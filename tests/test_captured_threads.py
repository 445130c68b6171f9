"""Captured reads of several threads and tasks at one call site (issue 28).

Each captured read says which of the run's threads made it (``CapturedRead.thread``: the threads
and tasks numbered in the order the run's own code started them), and replay serves each thread
its own values in its own order -- whatever order the threads read in, at record and at replay
time. The interleavings are drawn from seeds (``determinism_agents.Turns``), and each test checks
that the replay's interleaving is not the recording's, so the test means something. A read the
recording made in another thread is reported as such; a read that cannot be told apart (threads a
library started share their parent's number) is named in the mismatch it causes.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from test_docs_snippets import parse_blocks

from examples.fake_llm import FakeLLM
from stepfork_otel import ReplayMismatchError, ReplaySession, record, trace_tool
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.models import Trace
from tests.conftest import Recording
from tests.determinism_agents import WAIT, Turns, stamp

AGENTS = ROOT / "tests" / "determinism_agents.py"
SEEDS = [(1, 2), (3, 4), (5, 6), (7, 8)]
"""(recording's seed, replay's seed): each pair draws two different interleavings."""


@trace_tool
def report(worker: int, stamps: list[Any]) -> str:
    """Stands in for the call each worker makes with what it read."""
    return f"worker {worker}: {len(stamps)} stamps"


def _in_order(worker: int, asked: list[threading.Event], call: Callable[[], Any]) -> Any:
    """``call`` after worker ``worker - 1``'s (the calls keep one order: the reads do not)."""
    if worker and not asked[worker - 1].wait(WAIT):
        raise TimeoutError(f"worker {worker - 1} never reported")
    try:
        return call()
    finally:
        asked[worker].set()


def _threads(seed: int, workers: int = 4, rounds: int = 3) -> dict[str, Any]:
    """Threads of a pool, each in a copy of the run's context, stamp ``rounds`` times at the same
    lines in the order ``seed`` draws, then report what they read."""
    turns = Turns(workers, rounds, seed)
    asked = [threading.Event() for _ in range(workers)]

    def work(worker: int) -> list[Any]:
        stamps = []
        for _ in range(rounds):
            with turns.turn(worker):
                stamps.append(stamp())
        _in_order(worker, asked, lambda: report(worker, stamps))
        return stamps

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, w) for w in range(workers)]
        return {"stamps": [f.result() for f in futures], "order": turns.order}


def _tasks(seed: int, workers: int = 4, rounds: int = 3) -> dict[str, Any]:
    """asyncio tasks -- two by ``gather``, two in a ``TaskGroup`` (``create_task`` before Python
    3.11) -- stamp in the order ``seed`` draws, then report one after the other."""
    turns = Turns(workers, rounds, seed)

    async def main() -> list[list[Any]]:
        asked = [asyncio.Event() for _ in range(workers)]

        async def work(worker: int) -> list[Any]:
            stamps = []
            for _ in range(rounds):
                async with turns.aturn(worker):
                    stamps.append(stamp())
            if worker:
                await asyncio.wait_for(asked[worker - 1].wait(), WAIT)
            try:
                report(worker, stamps)
            finally:
                asked[worker].set()
            return stamps

        half = workers // 2
        gathered = asyncio.gather(*(work(w) for w in range(half)))
        if sys.version_info >= (3, 11):
            async with asyncio.TaskGroup() as group:
                grouped = [group.create_task(work(w)) for w in range(half, workers)]
                first = await gathered
        else:  # (no TaskGroup before Python 3.11)
            grouped = [asyncio.create_task(work(w)) for w in range(half, workers)]
            first = await gathered
            await asyncio.wait(grouped)
        return [*first, *(task.result() for task in grouped)]

    return {"stamps": asyncio.run(main()), "order": turns.order}


def _to_thread(seed: int, workers: int = 4, rounds: int = 2) -> dict[str, Any]:
    """asyncio tasks that each stamp in a thread of their own (``asyncio.to_thread``)."""
    turns = Turns(workers, rounds, seed)

    def stamps(worker: int) -> list[Any]:
        made = []
        for _ in range(rounds):
            with turns.turn(worker):
                made.append(stamp())
        return made

    async def main() -> list[list[Any]]:
        made = await asyncio.gather(*(asyncio.to_thread(stamps, w) for w in range(workers)))
        for worker, values in enumerate(made):
            report(worker, values)
        return list(made)

    return {"stamps": asyncio.run(main()), "order": turns.order}


def _nested(seed: int, workers: int = 2, inner: int = 2) -> dict[str, Any]:
    """Threads that each start threads of their own; the inner threads stamp in the order
    ``seed`` draws (thread ``2.1`` is the first thread that thread ``2`` started)."""
    turns = Turns(workers * inner, 2, seed)

    def leaf(number: int) -> list[Any]:
        made = []
        for _ in range(2):
            with turns.turn(number):
                made.append(stamp())
        return made

    def work(worker: int) -> list[list[Any]]:
        with ThreadPoolExecutor(max_workers=inner) as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, leaf, worker * inner + i)
                for i in range(inner)
            ]
            return [f.result() for f in futures]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, w) for w in range(workers)]
        made = [f.result() for f in futures]
    report(0, made)
    return {"stamps": made, "order": turns.order}


AGENTS_BY_NAME: dict[str, Callable[[int], dict[str, Any]]] = {
    "threads": _threads,
    "tasks": _tasks,
    "to_thread": _to_thread,
    "nested": _nested,
}
THREADS = {
    "threads": {"1", "2", "3", "4"},
    "tasks": {"1", "2", "3", "4"},  # (asyncio.run's main task continues the run's thread)
    "to_thread": {"1", "2", "3", "4"},  # (gather makes each to_thread a task: its thread is it)
    "nested": {"1.1", "1.2", "2.1", "2.2"},
}


@pytest.mark.parametrize(("seeds"), SEEDS, ids=lambda s: f"seeds{s[0]}-{s[1]}")
@pytest.mark.parametrize("name", list(AGENTS_BY_NAME))
def test_each_thread_is_served_its_own_values_in_any_interleaving(
    recording: Recording, tmp_path: Path, name: str, seeds: tuple[int, int]
) -> None:
    agent = AGENTS_BY_NAME[name]
    path = tmp_path / "run.sftrace"
    with record(path, capture=("time", "random", "uuid")) as run:
        recorded = agent(seeds[0])
        run.set_output(recorded["stamps"])
    trace = Trace.load(path)
    assert {r.thread for r in trace.captured} == THREADS[name]
    by_thread: dict[str | None, list[int]] = {}
    for read in trace.captured:
        by_thread.setdefault(read.thread, []).append(read.index)
    assert all(indexes == sorted(indexes) for indexes in by_thread.values())

    with ReplaySession.from_trace(trace) as session:
        replayed = agent(seeds[1])
    session.verify_complete()
    assert replayed["order"] != recorded["order"]  # another interleaving
    assert replayed["stamps"] == recorded["stamps"]  # each worker got its own values
    reads = session.summary.reads
    assert reads.recorded == reads.served == len(trace.captured)
    assert all(call.action == "substituted" for call in session.summary.calls)


def test_a_bundle_rebuilt_from_exported_spans_keeps_each_read_s_thread(
    recording: Recording, tmp_path: Path
) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter

    out = tmp_path / "otlp.jsonl"
    exporter = OtlpJsonFileExporter(out)
    recording.provider.add_span_processor(SimpleSpanProcessor(exporter))
    path = tmp_path / "run.sftrace"
    with record(path, capture=("time", "random", "uuid")):
        recorded = _tasks(21)
    exporter.shutdown()
    trace = Trace.load(path)
    imported = Trace.from_otlp_json(out)
    assert imported.captured == trace.captured
    assert {r.thread for r in imported.captured} == THREADS["tasks"]
    rebuilt = tmp_path / "imported.sftrace"
    imported.save(rebuilt)
    with ReplaySession.from_trace(rebuilt) as session:
        replayed = _tasks(22)
    session.verify_complete()
    assert replayed["order"] != recorded["order"]
    assert replayed["stamps"] == recorded["stamps"]


def test_an_agent_with_threads_and_tasks_replays_in_another_interleaving_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    """The real OpenAI SDK (sync in pool threads, async in tasks); recorded with one interleaving,
    replayed in a fresh process with another, the server stopped."""
    bundle = tmp_path / "workers.sftrace"

    def agent(mode: str, seed: int) -> Any:
        out = tmp_path / f"{mode}.json"
        done = subprocess.run(
            [sys.executable, str(AGENTS), mode, str(bundle), str(out), url, str(seed)],
            capture_output=True,
            text=True,
            timeout=180,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(out.read_text())

    with FakeLLM() as llm:
        url = llm.openai_url
        recorded = agent("record-workers", 11)
        requests = len(llm.requests)
    replayed = agent("replay-workers", 12)
    assert requests == 6  # three threads and three tasks, one request each
    assert "error" not in replayed, replayed.get("error")
    assert replayed["result"]["order"] != recorded["result"]["order"]
    for part in ("threads", "tasks"):
        assert replayed["result"][part] == recorded["result"][part]
    assert replayed["calls"] == [["llm", "substituted"]] * 6
    assert replayed["reads"] == [48, 48]  # 6 workers x 2 stamps x 4 reads
    threads = {r.thread for r in Trace.load(bundle).captured}
    assert threads == {"1", "2", "3", "4", "5", "6"}


# --- reads that are not the thread's own ------------------------------------------------------------


def _pickers(first: int, picks: tuple[int, ...]) -> list[str]:
    """Workers pick ``picks[w]`` random numbers each at one line, worker ``first`` first, then
    report in order. Raises the first error a worker raised."""
    workers = len(picks)
    turns = Turns(workers, 1, 0)
    turns.order = [first, *(w for w in range(workers) if w != first)]
    asked = [threading.Event() for _ in range(workers)]
    errors: list[BaseException] = []

    def work(worker: int) -> str:
        try:
            with turns.turn(worker):
                values = [random.random() for _ in range(picks[worker])]
            return str(_in_order(worker, asked, lambda: report(worker, values)))
        except BaseException as exc:
            errors.append(exc)
            raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, w) for w in range(workers)]
        for future in futures:
            future.exception()
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


def _record_pickers(path: Path, picks: tuple[int, ...]) -> Trace:
    with record(path, capture=("random",)):
        _pickers(0, picks)
    return Trace.load(path)


def test_a_read_the_recording_made_in_another_thread_is_reported_as_such(
    recording: Recording, tmp_path: Path
) -> None:
    trace = _record_pickers(tmp_path / "run.sftrace", (1, 1))
    assert [(r.index, r.thread) for r in trace.captured] == [(1, "1"), (2, "2")]
    with ReplaySession.from_trace(trace), pytest.raises(ReplayMismatchError) as raised:
        _pickers(1, (0, 2))  # worker 0 no longer picks; worker 1 picks twice, first
    text = str(raised.value)
    site = next(r.site for r in trace.captured)
    assert (
        f"captured read by another thread: this run read random.random at {site} in thread 2, "
        "but the recording read it there in thread 1 (read 1); its own recorded reads are used up"
    ) in text
    assert f"recorded: read 1 random.random at {site} in thread 1 (before call 1)" in text
    assert "a captured value is served only to the thread that read it" in text
    assert "input differs" not in text  # reported at the read, not at the call after it


def test_a_thread_the_recording_never_read_in_is_named(
    recording: Recording, tmp_path: Path
) -> None:
    trace = _record_pickers(tmp_path / "run.sftrace", (1, 1))
    with ReplaySession.from_trace(trace) as session, pytest.raises(ReplayMismatchError) as raised:
        _pickers(0, (1, 1, 1))  # a third worker, which the recording did not have
    site = trace.captured[0].site
    assert (
        f"this run read random.random at {site} in thread 3, which made no captured reads in "
        "the recording (they were made by thread 1, thread 2)"
    ) in str(raised.value)
    assert session.summary.reads.served == 2


def test_a_thread_reading_more_than_recorded_is_told_its_reads_are_used_up(
    recording: Recording, tmp_path: Path
) -> None:
    trace = _record_pickers(tmp_path / "run.sftrace", (1, 2))
    with ReplaySession.from_trace(trace), pytest.raises(ReplayMismatchError) as raised:
        _pickers(0, (1, 3))
    site = trace.captured[0].site
    assert (
        f"this run read random.random at {site}, but the recording's 2 captured read(s) in "
        "thread 2 are used up"
    ) in str(raised.value)


def test_lenient_replay_reads_another_threads_read_live_and_notes_it(
    recording: Recording, tmp_path: Path
) -> None:
    trace = _record_pickers(tmp_path / "run.sftrace", (2, 0))
    with (
        ReplaySession.from_trace(trace, captured="lenient") as session,
        pytest.raises(ReplayMismatchError, match="input differs"),  # (its live value)
    ):
        _pickers(0, (1, 1))
    notes = session.summary.reads.notes
    assert notes == (
        "read live (captured='lenient'): captured read by another thread: this run read "
        f"random.random at {trace.captured[0].site} in thread 2, but the recording read it there "
        "in thread 1 (read 2); it made no captured reads in the recording",
    )
    assert session.summary.reads.served == 1
    assert session.summary.reads.left_over == (
        f"read 2 random.random at {trace.captured[1].site} in thread 1 (before call 1)",
    )


# --- how threads are numbered -----------------------------------------------------------------------


@trace_tool
def warm_up() -> str:
    """A tool whose body starts a thread of its own: frozen replay does not run it, so that
    thread is not one of the run's (the run's next threads keep their numbers)."""
    box: list[str] = []
    thread = threading.Thread(target=contextvars.copy_context().run, args=(box.append, "warm"))
    thread.start()
    thread.join()
    return box[0]


@pytest.mark.parametrize("seeds", SEEDS[:2], ids=lambda s: f"seeds{s[0]}-{s[1]}")
def test_threads_a_boundary_body_starts_are_not_numbered(
    recording: Recording, tmp_path: Path, seeds: tuple[int, int]
) -> None:
    def run(seed: int) -> dict[str, Any]:
        warm_up()
        return _threads(seed, workers=3, rounds=2)

    path = tmp_path / "run.sftrace"
    with record(path, capture=("random", "uuid", "time")):
        recorded = run(seeds[0])
    assert {r.thread for r in Trace.load(path).captured} == {"1", "2", "3"}
    with ReplaySession.from_trace(path) as session:
        replayed = run(seeds[1])
    session.verify_complete()
    assert replayed["stamps"] == recorded["stamps"]


def test_the_run_s_own_reads_name_no_thread(recording: Recording, tmp_path: Path) -> None:
    """Sequential code writes what it did before: no ``thread`` on its reads."""
    path = tmp_path / "run.sftrace"
    with record(path, capture=("time", "uuid")):
        report(0, [time.time(), str(uuid.uuid4())])
    assert [r.thread for r in Trace.load(path).captured] == [None, None]
    assert b'"thread"' not in path.read_bytes()


def test_threads_a_library_starts_share_a_number_and_a_mismatch_says_so(
    recording: Recording, tmp_path: Path
) -> None:
    """A library's own copy of the context is not numbered (a pool of a framework, say): its
    threads read as the thread that started them, in the recorded order of that thread's reads,
    which they need not keep. The mismatch that follows names it."""
    library = tmp_path / "site-packages" / "threadlib.py"
    library.parent.mkdir()
    library.write_text(
        "from contextvars import copy_context\n"
        "from threading import Thread\n\n\n"
        "def start(target, *args):\n"
        "    thread = Thread(target=copy_context().run, args=(target, *args))\n"
        "    thread.start()\n"
        "    return thread\n"
    )
    sys.path.insert(0, str(library.parent))
    try:
        import threadlib  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(library.parent))

    def run(first: int) -> None:
        turns = Turns(2, 1, 0)
        turns.order = [first, 1 - first]
        values: dict[int, float] = {}

        def work(worker: int) -> None:
            with turns.turn(worker):
                values[worker] = random.random()

        started = [threadlib.start(work, w) for w in (0, 1)]
        for thread in started:
            thread.join(WAIT)
        report(0, [values[0], values[1]])

    path = tmp_path / "run.sftrace"
    with record(path, capture=("random",)):
        run(first=0)
    assert [r.thread for r in Trace.load(path).captured] == [None, None]
    with ReplaySession.from_trace(path), pytest.raises(ReplayMismatchError) as raised:
        run(first=1)
    text = str(raised.value)
    assert "input differs" in text
    assert (
        "the captured values of the thread the run started in were served to 2 OS threads: a "
        "thread started where the run's own code does not copy the context (by a library, such "
        "as anyio.to_thread) has the number of the thread that started it"
    ) in text


def test_a_failure_numbering_a_thread_is_logged_and_the_thread_or_task_still_starts(
    recording: Recording,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from stepfork_otel import _internal
    from stepfork_otel.recording import determinism

    def broken(*args: Any) -> None:
        raise RuntimeError("numbering broke")

    monkeypatch.setattr(_internal, "RAISE_INTERNAL_ERRORS", False)
    monkeypatch.setattr(determinism, "_fork", broken)

    async def tasks() -> list[float]:
        async def one() -> float:
            return random.random()

        return list(await asyncio.gather(one(), one()))

    path = tmp_path / "run.sftrace"
    with record(path, capture=("random",)):
        answers = _pickers(0, (1, 1))  # threads in copied contexts
        picked = asyncio.run(tasks())
    assert answers == ["worker 0: 1 stamps", "worker 1: 1 stamps"]
    assert len(picked) == 2
    assert [r.thread for r in Trace.load(path).captured] == [None] * 4  # (read as the run's)
    assert "internal error while numbering a thread of the run" in caplog.text
    assert "internal error while numbering a task of the run" in caplog.text


@pytest.mark.parametrize(
    ("thread", "reason"),
    [
        ("0", "thread 0 is not a thread's number (such as 2 or 2.1)"),
        ("1..2", "thread 1..2 is not a thread's number"),
        ("", "thread  is not a thread's number"),
        ("main", "thread main is not a thread's number"),
    ],
)
def test_a_read_naming_no_thread_s_number_is_a_bundle_error(
    recording: Recording, tmp_path: Path, thread: str, reason: str
) -> None:
    trace = _record_pickers(tmp_path / "run.sftrace", (1, 1))
    data = trace.model_dump(mode="json")
    data["captured"][1]["thread"] = thread
    damaged = tmp_path / "damaged.sftrace"
    Trace.model_validate(data).save(damaged)
    with pytest.raises(BundleError, match=re.escape(f"captured read 2: {reason}")):
        Trace.load(damaged)


def test_an_audit_counts_every_thread_s_reads_at_a_site_once(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "run.sftrace"
    with record(path, capture="audit"):
        _pickers(0, (1, 2))
    audit = [r for r in Trace.load(path).captured if r.kind == "audit"]
    assert [(r.source, r.count, r.thread) for r in audit] == [("random.random", 3, None)]


# --- the docs ---------------------------------------------------------------------------------------


def test_the_threads_example_in_the_docs_prints_what_the_page_shows(tmp_path: Path) -> None:
    """docs/replay.md's workers.py, and the replay that reads in another thread: run as pasted,
    their output is the page's."""
    blocks = parse_blocks(ROOT / "docs" / "replay.md")
    saved = next(b for b in blocks if b.tokens.get("file") == "workers.py")
    assert saved.next_block is not None
    raising = saved.next_block.next_block
    assert raising is not None
    assert raising.tokens.get("raises") == "ReplayMismatchError"
    assert raising.next_block is not None
    (tmp_path / "workers.py").write_text(saved.source)
    (tmp_path / "again.py").write_text(
        "try:\n"
        + "".join(f"    {line}\n" for line in raising.source.splitlines())
        + "except Exception as exc:\n"
        + "    print(f'{type(exc).__name__}: {exc}')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for script, shown in (("workers.py", saved.next_block), ("again.py", raising.next_block)):
        done = subprocess.run(
            [sys.executable, script],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout == shown.source, done.stdout


def test_show_names_the_thread_of_each_read(recording: Recording, tmp_path: Path) -> None:
    from stepfork_otel.cli._common import Style
    from stepfork_otel.cli.show_cmd import captured_lines

    trace = _record_pickers(tmp_path / "run.sftrace", (1, 1))
    lines = [
        line
        for line in captured_lines(trace, Style(None, enabled=False), False)
        if "random.random" in line
    ]
    assert len(lines) == 2
    assert lines[0].endswith("in thread 1")
    assert lines[1].endswith("in thread 2")
