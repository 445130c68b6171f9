"""An agent that reads the clock, randomness and uuids on its way to its LLM and tool calls, as
real agents do: "Today is {date}" in the system prompt, a ``uuid4()`` request id per tool call,
a random pick of the greeting. Written against the real OpenAI SDK (instrumented), for
``tests/test_determinism.py``.

Run as ``python tests/determinism_agents.py record|replay BUNDLE OUT.json URL CAPTURE`` (CAPTURE:
comma-separated sources, or ``none``). ``OUT.json``: what the agent returned, and in replay the
calls made and the captured-read summary, or the replay error's message.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
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


def main(argv: list[str]) -> int:
    mode, bundle, out, url, capture_arg = argv
    stepfork_otel.instrument_openai()
    capture = None if capture_arg == "none" else tuple(capture_arg.split(","))
    result: dict[str, Any] = {}
    if mode == "record":
        with record(bundle, capture=capture) as run:
            result["result"] = run_agent(url, "Where is my order?")
            run.set_output(result["result"])
    else:
        try:
            with ReplaySession.from_trace(bundle) as session:
                result["result"] = run_agent(url, "Where is my order?")
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
