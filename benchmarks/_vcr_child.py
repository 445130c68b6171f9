"""The cassette anchor of issue 22, run in the interpreter that has vcrpy: stepfork's frozen replay
of an OpenAI call against vcrpy replaying the same HTTP exchange from a cassette.

``python -m benchmarks._vcr_child CALLS ROUNDS SIZE`` (from the project root; ``bench_sdk.py``
runs it) prints, as its last line, the JSON of what it measured: per round, seconds per
``chat.completions.create`` to the loopback fake API (``examples/fake_llm.py``) whose completion
is ``SIZE`` bytes, wall time and CPU time of the process (``_common.timed_calls``), interleaved:

* ``live``: uninstrumented, sent to the server (the base of the ratios);
* ``sdk``: uninstrumented, the SDK answered from memory (``_common.in_memory_openai``): its own
  work for a call that sends nothing, which any replay still does -- a replay's share is its
  time beyond this;
* ``stepfork``: ``instrument_openai()`` and a frozen ``ReplaySession`` on the bundle of the same
  calls, recorded once before the rounds;
* ``vcrpy``: ``vcr.use_cassette(record_mode="none")`` on a cassette of the same calls, recorded
  once before the rounds, the run's exchanges played in order;
* ``vcrpy_repeat``: a cassette of one exchange played for every call
  (``allow_playback_repeats``): vcrpy at its cheapest, with no list of exchanges to search.

Both replays are checked to send nothing (the server counts requests) and to hand back the
recorded completion. Why a process of its own: vcrpy patches the HTTP library's transports
(``httpx``; ``httpx2`` too since vcrpy 9.4.2), so the anchor runs with whatever openai release
that interpreter holds -- ``.venv-vcr`` with ``openai==1.109.1`` (``httpx``) as ``bench_sdk.py``
says how to make it -- and the main environment needs no vcrpy.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks._common import (
    echo_prompt,
    in_memory_openai,
    interleave,
    openai_http_library,
    recording,
    scratch_dir,
    timed_calls,
)


def measure(calls: int, rounds: int, size: int) -> dict[str, Any]:
    import openai
    import vcr

    import stepfork_otel
    from examples.fake_llm import FakeLLM
    from stepfork_otel import ReplaySession, record

    messages: Any = [{"role": "user", "content": echo_prompt(size)}]
    directory = scratch_dir()
    bundle = directory / "sdk-replay.sftrace"
    cassette = directory / "sdk-replay.yaml"
    one = directory / "sdk-replay-one.yaml"

    with recording(), FakeLLM() as llm:
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-bench", max_retries=0)

        def create(on: Any = client) -> Any:
            return on.chat.completions.create(model="gpt-4o", messages=messages)

        def loop(on: Any = client) -> None:
            for _ in range(calls):
                create(on)

        # the exchange (its bytes answer the in-memory client), then recorded by each tool
        stepfork_otel.uninstrument_openai()
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        body = raw.http_response.content
        expected = json.loads(body)["choices"][0]["message"]["content"]
        in_memory = in_memory_openai(llm.openai_url, body, dict(raw.http_response.headers))
        stepfork_otel.instrument_openai()
        with record(bundle):
            loop()
        stepfork_otel.uninstrument_openai()
        with vcr.use_cassette(str(cassette), record_mode="all"):
            loop()
        with vcr.use_cassette(str(one), record_mode="all"):
            create()
        sent: list[int] = []

        def live() -> dict[str, float]:
            return timed_calls("live", loop, calls)

        def sdk() -> dict[str, float]:
            return timed_calls("sdk", lambda: loop(in_memory), calls)

        def stepfork() -> dict[str, float]:
            stepfork_otel.instrument_openai()
            try:
                with ReplaySession.from_trace(bundle) as replay:  # (loading it: not timed)
                    spent = timed_calls("stepfork", loop, calls)
                    replay.verify_complete()
                return spent
            finally:
                stepfork_otel.uninstrument_openai()

        def cassette_run(name: str, path: Path, repeats: bool) -> Any:
            def run() -> dict[str, float]:
                with vcr.use_cassette(  # (loading the cassette: not timed)
                    str(path), record_mode="none", allow_playback_repeats=repeats
                ) as played:
                    spent = timed_calls(name, loop, calls)
                if played.play_count != calls:
                    raise RuntimeError(f"vcrpy played {played.play_count} of {calls} calls")
                return spent

            return run

        def quiet(replay: Any) -> Any:
            """A replay that must reach no server: the requests it sent are counted."""

            def run() -> dict[str, float]:
                before = len(llm.requests)
                spent: dict[str, float] = replay()
                sent.append(len(llm.requests) - before)
                return spent

            return run

        series = interleave(
            [
                ("live", live),
                ("sdk", sdk),
                ("stepfork", quiet(stepfork)),
                ("vcrpy", quiet(cassette_run("vcrpy", cassette, False))),
                ("vcrpy_repeat", quiet(cassette_run("vcrpy_repeat", one, True))),
            ],
            rounds,
        )
        served = _served(create, bundle, cassette, vcr, ReplaySession)
    if any(sent):
        raise RuntimeError(f"a replay sent requests to the server: {sent}")
    if any(text != expected for text in served):
        raise RuntimeError("a replay did not hand back the recorded completion")
    http = openai_http_library().__name__
    return {
        "openai": openai.__version__,
        "http": f"{http} {metadata.version(http)}",
        "vcrpy": metadata.version("vcrpy"),
        "python": sys.executable,
        "completion_bytes": len(expected.encode()),
        "series": {name: s.values for name, s in series.items()},
    }


def _served(create: Any, bundle: Path, cassette: Path, vcr: Any, session: Any) -> list[str]:
    """What each replay hands the agent at its first call: the recorded completion, both."""
    import stepfork_otel

    stepfork_otel.instrument_openai()
    try:
        with session.from_trace(bundle):
            by_stepfork = create().choices[0].message.content
    finally:
        stepfork_otel.uninstrument_openai()
    with vcr.use_cassette(str(cassette), record_mode="none"):
        by_vcrpy = create().choices[0].message.content
    return [by_stepfork, by_vcrpy]


if __name__ == "__main__":
    calls, rounds, size = (int(a) for a in sys.argv[1:4])
    print(json.dumps(measure(calls, rounds, size)))
