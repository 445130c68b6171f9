"""An OpenAI Agents SDK agent with the SDK's own tracing left on, its trace exporter (a background
thread the SDK starts) pointed at the loopback fake server, for the whole-process network guard.

``python tests/guard_agents.py record|replay BUNDLE OUT.json URL``: ``record`` runs the agent and
flushes the SDK's traces to the server; ``replay`` replays the bundle frozen and waits, inside the
session, until the SDK's exporter thread has tried to send its traces, then drains what is left
from a thread of its own. ``OUT.json``: the agent's answer and, for a replay, the refusals the
session recorded and whether ``verify_complete()`` passed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from stepfork_otel import NetworkRefusedError, ReplaySession, instrument_openai, record, trace_tool

WAIT = 60.0  # for the SDK's exporter thread, whose first export is 5 s after it starts


@trace_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def agent(url: str) -> Any:
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool
    from agents.tracing import set_tracing_export_api_key
    from agents.tracing.processors import default_exporter
    from openai import AsyncOpenAI

    set_tracing_export_api_key(os.environ["GUARD_AGENTS_KEY"])
    default_exporter().endpoint = f"{url}/traces/ingest"  # the provider's endpoint, on loopback
    client = AsyncOpenAI(base_url=url, api_key=os.environ["GUARD_AGENTS_KEY"])
    weather = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[function_tool(get_weather)],
        model=OpenAIResponsesModel(model="gpt-4o", openai_client=client),
    )
    return Runner.run_sync(weather, "What is the weather in Paris?").final_output


def refusals(session: ReplaySession) -> list[dict[str, Any]]:
    return [e.to_dict()["network"] for e in session.errors if isinstance(e, NetworkRefusedError)]


def main(mode: str, bundle: str, out: str, url: str) -> int:
    from agents.tracing import get_trace_provider

    instrument_openai()
    result: dict[str, Any] = {}
    if mode == "record":
        with record(bundle):
            result["result"] = agent(url)
        get_trace_provider().force_flush()
    else:
        with ReplaySession.from_trace(bundle) as session:
            result["result"] = agent(url)
            deadline = time.monotonic() + WAIT
            while not refusals(session) and time.monotonic() < deadline:
                time.sleep(0.05)  # the SDK's thread exports on its own schedule
            result["exporter_thread_refused"] = bool(refusals(session))
            drain = threading.Thread(target=get_trace_provider().force_flush)
            drain.start()  # what is still queued, from a thread without the session's context
            drain.join(WAIT)
            try:
                session.verify_complete()
                result["verified"] = True
            except Exception as exc:
                result["verified"] = f"{type(exc).__name__}: {exc}"
        result["refusals"] = refusals(session)
        result["calls"] = [[call.kind, call.action] for call in session.calls]
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
