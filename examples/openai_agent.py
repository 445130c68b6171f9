"""An agent on the OpenAI SDK, recorded with one line and replayed offline.

Runs without keys or network: the OpenAI API is played by a loopback fake server
(``examples/fake_llm.py``). The agent loop is plain OpenAI SDK code; the only stepfork lines are
``instrument_openai()``, ``@trace_tool`` and ``record(...)`` -- then the same code is replayed
from the bundle with the server stopped.

    python examples/openai_agent.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import openai

import stepfork_otel
from stepfork_otel import ReplaySession, record, trace_tool

if __package__ in (None, ""):  # run as a script: examples/ is not a package on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.fake_llm import FakeLLM

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by its number.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "integer"}},
                "required": ["order_id"],
            },
        },
    }
]


@trace_tool
def lookup_order(order_id: int) -> dict[str, Any]:
    """Find an order by its number."""
    return {"order_id": order_id, "status": "shipped"}


def run_agent(client: openai.OpenAI, question: str) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = lookup_order(**json.loads(call.function.arguments))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )


def main(out_dir: Path) -> None:
    stepfork_otel.instrument_openai()  # every OpenAI / AsyncOpenAI client, from here on
    bundle = out_dir / "openai_agent.sftrace"
    question = "Where is order 2?"

    with FakeLLM() as llm:  # the "real" API, for the recording
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-example-not-a-key")
        with record(bundle, input={"question": question}) as run:
            answer = run_agent(client, question)
            run.set_output(answer)
        print(f"recorded:  {answer!r} ({len(llm.requests)} requests to the API) -> {bundle.name}")

    # the server is gone: replay serves every call from the bundle
    with ReplaySession.from_trace(bundle) as replay:
        again = run_agent(client, question)
        replay.verify_complete()
    actions = ", ".join(f"{c.kind} {c.name}: {c.action}" for c in replay.calls)
    print(f"replayed:  {again!r} ({actions})")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "out")
