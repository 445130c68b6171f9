"""The one span -> event conversion, from hand-built ``SpanRecord``s (as the processor and the
OTLP importer both produce them)."""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from stepfork_otel import ErrorEvent, LlmRequest, ToolCall, ToolResult, Trace
from stepfork_otel import constants as k
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.checks import validate_structure, verify_integrity
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.payload import Payload
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

#: The conversion with the built-in redaction rules (what every test here records with).
to_trace = functools.partial(spans_to_trace, redactor=DEFAULT_REDACTOR)

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
_ids = itertools.count(1)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def payload_attrs(prefix: str, text: str) -> dict[str, Any]:
    if prefix == "input":
        return {k.INPUT_VALUE: text, k.INPUT_SHA256: sha(text), k.INPUT_SIZE: len(text.encode())}
    return {k.OUTPUT_VALUE: text, k.OUTPUT_SHA256: sha(text), k.OUTPUT_SIZE: len(text.encode())}


def sid(n: int) -> str:
    return f"{n:016x}"


def run_span(n: int, start: int, end: int | None, parent: str | None = None) -> SpanRecord:
    return SpanRecord(
        TRACE_ID,
        sid(n),
        parent,
        "invoke_agent agent",
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes={
            k.KIND: k.KIND_RUN,
            k.CALL_SEQ: 0,
            k.RUN_NAME: f"run{n}",
            k.STATUS: k.STATUS_OK,
            **payload_attrs("input", f'{{"run":{n}}}'),
        },
    )


def tool_span(
    n: int,
    parent: str | None,
    start: int,
    end: int | None,
    *,
    name: str = "search",
    seq: int = 0,
    status: str | None = k.STATUS_OK,
    arg: Any = None,
    result: str | None = None,
) -> SpanRecord:
    attributes: dict[str, Any] = {
        k.KIND: k.KIND_TOOL,
        k.GEN_AI_TOOL_NAME: name,
        k.CALL_SEQ: seq,
        **payload_attrs("input", f'{{"arg":{arg if arg is not None else n}}}'),
    }
    if status is not None:
        attributes[k.STATUS] = status
        if status == k.STATUS_OK:
            attributes.update(payload_attrs("output", result or f'"r{n}"'))
        else:
            attributes[k.ERROR_TYPE] = "ValueError"
            attributes[k.ERROR_MESSAGE] = f"failed {n}"
    return SpanRecord(
        TRACE_ID,
        sid(n),
        parent,
        f"execute_tool {name}",
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=attributes,
    )


def llm_span(n: int, parent: str | None, start: int, end: int | None, seq: int = 0) -> SpanRecord:
    return SpanRecord(
        TRACE_ID,
        sid(n),
        parent,
        "chat m",
        kind="CLIENT",
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes={
            k.KIND: k.KIND_LLM,
            k.CALL_SEQ: seq,
            k.GEN_AI_PROVIDER_NAME: "openai",
            k.GEN_AI_REQUEST_MODEL: "m",
            k.GEN_AI_OPERATION_NAME: "chat",
            k.GEN_AI_USAGE_INPUT_TOKENS: 3,
            k.STATUS: k.STATUS_OK,
            **payload_attrs("input", f'{{"prompt":{n}}}'),
            **payload_attrs("output", f'{{"reply":{n}}}'),
        },
    )


def user_span(n: int, parent: str | None, start: int, end: int | None) -> SpanRecord:
    return SpanRecord(
        TRACE_ID,
        sid(n),
        parent,
        f"user step {n}",
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        status="ok",
        attributes={"app.secret_attribute": "never copied"},
    )


def outline(trace: Trace) -> list[tuple[str, str, str | None]]:
    return [(e.type, e.id, e.parent_id) for e in trace.events]


def assert_loads(trace: Trace, tmp_path: Path) -> Trace:
    """The conversion's output is a structurally valid bundle that round-trips."""
    assert validate_structure(trace) == []
    assert verify_integrity(trace) == []
    path = tmp_path / f"{next(_ids)}.sftrace"
    trace.save(path)
    loaded = Trace.load(path)
    assert loaded == trace
    return loaded


