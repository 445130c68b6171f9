"""The OpenAI SDK integration: what instrumenting costs a real SDK call, against what users run
instead (issue 22's anchors), and replay per streamed chunk.

Against the loopback fake API (``examples/fake_llm.py``), its completion 2 KB:

* ``chat.completions.create`` uninstrumented; answered from memory (the SDK's own work, nothing
  sent: what a replay cannot avoid); instrumented and recorded (the whole ``record()`` block, its
  end included, so the writer's work is in it); replayed frozen from that bundle; and under
  ``openinference-instrumentation-openai`` (the recording anchor: what users run instead), in one
  process, interleaved rounds. Each is timed in wall time and in CPU time of the whole process
  (every thread: the SDK's, the loopback server's, stepfork's writer, the span exporter), so an
  instrumentation's share is one subtraction from its reference and work moved to a thread of its
  own is still counted;
* the cassette anchor: stepfork's frozen replay against vcrpy replaying the same exchange from a
  cassette, in a child process run with an interpreter that has vcrpy (``_vcr_child.py``;
  ``STEPFORK_BENCH_VCR_PYTHON`` or ``.venv-vcr`` in the checkout). vcrpy patches the HTTP
  library's transports: ``httpx`` (openai 1.x) since long, ``httpx2`` (openai 2.x and later) only
  since vcrpy 9.4.2, so the anchor runs with the openai release that interpreter holds; without
  one, the section says how to make it;
* a streamed completion of many chunks read live (uninstrumented), recorded, and replayed frozen
  from the bundle with no server: time per chunk.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import (
    Series,
    echo_prompt,
    fmt_us,
    in_memory_openai,
    interleave,
    paired_ratio,
    per_call,
    ratio_rows,
    recording,
    run_module,
    scratch_dir,
    table,
    timed_calls,
    verdict,
)

CALLS = 200
#: Issue 22: the anchors' call returns a 2 KB completion.
COMPLETION = 2_000
WORDS = 400
ROOT = Path(__file__).resolve().parent.parent
VCR_PYTHON_ENV = "STEPFORK_BENCH_VCR_PYTHON"
VCR_VENV = ROOT / ".venv-vcr" / "bin" / "python"
VCR_SETUP = 'python3 -m venv .venv-vcr && .venv-vcr/bin/pip install -e . "openai==1.109.1" vcrpy'

Rows = list[tuple[str, str, str | None]]
"""A table's rows: (label, series, the series its share is counted from -- None: no share)."""


def _rows(series: dict[str, Series], base: str, rows: Rows) -> list[list[str]]:
    """``call | per call | x base | CPU per call | CPU share``: wall times and their per-round
    ratio to ``base``; CPU time of the process and, per round, what it adds to its reference."""
    wall = ratio_rows(series, base, [(label, key) for label, key, _ in rows])
    out = []
    for (label, key, reference), (_, per_call_wall, ratio) in zip(rows, wall, strict=True):
        share = "-" if reference is None else _signed(_share(series, key, reference))
        out.append([label, per_call_wall, ratio, fmt_us(series[f"{key} cpu"].median), share])
    return out


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_us(abs(seconds))


def _share(series: dict[str, Series], key: str, reference: str) -> float:
    """Median over rounds of the CPU a call takes beyond ``reference``'s, in the same round."""
    a, b = series[f"{key} cpu"].values, series[f"{reference} cpu"].values
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


_HEADER = ["call", "per call", "x live, uninstrumented", "CPU per call", "CPU share"]


def _openinference(loop: Callable[[], None], calls: int) -> Callable[[], dict[str, float]] | None:
    """The same calls under OpenInference's OpenAI instrumentation (what users run instead),
    its spans to a ``BatchSpanProcessor`` with an exporter that drops them (flushed inside the
    timing); None when it is not installed (an optional extra of the benchmark)."""
    try:
        from openinference.instrumentation.openai import OpenAIInstrumentor
    except ImportError:
        return None
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import stepfork_otel

    class _Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    instrumentor = OpenAIInstrumentor()

    def work() -> None:
        loop()
        provider.force_flush()

    def measure() -> dict[str, float]:
        stepfork_otel.uninstrument_openai()
        instrumentor.instrument(tracer_provider=provider)
        try:
            return timed_calls("openinference", work, calls)
        finally:
            instrumentor.uninstrument()

    return measure


def vcr_python() -> tuple[str | None, str]:
    """The interpreter the cassette anchor runs in, and where it was found -- or None and why:
    ``$STEPFORK_BENCH_VCR_PYTHON``, else ``.venv-vcr/bin/python`` in the checkout."""
    configured = os.environ.get(VCR_PYTHON_ENV)
    if configured:
        if not Path(configured).is_file():
            return None, f"`{VCR_PYTHON_ENV}={configured}` is not a file"
        return configured, f"`{VCR_PYTHON_ENV}`"
    if VCR_VENV.is_file():
        return str(VCR_VENV), "`.venv-vcr`"
    return None, "no `.venv-vcr` in the checkout and no `" + VCR_PYTHON_ENV + "`"


