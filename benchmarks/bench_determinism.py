"""Determinism capture: what ``time.time()`` and friends cost with capture off, on, and in
replay (``recording/determinism.py``).

All in this process, interleaved rounds, each read timed in a loop of ``READS`` reads made from
this module (the run's "own code"):

* **Capture off.** ``time.time()`` with nothing active, against ``time.time()`` inside a
  ``record(...)`` run without capture: nothing is installed then, so the ratio must be 1.0.
* **Capture on.** A captured read (``time.time()``, ``datetime.now()``, ``uuid.uuid4()``,
  ``random.random()``) inside a capturing run, the reads written down at the run's end included;
  a read of the same function by the standard library (``email.utils.formatdate``) and a read from
  another context while the interception is in place: what the run's own reads cost, and what
  code outside the run pays meanwhile.
* **Replay.** The same reads served from a recording.
* **Starting threads and tasks** while a run captures: each context the run's own code copies
  (``contextvars.copy_context()``) and each asyncio task it creates is numbered, so that replay
  can serve each thread its own values.
* **Starting a capturing run**: installing the interception (the run's modules' names are
  replaced: one pass over ``sys.modules``).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import email.utils
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from benchmarks._common import interleave, paired_ratio, ratio_rows, table
from stepfork_otel import ReplaySession, configure, record
from stepfork_otel.otel import setup
from stepfork_otel.recording import determinism


def fmt_us(seconds: float) -> str:
    """Reads cost tens of nanoseconds to microseconds: both shown exactly enough."""
    if seconds < 1e-6:
        return f"{seconds * 1e9:,.0f} ns"
    return f"{seconds * 1e6:,.2f} µs"


def _reads(fn: Callable[[], object], n: int) -> Callable[[], float]:
    def measure() -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n

    return measure


def _in_run(
    directory: Path, fn: Callable[[], object], n: int, capture: str | None
) -> Callable[[], float]:
    """Seconds per read of ``n`` reads inside one run (its start and end not timed, except that
    the reads' hand-over to the run span is: it happens when the run ends)."""
    counter = [0]

    def measure() -> float:
        counter[0] += 1
        run = record(directory / f"run-{counter[0]}.sftrace", capture=capture)
        run.__enter__()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if capture is None:
            elapsed = time.perf_counter() - start
            run.__exit__(None, None, None)
            return elapsed / n
        run._end_capture(run._span)  # type: ignore[arg-type]  # (timed: the reads' JSON)
        elapsed = time.perf_counter() - start
        run.__exit__(None, None, None)
        return elapsed / n

    return measure


def _replayed(
    directory: Path, fn: Callable[[], object], n: int, capture: str
) -> Callable[[], float]:
    path = directory / f"replay-{capture}.sftrace"
    with record(path, capture=capture):
        for _ in range(n):
            fn()

    def measure() -> float:
        with ReplaySession.from_trace(path) as session:
            start = time.perf_counter()
            for _ in range(n):
                fn()
            elapsed = time.perf_counter() - start
        session.verify_complete()
        return elapsed / n

    return measure


def _elsewhere(fn: Callable[[], object], n: int) -> Callable[[], float]:
    """Reads from a context without a run while a run in another context captures."""

    def measure() -> float:
        context = contextvars.copy_context()
        started = context.run(determinism.start_run, frozenset({"time"}), False)
        try:
            return _reads(fn, n)()
        finally:
            if started is not None:
                context.run(determinism.stop_run, started)

    return measure


async def _nothing() -> None:
    return None


def _tasks(count: int) -> Callable[[], None]:
    """An event loop that runs ``count`` tasks made by ``gather`` (the loop's start included)."""

    async def main() -> None:
        await asyncio.gather(*(_nothing() for _ in range(count)))

    return lambda: asyncio.run(main())


def run(quick: bool = False) -> str:
    n = 2_000 if quick else 20_000
    rounds = 3 if quick else 9
    directory = Path(tempfile.mkdtemp(prefix="stepfork-bench-det-"))
    configure(directory=directory)
    try:
        return _run(directory, n, rounds)
    finally:
        setup.reset()


def _run(directory: Path, n: int, rounds: int) -> str:
    clock = time.time
    formatdate = email.utils.formatdate
    sources: list[tuple[str, Callable[[], object], str]] = [
        ("time.time()", lambda: time.time(), "time"),
        ("datetime.now()", lambda: datetime.datetime.now(), "time"),
        ("uuid.uuid4()", lambda: uuid.uuid4(), "uuid"),
        ("random.random()", lambda: random.random(), "random"),
    ]
    off = interleave(
        [
            ("nothing active", _reads(lambda: time.time(), n)),
            ("in a run without capture", _in_run(directory, lambda: time.time(), n, None)),
        ],
        rounds,
    )
    assert time.time is clock  # nothing left installed
    rows = ratio_rows(
        off,
        "nothing active",
        [
            ("`time.time()`, nothing active (baseline)", "nothing active"),
            ("`time.time()` in a `record(...)` run without capture", "in a run without capture"),
        ],
        headline="in a run without capture",
        fmt=fmt_us,
    )
    on_rows = []
    for label, fn, capture in sources:
        series = interleave(
            [
                ("live", _reads(fn, n)),
                ("captured", _in_run(directory, fn, n, capture)),
                ("replayed", _replayed(directory, fn, n, capture)),
            ],
            rounds,
        )
        live = series["live"].median
        on_rows.append(
            [
                f"`{label}`",
                fmt_us(live),
                f"{fmt_us(series['captured'].median)} "
                f"(+{fmt_us(series['captured'].median - live)})",
                f"{fmt_us(series['replayed'].median)}",
            ]
        )
    outside = interleave(
        [
            ("stdlib, nothing active", _reads(formatdate, n // 4)),
            ("stdlib, in a capturing run", _in_run(directory, formatdate, n // 4, "time")),
            ("another context", _elsewhere(lambda: time.time(), n)),
            ("baseline", _reads(lambda: time.time(), n)),
        ],
        rounds,
    )

    tasks = n // 10
    starts = interleave(
        [
            ("copy, nothing active", _reads(lambda: contextvars.copy_context(), n)),
            ("copy, capturing", _in_run(directory, lambda: contextvars.copy_context(), n, "time")),
            ("tasks, nothing active", _reads(_tasks(tasks), 1)),
            ("tasks, capturing", _in_run(directory, _tasks(tasks), 1, "time")),
        ],
        rounds,
    )

    def per_task(name: str) -> str:
        return fmt_us(starts[name].median / tasks)

    def install() -> float:
        begin = time.perf_counter()
        determinism.acquire()
        determinism.release()
        return time.perf_counter() - begin

    installs = interleave([("install", install)], rounds)
    modules = len(sys.modules)
    lines = [
        "## Determinism capture: the clock, randomness and uuids (bench_determinism.py)",
        "",
        f"{n:,} reads per measurement, made from this module (the run's own code), medians of "
        f"{rounds} interleaved rounds; ratios are per round.",
        "",
        "**Capture off** -- nothing is installed, so a read costs what it did:",
        "",
        table(["read", "per read", "x baseline"], rows),
        "",
        "**Capture on** -- a read of the run's own code, recorded (the reads' JSON, written on the "
        "span when the run ends, included), and the same read served in replay:",
        "",
        table(["read", "live", "captured (extra)", "served in replay"], on_rows),
        "",
        "**Code outside the run while a run captures** -- the interception is process-wide, the "
        "check is per read:",
        "",
        table(
            ["read", "per read", "x its baseline"],
            [
                *ratio_rows(
                    outside,
                    "stdlib, nothing active",
                    [
                        (
                            "`email.utils.formatdate()` (the standard library reads the clock), "
                            "nothing active",
                            "stdlib, nothing active",
                        ),
                        (
                            "the same, inside a capturing run (not captured: its caller is the "
                            "stdlib)",
                            "stdlib, in a capturing run",
                        ),
                    ],
                    fmt=fmt_us,
                ),
                [
                    "`time.time()` from a context without a run, while another context captures",
                    fmt_us(outside["another context"].median),
                    f"{paired_ratio(outside, 'another context', 'baseline'):.2f}x "
                    f"(vs {fmt_us(outside['baseline'].median)})",
                ],
            ],
        ),
        "",
        "**Starting threads and tasks** -- in a capturing run each context the run's own code "
        "copies, and each task it creates, is numbered (the thread each read names):",
        "",
        table(
            ["what", "nothing active", "in a capturing run", "x"],
            [
                [
                    "`contextvars.copy_context()` (a thread's context)",
                    fmt_us(starts["copy, nothing active"].median),
                    fmt_us(starts["copy, capturing"].median),
                    f"{paired_ratio(starts, 'copy, capturing', 'copy, nothing active'):.2f}x",
                ],
                [
                    f"an asyncio task ({tasks:,} by `gather`, the loop's start included)",
                    per_task("tasks, nothing active"),
                    per_task("tasks, capturing"),
                    f"{paired_ratio(starts, 'tasks, capturing', 'tasks, nothing active'):.2f}x",
                ],
            ],
        ),
        "",
        f"**Starting and ending a capturing run** adds installing and removing the "
        f"interception: {fmt_us(installs['install'].median)} with the {modules:,} modules loaded "
        "here (the run's own modules' names are found in one pass over `sys.modules`; whether a "
        "file is the run's own is remembered after the first run).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv))
