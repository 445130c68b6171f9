"""A framework's context parameter on a ``@trace_tool`` tool (issue 26, item 6): pydantic-ai's
``ctx: RunContext[...]`` on an ``@agent.tool`` and LangChain's ``config: RunnableConfig`` in a
LangGraph agent are left out of the recorded input by default, so the agent -- recorded against
the fake OpenAI server -- replays frozen in a fresh process with the server stopped.

Before, the run context (the model, its provider and HTTP client, the message history) was
recorded as the tool's input: it has no JSON form, the bundle still said complete, and replay
failed at the tool (``ReplayMismatchError: ... the input of this call has no canonical JSON
form``, naming ``OpenAIProvider``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_runner import run_agent

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

AGENTS = Path(__file__).with_name("context_agents.py")


@pytest.mark.parametrize(
    ("scenario", "package"), [("pydantic_ai_ctx", "pydantic_ai"), ("langgraph_config", "langgraph")]
)
def test_a_tool_taking_framework_context_replays_frozen_offline(
    scenario: str, package: str, tmp_path: Path
) -> None:
    pytest.importorskip(package)
    bundle = tmp_path / f"{scenario}.sftrace"
    with FakeLLM() as llm:
        recorded = run_agent(AGENTS, scenario, "record", bundle, llm.openai_url)
        served = len(llm.requests)
    assert recorded["extra"] == ["Paris"]  # the tool ran, with its context
    assert "celsius" in json.dumps(recorded["result"])  # ... which it read
    trace = Trace.load(bundle)
    assert trace.complete
    (tool,) = [call for call in trace.calls if call.type == "tool_call"]
    assert json.loads(tool.input or "") == {"city": "Paris"}  # the context is not the input

    replayed = run_agent(AGENTS, scenario, "replay", bundle, llm.openai_url)  # server stopped
    assert replayed["result"] == recorded["result"]
    assert replayed["extra"] == []  # frozen: the tool was served from the recording
    kinds = [kind for kind, _ in replayed["calls"]]
    assert kinds.count("llm") == served
    assert kinds.count("tool") == 1
    assert {action for _, action in replayed["calls"]} == {"substituted"}