# --- order ---------------------------------------------------------------------------------------


def agent_spans() -> list[SpanRecord]:
    run = run_span(1, 100, 1000)
    return [
        run,
        llm_span(2, run.span_id, 110, 150, seq=1),
        tool_span(3, run.span_id, 160, 300, seq=2),
        llm_span(4, sid(3), 170, 200, seq=3),  # inside the tool's body
        user_span(5, run.span_id, 310, 500),
        tool_span(6, sid(5), 320, 400, seq=4, name="book"),  # through a user span
        llm_span(7, sid(6), 330, 390, seq=5),
        tool_span(8, run.span_id, 510, 520, seq=6, status=k.STATUS_ERROR),
    ]


def test_shuffled_spans_give_the_same_trace(tmp_path: Path) -> None:
    spans = agent_spans()
    reference = to_trace(spans)
    rng = random.Random(1234)
    for _ in range(25):
        shuffled = spans[:]
        rng.shuffle(shuffled)
        assert to_trace(shuffled) == reference
    assert_loads(reference, tmp_path)
    assert outline(reference) == [
        ("llm_request", "call-1", None),
        ("llm_response", "call-1.result", "call-1"),
        ("tool_call", "call-2", None),
        ("llm_request", "call-3", "call-2"),
        ("llm_response", "call-3.result", "call-3"),
        ("tool_result", "call-2.result", "call-2"),
        ("tool_call", "call-4", None),
        ("llm_request", "call-5", "call-4"),
        ("llm_response", "call-5.result", "call-5"),
        ("tool_result", "call-4.result", "call-4"),
        ("tool_call", "call-6", None),
        ("error", "call-6.error", "call-6"),
    ]
    assert [e.seq for e in reference.calls] == [1, 2, 3, 4, 5, 6]


def test_nesting_parent_ids_follow_the_enclosing_call(tmp_path: Path) -> None:
    trace = to_trace(agent_spans())
    by_span = {e.span_id: e for e in trace.calls}
    assert by_span[sid(4)].parent_id == by_span[sid(3)].id  # LLM inside the tool
    assert by_span[sid(7)].parent_id == by_span[sid(6)].id  # ... through a user span
    assert by_span[sid(6)].parent_id is None  # the user span is not a call
    assert by_span[sid(6)].parent_span_id == sid(5)  # but the OTel parent is kept
    call = by_span[sid(4)]
    assert isinstance(call, LlmRequest)
    assert (call.provider, call.model, call.operation) == ("openai", "m", "chat")
    assert trace.events[4].usage == {"input_tokens": 3}  # type: ignore[union-attr]


def test_context_spans_keep_names_and_timing_only() -> None:
    trace = to_trace(agent_spans())
    assert [(c.span_id, c.name, c.parent_span_id) for c in trace.context] == [
        (sid(5), "user step 5", sid(1))
    ]
    ctx = trace.context[0]
    assert (ctx.start_time_unix_nano, ctx.end_time_unix_nano, ctx.status) == (310, 500, "ok")
    assert "never copied" not in trace.model_dump_json()


def test_error_and_skipped_outcomes() -> None:
    run = run_span(1, 0, 100)
    skipped = tool_span(3, run.span_id, 20, 30, status=k.STATUS_SKIPPED)
    spans = [run, tool_span(2, run.span_id, 10, 15, status=k.STATUS_ERROR), skipped]
    trace = to_trace(spans)
    error, rejected = trace.events[1], trace.events[3]
    assert isinstance(error, ErrorEvent)
    assert isinstance(rejected, ErrorEvent)
    assert (error.status, error.error_type, error.message) == ("error", "ValueError", "failed 2")
    assert error.output == '{"error_type":"ValueError","message":"failed 2"}'
    assert error.output_sha256 == sha(error.output)
    assert error.duration_ns == 5
    assert rejected.status == "skipped"
    assert [c.status for c in trace.calls] == ["error", "skipped"]


