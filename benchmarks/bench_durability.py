"""Recording a long run: peak memory, what crash durability costs per call, the run's end.

One ``record(...)`` run of ``CALLS`` tool calls whose input and output are about 2 KB each, in a
fresh child process per variant (``python -m benchmarks.bench_durability --child VARIANT N``).
The bundle is written as the run goes: each call's events are appended when it ends,
and the trailer when the run ends. Variants: the default (appends buffered, flushed by a
background thread at most 1 s after the call ended: what a ``SIGKILL`` can lose), no background
flush (``background_flush=False``: written when 1 MiB is buffered and at the end -- the baseline, no
durability bound) and ``flush_interval=0`` (one ``write`` per call, made by the writer
thread while the call waits for it: the hand-off between the two threads is most of its cost). The per-trace span cap stays at its default (10,000): a run holds
what is open, so it is never met. Measured: the calls (median per call), the run's end (the
trailer and the close), the peak resident memory the run added (``VmHWM`` reset after the
imports, see ``benchmarks/_child.py``), and the bytes on disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CALLS = 100_000
QUICK_CALLS = 300
VARIANTS = ("flush <= 1 s (default)", "no background flush", "flush at once")
_SETTINGS = {  # variant -> (background_flush, flush_interval)
    "flush <= 1 s (default)": (True, 1.0),
    "no background flush": (False, 1.0),
    "flush at once": (True, 0.0),
}
#: The per-call cost is measured apart, in interleaved rounds of shorter runs (a child each).
ROUNDS, ROUND_CALLS = 7, 5_000
QUICK_ROUNDS, QUICK_ROUND_CALLS = 2, 200


def _child(variant: str, calls: int) -> dict[str, Any]:
    import tempfile

    from opentelemetry.sdk.trace import TracerProvider

    from benchmarks._common import payload_pool
    from benchmarks._proc import reset_peak, status
    from stepfork_otel import record, trace_tool
    from stepfork_otel.otel.processor import SftraceSpanProcessor
    from stepfork_otel.otel.setup import configure
    from stepfork_otel.trace.models import Trace

    pool = payload_pool(2_000, 64)
    provider = TracerProvider()
    processor = configure(tracer_provider=provider)
    assert isinstance(processor, SftraceSpanProcessor)
    processor.background_flush, processor.flush_interval = _SETTINGS[variant]

    @trace_tool
    def tool(request: Any) -> Any:
        return pool[(hash(str(request)[:32]) + 1) % len(pool)]

    directory = Path(tempfile.mkdtemp(prefix="stepfork-bench-durability-"))
    path = directory / "run.sftrace"
    reset_peak()
    base = status("VmRSS")
    on_disk_mid = 0
    start = time.perf_counter()
    with record(path, name="long"):
        for n in range(calls):
            tool(pool[n % len(pool)])
            if n == calls // 2:
                on_disk_mid = path.stat().st_size  # written as the run goes
        calls_done = time.perf_counter()
    ended = time.perf_counter()
    peak = status("VmHWM") - base
    size = path.stat().st_size
    complete = Trace.load(path).complete if calls <= 10_000 else None
    leftovers = sorted(p.name for p in directory.iterdir() if p.name != "run.sftrace")
    for p in directory.iterdir():
        p.unlink()
    directory.rmdir()
    provider.shutdown()
    return {
        "per_call_us": (calls_done - start) / calls * 1e6,
        "end_s": ended - calls_done,
        "peak_mb": peak / 1e6,
        "bundle_mb": size / 1e6,
        "mid_mb": on_disk_mid / 1e6,
        "leftovers": leftovers,
        "complete": complete,
    }


def _in_child(variant: str, calls: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_durability", "--child", variant, str(calls)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool = False) -> str:
    import statistics

    from benchmarks._common import table

    calls = QUICK_CALLS if quick else CALLS
    rounds, round_calls = (QUICK_ROUNDS, QUICK_ROUND_CALLS) if quick else (ROUNDS, ROUND_CALLS)
    base = "no background flush"
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS}
    per_call: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):  # interleaved: a noisy neighbour slows a round, not one side
        got = {v: _in_child(v, round_calls) for v in VARIANTS}
        for v in VARIANTS:
            assert got[v]["complete"], got[v]
            assert not got[v]["leftovers"], got[v]
            total = got[v]["per_call_us"] + got[v]["end_s"] / round_calls * 1e6
            per_call[v].append(total)
            ratios[v].append(
                total / (got[base]["per_call_us"] + got[base]["end_s"] / round_calls * 1e6)
            )
    median = {v: statistics.median(per_call[v]) for v in VARIANTS}
    ratio = {v: statistics.median(ratios[v]) for v in VARIANTS}
    results = {variant: _in_child(variant, calls) for variant in VARIANTS}
    rows = []
    for variant in VARIANTS:
        r = results[variant]
        rows.append(
            [
                variant,
                f"{median[variant]:.1f} µs ({ratio[variant]:.2f}x)",
                f"{r['end_s'] * 1e3:.1f} ms",
                f"{r['peak_mb']:.0f} MB",
                f"{r['bundle_mb']:.1f} MB",
                f"{r['mid_mb']:.1f} MB",
            ]
        )
    default = results[VARIANTS[0]]
    return "\n".join(
        [
            "## Long runs: memory, crash durability, the run's end (bench_durability.py)",
            "",
            f"One `record(...)` run of {calls:,} tool calls, input and output about 2,000 B each, "
            "one fresh child process per variant, the per-trace span cap at its default (10,000). "
            "The bundle is written as the run goes. Peak memory: resident high-water "
            "mark added by the run.",
            "",
            table(
                [
                    "variant",
                    f"per call, run's end included ({round_calls:,}-call runs)",
                    "run's end (trailer + close)",
                    "peak memory added",
                    "bundle",
                    "on disk at the run's half-way point",
                ],
                rows,
            ),
            "",
            f"Per call: medians of {rounds} interleaved rounds of a {round_calls:,}-call run in "
            "a fresh child each, the run's end spread over its calls; the ratio is to the run "
            "without a background flush (median of the per-round ratios). Memory holds what is "
            f"open, not the run: {default['peak_mb']:.0f} MB added for a "
            f"{default['bundle_mb']:.0f} MB bundle ({default['peak_mb'] / default['bundle_mb']:.2f}x"
            "), and the run's end writes one trailer.",
            "",
        ]
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
    else:
        print(run(quick="--quick" in sys.argv))
