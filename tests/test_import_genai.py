"""Replaying runs that only OpenTelemetry GenAI semantic-convention instrumentations traced
(issue 23): ``opentelemetry-instrumentation-openai-v2`` with content on the span
(``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``,
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY``) and logfire's
``instrument_openai()`` (``send_to_logfire=False``).

Every step runs as a user runs it: the agent in its own process traced ONLY by the
instrumentation, its spans sent over real OTLP/HTTP to the loopback receiver, the ``stepfork
import`` command in a subprocess, the replay in a fresh process with the fake server stopped.
The spans hold the messages, not the request body: each call is imported at fidelity
``messages-only`` (matched on what the span held, the rest listed per call) and its response is
rebuilt for the SDK from the output messages; a streaming agent gets the recorded final message
cut into the SDK's stream again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import stepfork
from conftest import installed
from foreign_support import (
    PROMPT,
    Traced,
    docs_block,
    normalised,
    replay,
    replay_sending_nothing,
    traced,
)

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace
from stepfork_otel.trace import foreign
from stepfork_otel.trace.models import LlmRequest, LlmResponse, payload_value

pytest.importorskip("openai")

INSTRUMENTATIONS = {
    "openai-v2": ("opentelemetry.instrumentation.openai_v2", foreign.GENAI),
    "logfire": ("logfire", foreign.LOGFIRE),
}
COMBINATIONS = [(i, a) for i in INSTRUMENTATIONS for a in ("weather", "stream")]


@pytest.fixture(scope="module", params=COMBINATIONS, ids=["-".join(c) for c in COMBINATIONS])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Traced:
    instrumentation, agent = request.param
    installed(INSTRUMENTATIONS[instrumentation][0])
    return traced(
        tmp_path_factory.mktemp(f"{instrumentation}-{agent}"), instrumentation, agent, otlp=True
    )


def test_the_spans_import_as_messages_only_calls_with_rebuilt_responses(run: Traced) -> None:
    print(run.imported)
    assert "complete -- weather-agent, 2 calls, ok" in run.imported
    assert "1 run imported" in run.imported
    trace = Trace.load(run.bundle)
    assert trace.complete
    assert trace.created_by == foreign.created_by([INSTRUMENTATIONS[run.instrumentation][1]])
    requests = [e for e in trace.events if isinstance(e, LlmRequest)]
    assert [(r.provider, r.model, r.fidelity) for r in requests] == [
        ("openai", "gpt-4o", "messages-only")
    ] * 2
    form = payload_value(requests[1].input)
    assert form["url"] == "chat/completions"
    assert [m["role"] for m in form["messages"]] == ["system", "user", "assistant", "tool"]
    assert form["messages"][1]["parts"] == [{"type": "text", "content": PROMPT}]
    call = form["messages"][2]["parts"][0]
    assert (call["type"], call["name"], call["arguments"]) == (
        "tool_call",
        "get_weather",
        {"city": "Paris"},
    )
    assert form["messages"][3]["parts"][0]["response"] == "sunny in Paris"
    held_tools = "tools" in form  # logfire records the definitions, openai-v2 does not
    assert held_tools == (run.instrumentation == "logfire")
    assert ("tool definitions" in (requests[1].unchecked or [])) == (not held_tools)
    responses = [e for e in trace.events if isinstance(e, LlmResponse)]
    assert [r.usage for r in responses] == [{"input_tokens": 11, "output_tokens": 7}] * 2
    first = payload_value(responses[0].output)["body"]
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    tool_call = first["choices"][0]["message"]["tool_calls"][0]
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert first["usage"] == {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    last = payload_value(responses[1].output)["body"]
    # (the fake server streams a trailing space)
    assert last["choices"][0]["message"]["content"].rstrip() == "Done: sunny in Paris"
    assert last["choices"][0]["finish_reason"] == "stop"
    assert trace.run.untraced_tools == ["get_weather"]
    assert "NOTAREALKEY" not in run.bundle.read_text()


def test_the_agent_replays_frozen_in_a_fresh_process_with_the_server_stopped(
    run: Traced, tmp_path: Path
) -> None:
    replayed = replay(run.agent, run.bundle, run.live["url"], tmp_path / "replay.json")
    print(replayed["report"])
    assert "error" not in replayed, replayed  # verify_complete() passed
    assert replayed["answer"] == run.live["answer"]
    assert replayed["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    assert replayed["tool_ran"] == ["Paris"]  # plain Python, not a boundary: it ran
    report = replayed["report"]
    assert report.startswith("Dependency-call matching: MATCHED (2 of 2 recorded calls matched")
    assert "note: imported (messages-only): not compared, the trace did not hold it" in report
    rebuilt = "note: stream rebuilt from the recorded final message (the trace holds no chunks)"
    assert report.count(rebuilt) == (2 if run.agent == "stream" else 0)


def test_replay_sends_nothing_to_a_server_that_is_up(run: Traced, tmp_path: Path) -> None:
    replayed = replay_sending_nothing(run.agent, run.bundle, tmp_path / "r.json")
    assert replayed["answer"] == run.live["answer"]


def test_a_different_prompt_diverges_at_the_first_call_and_says_where(
    run: Traced, tmp_path: Path
) -> None:
    changed = replay(
        run.agent, run.bundle, run.live["url"], tmp_path / "d.json", "What is the weather in Rome?"
    )
    name, message = changed["error"]
    print(message)
    assert name == "ReplayMismatchError"
    assert message.startswith(
        "at call 1 of this run: input differs from the recording (an imported call, fidelity "
        "messages-only: the request is compared on what the trace held -- model, messages"
    )
    assert (
        "in the recording's terms: first differing path: messages[1].parts[0].content: recorded "
        '"What is the weather in Paris?", this run "What is the weather in Rome?"' in message
    )
    assert '"content":"What is the weather in Paris?"' in message
    assert '"content":"What is the weather in Rome?"' in message
    assert changed["calls"] == [["llm", "rejected"]]
    assert "answer" not in changed


def test_a_request_parameter_the_span_held_is_compared(run: Traced, tmp_path: Path) -> None:
    """The weather agent sends ``temperature=0.0``, and both instrumentations record it: an
    agent that changed it diverges (the streaming agent sends none: nothing is held)."""
    trace = Trace.load(run.bundle)
    form = payload_value(trace.calls[0].input)
    expected = {"gen_ai.request.temperature": 0.0} if run.agent == "weather" else {}
    assert form["params"] == expected


def test_an_untraced_tool_made_a_boundary_is_refused_in_frozen_replay_and_runs_in_live(
    run: Traced, tmp_path: Path
) -> None:
    """The tool ran in the recording, but no span shows it: made a ``@trace_tool`` for the
    replay, frozen replay refuses it by name; live mode with the tool allowed runs it (and the
    LLM calls, against a server that is up)."""
    if run.agent == "stream":
        pytest.skip("one agent is enough")
    frozen = replay("weather", run.bundle, run.live["url"], tmp_path / "f.json", traced_tool=True)
    name, message = frozen["error"]
    assert name == "ReplayPolicyError"
    assert "tool 'get_weather' ran untraced in the recording" in message
    assert "no execute_tool or TOOL span" in message
    assert "--allow-live-tool get_weather" in message
    assert frozen["tool_ran"] == []
    assert frozen["calls"] == [["llm", "substituted"], ["tool", "rejected"]]

    with FakeLLM() as llm:
        live = replay(
            "weather",
            run.bundle,
            llm.openai_url,
            tmp_path / "l.json",
            PROMPT,
            "live",
            "get_weather",
            traced_tool=True,
        )
        assert len(llm.requests) == 2
    assert "error" not in live, live
    assert live["answer"] == run.live["answer"]
    assert live["tool_ran"] == ["Paris"]
    assert live["calls"] == [["llm", "executed"], ["tool", "executed"], ["llm", "executed"]]
    assert "ran live, unrecorded" in live["report"]


def test_the_outputs_pasted_in_the_docs_are_what_the_commands_print(
    run: Traced, tmp_path: Path
) -> None:
    if (run.instrumentation, run.agent) != ("openai-v2", "weather"):
        pytest.skip("the docs show the openai-v2 tool loop")
    shown = stepfork(
        "show",
        run.bundle.relative_to(run.bundle.parent.parent),
        cwd=run.bundle.parent.parent,
    )
    assert shown.returncode == 0, shown.stderr
    printed = (
        "$ stepfork import spans.jsonl -o bundles\n"
        + run.imported
        + "$ stepfork show bundles/*.sftrace\n"
        + shown.stdout
    )
    print(printed)
    assert normalised(docs_block("genai-show")) == normalised(printed)
    replayed = replay(run.agent, run.bundle, run.live["url"], tmp_path / "r.json")
    print(replayed["report"])
    assert normalised(docs_block("genai-report")) == normalised(replayed["report"] + "\n")
    changed = replay(
        run.agent, run.bundle, run.live["url"], tmp_path / "d.json", "What is the weather in Rome?"
    )
    name, message = changed["error"]
    print(message)
    assert normalised(docs_block("genai-diverged")) == normalised(f"{name}: {message}\n")


@pytest.mark.parametrize("agent", ["anthropic", "anthropic-stream"])
def test_logfire_anthropic_spans_replay_through_instrument_anthropic(
    agent: str, tmp_path: Path
) -> None:
    """logfire's ``instrument_anthropic()`` spans: the response is rebuilt as an Anthropic
    message (``tool_use`` blocks, ``stop_reason``), and cut into Anthropic's stream events when
    the agent streams. (The Anthropic SDK reads every response as a stream: a call that is not
    an API stream gets the message body, as a recording of it holds.)"""
    installed("logfire")
    run = traced(tmp_path / "trace", "logfire", agent, otlp=True)
    trace = Trace.load(run.bundle)
    requests = [e for e in trace.events if isinstance(e, LlmRequest)]
    assert [(r.provider, r.fidelity) for r in requests] == [("anthropic", "messages-only")] * 2
    form = payload_value(requests[1].input)
    assert form["url"] == "messages"
    assert [m["role"] for m in form["messages"]] == ["system", "user", "assistant", "tool"]
    first = payload_value(trace.outcome_of(requests[0]).output)["body"]  # type: ignore[union-attr]
    assert (first["type"], first["stop_reason"]) == ("message", "tool_use")
    assert first["content"][0]["input"] == {"city": "Paris"}

    replayed = replay_sending_nothing(agent, run.bundle, tmp_path / "r.json")
    assert "error" not in replayed, replayed
    assert replayed["answer"] == run.live["answer"]
    assert replayed["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    rebuilt = "note: stream rebuilt from the recorded final message"
    assert replayed["report"].count(rebuilt) == (2 if agent == "anthropic-stream" else 0)
