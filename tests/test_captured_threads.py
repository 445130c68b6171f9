"""Captured reads of several threads at one call site (issue 28): replay serves captured values in
the recorded order of the run's reads, and concurrent threads need not read in that order -- a
thread may then be served another thread's value, and the call it makes next is reported as
"input differs". The report says so: the site's reads were served to several threads."""

from __future__ import annotations

import contextvars
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from stepfork_otel import ReplayMismatchError, ReplaySession, record, trace_tool
from stepfork_otel.trace.models import Trace


@trace_tool
def report(worker: int, value: float) -> int:
    return worker


def _draw(worker: int, turn: threading.Event, then: threading.Event) -> float:
    turn.wait(10)
    value = random.random()  # one call site, read by both threads
    then.set()
    return value


def _run(first: int) -> list[BaseException]:
    """Two threads read at one site, ``first`` before the other; then each calls ``report``
    with what it read, worker 0 first."""
    go = [threading.Event(), threading.Event()]
    drawn = [threading.Event(), threading.Event()]
    reported = threading.Event()
    values: dict[int, float] = {}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            values[worker] = _draw(worker, go[worker], drawn[worker])
            if worker == 1:
                reported.wait(10)
            report(worker, values[worker])
        except BaseException as exc:
            errors.append(exc)
        finally:
            if worker == 0:
                reported.set()

    threads = [
        threading.Thread(target=contextvars.copy_context().run, args=(work, w)) for w in (0, 1)
    ]
    for thread in threads:
        thread.start()
    go[first].set()
    drawn[first].wait(10)
    go[1 - first].set()
    for thread in threads:
        thread.join(10)
    return errors


def test_a_value_served_to_another_thread_is_reported_as_such(
    recording: Any, tmp_path: Path
) -> None:
    path = tmp_path / "run.sftrace"
    with record(path, capture=("random",)):
        assert _run(first=0) == []
    trace = Trace.load(path)
    assert [r.source for r in trace.captured] == ["random.random", "random.random"]
    with ReplaySession.from_trace(trace):
        errors = _run(first=1)  # worker 1 reads first: it is served worker 0's value
    mismatch = next(e for e in errors if isinstance(e, ReplayMismatchError))
    text = str(mismatch)
    assert "input differs" in text
    assert "captured reads of random.random at" in text
    assert "were served to 2 threads" in text
    assert "a thread may have been served the value another thread read" in text


def test_reads_of_one_thread_get_no_such_note(recording: Any, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace"

    def agent(shift: float) -> None:
        report(0, random.random() + shift)

    with record(path, capture=("random",)):
        agent(0.0)
    with ReplaySession.from_trace(Trace.load(path)), pytest.raises(ReplayMismatchError) as info:
        agent(1.0)  # (the input differs for another reason)
    assert "input differs" in str(info.value)
    assert "served to" not in str(info.value)
