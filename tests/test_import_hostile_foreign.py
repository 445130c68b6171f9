"""Other instrumentations' spans that are hostile or damaged (issue 23): every span an adapter
cannot read is named, typed, and the rest of the trace still imports -- whatever the attribute
values are (cut JSON, wrong types, deep nesting, huge text). A seeded fuzz over GenAI, OpenLLMetry
and OpenInference spans, through the importer and the conversion; and the replay's projection of
a live request never fails on a recorded form a hand edit broke."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepfork_otel import constants as k
from stepfork_otel.trace import foreign, foreign_genai, grouping
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.foreign_request import live_arguments, live_form
from stepfork_otel.trace.models import LlmRequest, payload_value
from stepfork_otel.trace.otlp import ImportReport, iter_traces_from_otlp_json
from stepfork_otel.trace.payload import capture
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

GOOD = {
    "gen_ai.operation.name": "chat",
    "gen_ai.provider.name": "openai",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.request.temperature": 0.0,
    "gen_ai.input.messages": json.dumps(
        [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    ),
    "gen_ai.output.messages": json.dumps(
        [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "hello"}],
                "finish_reason": "stop",
            }
        ]
    ),
    "gen_ai.tool.definitions": json.dumps([{"type": "function", "name": "f", "parameters": {}}]),
    "gen_ai.usage.input_tokens": 3,
    "gen_ai.usage.output_tokens": 2,
}
TOOL = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "f",
    "gen_ai.tool.call.arguments": '{"a": 1}',
    "gen_ai.tool.call.result": "ok",
}
FLAT = {
    "llm.request.type": "chat",
    "gen_ai.system": "openai",
    "gen_ai.request.model": "gpt-4o",
    "gen_ai.prompt.0.role": "user",
    "gen_ai.prompt.0.content": "hi",
    "gen_ai.completion.0.role": "assistant",
    "gen_ai.completion.0.content": "hello",
    "gen_ai.completion.0.tool_calls.0.name": "f",
    "gen_ai.completion.0.tool_calls.0.arguments": '{"a": 1}',
}
OPENINFERENCE = {
    "openinference.span.kind": "LLM",
    "llm.system": "openai",
    "input.value": json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
    "input.mime_type": "application/json",
    "output.value": json.dumps({"id": "c", "object": "chat.completion", "choices": []}),
    "output.mime_type": "application/json",
}
OI_TOOL = {
    "openinference.span.kind": "TOOL",
    "tool.name": "f",
    "input.value": '{"a": 1}',
    "output.value": "ok",
}
HOSTILE_VALUES: list[Any] = [
    None,
    "",
    "[",
    '{"role": ',
    "[" * 3000 + "]" * 3000,
    "x" * 100_000,
    '[{"role": 1, "parts": "no"}]',
    '[{"parts": [{"type": "tool_call", "arguments": "{not json"}]}]',
    '[{"parts": [{"type": "text", "content": {"nested": [1, 2]}}]}]',
    '[null, 1, "a", []]',
    '{"not": "a list"}',
    12,
    -1,
    True,
    3.5,
    ["a", "b"],
    [1, None],
]
NAME = "name"


def span(span_id: str, start: int, attrs: dict[str, Any], name: str = "chat gpt-4o") -> SpanRecord:
    return SpanRecord(
        trace_id="ef" * 16,
        span_id=span_id,
        parent_span_id="0" * 16,
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=start + 1,
        status="ok",
        attributes=attrs,
    )


def mutated(rng: random.Random, base: dict[str, Any]) -> dict[str, Any]:
    attrs = dict(base)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice([*base, "gen_ai.prompt.7.content", "gen_ai.completion.0.finish_reason"])
        value = rng.choice(HOSTILE_VALUES)
        if value is None:
            attrs.pop(key, None)
        else:
            attrs[key] = value
    return attrs


def test_fuzzed_spans_never_stop_the_import_of_the_rest_of_their_trace() -> None:
    rng = random.Random(23)
    bases = [GOOD, TOOL, FLAT, OPENINFERENCE, OI_TOOL]
    names = ["chat gpt-4o", "execute_tool f", "openai.chat", "ChatCompletion", "f"]
    for _ in range(300):
        root = SpanRecord(
            "ef" * 16, "0" * 16, None, "root", start_time_unix_nano=0, end_time_unix_nano=99
        )
        spans = [root]
        for n in range(rng.randint(1, 4)):
            which = rng.randrange(len(bases))
            spans.append(span(f"{n + 1:016x}", n + 1, mutated(rng, bases[which]), names[which]))
        spans.append(span("f" * 16, 50, dict(GOOD)))  # one good call after the damage
        adopted = foreign.adopt(spans, DEFAULT_REDACTOR)
        assert adopted is not None
        trace = spans_to_trace(adopted.records, redactor=DEFAULT_REDACTOR, until_root_ends=False)
        last = trace.calls[-1]
        assert isinstance(last, LlmRequest)
        assert last.span_id == "f" * 16
        assert last.input is not None
        assert trace.outcome_of(last) is not None
        for note in adopted.notes:
            assert note.startswith("span "), note  # named per span


def test_a_cut_messages_attribute_is_named_with_the_length_limit() -> None:
    cut = dict(GOOD, **{"gen_ai.input.messages": GOOD["gen_ai.input.messages"][:20]})
    adopted = foreign.adopt([span("1" * 16, 1, cut)], DEFAULT_REDACTOR)
    assert adopted is not None
    (note,) = adopted.notes
    assert "input missing -- gen_ai.input.messages is cut or not JSON" in note
    assert "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT" in note


def test_hostile_spans_in_an_otlp_file_import_with_their_problems_named(tmp_path: Path) -> None:
    rng = random.Random(7)
    otlp_spans = []
    for n in range(40):
        attrs = mutated(rng, GOOD)
        otlp_spans.append(
            {
                "traceId": "ef" * 16,
                "spanId": f"{n + 1:016x}",
                "parentSpanId": "a" * 16,
                "name": "chat gpt-4o",
                "startTimeUnixNano": str(n + 1),
                "endTimeUnixNano": str(n + 2),
                "attributes": [{"key": k, "value": _any(v)} for k, v in attrs.items()],
            }
        )
    otlp_spans.append(
        {
            "traceId": "ef" * 16,
            "spanId": "a" * 16,
            "name": "root",
            "startTimeUnixNano": "0",
            "endTimeUnixNano": "99",
        }
    )
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": otlp_spans}]}]}))
    report = ImportReport()
    (trace,) = iter_traces_from_otlp_json(path, report=report)
    kept = [c for c in trace.context if c.name == "chat gpt-4o"]  # no longer a chat span
    assert len(trace.calls) + len(kept) == 40
    named = "\n".join(p.message for p in report.problems)
    assert "span 41 skipped" not in named, named
    for call in trace.calls:  # every call the import could not take whole is named
        if call.input is None or trace.outcome_of(call) is None:
            assert f"span {call.span_id} (chat gpt-4o, call {call.seq} of the trace)" in named


def _any(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any(v) for v in value if v is not None]}}
    return {"stringValue": value}


def test_the_live_projection_never_fails_on_a_broken_recorded_form() -> None:
    live = {
        "url": "chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    }
    for recorded in [
        None,
        1,
        "x",
        [],
        {"messages": 3},
        {"tail": "2"},
        {"tail": -1},
        {"params": [1]},
        {"messages": [None, {"parts": 5}]},
        {"tools": None},
    ]:
        canonical_json(live_form("openai", live, recorded))
        canonical_json(live_form("openai", recorded, {"messages": []}))
        canonical_json(live_arguments(recorded, {"a": 1}))


def test_a_messages_only_call_whose_input_is_not_a_form_makes_the_bundle_invalid() -> None:
    from stepfork_otel.trace.checks import validate_structure

    adopted = foreign.adopt([span("1" * 16, 1, dict(GOOD))], DEFAULT_REDACTOR)
    assert adopted is not None
    trace = spans_to_trace(adopted.records, redactor=DEFAULT_REDACTOR, until_root_ends=False)
    assert validate_structure(trace) == []
    call = trace.calls[0]
    broken = trace.model_copy(
        update={"events": [call.model_copy(update={"input": '{"body": {}}'}), *trace.events[1:]]}
    )
    (problem,) = validate_structure(broken)
    assert problem.message == "fidelity messages-only but the input is not a request form"


@pytest.mark.parametrize("text", ["NaN", "{", "1e400"])
def test_a_messages_only_call_whose_input_is_not_json_is_refused_before_replay(text: str) -> None:
    """Its input is parsed to compare a live call in its terms (not matched by fingerprint): a
    bundle whose fingerprint was made to agree with such a text is refused when it loads, with a
    typed error, not when the call comes."""
    from stepfork_otel import ReplaySession
    from stepfork_otel.trace.canonical import sha256_hex
    from stepfork_otel.trace.checks import validate_structure
    from stepfork_otel.trace.errors import BundleError

    adopted = foreign.adopt([span("1" * 16, 1, dict(GOOD))], DEFAULT_REDACTOR)
    assert adopted is not None
    trace = spans_to_trace(adopted.records, redactor=DEFAULT_REDACTOR, until_root_ends=False)
    call = trace.calls[0]
    broken = trace.model_copy(
        update={
            "events": [
                call.model_copy(update={"input": text, "input_sha256": sha256_hex(text)}),
                *trace.events[1:],
            ]
        }
    )
    (problem,) = validate_structure(broken)
    assert problem.message.startswith("fidelity messages-only but the input is not valid JSON (")
    with pytest.raises(BundleError, match="not valid JSON"):
        ReplaySession.from_trace(broken)


# --- flattened messages whose indexes leave a gap -----------------------------------------------

#: An index far past the others: walking every index up to it would build millions of messages.
FAR = 2_000_000


def adopted_call(attrs: dict[str, Any], name: str) -> tuple[LlmRequest, list[str], Any]:
    adopted = foreign.adopt([span("1" * 16, 1, attrs, name)], DEFAULT_REDACTOR)
    assert adopted is not None
    trace = spans_to_trace(adopted.records, redactor=DEFAULT_REDACTOR, until_root_ends=False)
    (call,) = trace.calls
    assert isinstance(call, LlmRequest)
    return call, adopted.notes, trace.outcome_of(call)


def test_a_gap_in_the_prompt_indexes_keeps_the_messages_after_it_and_says_so() -> None:
    """``gen_ai.prompt.0`` and ``gen_ai.prompt.2000000``: the messages in between are not on the
    span (no limit leaves such a hole), so only the one after the gap is compared -- read in
    time and memory bounded by the attributes, not by the indexes they name."""
    attrs = {key: value for key, value in FLAT.items() if not key.startswith("gen_ai.prompt.")}
    attrs |= {
        "gen_ai.prompt.0.role": "system",
        "gen_ai.prompt.0.content": "be brief",
        f"gen_ai.prompt.{FAR}.role": "user",
        f"gen_ai.prompt.{FAR}.content": "hi",
    }
    call, notes, outcome = adopted_call(attrs, "openai.chat")
    assert call.fidelity == "truncated"
    form = payload_value(call.input or "")
    assert form["tail"] == 1
    assert [m["parts"][0]["content"] for m in form["messages"]] == ["hi"]
    (note,) = notes
    assert f"gen_ai.prompt.{FAR - 1} is not on the span" in note
    assert f"the first {FAR} message(s) are left out" in note
    assert outcome is not None


def test_a_gap_in_the_completion_indexes_leaves_the_result_missing() -> None:
    """A response rebuilt from some of the choices would be made up: the result is missing."""
    attrs = dict(FLAT, **{f"gen_ai.completion.{FAR}.role": "assistant"})
    call, notes, outcome = adopted_call(attrs, "openai.chat")
    assert call.input is not None
    assert outcome is None
    (note,) = notes
    assert "result missing" in note
    assert f"gen_ai.completion.{FAR - 1} is not on the span" in note


def test_a_gap_in_openinference_message_indexes_keeps_the_messages_after_it() -> None:
    attrs = {
        key: value
        for key, value in OPENINFERENCE.items()
        if key not in ("input.value", "output.value")
    }
    attrs |= {
        "llm.input_messages.0.message.role": "system",
        "llm.input_messages.0.message.content": "be brief",
        f"llm.input_messages.{FAR}.message.role": "user",
        f"llm.input_messages.{FAR}.message.content": "hi",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": "hello",
        f"llm.output_messages.{FAR}.message.role": "assistant",
    }
    call, notes, outcome = adopted_call(attrs, "ChatCompletion")
    assert call.fidelity == "truncated"
    form = payload_value(call.input or "")
    assert (form["tail"], len(form["messages"])) == (1, 1)
    assert outcome is None
    tail, result = notes
    assert f"llm.input_messages.{FAR - 1} is not on the span" in tail
    assert "result missing" in result
    assert f"llm.output_messages.{FAR - 1} is not on the span" in result


# --- big hostile traces: linear time ------------------------------------------------------------
# (sizes that took seconds when each root, or each LLM span, walked the whole trace again)


def test_local_roots_map_every_span_in_one_pass_and_leave_cycles_out() -> None:
    parent_of: dict[str, str | None] = {
        "a": None,
        "b": "a",
        "c": "b",
        "r": "remote",  # a parent in another process: a root
        "s": "r",
        "x": "y",  # a cycle, and a span under it
        "y": "x",
        "z": "x",
        "self": "self",
    }
    assert grouping.local_roots(parent_of) == {"a": "a", "b": "a", "c": "a", "r": "r", "s": "r"}
    chain = {f"{n}": f"{n - 1}" if n else None for n in range(50_000)}
    assert set(grouping.local_roots(chain).values()) == {"0"}


def _enclosing_run(
    parent_of: dict[int, int | None], kind_of: dict[int, str | None], span_id: int
) -> int | None:
    """The nearest run span above ``span_id`` (None: not inside a run, as far as the spans go).
    Bounded by the number of spans, so hostile parent links that form a cycle end the walk."""
    parent, seen = parent_of.get(span_id), 0
    while parent is not None and seen <= len(parent_of):
        if parent not in kind_of:
            return None
        if kind_of[parent] == k.KIND_RUN:
            return parent
        parent, seen = parent_of.get(parent), seen + 1
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 14), st.sampled_from([k.KIND_RUN, k.KIND_TOOL, None])),
        min_size=1,
        max_size=15,
    )
)
def test_top_level_runs_are_the_runs_no_run_encloses(links: list[tuple[int, str | None]]) -> None:
    """The one-pass rule agrees with a walk up from each run (``_enclosing_run``, the rule it
    replaced), whatever the links -- parents never seen, cycles, a span its own parent."""
    parent_of: dict[int, int | None] = {
        n: (p if p != n + 1 else None) for n, (p, _) in enumerate(links)
    }
    kind_of = {n: kind for n, (_, kind) in enumerate(links)}
    expected = [
        i
        for i, kind in kind_of.items()
        if kind == k.KIND_RUN and _enclosing_run(parent_of, kind_of, i) is None
    ]
    assert grouping.top_level_runs(parent_of, kind_of) == expected


def test_many_runs_under_one_deep_chain_are_found_once_each() -> None:
    depth = 20_000
    parent_of: dict[str, str | None] = {f"c{n}": f"c{n - 1}" if n else None for n in range(depth)}
    kind_of: dict[str, object] = dict.fromkeys(parent_of)
    for n in range(depth):  # a run under every link of the chain
        parent_of[f"r{n}"] = f"c{n}"
        kind_of[f"r{n}"] = k.KIND_RUN
    assert len(grouping.top_level_runs(parent_of, kind_of)) == depth


def test_many_runs_and_many_spans_whose_parent_never_came_import_each_run_once(
    tmp_path: Path,
) -> None:
    """Each run's bundle says whether a span that may have been part of it lost its parent: a
    lookup per run, not a scan of every such span per run (8,000 of each took 7 s)."""
    runs, trace_id = 3_000, "ef" * 16

    def one(span_id: str, start: int, **more: Any) -> dict[str, Any]:
        return {
            "traceId": trace_id,
            "spanId": span_id,
            "name": more.pop("name", "agent"),
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + more.pop("duration", 1)),
            **more,
        }

    run = [{"key": k.KIND, "value": {"stringValue": k.KIND_RUN}}]
    call = [{"key": k.KIND, "value": {"stringValue": k.KIND_LLM}}]
    spans = []
    for n in range(runs):
        spans.append(one(f"{n + 0x100000:016x}", 10 * n + 1, attributes=run, duration=5))
        spans.append(
            one(
                f"{n + 0x200000:016x}",
                10 * n + 2,
                parentSpanId=f"{n + 0x100000:016x}",
                name="llm",
                attributes=call,
            )
        )
    for n in range(runs):  # made in spans of this process that never arrived, after every run
        spans.append(one(f"{n + 0x300000:016x}", 10**9 + n, parentSpanId="ab" * 8, flags=0x100))
    spans.append(one("cd" * 8, 10 * 7 + 2, parentSpanId="ab" * 8, flags=0x100))  # in run 7
    path = tmp_path / "spans.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    traces = list(iter_traces_from_otlp_json(path))
    assert len(traces) == runs
    incomplete = [t.run.span_id for t in traces if not t.complete]
    assert incomplete == [f"{7 + 0x100000:016x}"]


def test_a_trace_of_many_root_spans_imports_its_one_call() -> None:
    roots = [span(f"{n + 0x1000:016x}", 3, {}, "noise") for n in range(16_000)]
    roots = [replace(s, parent_span_id=None) for s in roots]
    run = SpanRecord(
        "ef" * 16, "0" * 16, None, "agent", start_time_unix_nano=0, end_time_unix_nano=9
    )
    adopted = foreign.adopt([run, span("1" * 16, 1, dict(GOOD)), *roots], DEFAULT_REDACTOR)
    assert adopted is not None
    kinds = {r.span_id: r.stepfork_kind for r in adopted.records if r.stepfork_kind}
    assert kinds == {"0" * 16: "run", "1" * 16: "llm"}


def test_calls_outside_runs_among_many_root_spans_make_their_bundles(tmp_path: Path) -> None:
    def otlp_span(span_id: str, kind: str | None) -> dict[str, Any]:
        attributes = [] if kind is None else [{"key": "stepfork.kind", "value": _any(kind)}]
        return {
            "traceId": "ef" * 16,
            "spanId": span_id,
            "name": "call" if kind else "noise",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": attributes,
        }

    spans = [otlp_span(f"{n + 0x1000:016x}", None) for n in range(16_000)]
    spans += [otlp_span("1" * 16, "llm"), otlp_span("2" * 16, "tool")]
    path = tmp_path / "spans.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    traces = list(iter_traces_from_otlp_json(path))
    assert sorted(t.calls[0].span_id for t in traces) == ["1" * 16, "2" * 16]


def test_a_trace_of_many_runs_makes_a_bundle_of_each(tmp_path: Path) -> None:
    """Each bundle is built from its own spans, not from the whole trace again."""
    spans = []
    for n in range(2_000):
        root, call = f"{n + 0x100000:016x}", f"{n + 0x200000:016x}"
        spans.append({"traceId": "ef" * 16, "spanId": root, "name": "agent"})
        attributes = [{"key": key, "value": _any(value)} for key, value in GOOD.items()]
        spans.append(
            {"traceId": "ef" * 16, "spanId": call, "parentSpanId": root, "name": "chat gpt-4o"}
            | {"startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": attributes}
        )
    path = tmp_path / "spans.json"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    traces = list(iter_traces_from_otlp_json(path))
    assert len(traces) == 2_000
    assert all(
        [c.span_id for c in t.calls] == [f"{int(t.run.span_id or '', 16) + 0x100000:016x}"]
        for t in traces
    )


def test_deeply_nested_llm_spans_make_one_call_the_innermost() -> None:
    chain = [
        replace(span(f"{n + 1:016x}", n, dict(GOOD)), parent_span_id=f"{n:016x}" if n else None)
        for n in range(8_000)
    ]
    adopted = foreign.adopt(chain, DEFAULT_REDACTOR)
    assert adopted is not None
    calls = [r.span_id for r in adopted.records if r.stepfork_kind == "llm"]
    assert calls == [f"{8_000:016x}"]


def test_the_tools_a_model_called_are_named_once_each_in_order() -> None:
    names = [f"tool_{n}" for n in range(20_000)]
    calls = [{"function": {"name": name}} for name in names + names[:10]]
    body = {"choices": [{"message": {"tool_calls": calls}}]}
    record = SpanRecord(
        "ef" * 16,
        "1" * 16,
        None,
        "chat",
        attributes={"stepfork.kind": "llm"},
        payloads={"stepfork.output": capture({"status": 200, "body": body}, DEFAULT_REDACTOR)},
    )
    assert foreign_genai.called_tools([record]) == names


def test_a_text_part_without_content_leaves_the_call_a_call() -> None:
    """The part is skipped (as the Anthropic builder does), not a KeyError that made the whole
    call context."""
    output = [
        {
            "role": "assistant",
            "parts": [{"type": "text"}, {"type": "tool_call", "id": "c1", "name": "f"}],
            "finish_reason": "tool_call",
        }
    ]
    attrs = dict(GOOD, **{"gen_ai.output.messages": json.dumps(output)})
    _, notes, outcome = adopted_call(attrs, "chat gpt-4o")
    assert notes == []
    assert outcome is not None
    (choice,) = payload_value(outcome.output or "")["body"]["choices"]
    assert choice["message"]["content"] is None
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["f"]


def test_a_note_names_a_span_by_its_redacted_name() -> None:
    """Span names may embed credentials: the notes name a call as the bundle would."""
    secret = "sk-proj-" + "Q9w8E7r6T5y4U3i2O1p0A9s8D7f6G5h4"
    cut = dict(GOOD, **{"gen_ai.input.messages": "[{"})
    adopted = foreign.adopt([span("1" * 16, 1, cut, f"chat {secret}")], DEFAULT_REDACTOR)
    assert adopted is not None
    (note,) = adopted.notes
    assert note.startswith("span 1111111111111111 (chat ")
    assert secret not in note
