"""Frameworks for free: pydantic-ai (OpenAI and Anthropic models, streaming), a LangGraph ReAct
agent on LangChain's ChatOpenAI/ChatAnthropic, and the OpenAI Agents SDK, each recorded against the
loopback fake server and replayed frozen in a fresh process with the server stopped -- with no
framework-specific code (tests/framework_agents.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_runner import run_agent

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

AGENTS = Path(__file__).with_name("framework_agents.py")


@pytest.mark.parametrize(
    ("scenario", "package", "tool_calls"),
    [
        ("pydantic_ai_openai", "pydantic_ai", 1),
        ("pydantic_ai_anthropic", "pydantic_ai", 1),
        ("pydantic_ai_stream", "pydantic_ai", 0),
        ("langgraph_openai", "langgraph", 1),
        ("langgraph_anthropic", "langchain_anthropic", 1),
        ("openai_agents", "agents", 1),
    ],
)
def test_a_framework_agent_replays_frozen_offline_with_no_framework_code(
    scenario: str, package: str, tool_calls: int, tmp_path: Path
) -> None:
    pytest.importorskip(package)
    bundle = tmp_path / f"{scenario}.sftrace"
    with FakeLLM() as llm:
        url = llm.anthropic_url if "anthropic" in scenario else llm.openai_url
        recorded = run_agent(AGENTS, scenario, "record", bundle, url)
        served = len(llm.requests)
    assert recorded["extra"] == ["Paris"] * tool_calls  # the tool ran
    replayed = run_agent(AGENTS, scenario, "replay", bundle, url)  # the server is stopped
    assert replayed["result"] == recorded["result"]
    assert replayed["extra"] == []  # the tool was served from the recording too
    kinds = [kind for kind, _ in replayed["calls"]]
    assert kinds.count("llm") == served
    assert kinds.count("tool") == tool_calls
    assert {action for _, action in replayed["calls"]} == {"substituted"}
    assert Trace.load(bundle).complete