def _cassette_anchor(calls: int, rounds: int) -> list[str]:
    """The vcrpy anchor's subsection: measured in the child, or how to make its interpreter."""
    title = "### Against vcrpy: replaying the same exchange from a cassette"
    python, where = vcr_python()
    if python is None:
        return [
            title,
            "",
            f"Not measured: {where}. It needs an interpreter with vcrpy and an openai release "
            f"it patches; from the checkout: `{VCR_SETUP}` (or point `{VCR_PYTHON_ENV}` at "
            "one). It would measure the same 2 KB call replayed frozen by stepfork "
            "(`instrument_openai()` + `ReplaySession`) and by vcrpy from a cassette of the same "
            "exchange, against the live call and the SDK answered from memory, in interleaved "
            "rounds in that interpreter (`benchmarks/_vcr_child.py`).",
            "",
        ]
    measured = run_module(
        "benchmarks._vcr_child", str(calls), str(rounds), str(COMPLETION), python=python
    )
    series = {name: Series(name, values) for name, values in measured["series"].items()}
    rows: Rows = [
        ("live, uninstrumented", "live", None),
        ("the SDK answered from memory (its `MockTransport`), nothing sent", "sdk", None),
        ("**stepfork**: `instrument_openai()`, replayed frozen from the bundle", "stepfork", "sdk"),
        ("**vcrpy**: the run's cassette (its exchanges played in order)", "vcrpy", "sdk"),
        (
            "vcrpy: a cassette of one exchange played again (`allow_playback_repeats`)",
            "vcrpy_repeat",
            "sdk",
        ),
    ]
    against = paired_ratio(series, "stepfork cpu", "vcrpy_repeat cpu")
    against_run = paired_ratio(series, "stepfork cpu", "vcrpy cpu")
    return [
        title,
        "",
        f"openai {measured['openai']} ({measured['http']}) and vcrpy {measured['vcrpy']}, in "
        f"{where} (`benchmarks/_vcr_child.py`), a {measured['completion_bytes']:,} B "
        f"completion; {calls} calls per round, {rounds} interleaved rounds, medians. The share "
        "of a replay is the CPU it takes beyond the SDK answered from memory: the SDK's own "
        "work, which every replay does. Neither replay sent a request (the server counted "
        "them), and both handed back the recorded completion.",
        "",
        table(_HEADER, _rows(series, "live", rows)),
        "",
        f"stepfork's frozen replay, whole call, CPU: **{against:.2f}x** vcrpy's cheapest "
        f"(target <= 1.0x: **{verdict(against, 1.0)}**), {against_run:.2f}x vcrpy on the run's "
        f"cassette (per-round ratios; wall: "
        f"{paired_ratio(series, 'stepfork', 'vcrpy_repeat'):.2f}x and "
        f"{paired_ratio(series, 'stepfork', 'vcrpy'):.2f}x). stepfork's own share of a replayed "
        f"call: {fmt_us(_share(series, 'stepfork', 'sdk'))} of CPU; vcrpy's: "
        f"{fmt_us(_share(series, 'vcrpy_repeat', 'sdk'))} (one exchange), "
        f"{fmt_us(_share(series, 'vcrpy', 'sdk'))} (the run's).",
        "",
    ]