def test_missing_outcomes_leave_calls_without_results(tmp_path: Path) -> None:
    run = run_span(1, 0, None)  # the run never ended
    spans = [
        run,
        tool_span(2, run.span_id, 10, None),  # still open: no outcome
        tool_span(3, run.span_id, 20, 30, status=None),  # ended, but never recorded a status
    ]
    trace = to_trace(spans)
    assert outline(trace) == [("tool_call", "call-1", None), ("tool_call", "call-2", None)]
    assert [trace.outcome_of(c) for c in trace.calls] == [None, None]
    assert trace.complete is False
    assert trace.incomplete_reason == "the run span never ended"
    assert_loads(trace, tmp_path)


def test_an_open_call_in_an_ended_run_makes_the_bundle_incomplete() -> None:
    run = run_span(1, 0, 100)
    trace = to_trace([run, tool_span(2, run.span_id, 10, None)])
    assert trace.complete is False
    assert trace.incomplete_reason == "1 call(s) had not ended when the bundle was written"
    incomplete = to_trace([run], complete=False, incomplete_reason="flushed")
    assert (incomplete.complete, incomplete.incomplete_reason) == (False, "flushed")


# --- which spans make the bundle -----------------------------------------------------------------


def two_runs() -> list[SpanRecord]:
    root = user_span(1, None, 0, 1000)
    return [
        root,
        run_span(2, 10, 100, parent=root.span_id),
        tool_span(3, sid(2), 20, 30, arg=3),
        run_span(4, 200, 300, parent=root.span_id),
        tool_span(5, sid(4), 210, 220, arg=5),
        tool_span(6, root.span_id, 400, 410, arg=6),  # outside both runs
    ]


def test_several_runs_need_a_root() -> None:
    with pytest.raises(ValueError, match=r"2 runs \(span ids 0000000000000002, 0000000000000004\)"):
        to_trace(two_runs())


def test_a_root_picks_one_runs_subtree(tmp_path: Path) -> None:
    first = to_trace(two_runs(), root_span_id=sid(2))
    second = to_trace(two_runs(), root_span_id=sid(4))
    assert (first.run.span_id, first.run.name) == (sid(2), "run2")
    assert [c.input for c in first.calls] == ['{"arg":3}']
    assert [c.input for c in second.calls] == ['{"arg":5}']
    assert first.context == []  # the application's span around the runs is not in either run
    rest = to_trace(two_runs(), root_span_id=sid(1))  # the local root: the calls outside runs
    assert [c.input for c in rest.calls] == ['{"arg":6}']
    assert rest.run.span_id is None
    assert [c.span_id for c in rest.context] == [sid(1)]
    assert_loads(first, tmp_path)
    with pytest.raises(ValueError, match="not among the spans"):
        to_trace(two_runs(), root_span_id=sid(99))


def test_one_run_is_cut_to_its_subtree() -> None:
    spans = [s for s in two_runs() if s.span_id not in (sid(4), sid(5))]
    trace = to_trace(spans)
    assert trace.run.span_id == sid(2)
    assert [c.input for c in trace.calls] == ['{"arg":3}']


def test_a_nested_run_belongs_to_the_outer_run() -> None:
    outer = run_span(1, 0, 100)
    inner = run_span(2, 10, 50, parent=outer.span_id)
    spans = [outer, inner, tool_span(3, inner.span_id, 20, 30), tool_span(4, outer.span_id, 60, 70)]
    trace = to_trace(spans)
    assert trace.run.span_id == sid(1)
    assert [c.span_id for c in trace.calls] == [sid(3), sid(4)]
    assert trace.context == []  # a run span is never a context span


def test_no_run_keeps_every_span() -> None:
    root = user_span(1, None, 0, 100)
    trace = to_trace([root, tool_span(2, root.span_id, 10, 20)])
    assert trace.run.span_id is None
    assert [c.name for c in trace.context] == ["user step 1"]
    assert len(trace.calls) == 1


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no spans"):
        to_trace([])
    other = SpanRecord("f" * 32, sid(9), None, "x")
    with pytest.raises(ValueError, match="2 traces"):
        to_trace([run_span(1, 0, 1), other])


