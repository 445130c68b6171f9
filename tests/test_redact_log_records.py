"""``configure(redact_all_spans=True)`` redacts the *log records* of other instrumentations too
(issue 28): ``opentelemetry-instrumentation-openai-v2`` sends the prompt and the answer as log
records unless told ``span_only``, and they reached the log exporter as they were while the span
copy was redacted. The real client and instrumentation, against the loopback server of
``test_redact_all_spans.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import installed
from opentelemetry import _logs as logs_api
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import TracerProvider
from test_redact_all_spans import ANSWER_SECRET, PROMPT_SECRET, _ask, chat_server  # noqa: F401

from stepfork_otel import configure
from stepfork_otel.otel.redacting import RedactingLogRecordProcessor, enable_log_redaction


@pytest.fixture
def openai_v2_events(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The instrumentation with content on spans and in log records (events)."""
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_and_event")
    instrumentation = installed("opentelemetry.instrumentation.openai_v2")
    instrumentor = instrumentation.OpenAIInstrumentor()
    yield instrumentor
    instrumentor.uninstrument()


def _logs() -> tuple[LoggerProvider, InMemoryLogRecordExporter]:
    provider = LoggerProvider()
    exporter = InMemoryLogRecordExporter()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))  # the application's
    return provider, exporter


def _text(record: ReadableLogRecord) -> str:
    log = record.log_record
    return json.dumps([log.body, dict(log.attributes or {}), log.event_name], default=str)


def _leaked(records: tuple[ReadableLogRecord, ...]) -> list[str]:
    found = []
    for record in records:
        log = record.log_record
        text = _text(record)
        for secret in (PROMPT_SECRET, ANSWER_SECRET):
            if secret in text or json.dumps(secret)[1:-1] in text:
                found.append(str(log.event_name))
    return found


@pytest.mark.parametrize("redact", [True, False], ids=["redact_all_spans", "without"])
def test_openai_v2_log_records_are_redacted_before_export(
    chat_server: str,  # noqa: F811
    openai_v2_events: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    redact: bool,
) -> None:
    logs, exporter = _logs()
    monkeypatch.setattr(logs_api, "get_logger_provider", lambda: logs)  # the global provider
    tracer_provider = TracerProvider()
    openai_v2_events.instrument(tracer_provider=tracer_provider, logger_provider=logs)
    configure(tmp_path, tracer_provider=tracer_provider, redact_all_spans=redact)
    assert ANSWER_SECRET in _ask(chat_server)  # the application still gets the real answer
    records = exporter.get_finished_logs()
    assert records, "the instrumentation sent no log record"
    if redact:
        assert _leaked(records) == []
        assert any("[REDACTED" in _text(r) for r in records)
    else:
        assert _leaked(records)  # the secrets were there to be redacted
    tracer_provider.shutdown()


def test_log_redaction_goes_first_once_and_covers_every_field(monkeypatch: Any) -> None:
    logs, exporter = _logs()
    first = enable_log_redaction(logs)
    late = InMemoryLogRecordExporter()
    logs.add_log_record_processor(SimpleLogRecordProcessor(late))  # added after
    assert enable_log_redaction(logs) is first  # idempotent
    processors = logs._multi_log_record_processor._log_record_processors
    assert isinstance(processors[0], RedactingLogRecordProcessor)
    assert sum(isinstance(p, RedactingLogRecordProcessor) for p in processors) == 1
    logs.get_logger("app").emit(
        body={"messages": [{"content": f"key {PROMPT_SECRET}"}], "api_key": "plain-value"},
        attributes={
            "http.request.header.authorization": "Bearer abc.def.ghi",
            "note": f"answer: {ANSWER_SECRET}",
            "session.id": "conversation-42",
            "blob": f"token {ANSWER_SECRET}".encode(),
            "count": 3,
        },
        event_name="gen_ai.user.message",
    )
    for records in (exporter.get_finished_logs(), late.get_finished_logs()):
        (record,) = records
        log = record.log_record
        assert _leaked(records) == []
        assert log.body["api_key"] == "[REDACTED]"
        attributes = dict(log.attributes or {})
        assert attributes["http.request.header.authorization"] == "[REDACTED]"
        assert attributes["session.id"] == "conversation-42"
        assert attributes["count"] == 3
        assert ANSWER_SECRET.encode() not in attributes["blob"]


def test_no_sdk_logger_provider_is_left_alone() -> None:
    assert enable_log_redaction(logs_api.NoOpLoggerProvider()) is None
