"""Agents on the real SDKs for the fork tests: a three-LLM-call tool loop, as users write one.

Each agent asks a model which tool to call (call 1, always ``gpt-4o`` / ``claude-sonnet-4-5``),
runs the tool (call 2), asks the *answer model* for the answer (call 3: the fork point of the
tests) and for a one-line version (call 4; streamed on OpenAI, while Anthropic streams call 3),
and optionally notifies the user with a ``forbidden`` tool (call 5).

Run as ``python tests/fork_agents.py AGENT ACTION BUNDLE OUT.json URL`` (``tests/agent_runner.py``
starts it), ``ACTION`` being ``record``, ``replay``, or ``fork:K=V,...`` with ``at`` (the fork
point), ``to`` (the fork's bundle), ``model`` (the answer model), ``city`` (the question),
``notify`` (call the forbidden tool) and ``allow`` (a tool to allow live). ``OUT.json`` holds what
the agent returned (or the replay error it raised) and what the session did.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sdk_agents import WEATHER_TOOL

from stepfork_otel import trace_tool


@trace_tool
def get_weather(city: str) -> str:
    return f"{city}: sunny, 24C"


@trace_tool(replay_policy="forbidden")
def notify(text: str) -> str:
    return "sent"


def trip_openai(url: str, model: str, city: str, notify_user: bool) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(
        base_url=url, api_key="sk-proj-NOTAREALKEY0123456789abcdef", max_retries=0
    )
    messages: list[Any] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    weather = get_weather(**json.loads(call.function.arguments))  # type: ignore[union-attr]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": weather},
    ]
    answer = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL])
    text = answer.choices[0].message.content or ""
    messages += [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "Say it in one line."},
    ]
    stream = client.chat.completions.create(model=model, messages=messages, stream=True)
    chunks = list(stream)
    line = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if notify_user:
        notify(line)
    models = [first.model, answer.model, *{c.model for c in chunks}]
    return {"answer": text, "line": line, "models": models, "stream": type(stream).__name__}


def trip_anthropic(url: str, model: str, city: str, notify_user: bool) -> dict[str, Any]:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-api03-NOTAREALKEY", max_retries=0)
    tools: list[Any] = [
        {
            "name": "get_weather",
            "description": "Weather in a city",
            "input_schema": WEATHER_TOOL["function"]["parameters"],  # type: ignore[index]
        }
    ]
    messages: list[Any] = [{"role": "user", "content": f"What is the weather in {city}?"}]
    first = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=tools
    )
    use = next(block for block in first.content if block.type == "tool_use")
    weather = get_weather(**use.input)  # type: ignore[arg-type]
    messages += [
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": weather}],
        },
    ]
    with client.messages.stream(
        model=model, max_tokens=100, messages=messages, tools=tools
    ) as stream:
        text = "".join(stream.text_stream)
        answered = stream.get_final_message()
    messages += [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "Say it in one line."},
    ]
    last = client.messages.create(model=model, max_tokens=50, messages=messages)
    line = "".join(block.text for block in last.content if block.type == "text")
    if notify_user:
        notify(line)
    models = [first.model, answered.model, last.model]
    return {"answer": text, "line": line, "models": models, "stream": type(stream).__name__}


def pydantic_ai(url: str, model: str, city: str, notify_user: bool) -> dict[str, Any]:
    """A framework's tool loop (``tests/framework_agents.py``): model, tool, model."""
    import framework_agents

    framework_agents.TOOL_RAN.clear()
    answer = framework_agents.pydantic_ai_openai(url)
    return {"answer": answer, "tool_ran": list(framework_agents.TOOL_RAN)}


AGENTS = {
    "openai": (trip_openai, "gpt-4o"),
    "anthropic": (trip_anthropic, "claude-sonnet-4-5"),
    "pydantic_ai": (pydantic_ai, "gpt-4o"),
}


def main(argv: list[str]) -> int:
    agent_name, action, bundle, out, url = argv
    import stepfork_otel
    from stepfork_otel import ReplayError, ReplaySession, record

    stepfork_otel.instrument_openai()
    stepfork_otel.instrument_anthropic()
    agent, default_model = AGENTS[agent_name]
    options = (
        dict(o.split("=", 1) for o in action.split(":", 1)[1].split(",")) if ":" in action else {}
    )
    model = options.get("model", default_model)
    city = options.get("city", "Paris")
    notify_user = "notify" in options

    def run() -> dict[str, Any]:
        return agent(url, model, city, notify_user)

    result: dict[str, Any] = {}
    if action == "record":
        with record(bundle, name=f"trip_{agent_name}") as recorder:
            result["result"] = run()
            recorder.set_output(result["result"]["answer"])
        Path(out).write_text(json.dumps(result, indent=1))
        return 0
    fork: dict[str, Any] = {}
    if action.startswith("fork:"):
        fork = {"fork_at": int(options["at"]), "record_to": options.get("to")}
        if options.get("allow"):
            fork["allow_live_tools"] = [options["allow"]]
    session = ReplaySession.from_trace(bundle, **fork)
    try:
        with session:
            result["result"] = run()
            if fork.get("record_to"):
                session.set_output(result["result"]["answer"])
        session.verify_complete()
    except ReplayError as exc:
        result["raised"] = [type(exc).__name__, exc.position, exc.reason, exc.details]
    result["calls"] = [[c.kind, c.action, c.recorded_id] for c in session.calls]
    result["fork_bundle"] = None if session.fork_bundle is None else str(session.fork_bundle)
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