# --- clocks that disagree with the structure ----------------------------------------------------


def test_equal_timestamps_keep_calls_before_their_outcomes(tmp_path: Path) -> None:
    run = run_span(1, 5, 5)  # a coarse clock: everything at the same instant
    spans = [
        run,
        tool_span(2, run.span_id, 5, 5, seq=1),
        tool_span(3, run.span_id, 5, 5, seq=2),
        llm_span(4, sid(3), 5, 5, seq=3),
        tool_span(5, run.span_id, 5, 5, seq=4),
    ]
    trace = to_trace(spans)
    assert outline(trace) == [
        ("tool_call", "call-1", None),
        ("tool_result", "call-1.result", "call-1"),
        ("tool_call", "call-2", None),
        ("llm_request", "call-3", "call-2"),
        ("llm_response", "call-3.result", "call-3"),
        ("tool_result", "call-2.result", "call-2"),
        ("tool_call", "call-4", None),
        ("tool_result", "call-4.result", "call-4"),
    ]
    assert_loads(trace, tmp_path)


def test_a_child_stamped_before_its_parent_still_comes_after_it(tmp_path: Path) -> None:
    run = run_span(1, 0, 1000)
    spans = [
        run,
        tool_span(2, run.span_id, 100, 200, seq=1),
        llm_span(3, sid(2), 90, 150, seq=1),  # another machine's clock runs behind
        tool_span(4, run.span_id, 300, 310, seq=2),
    ]
    trace = to_trace(spans)
    assert outline(trace) == [
        ("tool_call", "call-1", None),
        ("llm_request", "call-2", "call-1"),
        ("llm_response", "call-2.result", "call-2"),
        ("tool_result", "call-1.result", "call-1"),
        ("tool_call", "call-3", None),
        ("tool_result", "call-3.result", "call-3"),
    ]
    assert_loads(trace, tmp_path)


def test_concurrent_calls_interleave_by_time(tmp_path: Path) -> None:
    run = run_span(1, 0, 1000)
    spans = [
        run,
        tool_span(2, run.span_id, 10, 100, seq=1),
        tool_span(3, run.span_id, 20, 50, seq=2),
        tool_span(4, run.span_id, 60, 70, seq=3),
    ]
    trace = to_trace(spans)
    assert outline(trace) == [
        ("tool_call", "call-1", None),
        ("tool_call", "call-2", None),
        ("tool_result", "call-2.result", "call-2"),
        ("tool_call", "call-3", None),
        ("tool_result", "call-3.result", "call-3"),
        ("tool_result", "call-1.result", "call-1"),
    ]
    assert_loads(trace, tmp_path)


def test_equal_start_times_are_ordered_by_call_number() -> None:
    run = run_span(1, 0, 100)
    spans = [
        run,
        tool_span(9, run.span_id, 10, 20, seq=2, arg=2),
        tool_span(2, run.span_id, 10, 20, seq=1, arg=1),
    ]
    assert [c.input for c in to_trace(spans).calls] == ['{"arg":1}', '{"arg":2}']


def test_cyclic_parent_links_do_not_break_the_conversion(tmp_path: Path) -> None:
    a = tool_span(1, sid(2), 10, 20)
    b = tool_span(2, sid(1), 15, 18)
    self_parent = tool_span(3, sid(3), 30, 40)
    trace = to_trace([a, b, self_parent])
    assert [c.span_id for c in trace.calls] == [sid(1), sid(2), sid(3)]
    assert_loads(trace, tmp_path)


# --- payloads ------------------------------------------------------------------------------------


def with_attrs(span: SpanRecord, **changes: Any) -> SpanRecord:
    attributes = dict(span.attributes)
    for key, value in changes.items():
        real = getattr(k, key)
        if value is None:
            attributes.pop(real, None)
        else:
            attributes[real] = value
    return SpanRecord(
        span.trace_id,
        span.span_id,
        span.parent_span_id,
        span.name,
        span.kind,
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        span.status,
        attributes,
        span.payloads,
    )


