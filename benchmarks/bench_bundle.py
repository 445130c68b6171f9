"""Loading and verifying a large bundle: time, peak memory, file size (issue 2, "Performance").

The bundle: 100,000 recorded calls (half LLM requests, half tool calls, each with its outcome),
input and output payloads of about 2 KB each (realistic JSON, redacted, with real fingerprints),
built from the models and written with ``Trace.save``. Measured: ``Trace.load(path)`` plus
``verify_integrity(trace)`` (targets: <= 2 s, peak memory <= 3x the file size).

Every measurement runs in a fresh child process (``benchmarks/_child.py``, which also explains how
peak memory is read), in interleaved rounds with its baselines: reading the file and
``orjson.loads`` of each line the loader parses -- the header, event and end lines of the JSON
Lines layout; payload lines are taken verbatim, never parsed (the cost of parsing this bundle with
a fast JSON library and building nothing), and SHA-256 over every payload (the cost of
verification itself). Then the load is split into its parts to show what costs what. The same
run is also written in the layout a recording writes as the run goes (the header, the
events, a trailer), loaded and verified the same way, and a replay session is started on it
(load, verify, plan: the peak memory replay adds before its first call).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks._common import build_bundle, fmt_mb, fmt_ms, run_child, table, verdict

CALLS = 100_000
PAYLOAD = 2_000
TARGET_SECONDS = 2.0
TARGET_MEMORY = 3.0


def _rounds(path: Any, modes: list[str], rounds: int) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(rounds):
        shift = r % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            results[mode].append(run_child(mode, path))
    return results


def _median(results: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(r[key]) for r in results)


def _as_it_goes(path: Any) -> Any:
    """The bundle at ``path`` in the layout a recording writes as the run goes."""
    from stepfork_otel.trace.bundle import dump_trace, load_trace

    target = path.with_name(path.stem + "-as-it-goes.sftrace")
    if not target.exists():
        target.write_bytes(dump_trace(load_trace(path), trailer=True))
    return target


def run(quick: bool = False) -> str:
    calls = 2_000 if quick else CALLS
    rounds = 1 if quick else 5
    started = time.perf_counter()
    path = build_bundle(calls, PAYLOAD)
    build_time = time.perf_counter() - started
    size = path.stat().st_size
    modes = ["load_verify", "read_orjson", "sha_payloads", "parse_only"]
    res = _rounds(path, modes, rounds)
    traced = run_child("load_verify", path, "tracemalloc")
    as_it_goes = _as_it_goes(path)
    goes = _rounds(as_it_goes, ["load_verify", "session_start"], rounds)

    lv, ro, sha = res["load_verify"], res["read_orjson"], res["sha_payloads"]
    total = _median(lv, "total")
    ratio_orjson = statistics.median(a["total"] / b["total"] for a, b in zip(lv, ro, strict=True))
    mem = _median(lv, "rss_peak_added")
    mem_orjson = _median(ro, "rss_peak_added")
    parts = res["parse_only"]
    rows = [
        [
            "`Trace.load` + `verify_integrity`",
            fmt_ms(total),
            f"{ratio_orjson:.2f}x",
            fmt_mb(mem),
            f"{mem / size:.2f}x",
        ],
        [
            "baseline: read file + `orjson.loads` of each non-payload line",
            fmt_ms(_median(ro, "total")),
            "1.00x",
            fmt_mb(mem_orjson),
            f"{mem_orjson / size:.2f}x",
        ],
        [
            f"baseline: SHA-256 over all {sha[0]['payloads']:,} payloads "
            f"({fmt_mb(sha[0]['bytes'])})",
            fmt_ms(_median(sha, "total")),
            f"{statistics.median(s['total'] / b['total'] for s, b in zip(sha, ro, strict=True)):.2f}x",
            "-",
            "-",
        ],
    ]
    goes_total = _median(goes["load_verify"], "total")
    goes_mem = _median(goes["load_verify"], "rss_peak_added")
    session_mem = _median(goes["session_start"], "rss_peak_added")
    goes_size = as_it_goes.stat().st_size
    rows += [
        [
            "the same run written as it goes (trailer layout): load + verify",
            fmt_ms(goes_total),
            "-",
            fmt_mb(goes_mem),
            f"{goes_mem / goes_size:.2f}x",
        ],
        [
            "... and a replay session started on it (load, verify, plan)",
            fmt_ms(_median(goes["session_start"], "total")),
            "-",
            fmt_mb(session_mem),
            f"{session_mem / goes_size:.2f}x",
        ],
    ]
    split = [
        ["read the file (`Path.read_bytes`)", fmt_ms(_median(parts, "read"))],
        [
            "`parse_trace`: lines cut and checked, event lines validated by pydantic (strict) "
            "one by one, payloads taken verbatim",
            fmt_ms(_median(parts, "validate_json")),
        ],
        [
            "`validate_structure` (ids, parents, order), with the garbage collector's first pass "
            f"over the parsed objects ({fmt_ms(_median(parts, 'structure_gc'))} of it; the "
            "collector is paused during the parse)",
            fmt_ms(_median(parts, "structure")),
        ],
        ["`verify_integrity` (one SHA-256 per payload)", fmt_ms(_median(lv, "verify"))],
        [
            "= `Trace.load` + `verify_integrity`, measured together "
            f"(of it, garbage collection: {fmt_ms(_median(lv, 'gc'))})",
            fmt_ms(total),
        ],
    ]
    lines = [
        "## Bundle: load + verify a large bundle (bench_bundle.py)",
        "",
        f"{calls:,} recorded calls (half LLM, half tool; each a call event and an outcome event), "
        f"input and output about {PAYLOAD:,} B each; file size **{fmt_mb(size)}** "
        f"(built in {build_time:.1f} s, not measured). Each number is the median of {rounds} "
        "fresh child processes, run interleaved with the baselines; ratios are per-round. "
        "Peak memory: the kernel's resident high-water mark (`VmHWM`) reset after the child's "
        "imports, minus its RSS at that moment (see `benchmarks/_child.py`).",
        "",
        table(["what", "time", "x read+orjson", "peak memory added", "x file size"], rows),
        "",
        f"Targets: load + verify <= {TARGET_SECONDS:.0f} s: **{verdict(total, TARGET_SECONDS)}** "
        f"({total:.2f} s); peak memory <= {TARGET_MEMORY:.0f}x the file size: "
        f"**{verdict(mem / size, TARGET_MEMORY)}** ({mem / size:.2f}x). "
        f"tracemalloc peak of Python allocations during load + verify (one run): "
        f"{fmt_mb(traced['traced_peak'])} ({traced['traced_peak'] / size:.2f}x the file size).",
        "",
        "What the load costs, part by part (medians; the parts were timed in a separate child "
        "from the total):",
        "",
        table(["part", "time"], split),
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m benchmarks.bench_bundle [--quick]
    import sys

    print(run(quick="--quick" in sys.argv))
