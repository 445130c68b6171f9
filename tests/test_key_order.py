"""Unchanged code replays: a substituted value comes back with its keys in the order the call
returned them, while matching and fingerprints keep using the canonical (sorted-key) form."""

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
from stepfork_otel.trace.canonical import (
    KeyOrder,
    canonical_json,
    key_order,
    loads,
    restore_key_order,
)
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
    """Before: the substituted dict came back sorted, json.dumps built another prompt, and
    replay of the agent's own recording diverged at the LLM call, blaming the prompt."""
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
    outcome = trace.events[1]
    assert outcome.output == canonical_json({**returned, "api_key": "[REDACTED]"})  # sorted
    assert SECRET not in dump_trace(trace).decode()


def test_the_span_shows_the_value_as_returned_and_the_import_keeps_the_order(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "run.sftrace"):
        search("Paris")
    local = Trace.load(tmp_path / "run.sftrace")
    spans = recording.exporter.get_finished_spans()
    (span,) = (s for s in spans if s.name == "execute_tool search")
    attributes = dict(span.attributes or {})
    assert attributes["stepfork.output"] == local.events[1].output  # canonical: matched on
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
    assert dump_trace(imported) == dump_trace(local)


def test_a_sorted_value_adds_nothing_and_a_format_1_bundle_still_replays(
    recording: Recording, tmp_path: Path
) -> None:
    @tool
    def plain(n: int) -> dict[str, int]:
        return {"a": n, "b": n + 1}  # already in sorted order

    with record(tmp_path / "run.sftrace"):
        plain(1)
        search("Paris")
    trace = Trace.load(tmp_path / "run.sftrace")
    assert trace.events[1].output_key_order is None  # type: ignore[union-attr]
    assert trace.events[3].output_key_order  # type: ignore[union-attr]
    old = trace.model_copy(
        update={
            "format_version": 1,
            "events": [
                e.model_copy(update={"output_key_order": None}) if hasattr(e, "output") else e
                for e in trace.events
            ],
        }
    )
    with ReplaySession.from_trace(old):
        assert plain(1) == {"a": 1, "b": 2}
        assert list(search("Paris")) == ["api_key", "query", "results", "zone"]  # sorted


def test_a_hostile_key_order_is_ignored_not_obeyed() -> None:
    value = loads('{"a":{"x":1,"y":2},"b":[{"p":1,"q":2}]}')
    hostile: list[KeyOrder] = [
        {"path": ["a"], "order": [0, 0]},  # not a permutation
        {"path": ["nope"], "order": [1, 0]},  # no such key
        {"path": ["b", 7], "order": [1, 0]},  # no such index
        {"path": ["a", "x"], "order": [0]},  # not an object
        {"path": ["b", 0], "order": [1, 0]},  # the one entry that fits
    ]
    restored = restore_key_order(value, hostile)
    assert json.dumps(restored, separators=(",", ":")) == '{"a":{"x":1,"y":2},"b":[{"q":2,"p":1}]}'


def test_capture_keeps_the_returned_order_only_for_outputs_that_need_it() -> None:
    unsorted = {"b": 1, "a": {"d": 2, "c": 3}}
    assert capture(unsorted, DEFAULT_REDACTOR).as_returned is None  # inputs: canonical only
    kept = capture(unsorted, DEFAULT_REDACTOR, keep_order=True)
    assert kept.text == '{"a":{"c":3,"d":2},"b":1}'
    assert kept.as_returned == '{"b":1,"a":{"d":2,"c":3}}'
    assert capture({"a": 1}, DEFAULT_REDACTOR, keep_order=True).as_returned is None


_keys = st.text("abcdefgh", min_size=1, max_size=3)
_values = st.recursive(
    st.integers(-5, 5) | st.text("xyz", max_size=2) | st.none(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_values)
def test_restoring_the_key_order_gives_the_value_as_returned(value: Any) -> None:
    canonical = canonical_json(value)
    as_returned = json.dumps(value, separators=(",", ":"))
    restored = restore_key_order(loads(canonical), key_order(canonical, as_returned))
    assert json.dumps(restored, separators=(",", ":")) == as_returned


def test_a_permutation_out_of_range_never_loses_a_key() -> None:
    value = loads('{"a":1,"b":2}')
    for permutation in ([-1, 1], [1, 1], [0, 2], [0], [1, 0, 2]):
        restored = restore_key_order(value, [{"path": [], "order": permutation}])
        assert sorted(restored) == ["a", "b"], permutation


def test_the_shape_cache_stays_bounded_and_never_changes_an_answer() -> None:
    """Shapes are remembered (outputs repeat them), but a stream of new shapes, or objects with
    very many keys, neither grows the cache past its bound nor changes what is found."""
    from stepfork_otel.trace import canonical

    wide = {f"k{i:03d}": i for i in range(200, 0, -1)}  # 200 keys, reversed: never cached
    many = [{f"b{n}": 1, f"a{n}": 2} for n in range(canonical._SHAPES_MAX + 10)]
    for value in (wide, many, wide):
        text = canonical_json(value)
        returned = json.dumps(value, separators=(",", ":"))
        order = key_order(text, returned)
        assert order
        restored = restore_key_order(loads(text), order)
        assert json.dumps(restored, separators=(",", ":")) == returned
        assert len(canonical._shapes) <= canonical._SHAPES_MAX
    assert tuple(wide) not in canonical._shapes
    one = many[:1]
    text, returned = canonical_json(one), json.dumps(one, separators=(",", ":"))
    first = key_order(text, returned)
    assert first == [{"path": [0], "order": [1, 0]}]
    first[0]["order"].append(9)  # an entry is the caller's own: the cache keeps its permutation
    assert key_order(text, returned) == [{"path": [0], "order": [1, 0]}]
