"""``configure(redact_all_spans=True)``: spans of *other* instrumentations are redacted with the same
rules before any exporter sees them.

The real ``openai`` client is driven against a loopback HTTP server that answers with a Chat
Completions body, under the real ``openinference-instrumentation-openai`` and
``opentelemetry-instrumentation-openai-v2`` instrumentors (content capture on). The prompt and the
answer carry secrets; with the option, no exported span of those instrumentations holds one (in
any attribute, event or status); without it, they do -- so the test shows the option is what
keeps them out.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import installed
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from secret_families import CORPUS

from stepfork_otel import configure, trace_tool
from stepfork_otel.otel.redacting import RedactingSpanProcessor, enable_span_redaction

openai = pytest.importorskip("openai")

SECRETS = [s for s in CORPUS if s.family in ("openai_project", "github_fine_grained", "jwt")]
PROMPT_SECRET = SECRETS[0].secret
ANSWER_SECRET = SECRETS[1].secret
HEADER_SECRET = SECRETS[2].secret


class _ChatHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        body = {
            "id": "chatcmpl-loopback",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "gpt-4.1-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": f"Rotate this token now: {ANSWER_SECRET}",
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def chat_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _ask(base_url: str) -> str:
    client = openai.OpenAI(base_url=base_url, api_key="sk-test-loopback", max_retries=0)
    response = client.chat.completions.create(
        model="gpt-4.1-mini",
        messages=[
            {"role": "system", "content": "You are a deployment assistant."},
            {"role": "user", "content": f"Why does my deploy fail? OPENAI_KEY={PROMPT_SECRET}"},
        ],
        extra_headers={"X-Debug": f"Authorization: Bearer {HEADER_SECRET}"},
    )
    return str(response.choices[0].message.content)


def _texts(span: ReadableSpan) -> list[str]:
    texts = [span.name, json.dumps(dict(span.attributes or {}), default=str)]
    for event in span.events:
        texts += [event.name, json.dumps(dict(event.attributes or {}), default=str)]
    if span.status.description:
        texts.append(span.status.description)
    return texts


def _leaked(spans: list[ReadableSpan]) -> list[str]:
    found = []
    for span in spans:
        for text in _texts(span):
            for secret in (PROMPT_SECRET, ANSWER_SECRET):
                if secret in text or json.dumps(secret)[1:-1] in text:
                    found.append(f"{span.instrumentation_scope.name}: {span.name}")
    return found


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # the application's exporter
    return provider, exporter


@pytest.fixture
def openinference() -> Iterator[Any]:
    instrumentation = installed("openinference.instrumentation.openai")
    instrumentor = instrumentation.OpenAIInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.fixture
def openai_v2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    instrumentation = installed("opentelemetry.instrumentation.openai_v2")
    instrumentor = instrumentation.OpenAIInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


@pytest.mark.parametrize("redact", [True, False], ids=["redact_all_spans", "without"])
def test_openinference_spans_are_redacted_before_export(
    chat_server: str, openinference: Any, tmp_path: Any, redact: bool
) -> None:
    provider, exporter = _provider()
    openinference.instrument(tracer_provider=provider)
    configure(tmp_path, tracer_provider=provider, redact_all_spans=redact)
    assert ANSWER_SECRET in _ask(chat_server)  # the application still gets the real answer
    spans = [
        s for s in exporter.get_finished_spans() if "openinference" in s.instrumentation_scope.name
    ]
    assert spans, "the instrumentation made no span"
    if redact:
        assert _leaked(spans) == []
        attributes = dict(spans[0].attributes or {})
        assert "[REDACTED" in attributes["input.value"]
        assert "[REDACTED" in attributes["output.value"]
    else:
        assert _leaked(spans)  # the secrets were there to be redacted


@pytest.mark.parametrize("redact", [True, False], ids=["redact_all_spans", "without"])
def test_openai_v2_spans_are_redacted_before_export(
    chat_server: str, openai_v2: Any, tmp_path: Any, redact: bool
) -> None:
    provider, exporter = _provider()
    openai_v2.instrument(tracer_provider=provider)
    configure(tmp_path, tracer_provider=provider, redact_all_spans=redact)
    _ask(chat_server)
    spans = [
        s for s in exporter.get_finished_spans() if s.instrumentation_scope.name != "stepfork_otel"
    ]
    assert spans, "the instrumentation made no span"
    if redact:
        assert _leaked(spans) == []
    else:
        assert _leaked(spans)


def test_the_redacting_processor_runs_before_every_exporter(tmp_path: Any) -> None:
    provider, exporter = _provider()
    configure(tmp_path, tracer_provider=provider, redact_all_spans=True)
    late = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(late))  # added after configure
    configure(tmp_path, tracer_provider=provider, redact_all_spans=True)  # idempotent
    processors = provider._active_span_processor._span_processors
    assert sum(isinstance(p, RedactingSpanProcessor) for p in processors) == 1
    assert isinstance(processors[0], RedactingSpanProcessor)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("GET https://bob:hunter2pass@db.example.com/x") as span:
        span.set_attribute("http.request.header.authorization", "Bearer abc.def.ghi")
        span.set_attribute("db.statement", f"-- {PROMPT_SECRET}")
        span.set_attribute("api_key_id", "Xy7Gh2Kq9Lm3Np8Rs4Tv")
        span.set_attribute("session.id", "conversation-42")
        span.set_attribute("tags", ["ok", f"token={HEADER_SECRET}"])
        span.set_attribute("count", 3)
        span.add_event("request", {"body": f'{{"password": "{PROMPT_SECRET}"}}'})
        span.set_status(Status(StatusCode.ERROR, f"failed with {PROMPT_SECRET}"))
    for spans in (exporter.get_finished_spans(), late.get_finished_spans()):
        (done,) = spans
        text = " ".join(_texts(done))
        assert PROMPT_SECRET not in text
        assert HEADER_SECRET not in text
        assert "hunter2pass" not in text
        attributes = dict(done.attributes or {})
        assert attributes["http.request.header.authorization"] == "[REDACTED]"
        assert attributes["api_key_id"] == "[REDACTED:generic_secret]"
        assert attributes["session.id"] == "conversation-42"
        assert attributes["count"] == 3
        assert attributes["tags"][0] == "ok"
        assert done.status.status_code is StatusCode.ERROR


def test_stepfork_spans_pass_through_unchanged(recording: Any) -> None:
    # already redacted at the boundary: the processor leaves them alone (and costs nothing there)
    enable_span_redaction(recording.provider)

    @trace_tool
    def lookup(city: str) -> str:
        return city

    lookup("Paris")
    (span,) = recording.exporter.get_finished_spans()
    assert dict(span.attributes or {})["input.value"] == '{"city":"Paris"}'


def test_readable_span_fields_the_processor_replaces_exist() -> None:
    # the processor relies on these ReadableSpan fields of the installed SDK
    span = ReadableSpan(name="x")
    for name in ("_name", "_attributes", "_events", "_links", "_status"):
        assert hasattr(span, name), name
