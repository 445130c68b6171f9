"""A hand-written ``llm_request`` whose request and response have an SDK's shape gets the GenAI
attributes the SDK integrations write (so Phoenix and Langfuse show it as a conversation), built
from the redacted payloads; one of another shape gets none of them, and replay spans get them too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepfork_otel import ReplaySession, llm_request, record
from stepfork_otel import constants as k
from tests.conftest import Recording

SECRET = "sk-proj-" + "Q7" * 24

CHAT = {
    "messages": [
        {"role": "system", "content": "You book flights."},
        {"role": "user", "content": f"Book Paris, my key is {SECRET}"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "search_flights",
                "description": "Search flights",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ],
    "temperature": 0.1,
}
CHAT_REPLY = {
    "id": "chatcmpl-1",
    "model": "gpt-4.1-mini",
    "choices": [
        {
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search_flights", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7},
}


def _llm_spans(recording: Recording) -> list[Any]:
    return [
        s
        for s in recording.exporter.get_finished_spans()
        if s.attributes is not None and s.attributes.get(k.KIND) == k.KIND_LLM
    ]


@pytest.fixture
def content(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")


def test_an_openai_shaped_call_is_a_conversation_on_its_span(
    recording: Recording, tmp_path: Path, content: None
) -> None:
    with record(tmp_path / "run.sftrace"):
        llm_request(provider="openai", model="gpt-4.1-mini", input=CHAT, call=lambda: CHAT_REPLY)
    (span,) = _llm_spans(recording)
    attributes = span.attributes
    assert attributes[k.GEN_AI_REQUEST_TEMPERATURE] == 0.1
    assert attributes[k.GEN_AI_RESPONSE_FINISH_REASONS] == ("tool_calls",)
    assert attributes[k.GEN_AI_USAGE_INPUT_TOKENS] == 12
    inputs = json.loads(attributes[k.GEN_AI_INPUT_MESSAGES])
    assert [m["role"] for m in inputs] == ["user"]
    assert "[REDACTED:" in json.dumps(inputs)  # built from the redacted payload
    assert SECRET not in json.dumps(dict(attributes))
    assert json.loads(attributes[k.GEN_AI_SYSTEM_INSTRUCTIONS])[0]["content"] == "You book flights."
    (reply,) = json.loads(attributes[k.GEN_AI_OUTPUT_MESSAGES])
    assert reply["parts"][0]["type"] == "tool_call"
    assert reply["parts"][0]["name"] == "search_flights"
    (tool,) = json.loads(attributes[k.GEN_AI_TOOL_DEFINITIONS])
    assert tool["name"] == "search_flights"

    recording.exporter.clear()
    with ReplaySession.from_trace(tmp_path / "run.sftrace") as replay:
        llm_request(provider="openai", model="gpt-4.1-mini", input=CHAT, call=lambda: CHAT_REPLY)
    replay.verify_complete()
    (replayed,) = _llm_spans(recording)
    assert replayed.attributes[k.GEN_AI_OUTPUT_MESSAGES] == attributes[k.GEN_AI_OUTPUT_MESSAGES]


def test_an_anthropic_shaped_call_is_read_as_anthropic(
    recording: Recording, tmp_path: Path, content: None
) -> None:
    request = {
        "system": "Be brief.",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    reply = {
        "id": "msg_1",
        "model": "claude-sonnet-4-5",
        "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "Hello."}],
        "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 3},
    }
    with record(tmp_path / "run.sftrace"):
        llm_request(
            provider="anthropic", model="claude-sonnet-4-5", input=request, call=lambda: reply
        )
    (span,) = _llm_spans(recording)
    attributes = span.attributes
    assert attributes[k.GEN_AI_REQUEST_MAX_TOKENS] == 64
    assert attributes[k.GEN_AI_USAGE_INPUT_TOKENS] == 8  # the convention counts cached tokens
    assert json.loads(attributes[k.GEN_AI_SYSTEM_INSTRUCTIONS])[0]["content"] == "Be brief."
    (out,) = json.loads(attributes[k.GEN_AI_OUTPUT_MESSAGES])
    assert out["parts"] == [{"type": "text", "content": "Hello."}]


def test_a_call_of_another_shape_gets_no_conversation(
    recording: Recording, tmp_path: Path, content: None
) -> None:
    with record(tmp_path / "run.sftrace"):
        llm_request(
            provider="local",
            model="llama",
            input={"prompt": "complete this"},
            call=lambda: {"text": "done", "usage": {"input_tokens": 3, "output_tokens": 1}},
        )
    (span,) = _llm_spans(recording)
    assert k.GEN_AI_INPUT_MESSAGES not in span.attributes
    assert k.GEN_AI_OUTPUT_MESSAGES not in span.attributes
    assert span.attributes[k.GEN_AI_USAGE_INPUT_TOKENS] == 3  # usage as before


def test_without_content_capture_only_the_parameters_are_written(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "run.sftrace"):
        llm_request(provider="openai", model="gpt-4.1-mini", input=CHAT, call=lambda: CHAT_REPLY)
    (span,) = _llm_spans(recording)
    assert span.attributes[k.GEN_AI_REQUEST_TEMPERATURE] == 0.1
    assert k.GEN_AI_INPUT_MESSAGES not in span.attributes
