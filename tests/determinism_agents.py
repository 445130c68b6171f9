"""An agent that reads the clock, randomness and uuids on its way to its LLM and tool calls, as
real agents do: "Today is {date}" in the system prompt, a ``uuid4()`` request id per tool call,
a random pick of the greeting. Written against the real OpenAI SDK (instrumented), for
``tests/test_determinism.py``.

Also an agent whose workers -- threads of a pool, then asyncio tasks -- each stamp their request
at the same lines (``stamp``) and ask the LLM, for ``tests/test_captured_threads.py``; the order
in which the workers read is drawn from a seed (:class:`Turns`), so a recording and its replay can
read in different interleavings.

Run as ``python tests/determinism_agents.py record|replay BUNDLE OUT.json URL CAPTURE`` (CAPTURE:
comma-separated sources, or ``none``), or ``record-workers|replay-workers BUNDLE OUT.json URL
SEED``. ``OUT.json``: what the agent returned, and in replay the calls made and the captured-read
summary, or the replay error's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import random
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import stepfork_otel
from stepfork_otel import ReplaySession, record, trace_tool
from stepfork_otel.replay.errors import ReplayError


@trace_tool
def lookup_order(order_id: str, request_id: str) -> dict[str, Any]:
    """Look an order up in the shop's database."""
    return {"order_id": order_id, "status": "delivered", "request": request_id}


def run_agent(url: str, question: str) -> dict[str, Any]:
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key="sk-test-not-a-real-key", max_retries=0)
    today = datetime.now().strftime("%A %d %B %Y, %H:%M:%S.%f")
    greeting = random.choice(["Hello", "Hi", "Good day", "Welcome"])
    started = time.time()
    system = f"{greeting}. Today is {today}. You help customers with their orders."
    request_id = str(uuid.uuid4())
    order = lookup_order("1042", request_id)
    reply = client.chat.completions.create(
        model="gpt-4.1-mini",
        messages=[
            {"role": "system", "content": system},
            {"role": "user", "content": f"{question} (order: {json.dumps(order)})"},
        ],
    )
    return {
        "system": system,
        "request_id": request_id,
        "answer": reply.choices[0].message.content,
        "started": started,
        "trace_id": uuid.uuid4().hex,
    }


# --- workers reading at one site, in an order drawn from a seed ------------------------------------

GREETINGS = ["Hello", "Hi", "Good day", "Welcome"]
WAIT = 30.0  # seconds a worker waits for its turn before the run fails


class Turns:
    """The order in which ``workers`` workers make their ``rounds`` stamps each, drawn from
    ``seed`` (a scheduler's choice, made repeatable): a worker's next stamp waits for its turn."""

    def __init__(self, workers: int, rounds: int, seed: int) -> None:
        self.order = [worker for worker in range(workers) for _ in range(rounds)]
        random.Random(seed).shuffle(self.order)  # (a generator of its own: not a captured read)
        self.position = 0
        self.changed = threading.Condition()

    def mine(self, worker: int) -> bool:
        return self.position < len(self.order) and self.order[self.position] == worker

    @contextlib.contextmanager
    def turn(self, worker: int) -> Iterator[None]:
        """For a thread: wait for the worker's turn, then (after the body) pass it on."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.mine(worker), WAIT):
                raise TimeoutError(f"worker {worker} never got its turn")
        try:
            yield
        finally:
            with self.changed:
                self.position += 1
                self.changed.notify_all()

    @contextlib.asynccontextmanager
    async def aturn(self, worker: int) -> AsyncIterator[None]:
        """For an asyncio task (all on one loop): the same, yielding to the others meanwhile."""
        deadline = time.monotonic() + WAIT  # (a monotonic clock is not a captured source)
        while not self.mine(worker):
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {worker} never got its turn")
            await asyncio.sleep(0)
        try:
            yield
        finally:
            self.position += 1


def stamp() -> list[Any]:
    """What a worker puts on its request: the time, a request id and a greeting."""
    return [datetime.now().isoformat(), str(uuid.uuid4()), random.choice(GREETINGS), time.time()]


def _ask(client: Any, worker: int, stamps: list[Any]) -> Any:
    return client.chat.completions.create(
        model="gpt-4.1-mini",
        messages=[{"role": "user", "content": f"worker {worker}: {json.dumps(stamps)}"}],
    )


def workers_agent(url: str, seed: int, workers: int = 3, rounds: int = 2) -> dict[str, Any]:
    """``workers`` threads of a pool, then as many asyncio tasks, stamp ``rounds`` times each in
    the order ``seed`` draws, then ask the LLM one after the other (worker 0 first)."""
    from openai import AsyncOpenAI, OpenAI

    client = OpenAI(base_url=url, api_key="sk-test-not-a-real-key", max_retries=0)
    turns = Turns(workers, rounds, seed)
    asked = [threading.Event() for _ in range(workers)]

    def in_thread(worker: int) -> dict[str, Any]:
        stamps = []
        for _ in range(rounds):
            with turns.turn(worker):
                stamps.append(stamp())
        if worker and not asked[worker - 1].wait(WAIT):
            raise TimeoutError(f"worker {worker - 1} never asked")
        try:
            reply = _ask(client, worker, stamps)
        finally:
            asked[worker].set()
        return {"stamps": stamps, "answer": reply.choices[0].message.content}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(contextvars.copy_context().run, in_thread, w) for w in range(workers)
        ]
        threads = [future.result() for future in futures]

    async def in_tasks() -> list[dict[str, Any]]:
        aclient = AsyncOpenAI(base_url=url, api_key="sk-test-not-a-real-key", max_retries=0)
        tasks_turns = Turns(workers, rounds, seed + 1)
        aasked = [asyncio.Event() for _ in range(workers)]

        async def in_task(worker: int) -> dict[str, Any]:
            stamps = []
            for _ in range(rounds):
                async with tasks_turns.aturn(worker):
                    stamps.append(stamp())
            if worker:
                await aasked[worker - 1].wait()
            try:
                reply = await _ask(aclient, worker, stamps)
            finally:
                aasked[worker].set()
            return {"stamps": stamps, "answer": reply.choices[0].message.content}

        return list(await asyncio.gather(*(in_task(w) for w in range(workers))))

    return {"threads": threads, "tasks": asyncio.run(in_tasks()), "order": turns.order}


def main(argv: list[str]) -> int:
    mode, bundle, out, url, capture_arg = argv
    stepfork_otel.instrument_openai()
    if mode.endswith("-workers"):
        seed = int(capture_arg)
        capture = ("time", "random", "uuid")

        def agent() -> dict[str, Any]:
            return workers_agent(url, seed)
    else:
        capture = None if capture_arg == "none" else tuple(capture_arg.split(","))

        def agent() -> dict[str, Any]:
            return run_agent(url, "Where is my order?")

    result: dict[str, Any] = {}
    if mode.startswith("record"):
        with record(bundle, capture=capture) as run:
            result["result"] = agent()
            run.set_output(result["result"])
    else:
        try:
            with ReplaySession.from_trace(bundle) as session:
                result["result"] = agent()
                session.verify_complete()
        except ReplayError as exc:
            result["error"] = [type(exc).__name__, str(exc)]
        summary = session.summary
        result["calls"] = [[call.kind, call.action] for call in summary.calls]
        result["reads"] = [summary.reads.recorded, summary.reads.served]
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
