"""Frozen replay: per-call cost, beside recording the same calls; session start on a big bundle.

Issue 3, "Performance". An agent makes ``CALLS`` dependency calls (alternately an ``@trace_tool``
tool and an ``llm_request``), input and output about 2 KB of realistic JSON each (one in ten
holding a secret). Each round records the run with ``record(...)`` and then replays it in frozen
mode with ``ReplaySession.from_trace(path)``, both on an SDK provider with the bundle processor
attached, timing every call. A replayed call's cost is everything the boundary does: normalise
and canonicalise the input (and redact and hash it, unless it is byte-identical to the recorded
input, which is already redacted and fingerprinted), match it against the recording, parse the
recorded output into a fresh value, and write the replay span. The agent runs outside any span of
its own, as a test that replays it does, so each call's span is a root. Target: median <= 50 µs.

Session start: ``ReplaySession.from_trace(path)`` on a 100,000-call bundle against
``Trace.load`` + ``verify_integrity`` alone, each in fresh child processes, interleaved.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks._common import (
    Recorder,
    build_bundle,
    fmt_mb,
    fmt_ms,
    fmt_us,
    payload_pool,
    recording,
    run_child,
    scratch_dir,
    table,
    verdict,
)
from stepfork_otel import ReplaySession, llm_request, record, trace_tool
from stepfork_otel import constants as k
from stepfork_otel.trace.canonical import canonical_bytes
from stepfork_otel.trace.models import Trace, payload_value
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

CALLS = 1_000
PAYLOAD = 2_000
TARGET_MEDIAN = 50e-6
#: Issue 12, item 3: a replayed call at most this many times a bare span, in the same run.
TARGET_RATIO = 2.0
BIG_BUNDLE_CALLS = 100_000


class _Agent:
    """A scripted agent: the same calls, with the same inputs, every time it runs."""

    def __init__(self, calls: int) -> None:
        self.inputs = payload_pool(PAYLOAD, calls, seed=3)
        self.outputs = payload_pool(PAYLOAD, calls, seed=4)
        outputs = self.outputs

        @trace_tool
        def search_flights(request: dict[str, Any], n: int) -> dict[str, Any]:
            return outputs[n]

        self.tool = search_flights

    def run(self) -> tuple[list[int], list[Any]]:
        """Make every call; return each call's duration (ns) and what it returned."""
        durations: list[int] = []
        results: list[Any] = []
        clock = time.perf_counter_ns
        outputs = self.outputs
        for n, value in enumerate(self.inputs):
            start = clock()
            if n % 2:
                result = llm_request(
                    provider="openai",
                    model="gpt-4.1-mini",
                    input=value,
                    call=lambda n=n: outputs[n],  # type: ignore[misc]
                )
            else:
                result = self.tool(value, n)
            durations.append(clock() - start)
            results.append(result)
        return durations, results


