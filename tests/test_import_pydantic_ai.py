"""Replaying a pydantic-ai agent from the spans its own instrumentation wrote
(``Agent.instrument_all(InstrumentationSettings(include_content=True))``, no stepfork in the
traced process): ``chat`` spans in the GenAI semantic conventions and an ``execute_tool`` span
per tool run, with the arguments and the result -- so the tool call is in the bundle too.

In replay the agent runs under ``instrument_openai()`` with its tool made a boundary
(``@trace_tool``), in a fresh process with the fake server stopped: the LLM calls and the tool
are served from the recording (the tool does not run).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import stepfork
from conftest import installed
from foreign_support import Traced, replay, traced

from stepfork_otel import Trace
from stepfork_otel.trace import foreign
from stepfork_otel.trace.models import ToolCall, ToolResult, payload_value

pytest.importorskip("openai")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    installed("pydantic_ai")
    return traced(tmp_path_factory.mktemp("pydantic-ai"), "pydantic-ai", "pydantic-ai", otlp=True)


def test_the_tool_span_becomes_a_tool_call(run: Traced) -> None:
    print(run.imported)
    assert "complete -- weather-agent, 3 calls, ok" in run.imported
    trace = Trace.load(run.bundle)
    assert trace.created_by == foreign.created_by([foreign.GENAI])
    assert [type(c).__name__ for c in trace.calls] == ["LlmRequest", "ToolCall", "LlmRequest"]
    tool = trace.calls[1]
    assert isinstance(tool, ToolCall)
    assert (tool.name, payload_value(tool.input or "")) == ("get_weather", {"city": "Paris"})
    assert tool.fidelity == "messages-only"
    result = trace.outcome_of(tool)
    assert isinstance(result, ToolResult)
    assert payload_value(result.output or "") == "sunny in Paris"
    assert trace.run.untraced_tools is None  # every tool the model called has its span


def test_the_agent_replays_frozen_with_its_tool_served_from_the_recording(
    run: Traced, tmp_path: Path
) -> None:
    replayed = replay(
        "pydantic-ai", run.bundle, run.live["url"], tmp_path / "r.json", traced_tool=True
    )
    print(replayed["report"])
    assert "error" not in replayed, replayed  # verify_complete() passed
    assert replayed["answer"] == run.live["answer"]
    assert replayed["calls"] == [
        ["llm", "substituted"],
        ["tool", "substituted"],
        ["llm", "substituted"],
    ]
    assert replayed["tool_ran"] == []  # served, not run
    assert "fidelity messages-only" in replayed["report"]


def test_a_tool_left_plain_in_the_replay_leaves_its_recorded_call_unmade(
    run: Traced, tmp_path: Path
) -> None:
    """Not a boundary, the tool runs as plain code and the recorded tool call is never made:
    the next LLM call is refused, naming the tool call the recording expected there."""
    replayed = replay("pydantic-ai", run.bundle, run.live["url"], tmp_path / "r.json")
    name, message = replayed["error"]
    assert name == "ReplayMismatchError"
    assert message.startswith(
        "at call 2 of this run: call order differs: this call was recorded later, as call-3, "
        "but the next recorded call is tool get_weather (call-2)"
    )
    assert replayed["tool_ran"] == ["Paris"]


def test_a_different_prompt_diverges_at_the_first_call(run: Traced, tmp_path: Path) -> None:
    changed = replay(
        "pydantic-ai",
        run.bundle,
        run.live["url"],
        tmp_path / "d.json",
        "What is the weather in Rome?",
        traced_tool=True,
    )
    name, message = changed["error"]
    assert name == "ReplayMismatchError"
    assert message.startswith("at call 1 of this run: input differs from the recording")
    assert "What is the weather in Rome?" in message
    assert changed["tool_ran"] == []


# --- the same agent, its spans rewritten by openinference-instrumentation-pydantic-ai -----------

FIXTURE = Path(__file__).with_name("fixtures") / "openinference-pydantic-ai" / "pydantic-ai.jsonl"


def test_openinference_pydantic_ai_spans_replay_frozen(tmp_path: Path) -> None:
    """``openinference-instrumentation-pydantic-ai`` 0.1.30 installs beside the pinned
    OpenTelemetry in a separate virtualenv (not a dependency here): its spans were recorded once
    into the fixture, as ``tests/test_import_openllmetry.py`` says for OpenLLMetry (instrumentation
    ``openinference-pydantic-ai`` of ``tests/foreign_agents.py``). Its processor adds OpenInference
    attributes to pydantic-ai's spans: the LLM spans' ``input.value`` is only the last user
    text, so they are read by their GenAI attributes; the TOOL span's ``input.value`` holds the
    arguments and ``output.value`` the result."""
    spans = tmp_path / "spans.jsonl"
    spans.write_bytes(FIXTURE.read_bytes())
    done = stepfork("import", "spans.jsonl", "-o", "bundles", cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    (bundle,) = (tmp_path / "bundles").glob("*.sftrace")
    trace = Trace.load(bundle)
    assert trace.created_by == foreign.created_by([foreign.OPENINFERENCE])
    assert [(type(c).__name__, c.fidelity) for c in trace.calls] == [
        ("LlmRequest", "messages-only"),
        ("ToolCall", "messages-only"),
        ("LlmRequest", "messages-only"),
    ]
    replayed = replay(
        "pydantic-ai", bundle, "http://127.0.0.1:9/v1", tmp_path / "r.json", traced_tool=True
    )
    assert "error" not in replayed, replayed
    assert replayed["answer"] == "Done: sunny in Paris"
    assert replayed["calls"] == [
        ["llm", "substituted"],
        ["tool", "substituted"],
        ["llm", "substituted"],
    ]
    assert replayed["tool_ran"] == []
