"""GenAI message attributes Phoenix and the OTel GenAI instrumentations can read: an unknown
``finish_reason`` is left out (never ``null``), and ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_
CONTENT`` turns content on for stepfork with the values the official instrumentations accept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import constants as k
from stepfork_otel import llm_request, record

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def _reply(**choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "gpt-4.1-mini",
        "choices": [{"message": {"role": "assistant", "content": "Hello"}, **choice}],
    }


def _llm_attributes(recording: Recording) -> dict[str, Any]:
    (span,) = [
        s
        for s in recording.exporter.get_finished_spans()
        if (s.attributes or {}).get(k.KIND) == k.KIND_LLM
    ]
    return dict(span.attributes or {})


def _call(tmp_path: Path, reply: dict[str, Any], provider: str = "openai") -> None:
    with record(tmp_path / "run.sftrace"):
        llm_request(provider=provider, model="gpt-4.1-mini", input=CHAT, call=lambda: reply)


@pytest.mark.parametrize("choice", [{}, {"finish_reason": None}], ids=["absent", "null"])
def test_an_unknown_finish_reason_is_left_out(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, choice: dict[str, Any]
) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    _call(tmp_path, _reply(**choice))
    attributes = _llm_attributes(recording)
    (message,) = json.loads(attributes[k.GEN_AI_OUTPUT_MESSAGES])
    assert message == {"role": "assistant", "parts": [{"type": "text", "content": "Hello"}]}
    assert k.GEN_AI_RESPONSE_FINISH_REASONS not in attributes


def test_a_known_finish_reason_is_kept(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    _call(tmp_path, _reply(finish_reason="stop"))
    (message,) = json.loads(_llm_attributes(recording)[k.GEN_AI_OUTPUT_MESSAGES])
    assert message["finish_reason"] == "stop"


def test_an_anthropic_message_without_stop_reason_has_no_null(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    reply = {"id": "msg_1", "model": "claude", "role": "assistant", "content": "Hello"}
    _call(tmp_path, reply, provider="anthropic")
    (message,) = json.loads(_llm_attributes(recording)[k.GEN_AI_OUTPUT_MESSAGES])
    assert "finish_reason" not in message


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("true", True),
        ("True", True),
        ("SPAN_ONLY", True),
        ("span_and_event", True),
        ("SPAN_AND_EVENT", True),
        ("EVENT_ONLY", False),
        ("NO_CONTENT", False),
        ("false", False),
        ("", False),
    ],
)
def test_the_content_variable_takes_the_genai_instrumentations_values(
    recording: Recording,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    on: bool,
) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, value)
    _call(tmp_path, _reply(finish_reason="stop"))
    assert (k.GEN_AI_OUTPUT_MESSAGES in _llm_attributes(recording)) is on


class _CountingJson:
    """Stands in for ``orjson`` in ``recording/integrations/genai.py``: the texts it parses."""

    def __init__(self) -> None:
        import orjson

        self._orjson = orjson
        self.JSONDecodeError = orjson.JSONDecodeError
        self.parsed: list[str] = []

    def loads(self, text: Any) -> Any:
        self.parsed.append(text if isinstance(text, str) else bytes(text).decode())
        return self._orjson.loads(text)

    def dumps(self, *args: Any, **kwargs: Any) -> Any:
        return self._orjson.dumps(*args, **kwargs)


def _replayed_and_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: Any, recording: Recording
) -> tuple[dict[str, Any], list[str]]:
    from stepfork_otel import ReplaySession
    from stepfork_otel.recording.integrations import genai

    with record(tmp_path / "run.sftrace"):
        agent()
    recorded = _llm_attributes(recording)
    recording.exporter.clear()
    counting = _CountingJson()
    monkeypatch.setattr(genai, "orjson", counting)
    with ReplaySession.from_trace(tmp_path / "run.sftrace") as replay:
        agent()
        replay.verify_complete()
    replayed = _llm_attributes(recording)
    assert replayed[k.REPLAY_ACTION] == k.ACTION_SUBSTITUTED
    for key in (k.GEN_AI_RESPONSE_ID, k.GEN_AI_RESPONSE_FINISH_REASONS, k.GEN_AI_OUTPUT_MESSAGES):
        assert replayed[key] == recorded[key]  # described as when it was recorded
    return replayed, counting.parsed


ANSWER = "the answer only the recorded response holds"


def test_a_substituted_call_is_described_from_the_value_the_session_parsed(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replay describes a substituted call (GenAI attributes) from the recorded output the
    session already parsed to substitute it: the output text is not parsed a second time (it
    was, twice for a hand-written call: once alone and once inside a wrapper string)."""
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    reply = _reply(finish_reason="stop")
    reply["choices"][0]["message"]["content"] = ANSWER

    def agent() -> None:
        llm_request(provider="openai", model="gpt-4.1-mini", input=CHAT, call=lambda: reply)

    _, parsed = _replayed_and_parsed(tmp_path, monkeypatch, agent, recording)
    assert parsed, "the request is still parsed"
    assert not [text for text in parsed if ANSWER in text], parsed


def test_a_substituted_sdk_call_is_described_from_the_value_the_session_parsed(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import installed

    from examples.fake_llm import FakeLLM

    openai = installed("openai")
    import stepfork_otel

    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    stepfork_otel.instrument_openai()
    with FakeLLM() as llm:
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)
        question = [{"role": "user", "content": "repeat: " + ANSWER}]

        def agent() -> None:
            client.chat.completions.create(model="gpt-4o", messages=question)

        try:
            replayed, parsed = _replayed_and_parsed(tmp_path, monkeypatch, agent, recording)
        finally:
            client.close()
            stepfork_otel.uninstrument_openai()
    assert replayed[k.GEN_AI_PROVIDER_NAME] == "openai"
    (request,) = parsed  # the request only, not the response record
    assert '"url":"chat/completions"' in request