def run(quick: bool = False) -> str:
    import openai

    import stepfork_otel
    from examples.fake_llm import FakeLLM
    from stepfork_otel import ReplaySession, record

    calls = 20 if quick else CALLS
    rounds = 2 if quick else 7
    words = 40 if quick else WORDS
    directory = scratch_dir()
    prompt = " ".join(f"w{i}" for i in range(words))
    messages: Any = [{"role": "user", "content": echo_prompt(COMPLETION)}]
    streamed: Any = [{"role": "user", "content": prompt}]

    with recording(), FakeLLM() as llm:
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-bench", max_retries=0)

        def loop(on: Any = client) -> None:
            for _ in range(calls):
                on.chat.completions.create(model="gpt-4o", messages=messages)

        stepfork_otel.uninstrument_openai()
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        body = raw.http_response.content
        in_memory = in_memory_openai(llm.openai_url, body, dict(raw.http_response.headers))
        bundle = directory / "calls.sftrace"

        def plain() -> dict[str, float]:
            stepfork_otel.uninstrument_openai()
            return timed_calls("uninstrumented", loop, calls)

        def from_memory() -> dict[str, float]:
            stepfork_otel.uninstrument_openai()
            return timed_calls("in_memory", lambda: loop(in_memory), calls)

        def recorded_run() -> None:
            with record(bundle):
                loop()

        def instrumented() -> dict[str, float]:
            stepfork_otel.instrument_openai()
            return timed_calls("instrumented", recorded_run, calls)

        instrumented()

        def replayed() -> dict[str, float]:
            stepfork_otel.instrument_openai()
            with ReplaySession.from_trace(bundle) as replay:  # (loading it: not timed)
                spent = timed_calls("replayed", loop, calls)
                replay.verify_complete()
            return spent

        candidates = [
            ("uninstrumented", plain),
            ("in_memory", from_memory),
            ("instrumented", instrumented),
            ("replayed", replayed),
        ]
        anchor = _openinference(loop, calls)
        if anchor is not None:
            candidates.append(("openinference", anchor))
        requests = len(llm.requests)
        calls_series = interleave(candidates, rounds)
        live_calls = (rounds + 1) * calls * (len(candidates) - 2)  # (the warm-up round too)
        if len(llm.requests) - requests != live_calls:
            raise RuntimeError("the replayed or in-memory calls reached the server")

        chunks = words + 3  # the role chunk, one per word, the finish chunk, [DONE]
        stream_bundle = directory / "stream.sftrace"

        def read_stream() -> None:
            for _ in client.chat.completions.create(model="gpt-4o", messages=streamed, stream=True):
                pass

        def live_stream() -> None:
            stepfork_otel.uninstrument_openai()
            read_stream()

        def recorded_stream() -> None:
            stepfork_otel.instrument_openai()
            with record(stream_bundle):
                read_stream()

        recorded_stream()

        def replayed_stream() -> None:
            stepfork_otel.instrument_openai()
            with ReplaySession.from_trace(stream_bundle) as replay:
                read_stream()
                replay.verify_complete()

        stream_series = interleave(
            [
                ("live", per_call(live_stream, chunks)),
                ("recorded", per_call(recorded_stream, chunks)),
                ("replayed", per_call(replayed_stream, chunks)),
            ],
            rounds,
        )
        stepfork_otel.uninstrument_openai()

    named: Rows = [
        ("`chat.completions.create`, live, uninstrumented", "uninstrumented", None),
        ("the SDK answered from memory (its `MockTransport`), nothing sent", "in_memory", None),
        (
            "**stepfork**: `instrument_openai()`, recorded (the whole `record()` block, its end "
            "included)",
            "instrumented",
            "uninstrumented",
        ),
        ("stepfork: replayed frozen from the bundle, nothing sent", "replayed", "in_memory"),
    ]
    if "openinference" in calls_series:
        named.append(
            (
                "**openinference**-instrumentation-openai (its spans to a batch processor, "
                "flushed)",
                "openinference",
                "uninstrumented",
            )
        )
        ours, theirs = (
            _share(calls_series, key, "uninstrumented") for key in ("instrumented", "openinference")
        )
        versus = (
            f"**{ours / theirs:.2f}x** (target <= 1.0x: **{verdict(ours / theirs, 1.0)}**"
            if theirs > 0
            else "**n/a** (openinference's share is lost in this run's noise"
        )
        anchor_text = (
            f"Recording: stepfork adds {fmt_us(ours)} of CPU per call, openinference "
            f"{fmt_us(theirs)}: {versus}; whole call, CPU: "
            f"{paired_ratio(calls_series, 'instrumented cpu', 'openinference cpu'):.2f}x, "
            f"wall: {paired_ratio(calls_series, 'instrumented', 'openinference'):.2f}x)."
        )
    else:
        anchor_text = (
            "openinference-instrumentation-openai is not installed here: no recording anchor."
        )
    replay_share = _share(calls_series, "replayed", "in_memory")
    stream_rows = ratio_rows(
        stream_series, "live", [(name, name) for name in ("live", "recorded", "replayed")]
    )
    return "\n".join(
        [
            "## SDK integration: an instrumented OpenAI call, and replay per streamed chunk "
            "(bench_sdk.py)",
            "",
            f"openai {openai.__version__} against the loopback fake API (in this process), a "
            f"{len(body):,} B response holding a {COMPLETION:,} B completion; {calls} calls per "
            f"round, {rounds} interleaved rounds, medians; wall-time ratios per round against "
            "the live uninstrumented call. CPU: of the whole process per call (every thread: "
            "the SDK's, the server's, stepfork's writer, the exporter); a share is the CPU a "
            "call takes beyond its reference in the same round -- the uninstrumented call for "
            "a recording, the SDK answered from memory for a replay.",
            "",
            table(_HEADER, _rows(calls_series, "uninstrumented", named)),
            "",
            anchor_text
            + f" Replay: stepfork's own share of a frozen replayed call is {fmt_us(replay_share)} "
            "of CPU beyond the SDK's work.",
            "",
            *_cassette_anchor(calls, rounds),
            f"A streamed completion of {chunks} chunks, time per chunk (the whole stream read, "
            "including the request); `replayed` is served from the bundle with no server.",
            "",
            table(["stream", "per chunk", "vs live"], stream_rows),
            "",
        ]
    )


if __name__ == "__main__":  # python -m benchmarks.bench_sdk [--quick]
    import sys

    print(run(quick="--quick" in sys.argv))
