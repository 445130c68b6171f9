"""A substituted LLM call called no model, so its span carries no ``gen_ai.usage.*`` (Phoenix
and Langfuse bill tokens and cost from them): the recorded usage stays on it under stepfork's own
keys, and the replay's bundle keeps it. A call that runs live in a replay is billed as usual."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import LlmResponse, ReplaySession, Trace, llm_request, record
from stepfork_otel import constants as k

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}
REPLY = {
    "id": "chatcmpl-1",
    "model": "gpt-4.1-mini",
    "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "Hello"}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 7},
}
PLAIN_REPLY = {"model": "m", "text": "Hello", "usage": {"input_tokens": 5, "output_tokens": 2}}


def _agent(reply: dict[str, Any]) -> None:
    llm_request(provider="openai", model="gpt-4.1-mini", input=CHAT, call=lambda: dict(reply))


def _llm_attributes(recording: Recording) -> dict[str, Any]:
    (span,) = [
        s
        for s in recording.exporter.get_finished_spans()
        if (s.attributes or {}).get(k.KIND) == k.KIND_LLM
    ]
    return dict(span.attributes or {})


@pytest.mark.parametrize("reply", [REPLY, PLAIN_REPLY], ids=["openai-shaped", "other-shape"])
def test_a_substituted_call_bills_no_tokens(
    recording: Recording, tmp_path: Path, reply: dict[str, Any]
) -> None:
    path = tmp_path / "run.sftrace"
    with record(path):
        _agent(reply)
    recorded = _llm_attributes(recording)
    tokens = (recorded[k.GEN_AI_USAGE_INPUT_TOKENS], recorded[k.GEN_AI_USAGE_OUTPUT_TOKENS])
    recording.exporter.clear()

    with (
        ReplaySession.from_trace(path, mode="frozen") as replay,
        record(tmp_path / "replay.sftrace"),
    ):
        _agent(reply)
        replay.verify_complete()
    replayed = _llm_attributes(recording)
    assert replayed[k.REPLAY_ACTION] == k.ACTION_SUBSTITUTED
    assert not [key for key in replayed if key.startswith("gen_ai.usage.")], replayed
    assert (replayed[k.USAGE_INPUT_TOKENS], replayed[k.USAGE_OUTPUT_TOKENS]) == tokens
    bundle = Trace.load(tmp_path / "replay.sftrace")
    (response,) = [e for e in bundle.events if isinstance(e, LlmResponse)]
    usage = response.usage
    assert usage is not None
    assert (usage["input_tokens"], usage["output_tokens"]) == tokens


def test_a_live_call_in_a_replay_is_billed(recording: Recording, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace"
    with record(path):
        _agent(REPLY)
    recording.exporter.clear()
    with ReplaySession.from_trace(path, mode="hybrid", live_llms=["openai/gpt-4.1-mini"]):
        _agent(REPLY)
    replayed = _llm_attributes(recording)
    assert replayed[k.REPLAY_ACTION] == k.ACTION_EXECUTED
    assert replayed[k.GEN_AI_USAGE_INPUT_TOKENS] == 12


ANTHROPIC_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Hello"}],
    "stop_reason": "end_turn",
    "usage": {
        "input_tokens": 5,
        "output_tokens": 2,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 4,
    },
}


def test_a_substituted_call_bills_no_cache_tokens_under_either_name(
    recording: Recording, tmp_path: Path
) -> None:
    """Cache writes are described under the current name (``cache_write``) and the old one
    (``cache_creation``); a substituted call carries neither."""

    def agent() -> None:
        llm_request(
            provider="anthropic",
            model="claude-sonnet-4-5",
            input={"max_tokens": 10, **CHAT},
            call=lambda: dict(ANTHROPIC_REPLY),
        )

    path = tmp_path / "run.sftrace"
    with record(path):
        agent()
    recorded = _llm_attributes(recording)
    assert recorded[k.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS] == 4
    assert recorded[k.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] == 4
    assert recorded[k.GEN_AI_USAGE_INPUT_TOKENS] == 5 + 3 + 4
    recording.exporter.clear()
    with ReplaySession.from_trace(path, mode="frozen") as replay:
        agent()
        replay.verify_complete()
    replayed = _llm_attributes(recording)
    assert replayed[k.REPLAY_ACTION] == k.ACTION_SUBSTITUTED
    assert not [key for key in replayed if key.startswith("gen_ai.usage.")], replayed
