"""Integration: the booking agent example recorded through a real SDK ``TracerProvider``, with an
``InMemorySpanExporter`` beside the bundle processor. Both sides are checked: what an exporter
receives, and what the bundle holds."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pytest
from conftest import Recording
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

import examples.booking_agent as agent
from stepfork_otel import ErrorEvent, LlmRequest, LlmResponse, ToolCall, ToolResult, Trace, record
from stepfork_otel import constants as k
from stepfork_otel.otel.processor import span_record
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.models import payload_value
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

#: The conversion with the built-in redaction rules (what every test here records with).
to_trace = functools.partial(spans_to_trace, redactor=DEFAULT_REDACTOR)

QUESTION = "Book me the cheapest flight to Paris."
ERROR_TYPE = "examples.booking_agent.SeatUnavailableError"
REDACTED = "booking API (key [REDACTED:openai_api_key]) refused AF1381: no seats left"


@pytest.fixture
def failure(recording: Recording, tmp_path: Path) -> Path:
    path = tmp_path / "failure.sftrace"
    with (
        pytest.raises(agent.SeatUnavailableError),
        record(
            path,
            input={"question": QUESTION},
            name="booking_agent",
            entrypoint="examples.booking_agent:run_agent",
        ) as run,
    ):
        run.set_output(agent.run_agent(QUESTION))
    return path


def test_exported_spans(recording: Recording, failure: Path) -> None:
    spans = recording.exporter.get_finished_spans()
    by_start = sorted(spans, key=lambda s: s.start_time or 0)
    assert [(s.name, s.kind) for s in by_start] == [
        ("invoke_agent booking_agent", SpanKind.INTERNAL),
        ("chat gpt-4.1-mini", SpanKind.CLIENT),
        ("execute_tool search_flights", SpanKind.INTERNAL),
        ("chat gpt-4.1-mini", SpanKind.CLIENT),
        ("execute_tool book_flight", SpanKind.INTERNAL),
    ]
    root = by_start[0]
    assert root.parent is None
    for span in by_start[1:]:
        assert span.parent is not None
        assert span.parent.span_id == root.context.span_id
        assert span.context.trace_id == root.context.trace_id
    assert [dict(s.attributes or {})[k.CALL_SEQ] for s in by_start] == [0, 1, 2, 3, 4]

    def a(span: ReadableSpan) -> dict[str, object]:
        return dict(span.attributes or {})

    assert a(root)[k.GEN_AI_AGENT_NAME] == "booking_agent"
    assert a(root)[k.OPENINFERENCE_SPAN_KIND] == "AGENT"
    assert a(root)[k.ERROR_TYPE] == ERROR_TYPE
    assert root.status.status_code is StatusCode.ERROR
    llm = a(by_start[1])
    assert llm[k.GEN_AI_PROVIDER_NAME] == "openai"
    assert llm[k.GEN_AI_REQUEST_MODEL] == "gpt-4.1-mini"
    assert (llm[k.GEN_AI_USAGE_INPUT_TOKENS], llm[k.GEN_AI_USAGE_OUTPUT_TOKENS]) == (120, 18)
    assert llm[k.OPENINFERENCE_SPAN_KIND] == "LLM"
    search = a(by_start[2])
    assert search[k.GEN_AI_TOOL_NAME] == "search_flights"
    assert search[k.INPUT_VALUE] == '{"city":"Paris","max_results":5}'
    book = by_start[4]
    assert a(book)[k.ERROR_MESSAGE] == REDACTED
    assert book.status.status_code is StatusCode.ERROR
    assert [dict(e.attributes or {}) for e in book.events] == [
        {k.EXCEPTION_TYPE: ERROR_TYPE, k.EXCEPTION_MESSAGE: REDACTED}
    ]
    for span in spans:  # the booking API key reaches no exporter
        assert agent.BOOKING_API_KEY not in repr(a(span))
        assert agent.BOOKING_API_KEY not in repr([e.attributes for e in span.events])
        assert agent.BOOKING_API_KEY not in (span.status.description or "")
        assert len(a(span)) < 32


def test_bundle(recording: Recording, failure: Path) -> None:
    data = failure.read_bytes()
    assert agent.BOOKING_API_KEY.encode() not in data
    trace = Trace.load(failure)
    assert trace.complete
    assert verify_integrity(trace) == []
    summary = [
        (type(e).__name__, getattr(e, "name", None) or getattr(e, "model", None))
        for e in trace.events
    ]
    assert summary == [
        ("LlmRequest", "gpt-4.1-mini"),
        ("LlmResponse", "gpt-4.1-mini"),
        ("ToolCall", "search_flights"),
        ("ToolResult", "search_flights"),
        ("LlmRequest", "gpt-4.1-mini"),
        ("LlmResponse", "gpt-4.1-mini"),
        ("ToolCall", "book_flight"),
        ("ErrorEvent", None),
    ]
    first, search, result, book, error = (
        trace.events[0],
        trace.events[2],
        trace.events[3],
        trace.events[6],
        trace.events[7],
    )
    assert isinstance(first, LlmRequest)
    assert first.model_fingerprint is not None
    assert payload_value(first.input)["messages"][1]["content"] == QUESTION
    assert isinstance(trace.events[1], LlmResponse)
    assert trace.events[1].usage == {"input_tokens": 120, "output_tokens": 18}
    assert isinstance(search, ToolCall)
    assert payload_value(search.input) == {"city": "Paris", "max_results": 5}
    assert isinstance(result, ToolResult)
    assert [f["flight_id"] for f in payload_value(result.output)] == ["AF1381", "BA0304", "U28431"]
    assert isinstance(book, ToolCall)
    assert payload_value(book.input) == {"flight_id": "AF1381", "passenger": "Ada Lovelace"}
    assert isinstance(error, ErrorEvent)
    assert (error.parent_id, error.error_type, error.message) == (book.id, ERROR_TYPE, REDACTED)
    for event in trace.events:  # every stored fingerprint is the SHA-256 of the stored text
        text = (
            getattr(event, "input", None)
            if event.type in ("tool_call", "llm_request")
            else (getattr(event, "output", None))
        )
        sha = (
            event.input_sha256
            if event.type in ("tool_call", "llm_request")
            else (event.output_sha256)
        )
        assert text is not None
        assert sha == hashlib.sha256(text.encode()).hexdigest()
    assert trace.run.name == "booking_agent"
    assert trace.run.entrypoint == "examples.booking_agent:run_agent"
    assert payload_value(trace.run.input) == {"question": QUESTION}
    assert trace.run.output is None
    assert (trace.run.status, trace.run.error_type, trace.run.error_message) == (
        "error",
        ERROR_TYPE,
        REDACTED,
    )


def test_exported_spans_rebuild_the_same_bundle(recording: Recording, failure: Path) -> None:
    """The one conversion: the exporter's copy of the spans (no hand-off) gives the bundle
    byte for byte, since nothing was cut or left off the spans."""
    rebuilt = to_trace([span_record(s) for s in recording.exporter.get_finished_spans()])
    assert dump_trace(rebuilt, trailer=True) == failure.read_bytes()  # (written as it went)


def test_the_successful_run(recording: Recording, tmp_path: Path) -> None:
    path = tmp_path / "success.sftrace"
    with record(path, input={"question": "London please"}) as run:
        run.set_output(agent.run_agent("Book me the cheapest flight to London."))
    trace = Trace.load(path)
    assert [c.name for c in trace.calls if isinstance(c, ToolCall)] == [
        "search_flights",
        "book_flight",
        "charge_card",
    ]
    charge = next(c for c in trace.calls if isinstance(c, ToolCall) and c.name == "charge_card")
    assert charge.replay_policy.value == "forbidden"
    assert payload_value(charge.input) == {"amount": 95.0, "card_token": "[REDACTED]"}
    assert payload_value(trace.run.output) == "Booked and paid: captured."
    assert agent.CARD_TOKEN.encode() not in path.read_bytes()
