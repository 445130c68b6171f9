"""The boundaries (``@trace_tool``, ``llm_request``/``allm_request``) and ``record(...)``: what they
put on spans, what reaches the bundle, and that the user's call behaves exactly as without them."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from stepfork_otel import (
    ErrorEvent,
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
    allm_request,
    canonical_json,
    configure,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel import constants as k
from stepfork_otel.otel.processor import span_record
from stepfork_otel.recording.handoff import HANDOFF
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.models import payload_value
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

#: The conversion with the built-in redaction rules (what every test here records with).
to_trace = functools.partial(spans_to_trace, redactor=DEFAULT_REDACTOR)

SECRET = "sk-proj-Xf3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jK"


def spans_named(recording: Recording, name: str) -> list[ReadableSpan]:
    return [s for s in recording.exporter.get_finished_spans() if s.name == name]


def only_span(recording: Recording, name: str) -> ReadableSpan:
    spans = spans_named(recording, name)
    assert len(spans) == 1, [s.name for s in recording.exporter.get_finished_spans()]
    return spans[0]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run_once(path: Path, body: Any, **kwargs: Any) -> Trace:
    with record(path, **kwargs):
        body()
    return Trace.load(path)


# --- @trace_tool ---------------------------------------------------------------------------------


@trace_tool
def search_flights(city: str, max_results: int = 5) -> list[dict[str, Any]]:
    return [{"city": city, "n": i} for i in range(min(max_results, 2))]


def test_bare_tool_span_names_kind_and_attributes(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "run.sftrace", name="booker"):
        assert search_flights("Paris") == [{"city": "Paris", "n": 0}, {"city": "Paris", "n": 1}]
    span = only_span(recording, "execute_tool search_flights")
    a = attrs(span)
    assert span.kind is SpanKind.INTERNAL
    assert a[k.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert a[k.GEN_AI_TOOL_NAME] == "search_flights"
    assert a[k.OPENINFERENCE_SPAN_KIND] == "TOOL"
    assert a[k.KIND] == k.KIND_TOOL
    assert a[k.REPLAY_POLICY] == "replayable"
    assert a[k.STATUS] == k.STATUS_OK
    assert a[k.CALL_SEQ] == 1
    # each payload travels once: as the OpenInference value, which is the canonical text here
    assert k.INPUT not in a
    assert k.OUTPUT not in a
    assert a[k.INPUT_VALUE] == '{"city":"Paris","max_results":5}'
    assert a[k.INPUT_MIME_TYPE] == k.MIME_JSON
    assert a[k.INPUT_SHA256] == sha(a[k.INPUT_VALUE])
    assert a[k.INPUT_SIZE] == len(a[k.INPUT_VALUE])
    assert a[k.OUTPUT_VALUE] == '[{"city":"Paris","n":0},{"city":"Paris","n":1}]'
    assert a[k.OUTPUT_SHA256] == sha(a[k.OUTPUT_VALUE])
    assert len(a) <= 32  # far below the SDK's default limit of 128
    assert (
        span.status.status_code is StatusCode.OK
    )  # a call that succeeded (tests/test_span_status.py)
    root = only_span(recording, "invoke_agent booker")
    assert span.parent is not None
    assert span.parent.span_id == root.context.span_id
    assert attrs(root)[k.OPENINFERENCE_SPAN_KIND] == "AGENT"
    assert attrs(root)[k.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert attrs(root)[k.CALL_SEQ] == 0


def test_name_and_replay_policy(recording: Recording, tmp_path: Path) -> None:
    @trace_tool(name="charge", replay_policy="forbidden")
    def charge_card(amount: float) -> dict[str, Any]:
        return {"charged": amount}

    trace = run_once(tmp_path / "r.sftrace", lambda: charge_card(12.5))
    a = attrs(only_span(recording, "execute_tool charge"))
    assert a[k.GEN_AI_TOOL_NAME] == "charge"
    assert a[k.REPLAY_POLICY] == "forbidden"
    call = trace.calls[0]
    assert isinstance(call, ToolCall)
    assert call.name == "charge"
    assert call.replay_policy.value == "forbidden"
    assert charge_card.__name__ == "charge_card"  # functools.wraps kept the function's identity


def test_bare_parentheses_and_name_only(recording: Recording, tmp_path: Path) -> None:
    @trace_tool()
    def a(x: int) -> int:
        return x + 1

    @trace_tool(name="renamed")
    def b(x: int) -> int:
        return x * 2

    trace = run_once(tmp_path / "r.sftrace", lambda: (a(1), b(2)))
    assert [c.name for c in trace.calls if isinstance(c, ToolCall)] == ["a", "renamed"]


def test_invalid_replay_policy_is_a_clear_error_at_decoration() -> None:
    with pytest.raises(ValueError, match=r"unknown replay_policy 'sometimes'; expected one of"):

        @trace_tool(replay_policy="sometimes")
        def tool() -> None: ...


def test_decorating_a_non_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expects a function"):
        trace_tool(name="x")(42)  # type: ignore[arg-type]


async def test_async_tool(recording: Recording, tmp_path: Path) -> None:
    @trace_tool
    async def fetch(url: str, retries: int = 2) -> dict[str, Any]:
        return {"url": url, "retries": retries}

    async with record(tmp_path / "a.sftrace") as run:
        result = await fetch("https://example.test/x")
        run.set_output(result)
    assert result == {"url": "https://example.test/x", "retries": 2}
    a = attrs(only_span(recording, "execute_tool fetch"))
    assert a[k.INPUT_VALUE] == '{"retries":2,"url":"https://example.test/x"}'
    assert k.OUTPUT not in a  # the output travels once, as returned
    assert a[k.OUTPUT_VALUE] == '{"url":"https://example.test/x","retries":2}'  # as returned
    trace = Trace.load(tmp_path / "a.sftrace")
    assert [e.type for e in trace.events] == ["tool_call", "tool_result"]
    assert trace.run.output == '{"retries":2,"url":"https://example.test/x"}'  # canonical


def test_methods_leave_self_and_cls_out(recording: Recording, tmp_path: Path) -> None:
    class Client:
        def __init__(self) -> None:
            self.secret_state = "not recorded"

        @trace_tool
        def lookup(self, key: str) -> str:
            return key.upper()

        @classmethod
        @trace_tool
        def build(cls, size: int = 3) -> int:
            return size

        @staticmethod
        @trace_tool
        def plain(x: int) -> int:
            return x

    def body() -> None:
        assert Client().lookup("abc") == "ABC"
        assert Client.build() == 3
        assert Client.plain(7) == 7

    trace = run_once(tmp_path / "m.sftrace", body)
    assert [(c.name, c.input) for c in trace.calls] == [
        ("lookup", '{"key":"abc"}'),
        ("build", '{"size":3}'),
        ("plain", '{"x":7}'),
    ]


def test_var_args_and_kwargs(recording: Recording, tmp_path: Path) -> None:
    @trace_tool
    def combine(first: str, *rest: int, sep: str = "-", **options: Any) -> str:
        return sep.join([first, *map(str, rest)]) + str(sorted(options))

    trace = run_once(tmp_path / "v.sftrace", lambda: combine("a", 1, 2, sep="+", z=1, y=[2]))
    assert payload_value(trace.calls[0].input) == {
        "first": "a",
        "rest": [1, 2],
        "sep": "+",
        "options": {"y": [2], "z": 1},
    }
    assert payload_value(trace.events[1].output) == "a+1+2['y', 'z']"  # type: ignore[union-attr]


def test_positional_and_keyword_calls_normalise_to_the_same_input(
    recording: Recording, tmp_path: Path
) -> None:
    def body() -> None:
        search_flights("Rome")
        search_flights(city="Rome")
        search_flights("Rome", 5)
        search_flights(max_results=5, city="Rome")

    trace = run_once(tmp_path / "n.sftrace", body)
    inputs = {(c.input, c.input_sha256) for c in trace.calls}
    assert inputs == {('{"city":"Rome","max_results":5}', sha('{"city":"Rome","max_results":5}'))}


def test_a_changed_default_changes_the_recorded_input_and_fingerprint(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool(name="search")
    def search_v1(city: str, max_results: int = 5) -> int:
        return max_results

    @trace_tool(name="search")
    def search_v2(city: str, max_results: int = 10) -> int:
        return max_results

    v1 = run_once(tmp_path / "v1.sftrace", lambda: search_v1("Oslo")).calls[0]
    v2 = run_once(tmp_path / "v2.sftrace", lambda: search_v2("Oslo")).calls[0]
    assert v1.input == '{"city":"Oslo","max_results":5}'
    assert v2.input == '{"city":"Oslo","max_results":10}'
    assert v1.input_sha256 != v2.input_sha256


def test_wrong_arguments_raise_the_functions_own_type_error(
    recording: Recording, tmp_path: Path
) -> None:
    def plain(city: str, max_results: int = 5) -> None: ...

    expected: list[str] = []
    for call in (lambda f: f(), lambda f: f("a", 1, 2), lambda f: f("a", nope=1)):
        with pytest.raises(TypeError) as raw:
            call(plain)
        expected.append(str(raw.value))
    wrapped = trace_tool(name="plain")(plain)
    with record(tmp_path / "w.sftrace"):
        for call, message in zip(
            (lambda f: f(), lambda f: f("a", 1, 2), lambda f: f("a", nope=1)),
            expected,
            strict=True,
        ):
            with pytest.raises(TypeError) as got:
                call(wrapped)
            assert str(got.value) == message
    assert spans_named(recording, "execute_tool plain") == []  # a call that never happened


# --- failures ------------------------------------------------------------------------------------


class BookingError(RuntimeError):
    pass


@trace_tool
def book(flight: str) -> None:
    raise BookingError(f"booking API (key {SECRET}) refused {flight}")


def test_failure_recorded_sanitised_and_reraised_unchanged(
    recording: Recording, tmp_path: Path
) -> None:
    caught: list[BaseException] = []
    original: list[BaseException] = []

    @trace_tool
    def fails() -> None:
        exc = BookingError(f"booking API (key {SECRET}) refused AF1")
        original.append(exc)
        raise exc

    with record(tmp_path / "f.sftrace"):
        try:
            fails()
        except BookingError as exc:
            caught.append(exc)
    assert caught[0] is original[0]  # the very same object
    assert str(caught[0]) == f"booking API (key {SECRET}) refused AF1"  # message untouched
    span = only_span(recording, "execute_tool fails")
    a = attrs(span)
    error_type = f"{__name__}.BookingError"
    redacted = "booking API (key [REDACTED:openai_api_key]) refused AF1"
    assert a[k.STATUS] == k.STATUS_ERROR
    assert a[k.ERROR_TYPE] == error_type
    assert a[k.ERROR_MESSAGE] == redacted
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == f"{error_type}: {redacted}"
    assert [(e.name, dict(e.attributes or {})) for e in span.events] == [
        ("exception", {k.EXCEPTION_TYPE: error_type, k.EXCEPTION_MESSAGE: redacted})
    ]
    for exported in recording.exporter.get_finished_spans():
        assert SECRET not in repr(dict(exported.attributes or {}))
        assert SECRET not in repr([dict(e.attributes or {}) for e in exported.events])
        assert SECRET not in (exported.status.description or "")
    data = (tmp_path / "f.sftrace").read_text()
    assert SECRET not in data
    trace = Trace.load(tmp_path / "f.sftrace")
    error = trace.events[-1]
    assert isinstance(error, ErrorEvent)
    assert (error.error_type, error.message, error.parent_id) == (error_type, redacted, "call-1")
    assert error.output == canonical_json({"error_type": error_type, "message": redacted})
    assert trace.run.status == "ok"  # the agent caught it
    assert verify_integrity(trace) == []


async def test_async_failures_are_recorded_and_reraised(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    async def afails(n: int) -> None:
        raise KeyError(n)

    async def call() -> None:
        raise ValueError(f"upstream said {SECRET}")

    async with record(tmp_path / "af.sftrace"):
        with pytest.raises(ValueError, match="upstream said sk-proj"):
            await allm_request(provider="openai", model="m", input={"q": 1}, call=call)
        with pytest.raises(KeyError):
            await afails(3)
    trace = Trace.load(tmp_path / "af.sftrace")
    errors = [e for e in trace.events if isinstance(e, ErrorEvent)]
    assert [(e.parent_id, e.error_type, e.message) for e in errors] == [
        ("call-1", "ValueError", "upstream said [REDACTED:openai_api_key]"),
        ("call-2", "KeyError", "3"),
    ]


def test_base_exceptions_are_recorded_and_not_swallowed(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), record(tmp_path / "k.sftrace"):
        interrupted()
    assert attrs(only_span(recording, "execute_tool interrupted"))[k.ERROR_TYPE] == (
        "KeyboardInterrupt"
    )


def test_an_unprintable_exception_still_propagates(recording: Recording, tmp_path: Path) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    @trace_tool
    def odd() -> None:
        raise Unprintable

    with pytest.raises(Unprintable), record(tmp_path / "u.sftrace"):
        odd()
    assert attrs(only_span(recording, "execute_tool odd"))[k.ERROR_MESSAGE] == (
        "<unprintable Unprintable>"
    )


# --- LLM calls -----------------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass
class Completion:
    model: str
    text: str
    usage: Usage


def test_llm_request_span_usage_and_model_fingerprint(recording: Recording, tmp_path: Path) -> None:
    def body() -> None:
        reply = llm_request(
            provider="openai",
            model="gpt-4.1-mini",
            input={"messages": [{"role": "user", "content": "hi"}]},
            call=lambda: {
                "model": "gpt-4.1-mini-2025",
                "usage": {"prompt_tokens": 11, "completion_tokens": 3},
            },
        )
        assert reply["usage"]["prompt_tokens"] == 11
        obj = llm_request(
            provider="anthropic",
            model="claude-x",
            input="ping",
            call=lambda: Completion("claude-x", "pong", Usage(7, 2)),
        )
        assert obj.text == "pong"

    trace = run_once(tmp_path / "l.sftrace", body)
    first = only_span(recording, "chat gpt-4.1-mini")
    a = attrs(first)
    assert first.kind is SpanKind.CLIENT
    assert a[k.GEN_AI_OPERATION_NAME] == "chat"
    assert a[k.GEN_AI_PROVIDER_NAME] == "openai"
    assert a[k.GEN_AI_REQUEST_MODEL] == "gpt-4.1-mini"
    assert a[k.GEN_AI_RESPONSE_MODEL] == "gpt-4.1-mini-2025"
    assert a[k.OPENINFERENCE_SPAN_KIND] == "LLM"
    assert (a[k.GEN_AI_USAGE_INPUT_TOKENS], a[k.GEN_AI_USAGE_OUTPUT_TOKENS]) == (11, 3)
    expected_fp = sha(
        canonical_json({"model": "gpt-4.1-mini", "operation": "chat", "provider": "openai"})
    )
    assert a[k.MODEL_FINGERPRINT] == expected_fp
    b = attrs(only_span(recording, "chat claude-x"))
    assert (b[k.GEN_AI_USAGE_INPUT_TOKENS], b[k.GEN_AI_USAGE_OUTPUT_TOKENS]) == (7, 2)
    assert b[k.MODEL_FINGERPRINT] != expected_fp
    assert b[k.OUTPUT_VALUE] == (  # as returned: the dataclasses' field order
        '{"model":"claude-x","text":"pong","usage":{"prompt_tokens":7,"completion_tokens":2}}'
    )
    request, response = trace.events[0], trace.events[1]
    assert isinstance(request, LlmRequest)
    assert isinstance(response, LlmResponse)
    assert request.model_fingerprint == expected_fp
    assert (request.provider, request.model, request.operation) == (
        "openai",
        "gpt-4.1-mini",
        "chat",
    )
    assert response.usage == {"input_tokens": 11, "output_tokens": 3}
    assert response.model == "gpt-4.1-mini-2025"


def test_llm_operation_names_the_span(recording: Recording, tmp_path: Path) -> None:
    run_once(
        tmp_path / "e.sftrace",
        lambda: llm_request(
            provider="openai", model="emb", operation="embeddings", input="x", call=lambda: [0.5]
        ),
    )
    assert attrs(only_span(recording, "embeddings emb"))[k.GEN_AI_OPERATION_NAME] == "embeddings"


async def test_allm_request_awaits_the_call(recording: Recording, tmp_path: Path) -> None:
    calls: list[str] = []

    async def call() -> dict[str, Any]:
        calls.append("ran")
        return {"usage": {"input_tokens": 5, "output_tokens": 1}, "content": "ok"}

    async with record(tmp_path / "al.sftrace"):
        reply = await allm_request(provider="anthropic", model="c", input={"q": "?"}, call=call)
    assert reply["content"] == "ok"
    assert calls == ["ran"]
    a = attrs(only_span(recording, "chat c"))
    assert (a[k.GEN_AI_USAGE_INPUT_TOKENS], a[k.GEN_AI_USAGE_OUTPUT_TOKENS]) == (5, 1)
    assert Trace.load(tmp_path / "al.sftrace").events[1].output == (  # type: ignore[union-attr]
        '{"usage":{"input_tokens":5,"output_tokens":1},"content":"ok"}'  # as returned
    )


def test_llm_replay_policy_is_validated() -> None:
    with pytest.raises(ValueError, match="unknown replay_policy"):
        llm_request(provider="p", model="m", input=1, call=lambda: 1, replay_policy="nope")


# --- payloads on spans: size cap, capture off, attribute length limits -------------------------


BIG = {"rows": [{"id": i, "note": "x" * 40} for i in range(20)]}


def test_size_cap_leaves_payload_off_the_span_but_whole_in_the_bundle(
    recording: Recording, tmp_path: Path
) -> None:
    configure(max_span_payload_bytes=200)

    @trace_tool
    def big(n: int) -> dict[str, Any]:
        return BIG

    trace = run_once(tmp_path / "cap.sftrace", lambda: big(1))
    a = attrs(only_span(recording, "execute_tool big"))
    full = canonical_json(BIG)
    assert len(full) > 200
    assert a[k.INPUT_VALUE] == '{"n":1}'  # small payloads stay
    assert k.OUTPUT not in a
    assert k.OUTPUT_VALUE not in a
    assert a[k.OUTPUT_OMITTED] == k.OMITTED_SIZE_CAP
    assert a[k.OUTPUT_PREVIEW] == full[: k.PREVIEW_CHARS]
    assert (a[k.OUTPUT_SHA256], a[k.OUTPUT_SIZE]) == (sha(full), len(full))
    result = trace.events[1]
    assert isinstance(result, ToolResult)
    assert (result.output, result.output_sha256, result.output_missing) == (full, sha(full), None)


def test_capture_off_keeps_fingerprints_only_on_spans(recording: Recording, tmp_path: Path) -> None:
    configure(capture_content=False)
    trace = run_once(tmp_path / "off.sftrace", lambda: search_flights("Nice"), input={"q": "Nice"})
    for span in recording.exporter.get_finished_spans():
        a = attrs(span)
        for key in (k.INPUT, k.OUTPUT, k.INPUT_VALUE, k.OUTPUT_VALUE, k.INPUT_PREVIEW):
            assert key not in a, (span.name, key)
        assert k.OUTPUT_PREVIEW not in a
        assert "Nice" not in repr(a)
        assert a[k.INPUT_OMITTED] == k.OMITTED_CAPTURE_DISABLED
        assert len(a[k.INPUT_SHA256]) == 64
    call = trace.calls[0]
    assert call.input == '{"city":"Nice","max_results":5}'
    assert call.input_sha256 == sha(call.input)
    assert trace.run.input == '{"q":"Nice"}'
    assert verify_integrity(trace) == []


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Recording]:
    """A provider whose SpanLimits cut every attribute value to 80 characters."""
    provider = TracerProvider(span_limits=SpanLimits(max_attribute_length=80))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    processor = configure(directory=tmp_path / "traces", tracer_provider=provider)
    yield Recording(provider, exporter, processor, tmp_path / "traces")
    provider.shutdown()


def test_attribute_length_limit_truncates_spans_never_the_bundle(
    limited: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def big(n: int) -> dict[str, Any]:
        if n < 0:
            raise ValueError("m" * 300)
        return BIG

    path = tmp_path / "lim.sftrace"
    with record(path, input={"long": "y" * 200}):
        big(1)
        with pytest.raises(ValueError):
            big(-1)
    full = canonical_json(BIG)
    spans = limited.exporter.get_finished_spans()
    a = attrs(next(s for s in spans if s.name == "execute_tool big"))
    assert k.OUTPUT not in a  # sorted already: the payload travels once, as output.value
    assert len(a[k.OUTPUT_VALUE]) == 80
    assert full.startswith(a[k.OUTPUT_VALUE])
    assert a[k.OUTPUT_SHA256] == sha(full)

    local = Trace.load(path)  # the local bundle holds everything whole (hand-off)
    assert local.events[1].output == full  # type: ignore[union-attr]
    assert local.run.input == canonical_json({"long": "y" * 200})
    error = local.events[-1]
    assert isinstance(error, ErrorEvent)
    assert error.message == "m" * 300
    assert verify_integrity(local) == []

    # the same spans as a collector received them: no hand-off
    exported = to_trace([span_record(s) for s in spans])
    result = exported.events[1]
    assert isinstance(result, ToolResult)
    assert (result.output, result.output_missing) == (None, "truncated")
    assert result.output_sha256 == sha(full)
    assert exported.run.input is None
    assert exported.run.input_missing == "truncated"
    assert exported.calls[0].input == '{"n":1}'  # short payloads are whole and kept
    assert verify_integrity(exported) == []


def test_a_limit_shorter_than_a_fingerprint_marks_the_payload_truncated(tmp_path: Path) -> None:
    provider = TracerProvider(span_limits=SpanLimits(max_attribute_length=20))
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configure(directory=tmp_path / "traces", tracer_provider=provider)
    with record(tmp_path / "tiny.sftrace"):
        search_flights("Lisbon")
    local = Trace.load(tmp_path / "tiny.sftrace")
    assert local.calls[0].input == '{"city":"Lisbon","max_results":5}'
    exported = to_trace([span_record(s) for s in exporter.get_finished_spans()])
    call = exported.calls[0]
    assert (call.input, call.input_sha256, call.input_missing) == (None, None, "truncated")
    provider.shutdown()


# --- record(...) ---------------------------------------------------------------------------------


def test_record_to_a_file_stores_input_redacted_and_output(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "sub" / "run.sftrace"
    with record(path, input={"question": "q", "api_key": "abc", "note": SECRET}) as run:
        assert run.trace_id is not None
        assert run.path == path
        run.set_output({"answer": 42, "token": "t"})
    assert run.path == path
    assert path.exists()
    trace = run.trace
    assert trace.trace_id == run.trace_id
    assert payload_value(trace.run.input) == {
        "api_key": "[REDACTED]",
        "note": "[REDACTED:openai_api_key]",
        "question": "q",
    }
    assert payload_value(trace.run.output) == {"answer": 42, "token": "[REDACTED]"}
    assert trace.run.status == "ok"
    assert trace.complete
    assert SECRET not in path.read_text()
    assert '"abc"' not in path.read_text()
    root = only_span(recording, "invoke_agent agent")
    assert SECRET not in repr(attrs(root))
    assert attrs(root)[k.INPUT_VALUE] == trace.run.input


def test_record_into_a_directory_names_the_bundle_by_trace_id(
    recording: Recording, tmp_path: Path
) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    with record(existing) as run:
        search_flights("Paris")
    assert run.path == existing / f"{run.trace_id}.sftrace"
    assert run.path.exists()
    with record(f"{tmp_path / 'new'}/") as run2:  # a trailing separator means a directory
        search_flights("Paris")
    assert run2.path == tmp_path / "new" / f"{run2.trace_id}.sftrace"
    assert run2.trace.calls[0].name == "search_flights"
    with record() as run3:  # no destination: the configured directory
        search_flights("Paris")
    assert run3.path == recording.directory / f"{run3.trace_id}.sftrace"
    assert run3.path.exists()


def test_run_failure_is_recorded_and_propagates(recording: Recording, tmp_path: Path) -> None:
    with pytest.raises(BookingError), record(tmp_path / "rf.sftrace", name="agent") as run:
        book("AF1")
    trace = Trace.load(tmp_path / "rf.sftrace")
    assert run.path == tmp_path / "rf.sftrace"
    assert trace.run.status == "error"
    assert trace.run.error_type == f"{__name__}.BookingError"
    assert trace.run.error_message == "booking API (key [REDACTED:openai_api_key]) refused AF1"
    assert trace.run.output is None
    root = only_span(recording, "invoke_agent agent")
    assert root.status.status_code is StatusCode.ERROR


def test_run_spans_hang_under_one_root_with_call_numbers(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def outer(n: int) -> int:
        return llm_request(provider="p", model="m", input=n, call=lambda: n + 1)

    with record(tmp_path / "tree.sftrace", name="tree"):
        search_flights("A")
        outer(1)
        search_flights("B")
    spans = recording.exporter.get_finished_spans()
    root = only_span(recording, "invoke_agent tree")
    assert root.parent is None
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    boundary = sorted(
        (s for s in spans if attrs(s)[k.KIND] != k.KIND_RUN), key=lambda s: attrs(s)[k.CALL_SEQ]
    )
    assert [(s.name, attrs(s)[k.CALL_SEQ]) for s in boundary] == [
        ("execute_tool search_flights", 1),
        ("execute_tool outer", 2),
        ("chat m", 3),
        ("execute_tool search_flights", 4),
    ]
    by_id = {s.context.span_id: s for s in spans}
    assert boundary[2].parent is not None
    assert by_id[boundary[2].parent.span_id].name == ("execute_tool outer")
    for span in (boundary[0], boundary[1], boundary[3]):
        assert span.parent is not None
        assert span.parent.span_id == root.context.span_id
    trace = Trace.load(tmp_path / "tree.sftrace")
    assert [(e.type, e.id, e.parent_id) for e in trace.events] == [
        ("tool_call", "call-1", None),
        ("tool_result", "call-1.result", "call-1"),
        ("tool_call", "call-2", None),
        ("llm_request", "call-3", "call-2"),
        ("llm_response", "call-3.result", "call-3"),
        ("tool_result", "call-2.result", "call-2"),
        ("tool_call", "call-4", None),
        ("tool_result", "call-4.result", "call-4"),
    ]


def test_boundary_calls_outside_a_run_start_their_own_numbering(recording: Recording) -> None:
    search_flights("Solo")
    llm_request(provider="p", model="m", input=1, call=lambda: 2)
    spans = recording.exporter.get_finished_spans()
    assert [attrs(s)[k.CALL_SEQ] for s in spans] == [1, 1]
    assert len({s.context.trace_id for s in spans}) == 2
    # with a configured directory each such trace is its own bundle
    files = sorted(recording.directory.glob("*.sftrace"))
    assert {f.stem for f in files} == {format(s.context.trace_id, "032x") for s in spans}


def test_run_entrypoint_and_keep(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "e.sftrace", entrypoint="pkg.mod:main") as run:
        run.keep()
    a = attrs(only_span(recording, "invoke_agent agent"))
    assert a[k.RUN_ENTRYPOINT] == "pkg.mod:main"
    assert a[k.RUN_KEEP] is True
    assert Trace.load(tmp_path / "e.sftrace").run.entrypoint == "pkg.mod:main"


def test_trace_before_the_run_ended_is_an_error(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "x.sftrace") as run, pytest.raises(RuntimeError, match="still running"):
        run.trace  # noqa: B018


def test_a_sampled_out_run_warns_and_writes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider(sampler=ALWAYS_OFF)
    configure(directory=tmp_path / "traces", tracer_provider=provider)
    during: list[int] = []

    @trace_tool
    def probe(city: str) -> str:
        during.append(HANDOFF.pending)  # while its (unsampled) span is open
        return city

    with caplog.at_level("WARNING", logger="stepfork_otel"), record(tmp_path / "s.sftrace") as run:
        assert search_flights("X") == [{"city": "X", "n": 0}, {"city": "X", "n": 1}]
        assert probe("Y") == "Y"
    assert run.path is None
    assert not (tmp_path / "s.sftrace").exists()
    assert "was not sampled" in caplog.text
    assert during == [0]  # nothing kept for spans no processor will see, not even for a while
    assert HANDOFF.pending == 0


def test_a_tool_span_carries_its_description_and_parameter_schema(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def search_flights(city: str, max_results: int = 5) -> list[str]:
        """Search flights to a city.

        Returns flight numbers."""
        return [city] * max_results

    with record(tmp_path / "t.sftrace"):
        search_flights("Paris", 1)
    (span,) = [s for s in recording.exporter.get_finished_spans() if s.name.startswith("execute")]
    a = dict(span.attributes or {})
    assert a[k.GEN_AI_TOOL_DESCRIPTION] == "Search flights to a city.\n\nReturns flight numbers."
    assert a[k.OI_TOOL_DESCRIPTION] == a[k.GEN_AI_TOOL_DESCRIPTION]
    assert a[k.GEN_AI_TOOL_TYPE] == "function"
    schema = json.loads(a[k.OI_TOOL_PARAMETERS])
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["properties"]["max_results"]["default"] == 5
    assert schema["required"] == ["city"]
