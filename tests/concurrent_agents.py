"""Agents that fan out concurrent calls with the real SDKs, as users write them, for
``tests/test_replay_concurrent_sdk.py``: ``asyncio.gather`` of ``AsyncOpenAI`` calls, the same
with a thread pool, each call after a random wait, then one call that uses all their answers.

The random waits come from ``STEPFORK_TEST_SEED``: a replay with another seed starts the calls in
another order. The order the calls started in this process is the runner's ``extra``.

Run as ``python tests/concurrent_agents.py SCENARIO record|replay BUNDLE OUT.json URL``, or
``... SCENARIO replay-seeds BUNDLE OUT.json URL SEED,SEED,...`` to replay the bundle once per seed
in this one process (a new session each time), writing ``[{"result", "calls", "started"}, ...]``.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import random
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

N = 20
QUESTION = "question"
_started: list[int] = []
_lock = threading.Lock()


def _waits() -> list[float]:
    rng = random.Random(int(os.environ.get("STEPFORK_TEST_SEED", "0")))
    return [rng.random() / 50 for _ in range(N)]


def _question(i: int) -> str:
    changed = os.environ.get("STEPFORK_TEST_CHANGE")
    return f"{QUESTION} {i}" + (" (changed)" if changed == str(i) else "")


def _began(i: int) -> None:
    with _lock:
        _started.append(i)


def _text(completion: Any) -> str:
    return str(completion.choices[0].message.content)


def openai_gather(url: str) -> dict[str, Any]:
    import openai

    waits = _waits()

    async def run() -> dict[str, Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)

        async def one(i: int) -> str:
            await asyncio.sleep(waits[i])  # something of variable duration first
            _began(i)
            completion = await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": _question(i)}]
            )
            return _text(completion)

        answers = await asyncio.gather(*(one(i) for i in range(N)))
        final = await client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "summarise: " + "; ".join(answers)}],
        )
        return {"answers": answers, "final": _text(final)}

    return asyncio.run(run())


def openai_threads(url: str) -> dict[str, Any]:
    import openai

    waits = _waits()
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)

    def one(i: int) -> str:
        threading.Event().wait(waits[i])
        _began(i)
        completion = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": _question(i)}]
        )
        return _text(completion)

    with ThreadPoolExecutor(max_workers=N) as pool:  # each task runs in a copy of the context
        futures = [pool.submit(contextvars.copy_context().run, one, i) for i in range(N)]
        answers = [f.result() for f in futures]
    final = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "summarise: " + "; ".join(answers)}]
    )
    return {"answers": answers, "final": _text(final)}


CITIES = ["Paris", "Rome", "Oslo", "Lima", "Kyoto"]


def pydantic_ai_parallel_tools(url: str) -> Any:
    """A pydantic-ai agent on the instrumented OpenAI SDK whose model asks for five tool calls at
    once (the server's doing, see the test): pydantic-ai runs them concurrently, each tool an
    async ``@trace_tool`` that awaits a random wait first; then the model answers from them."""
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from stepfork_otel import trace_tool

    waits = _waits()
    client = AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
    agent = Agent(OpenAIChatModel("gpt-4o", provider=OpenAIProvider(openai_client=client)))
    arrived: list[str] = []

    @trace_tool
    async def forecast(city: str) -> str:
        arrived.append(city)
        while len(arrived) < len(CITIES):  # (recording only: frozen replay runs no body)
            await asyncio.sleep(0.005)  # all five are open together, as with a slow service
        return f"{city}: sunny"

    @agent.tool_plain
    async def weather(city: str) -> str:
        """The forecast for a city."""
        i = CITIES.index(city)
        await asyncio.sleep(waits[i])
        _began(i)
        return await forecast(city)

    return agent.run_sync("weather everywhere").output


SCENARIOS: dict[str, Callable[[str], Any]] = {
    "openai_gather": openai_gather,
    "openai_threads": openai_threads,
    "pydantic_ai_parallel_tools": pydantic_ai_parallel_tools,
}


def replay_seeds(scenario: str, bundle: str, out: str, url: str, seeds: str) -> int:
    import json
    from pathlib import Path

    import stepfork_otel
    from stepfork_otel import ReplaySession

    stepfork_otel.instrument_openai()
    runs = []
    for seed in seeds.split(","):
        os.environ["STEPFORK_TEST_SEED"] = seed
        _started.clear()
        with ReplaySession.from_trace(bundle) as session:
            result = SCENARIOS[scenario](url)
            session.verify_complete()
        calls = [[call.kind, call.action] for call in session.calls]
        runs.append({"result": result, "calls": calls, "started": list(_started)})
    Path(out).write_text(json.dumps(runs))
    return 0


if __name__ == "__main__":
    if sys.argv[2] == "replay-seeds":
        scenario, _, bundle, out, url, seeds = sys.argv[1:]
        sys.exit(replay_seeds(scenario, bundle, out, url, seeds))
    from agent_runner import main

    sys.exit(main(sys.argv[1:], SCENARIOS, extra=lambda: list(_started)))