def test_a_cut_payload_is_missing_never_whole() -> None:
    whole = '{"arg":"' + "x" * 100 + '"}'
    base = tool_span(1, None, 0, 10, result=whole)
    cut = with_attrs(base, OUTPUT_VALUE=whole[:40])
    result = to_trace([cut]).events[1]
    assert isinstance(result, ToolResult)
    assert (result.output, result.output_missing, result.output_sha256) == (
        None,
        "truncated",
        sha(whole),
    )
    # the size alone tells, even without a fingerprint
    no_sha = with_attrs(cut, OUTPUT_SHA256=None)
    assert to_trace([no_sha]).events[1].output_missing == "truncated"  # type: ignore[union-attr]
    # a fingerprint that is not 64 hex digits was cut too: neither it nor the text is kept
    cut_sha = with_attrs(base, OUTPUT_SHA256=sha(whole)[:20], OUTPUT_VALUE=whole[:20])
    event = to_trace([cut_sha]).events[1]
    assert (event.output, event.output_sha256, event.output_missing) == (None, None, "truncated")  # type: ignore[union-attr]


def test_legacy_spans_without_fingerprints_keep_their_payload() -> None:
    span = with_attrs(
        tool_span(1, None, 0, 10),
        INPUT_SHA256=None,
        INPUT_SIZE=None,
        OUTPUT_SHA256=None,
        OUTPUT_SIZE=None,
    )
    trace = to_trace([span])
    assert trace.calls[0].input == '{"arg":1}'
    assert trace.calls[0].input_sha256 is None
    assert trace.events[1].output == '"r1"'  # type: ignore[union-attr]


def test_payloads_left_off_the_span_say_why() -> None:
    text = '{"arg":1}'
    capped = with_attrs(
        tool_span(1, None, 0, 10),
        INPUT_VALUE=None,
        INPUT_OMITTED=k.OMITTED_SIZE_CAP,
        OUTPUT_VALUE=None,
    )
    trace = to_trace([capped])
    call, result = trace.calls[0], trace.events[1]
    assert (call.input, call.input_sha256, call.input_missing) == (None, sha(text), "size_cap")
    assert result.output_missing == "not_recorded"  # type: ignore[union-attr]
    off = with_attrs(capped, INPUT_OMITTED=k.OMITTED_CAPTURE_DISABLED)
    assert to_trace([off]).calls[0].input_missing == "capture_disabled"


def test_handed_over_payloads_replace_the_attributes() -> None:
    whole = '{"big":"' + "z" * 500 + '"}'
    span = with_attrs(tool_span(1, None, 0, 10, status=k.STATUS_ERROR), INPUT_VALUE=whole[:10])
    handed = SpanRecord(
        span.trace_id,
        span.span_id,
        None,
        span.name,
        start_time_unix_nano=0,
        end_time_unix_nano=10,
        attributes=span.attributes,
        payloads={
            k.INPUT: Payload.from_text(whole),
            k.ERROR_MESSAGE: Payload.from_text("the whole message"),
        },
    )
    trace = to_trace([handed])
    assert trace.calls[0].input == whole
    assert trace.calls[0].input_sha256 == sha(whole)
    error = trace.events[1]
    assert isinstance(error, ErrorEvent)
    assert error.message == "the whole message"


def test_tool_fields() -> None:
    span = with_attrs(tool_span(1, None, 0, 10, name="charge"), REPLAY_POLICY="forbidden")
    call = to_trace([span]).calls[0]
    assert isinstance(call, ToolCall)
    assert (call.name, call.replay_policy.value, call.time_unix_nano) == ("charge", "forbidden", 0)
    bogus = with_attrs(span, REPLAY_POLICY="weird")
    assert to_trace([bogus]).calls[0].replay_policy.value == "replayable"
