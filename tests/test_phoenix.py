"""What a user sees in a real local Phoenix, queried through its REST API (``docs/otel-setups.md``).

The server test needs ``arize-phoenix``, which is not a dev extra: ``.ci/run`` installs it into
``.venv-phoenix`` and runs this file there; elsewhere that test is skipped, saying so. The unit
tests of the tool definitions Phoenix reads run everywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from phoenix_server import GRPC_AGENT, SDK_AGENT, Phoenix, feed, phoenix_installed, running_phoenix

from stepfork_otel.recording.integrations.genai import tool_definitions

# --- the tool definitions, in the shape Phoenix validates -----------------------------------------


def test_openai_chat_tools_are_flattened_to_the_convention() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "description": "Find an order by its number.",
                "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}},
                "strict": True,
            },
        }
    ]
    assert tool_definitions(tools) == [
        {
            "type": "function",
            "name": "lookup_order",
            "description": "Find an order by its number.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}},
        }
    ]


def test_anthropic_and_responses_tools_and_built_in_tools() -> None:
    schema = {"type": "object", "properties": {}}
    assert tool_definitions(
        [
            {"name": "get_weather", "description": "Weather.", "input_schema": schema},
            {"type": "function", "name": "search", "parameters": schema},  # Responses: flat
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"type": "web_search"},  # no name: Phoenix would drop the whole list
            "not a tool",
            {},
        ]
    ) == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather.",
            "parameters": schema,
        },
        {"type": "function", "name": "search", "parameters": schema},
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "web_search", "name": "web_search"},
    ]


# --- a real Phoenix ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    if not phoenix_installed():
        if os.environ.get("STEPFORK_REQUIRE_PHOENIX"):  # .ci/run: a skip there would hide a gap
            pytest.fail("STEPFORK_REQUIRE_PHOENIX is set but arize-phoenix is not installed")
        pytest.skip("arize-phoenix is not installed here (.ci/run runs this in .venv-phoenix)")
    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as running:
        yield running


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


@pytest.mark.slow
def test_a_recorded_run_and_its_replay_as_phoenix_shows_them(
    phoenix: Phoenix, tmp_path: Path
) -> None:
    # every listener of the server is on loopback, the gRPC receiver included
    addresses = phoenix.listening_addresses()
    assert f"127.0.0.1:{phoenix.port}" in addresses
    assert any(a.endswith(f":{phoenix.grpc_port}") for a in addresses)
    assert all(a.startswith(("127.0.0.1:", "::ffff:127.0.0.1:", "::1:")) for a in addresses)

    fed = feed(
        SDK_AGENT,
        phoenix.http_endpoint,
        tmp_path / "sdk",
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="true",
    )
    feed(GRPC_AGENT, phoenix.grpc_endpoint, tmp_path / "grpc")
    phoenix.wait_for_spans("support-agent", 8)  # run + 3 calls, replay root + 3 calls
    phoenix.wait_for_spans("booking-agent", 8)  # run + 7 calls

    # the project comes from the resource attribute openinference.project.name
    projects = {p["name"] for p in phoenix.get("/v1/projects")["data"]}
    assert {"support-agent", "booking-agent"} <= projects
    if "default" in projects:
        assert phoenix.spans("default") == []

    spans = phoenix.spans("support-agent")
    kinds = {(s["name"], s["span_kind"]) for s in spans}
    assert kinds == {
        ("invoke_agent support_agent", "AGENT"),
        ("replay support_agent", "AGENT"),
        ("chat gpt-4o", "LLM"),
        ("execute_tool lookup_order", "TOOL"),
    }

    # the recorded run and its replay: two traces, each with its own root, told apart by name
    (run,) = by_name(spans, "invoke_agent support_agent")
    (replay,) = by_name(spans, "replay support_agent")
    assert run["parent_id"] is None
    assert replay["parent_id"] is None
    original, replayed = run["context"]["trace_id"], replay["context"]["trace_id"]
    assert original != replayed
    assert replay["attributes"]["stepfork.replay.of"] == original
    for trace_id, root in ((original, run), (replayed, replay)):
        calls = [s for s in spans if s["context"]["trace_id"] == trace_id and s is not root]
        assert sorted(s["name"] for s in calls) == [
            "chat gpt-4o",
            "chat gpt-4o",
            "execute_tool lookup_order",
        ]
        assert {s["parent_id"] for s in calls} == {root["context"]["span_id"]}
    traces = phoenix.get("/v1/projects/support-agent/traces")["data"]
    assert sorted(t["trace_id"] for t in traces) == sorted([original, replayed])

    # an LLM span: the messages Phoenix renders as a conversation (it reads gen_ai.*), the tools
    second = max(
        (s for s in by_name(spans, "chat gpt-4o") if s["context"]["trace_id"] == original),
        key=lambda s: s["start_time"],
    )
    a = second["attributes"]
    assert a["llm.input_messages.0.message.role"] == "user"
    assert a["llm.input_messages.0.message.content"] == (
        "Where is order 2? My key is [REDACTED:openai_api_key]"
    )
    assert a["llm.input_messages.1.message.role"] == "assistant"
    call = "llm.input_messages.1.message.tool_calls.0.tool_call"
    assert a[f"{call}.function.name"] == "lookup_order"
    assert json.loads(a[f"{call}.function.arguments"]) == {"order_id": 2}
    assert a["llm.input_messages.2.message.role"] == "tool"
    assert json.loads(a["llm.input_messages.2.message.content"]) == {
        "order_id": 2,
        "status": "shipped",
    }
    assert a["llm.output_messages.0.message.role"] == "assistant"
    assert a["llm.output_messages.0.message.content"].startswith("Done: ")
    assert not any(key.startswith("llm.tools.1.") for key in a)
    schema = json.loads(a["llm.tools.0.tool.json_schema"])
    assert schema["function"]["name"] == "lookup_order"
    assert schema["function"]["parameters"]["properties"] == {"order_id": {"type": "integer"}}
    assert a["llm.token_count.total"] > 0
    assert a["llm.model_name"] == "gpt-4o"

    # a succeeded call or run is OK, not Unset; a replayed LLM call called no model, so Phoenix
    # counts no tokens for it (stepfork keeps the recorded usage as stepfork.usage.*); every LLM
    # span keeps its output bubble (no "finish_reason": null to make Phoenix drop it)
    assert {s["status_code"] for s in spans if s is not replay} == {"OK"}
    for llm in by_name(spans, "chat gpt-4o"):
        attributes = llm["attributes"]
        assert attributes["llm.output_messages.0.message.role"] == "assistant"
        billed = [key for key in attributes if key.startswith("llm.token_count.")]
        if llm["context"]["trace_id"] == replayed:
            assert billed == [], billed
            assert attributes["stepfork.usage.input_tokens"] > 0
        else:
            assert billed, attributes

    # a TOOL span: its description (the docstring) and its parameters' schema (the signature)
    tool_span = by_name(spans, "execute_tool lookup_order")[0]["attributes"]
    assert tool_span["tool.name"] == "lookup_order"
    assert tool_span["tool.description"] == "Find an order by its number."
    assert tool_span["tool.parameters.type"] == "object"
    assert tool_span["tool.parameters.properties.order_id.type"] == "integer"
    assert tool_span["tool.parameters.required"] == ["order_id"]
    # each payload reached Phoenix once: the canonical text is the OpenInference value
    assert tool_span["input.value"] == '{"order_id":2}'
    assert "stepfork.input" not in tool_span
    assert tool_span["stepfork.input.sha256"] == sha256_of('{"order_id":2}')

    # the plain SDK over gRPC: its own project, the same kinds
    booking = phoenix.spans("booking-agent")
    assert {(s["name"], s["span_kind"]) for s in booking} == {
        ("invoke_agent booking_agent", "AGENT"),
        ("chat gpt-4.1-mini", "LLM"),
        ("execute_tool search_flights", "TOOL"),
        ("execute_tool book_flight", "TOOL"),
        ("execute_tool charge_card", "TOOL"),
    }
    (charge,) = by_name(booking, "execute_tool charge_card")
    assert json.loads(charge["attributes"]["input.value"])["card_token"] == "[REDACTED]"

    # the planted secret never reached Phoenix: 0 hits in its database; what stands in its
    # place is there, so this is the database that holds the spans
    stored = phoenix.database_bytes()
    assert stored.count(fed["secret"].encode()) == 0
    assert stored.count(fed["secret"][8:].encode()) == 0  # not even without its prefix
    assert stored.count(b"[REDACTED:openai_api_key]") > 0
    assert stored.count(b"tok_4242_visa_exp1228") == 0  # the booking agent's card token
