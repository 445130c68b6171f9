"""Frameworks for free: pydantic-ai (OpenAI and Anthropic models, streaming), a LangGraph ReAct
agent on LangChain's ChatOpenAI/ChatAnthropic, and the OpenAI Agents SDK, each recorded against the
loopback fake server and replayed frozen in a fresh process with the server stopped -- with no
framework-specific code (tests/framework_agents.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

AGENTS = Path(__file__).with_name("framework_agents.py")


def run(scenario: str, mode: str, bundle: Path, url: str) -> dict[str, Any]:
    out = bundle.with_suffix(f".{mode}.json")
    env = dict(os.environ, PYTHONPATH=str(AGENTS.parent.parent), OPENAI_AGENTS_DISABLE_TRACING="1")
    done = subprocess.run(
        [sys.executable, str(AGENTS), scenario, mode, str(bundle), str(out), url],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


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
        recorded = run(scenario, "record", bundle, url)
        served = len(llm.requests)
    assert recorded["tool_ran"] == ["Paris"] * tool_calls
    replayed = run(scenario, "replay", bundle, url)  # the server is stopped
    assert replayed["answer"] == recorded["answer"]
    assert replayed["tool_ran"] == []  # the tool was served from the recording too
    kinds = [kind for kind, _ in replayed["actions"]]
    assert kinds.count("llm") == served
    assert kinds.count("tool") == tool_calls
    assert {action for _, action in replayed["actions"]} == {"substituted"}
    assert Trace.load(bundle).complete
