"""The OpenAI SDK integration: what instrumenting costs a real SDK call, and replay per streamed chunk.

Against the loopback fake API (``examples/fake_llm.py``), in one process, interleaved rounds:

* ``chat.completions.create`` uninstrumented vs instrumented and recorded (inside ``record()``,
  the bundle processor attached): the same SDK, the same server, the same request;
* a streamed completion of many chunks read live (uninstrumented), recorded, and replayed frozen
  from the bundle with no server: time per chunk.
"""

from __future__ import annotations

from typing import Any

from benchmarks._common import (
    interleave,
    per_call,
    ratio_rows,
    recording,
    scratch_dir,
    table,
)

CALLS = 200
WORDS = 400


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

        def plain() -> None:
            stepfork_otel.uninstrument_openai()
            for _ in range(calls):
                client.chat.completions.create(model="gpt-4o", messages=messages)

        def instrumented() -> None:
            stepfork_otel.instrument_openai()
            with record(directory / "calls.sftrace"):
                for _ in range(calls):
                    client.chat.completions.create(model="gpt-4o", messages=messages)

        calls_series = interleave(
            [
                ("uninstrumented", per_call(plain, calls)),
                ("instrumented", per_call(instrumented, calls)),
            ],
            rounds,
        )

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

    rows = ratio_rows(
        calls_series,
        "uninstrumented",
        [
            ("`chat.completions.create`, uninstrumented", "uninstrumented"),
            ("the same, instrumented and recorded", "instrumented"),
        ],
    )
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
