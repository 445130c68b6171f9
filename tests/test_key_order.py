"""Unchanged code replays: a substituted value comes back with its keys in the order the call
returned them. An output is recorded once, as returned (redacted): the bundle's text, its
fingerprint, the span's ``output.value`` and what replay decodes are that one text. Inputs stay
canonical (sorted keys), because matching compares them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import Recording
from hypothesis import given, settings
from hypothesis import strategies as st
from otlp_receiver import collector_lines

from stepfork_otel import ReplaySession, Trace, iter_traces_from_otlp_json, llm_request, record
from stepfork_otel import trace_tool as tool
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.canonical import as_returned_bytes, canonical_json, sha256_hex
from stepfork_otel.trace.payload import capture
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

SECRET = "sk-proj-" + "a1b2c3d4" * 6


@tool
def search(city: str) -> dict[str, Any]:
    return {
        "query": {"to": city, "from": "Oslo"},
        "results": [{"price": 89, "id": "AF1381", "seats": {"left": 0, "class": "Y"}}],
        "zone": "CET",
        "api_key": SECRET,  # redacted, and its neighbours keep their order
    }


def agent(city: str) -> str:
    found = search(city)
    return llm_request(
        provider="openai",
        model="m",
        input={"messages": [{"role": "tool", "content": json.dumps(found)}]},
        call=lambda: "book AF1381",
    )


def test_an_agent_that_dumps_a_tool_result_into_its_prompt_replays(
    recording: Recording, tmp_path: Path
) -> None:
    """Were the substituted dict to come back sorted, json.dumps would build another prompt, and
    replay of the agent's own recording would diverge at the LLM call, blaming the prompt."""
    with record(tmp_path / "run.sftrace"):
        agent("Paris")
    with ReplaySession.from_trace(tmp_path / "run.sftrace") as replay:
        assert agent("Paris") == "book AF1381"
        replay.verify_complete()
    (call,) = (c for c in replay.calls if c.kind == "tool")
    assert call.action == "substituted"


def test_the_value_comes_back_as_returned_and_redacted(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "run.sftrace"):
        returned = search("Paris")
    with ReplaySession.from_trace(tmp_path / "run.sftrace"):
        replayed = search("Paris")
    assert list(replayed) == list(returned)
    assert list(replayed["query"]) == ["to", "from"]
    assert list(replayed["results"][0]) == ["price", "id", "seats"]
    assert list(replayed["results"][0]["seats"]) == ["left", "class"]
    assert replayed["api_key"] == "[REDACTED]"
    trace = Trace.load(tmp_path / "run.sftrace")
    call, outcome = trace.events[0], trace.events[1]
    stored = as_returned_bytes({**returned, "api_key": "[REDACTED]"}).decode()
    assert outcome.output == stored  # type: ignore[union-attr]  # once, as returned
    assert outcome.output_sha256 == sha256_hex(stored)  # type: ignore[union-attr]
    assert call.input == canonical_json({"city": "Paris"})  # type: ignore[union-attr]
    assert SECRET not in dump_trace(trace).decode()


def test_the_span_carries_each_payload_once_and_the_import_keeps_the_order(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "run.sftrace"):
        search("Paris")
    local = Trace.load(tmp_path / "run.sftrace")
    spans = recording.exporter.get_finished_spans()
    (span,) = (s for s in spans if s.name == "execute_tool search")
    attributes = dict(span.attributes or {})
    assert "stepfork.output" not in attributes
    assert "stepfork.input" not in attributes
    assert attributes["output.value"] == local.events[1].output  # type: ignore[union-attr]
    assert list(json.loads(str(attributes["output.value"]))) == [
        "query",
        "results",
        "zone",
        "api_key",
    ]
    assert SECRET not in str(attributes)
    collector = tmp_path / "collector.jsonl"
    collector.write_bytes(b"".join(collector_lines(spans, batch_size=3)))
    (imported,) = iter_traces_from_otlp_json(collector)
    assert imported.events == local.events


def test_capture_keeps_the_returned_order_only_for_outputs() -> None:
    unsorted = {"b": 1, "a": {"d": 2, "c": 3}}
    assert capture(unsorted, DEFAULT_REDACTOR).text == '{"a":{"c":3,"d":2},"b":1}'  # inputs
    kept = capture(unsorted, DEFAULT_REDACTOR, keep_order=True)
    assert kept.text == '{"b":1,"a":{"d":2,"c":3}}'
    assert kept.sha256 == sha256_hex(kept.text)


_keys = st.text("abcdefgh", min_size=1, max_size=3)
_values = st.recursive(
    st.integers(-5, 5) | st.text("xyz", max_size=2) | st.none(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_values)
def test_any_output_comes_back_in_its_returned_order(value: Any) -> None:
    payload = capture(value, DEFAULT_REDACTOR, keep_order=True)
    assert payload.text == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