def _p90(values: list[int]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def _bare_spans(tracer: Any, plans: list[tuple[str, Any, dict[str, Any]]]) -> list[int]:
    """Bare SDK spans with the replay spans' names, kinds and attributes, each timed alone;
    roots, as the replay spans are."""
    durations: list[int] = []
    clock = time.perf_counter_ns
    for name, kind, attributes in plans:
        start = clock()
        with tracer.start_as_current_span(name, kind=kind, attributes=attributes):
            pass
        durations.append(clock() - start)
    return durations


def _parts(agent: _Agent, path: Any) -> list[list[str]]:
    """Two parts of a replayed call that are work on the payloads themselves, timed alone over
    the same inputs and outputs: the input's canonical JSON (compared with the recording) and
    the parse of the recorded output into the fresh value the agent gets."""
    trace = Trace.load(path)
    inputs = [{"request": v, "n": n} if n % 2 == 0 else v for n, v in enumerate(agent.inputs)]
    outcomes = [o for c in trace.calls if (o := trace.outcome_of(c)) and o.output]
    outputs = [o.output for o in outcomes]
    rows = []
    for label, fn, items in (
        ("canonical JSON of the input (`canonical_bytes`)", canonical_bytes, inputs),
        ("redaction of the input (`redact_canonical`)", _redacted, inputs),
        ("parse of the recorded output, as returned (`payload_value`)", payload_value, outputs),
    ):
        best = min(_time_all(fn, items) for _ in range(5))
        rows.append([label, fmt_us(best / len(items))])
    return rows


def _redacted(value: Any) -> str:
    return DEFAULT_REDACTOR.redact_canonical(canonical_bytes(value).decode("utf-8"))


def _time_all(fn: Any, items: list[Any]) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return time.perf_counter() - start


class _Stats:
    def __init__(self) -> None:
        self.medians: list[float] = []
        self.p90s: list[float] = []

    def add(self, durations: list[int]) -> None:
        self.medians.append(statistics.median(durations))
        self.p90s.append(_p90(durations))

    def row(self, label: str, ratio: str) -> list[str]:
        return [
            label,
            fmt_us(statistics.median(self.medians) / 1e9),
            fmt_us(statistics.median(self.p90s) / 1e9),
            ratio,
        ]


def _per_call(recorder: Recorder, calls: int, rounds: int) -> str:
    recorder.use(processors=True)
    agent = _Agent(calls)
    path = scratch_dir() / "replay.sftrace"
    with record(path):
        agent.run()

    def replay_once() -> None:
        with ReplaySession.from_trace(path):
            agent.run()

    plans = [  # what the replay spans carry, for the bare-span baseline
        (span.name, span.kind, dict(span.attributes or {}))
        for span in recorder.capture_spans(replay_once)
        if (span.attributes or {}).get(k.KIND) in (k.KIND_TOOL, k.KIND_LLM)
    ]
    if len(plans) != calls:
        raise RuntimeError(f"expected {calls} replay spans, got {len(plans)}")
    tracer = recorder.provider.get_tracer("bench")
    recording_, replay, bare = _Stats(), _Stats(), _Stats()
    for r in range(rounds + 1):  # the first round warms up
        with record(path):
            recorded, _ = agent.run()
        with ReplaySession.from_trace(path) as session:
            replayed, results = agent.run()
            session.verify_complete()
        spans = _bare_spans(tracer, plans)
        counts = session.summary.counts()
        if counts["substituted"] != calls:
            raise RuntimeError(f"expected {calls} substituted calls, got {counts}")
        trace = session.trace  # the values served are the recorded (redacted) outputs
        served = [
            payload_value(o.output) if (o := trace.outcome_of(c)) else None for c in trace.calls
        ]
        if served != results:
            raise RuntimeError("replay did not serve the recorded outputs")
        if r:
            recording_.add(recorded)
            replay.add(replayed)
            bare.add(spans)

    def times(a: _Stats, b: _Stats) -> float:
        return statistics.median(x / y for x, y in zip(a.medians, b.medians, strict=True))

    def ratio(a: _Stats, b: _Stats) -> str:
        return f"{times(a, b):.2f}x"

    median = statistics.median(replay.medians) / 1e9
    rows = [
        replay.row("frozen replay (match + substitute + replay span)", ratio(replay, bare)),
        recording_.row("recording the same calls", ratio(recording_, bare)),
        bare.row(
            f"baseline: bare SDK span with the replay span's attributes ({len(plans[0][2])})",
            "1.00x",
        ),
    ]
    rows[0][1] = f"**{rows[0][1]}**"
    return "\n".join(
        [
            table(["per call", "median", "p90", "x bare span"], rows),
            "",
            f"Targets: median <= {fmt_us(TARGET_MEDIAN)}: **{verdict(median, TARGET_MEDIAN)}** "
            f"({fmt_us(median)}); <= {TARGET_RATIO:g}x a bare span: "
            f"**{verdict(times(replay, bare), TARGET_RATIO)}** ({ratio(replay, bare)}). "
            f"A replayed call costs {ratio(replay, recording_)} the "
            "recording of the same call (per-round ratio of medians).",
            "",
            "Work on the payloads inside a replayed call, timed alone (best of 5 passes over the "
            f"{calls:,} payloads; inside the calls it costs more, the payloads no longer being in "
            "the CPU caches):",
            "",
            table(["part (per call)", "time"], _parts(agent, path)),
        ]
    )


def _session_start(calls: int, rounds: int) -> str:
    path = build_bundle(calls, PAYLOAD)
    size = path.stat().st_size
    modes = ["session_start", "load_verify", "session_parts"]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(rounds):
        shift = r % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            results[mode].append(run_child(mode, path))

    def median(mode: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in results[mode])

    start = median("session_start", "total")
    ratio = statistics.median(
        a["total"] / b["total"]
        for a, b in zip(results["session_start"], results["load_verify"], strict=True)
    )
    # the split, from one child per round: load, verify, then a session on the loaded trace
    # (its constructor verifies -- counted once below -- checks model fingerprints, builds the plan)
    shares = [
        (p["load"] + p["verify"])
        / (p["load"] + p["verify"] + p["session_on_loaded_trace"] - p["verify"])
        for p in results["session_parts"]
    ]
    share = statistics.median(shares)
    rest = statistics.median(
        p["session_on_loaded_trace"] - p["verify"] for p in results["session_parts"]
    )
    rows = [
        [
            "`ReplaySession.from_trace(path)`",
            fmt_ms(start),
            f"{ratio:.2f}x",
            fmt_mb(median("session_start", "rss_peak_added")),
        ],
        [
            "`Trace.load` + `verify_integrity` alone",
            fmt_ms(median("load_verify", "total")),
            "1.00x",
            fmt_mb(median("load_verify", "rss_peak_added")),
        ],
    ]
    verdict_text = (
        "dominated by reading and verifying the file: met"
        if share >= 0.5
        else "NOT dominated by reading and verifying the file"
    )
    return "\n".join(
        [
            f"Session start on a {calls:,}-call bundle ({fmt_mb(size)}, the bundle of "
            f"bench_bundle.py), medians of {rounds} fresh child processes each, interleaved:",
            "",
            table(["what", "time", "x load+verify", "peak memory added"], rows),
            "",
            f"Split (a third child per round): load {fmt_ms(median('session_parts', 'load'))}, "
            f"verify {fmt_ms(median('session_parts', 'verify'))}, then a `ReplaySession` built "
            f"on the loaded trace {fmt_ms(median('session_parts', 'session_on_loaded_trace'))} "
            "-- its own `verify_integrity` (which `from_trace(path)` runs once, the same as the "
            f"verify above) plus {fmt_ms(rest)} of building the replay plan. "
            f"Load + verify is **{100 * share:.0f} %** of a session start ({verdict_text}).",
        ]
    )


def run(quick: bool = False) -> str:
    calls = 100 if quick else CALLS
    rounds = 2 if quick else 7
    with recording() as recorder:
        per_call = _per_call(recorder, calls, rounds)
    start = _session_start(2_000 if quick else BIG_BUNDLE_CALLS, 1 if quick else 5)
    return "\n".join(
        [
            "## Replay: frozen per-call cost and session start (bench_replay.py)",
            "",
            f"A run of {calls:,} calls (alternately a tool and an LLM call), input and output "
            f"about {PAYLOAD:,} B each, recorded with `record(...)` and replayed frozen, "
            f"{rounds} rounds (after one warm-up); each call timed alone. Medians and p90 are "
            "per round, then the median over rounds; ratios are per round. The baseline is a bare "
            "SDK span carrying the attributes the replay span carried (captured from a real "
            "replay), on the same provider with the bundle processor.",
            "",
            per_call,
            "",
            start,
            "",
        ]
    )


if __name__ == "__main__":  # python -m benchmarks.bench_replay [--quick]
    import sys

    print(run(quick="--quick" in sys.argv))
