"""The OpenAI SDK integration: what instrumenting costs a real SDK call, and replay per streamed chunk.

Against the loopback fake API (``examples/fake_llm.py``), in one process, interleaved rounds:

* ``chat.completions.create`` uninstrumented vs instrumented and recorded (inside ``record()``,
  the bundle processor attached): the same SDK, the same server, the same request;
* a streamed completion of many chunks read live (uninstrumented), recorded, and replayed frozen
  from the bundle with no server: time per chunk.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks._common import (
    fmt_us,
    interleave,
    paired_ratio,
    per_call,
    ratio_rows,
    recording,
    scratch_dir,
    table,
)

CALLS = 200
WORDS = 400


def _openinference(loop: Callable[[], float]) -> Callable[[], float] | None:
    """The same loop under OpenInference's OpenAI instrumentation (what users run instead),
    exporting its spans through a ``BatchSpanProcessor`` to an exporter that drops them; None
    when it is not installed (an optional extra of the benchmark)."""
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

    def measure() -> float:
        stepfork_otel.uninstrument_openai()
        instrumentor.instrument(tracer_provider=provider)
        try:
            return loop()
        finally:
            instrumentor.uninstrument()

    return measure


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
    messages: Any = [{"role": "user", "content": "hello"}]
    streamed: Any = [{"role": "user", "content": prompt}]

    with recording(), FakeLLM() as llm:
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-bench", max_retries=0)

        def loop() -> float:
            start = time.perf_counter()
            for _ in range(calls):
                client.chat.completions.create(model="gpt-4o", messages=messages)
            return (time.perf_counter() - start) / calls

        def plain() -> float:
            stepfork_otel.uninstrument_openai()
            return loop()

        def instrumented() -> float:
            stepfork_otel.instrument_openai()
            with record(directory / "calls.sftrace"):
                return loop()

        instrumented()
        replay_bundle = directory / "calls.sftrace"

        def replayed() -> float:
            stepfork_otel.instrument_openai()
            with ReplaySession.from_trace(replay_bundle) as replay:
                spent = loop()
                replay.verify_complete()
            return spent

        candidates = [
            ("uninstrumented", plain),
            ("instrumented", instrumented),
            ("replayed", replayed),
        ]
        anchor = _openinference(loop)
        if anchor is not None:
            candidates.append(("openinference", anchor))
        calls_series = interleave(candidates, rounds)

        chunks = words + 3  # the role chunk, one per word, the finish chunk, [DONE]
        bundle = directory / "stream.sftrace"

        def live_stream() -> None:
            stepfork_otel.uninstrument_openai()
            for _ in client.chat.completions.create(model="gpt-4o", messages=streamed, stream=True):
                pass

        def recorded_stream() -> None:
            stepfork_otel.instrument_openai()
            with record(bundle):
                for _ in client.chat.completions.create(
                    model="gpt-4o", messages=streamed, stream=True
                ):
                    pass

        recorded_stream()

        def replayed_stream() -> None:
            stepfork_otel.instrument_openai()
            with ReplaySession.from_trace(bundle) as replay:
                for _ in client.chat.completions.create(
                    model="gpt-4o", messages=streamed, stream=True
                ):
                    pass
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

    named = [
        ("`chat.completions.create`, uninstrumented", "uninstrumented"),
        ("the same, `instrument_openai()` and recorded (`record()`)", "instrumented"),
        ("the same, replayed frozen from the bundle (no request sent)", "replayed"),
    ]
    if "openinference" in calls_series:
        named.append(
            (
                "the same, `openinference-instrumentation-openai` (its spans to a batch processor)",
                "openinference",
            )
        )
    rows = ratio_rows(calls_series, "uninstrumented", named)
    base = calls_series["uninstrumented"].median
    shares = [
        f"stepfork's share of a recorded call (beyond the SDK's own work): "
        f"{fmt_us(calls_series['instrumented'].median - base)}"
    ]
    if "openinference" in calls_series:
        shares.append(
            f"openinference's: {fmt_us(calls_series['openinference'].median - base)} "
            f"(stepfork recording / openinference, whole call: "
            f"{paired_ratio(calls_series, 'instrumented', 'openinference'):.2f}x)"
        )
    else:
        shares.append("openinference-instrumentation-openai is not installed: no anchor")
    stream_rows = ratio_rows(
        stream_series, "live", [(name, name) for name in ("live", "recorded", "replayed")]
    )
    return "\n".join(
        [
            "## SDK integration: an instrumented OpenAI call, and replay per streamed chunk (bench_sdk.py)",
            "",
            f"openai {openai.__version__} against the loopback fake API; {calls} calls per round, "
            f"{rounds} rounds, medians; ratios per round against the uninstrumented call.",
            "",
            table(["call", "per call", "ratio"], rows),
            "",
            "; ".join(shares) + ". vcrpy (the cassette anchor of issue 22) is not measured: "
            "vcrpy 9.4 patches httpx, and openai 3.x sends through httpx2, which it does not "
            "intercept.",
            "",
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
