"""The real ``openai`` and ``anthropic`` SDKs, instrumented with one line each, against a loopback
fake server: every scenario is recorded, then replayed in a fresh process with the server stopped.
The agent must see the same classes and ``model_dump()`` values, streams chunk for chunk, the
same exception classes, and replay must serve every call (no request reaches anything)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_runner import run_agent

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

pytest.importorskip("openai")
pytest.importorskip("anthropic")

AGENTS = Path(__file__).with_name("sdk_agents.py")


Run = tuple[dict[str, Any], dict[str, Any], Trace, int, Path]
_runs: dict[str, Run] = {}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Each scenario recorded (server up) and replayed in a fresh process (server stopped), once
    per module: ``(recorded, replayed, trace, requests served while recording, bundle)``."""

    def get(scenario: str, kind: str) -> Run:
        if scenario not in _runs:
            tmp_path = tmp_path_factory.mktemp(scenario)
            bundle = tmp_path / f"{scenario}.sftrace"
            with FakeLLM() as llm:
                url = llm.openai_url if kind == "openai" else llm.anthropic_url
                recorded = run_agent(AGENTS, scenario, "record", bundle, url)
                served = len(llm.requests)
            replayed = run_agent(AGENTS, scenario, "replay", bundle, url)  # the server is gone
            _runs[scenario] = (recorded, replayed, Trace.load(bundle), served, bundle)
        return _runs[scenario]

    return get


@pytest.mark.parametrize(
    ("scenario", "kind"),
    [
        ("openai_sync", "openai"),
        ("openai_async", "openai"),
        ("anthropic_sync", "anthropic"),
        ("anthropic_async", "anthropic"),
        ("openai_raw", "openai"),
        ("anthropic_raw", "anthropic"),
    ],
)
def test_an_sdk_agent_replays_offline_seeing_exactly_what_it_saw_live(
    scenario: str, kind: str, runs: Any
) -> None:
    recorded, replayed, trace, served, _ = runs(scenario, kind)
    assert replayed["result"] == recorded["result"]
    calls = [e for e in trace.events if e.type == "llm_request"]
    assert len(calls) == served  # one recorded call per HTTP attempt, retries included
    assert replayed["calls"] == [["llm", "substituted"]] * served
    assert trace.complete


def test_the_openai_agent_saw_the_sdk_own_types_streams_and_errors(runs: Any) -> None:
    _, replayed, trace, _, bundle = runs("openai_sync", "openai")
    seen = replayed["result"]
    assert seen[0][0] == "openai.types.chat.chat_completion.ChatCompletion"
    assert seen[1][0] == "Stream"
    assert [c[0] for c in seen[1][1]] == [
        "openai.types.chat.chat_completion_chunk.ChatCompletionChunk"
    ] * len(seen[1][1])
    assert seen[2][0] == "early"
    quirky = seen[4][1]
    assert quirky["choices"][0]["finish_reason"] is None
    assert quirky["created"] == 1700000000.5
    assert seen[6][:2] == ["RateLimitError", 429]
    assert seen[7][:2] == ["InternalServerError", 500]
    assert seen[9][1]["choices"][0]["message"]["parsed"] == {"text": "Paris"}
    assert seen[12][1]["data"][0]["embedding"]
    assert seen[13][0] == "req_fake"
    # the request as sent is the recorded input: extra_body and sampling parameters included
    inputs = [json.loads(e.input or "") for e in trace.events if e.type == "llm_request"]
    streamed = inputs[1]
    assert streamed["url"] == "chat/completions"
    assert streamed["body"]["metadata_tag"] == "x"
    assert streamed["body"]["temperature"] == 0.2
    # the API key never reaches the bundle, whatever the position
    text = bundle.read_text()
    assert "NOTAREALKEY" not in text
    assert "authorization" not in text.lower()


def test_a_stream_closed_early_is_recorded_as_read_so_far(runs: Any) -> None:
    _, _, trace, _, _ = runs("openai_sync", "openai")
    outputs = [json.loads(e.output or "") for e in trace.events if e.type == "llm_response"]
    early = outputs[2]
    assert early["complete"] is False
    assert 1 <= len(early["chunks"]) < 8
    assert all(o["complete"] for o in outputs if "chunks" in o and o is not early)


def test_a_connection_failure_replays_as_the_sdk_connection_error(runs: Any) -> None:
    recorded, replayed, trace, _, _ = runs("openai_timeout", "openai")
    assert recorded["result"] == replayed["result"]
    assert replayed["result"][0][0] == "APIConnectionError"
    assert replayed["result"][0][2] == "ConnectError"
    errors = [e for e in trace.events if e.type == "error"]
    assert len(errors) == 2  # the first attempt and its retry
    library, name = errors[0].error_type.rsplit(".", 1)
    assert (library, name) in {("httpx2", "ConnectError"), ("httpx", "ConnectError")}


@pytest.mark.parametrize(
    ("scenario", "kind"), [("openai_raw", "openai"), ("anthropic_raw", "anthropic")]
)
def test_replayed_raw_responses_behave_as_read_ones(scenario: str, kind: str, runs: Any) -> None:
    """``with_raw_response`` / ``with_streaming_response``, sync and async: status, headers,
    the request, ``parse()``, the lines of a stream, and ``elapsed`` -- which raised in replay
    ("may only be accessed after the response has been read or closed") because a response
    built from the recording had never been sent."""
    recorded, replayed, _, _, _ = runs(scenario, kind)
    assert replayed["result"] == recorded["result"]
    for seen in replayed["result"]:
        assert seen["elapsed"] == ["timedelta", True]
        assert seen["closed"] is True
        assert seen["status"] == 200
        assert seen["request"][0] == "POST"
        assert seen["body"]  # parsed, or the stream's lines
    content_types = [seen["content type"] for seen in replayed["result"]]
    assert "text/event-stream" in content_types
    assert "application/json" in content_types
