"""Redaction of *every* span before it is exported: ``configure(redact_all_spans=True)``.

stepfork redacts its own spans at the boundary, but an application usually runs other
instrumentations too -- ``opentelemetry-instrumentation-openai-v2``, OpenInference, HTTP client
instrumentations -- whose spans carry prompts, tool results and headers as they are, and ship over
the same exporters. :class:`RedactingSpanProcessor` applies the configured redactor to the span
name, the attributes, the event names and attributes, the link attributes and the status
description of every span that ends, and is placed *first* among the provider's processors, so
that every processor after it (the application's ``BatchSpanProcessor`` and exporters, the
collector pipeline) sees only the redacted span.

How a value is redacted is what recording does to a payload: an attribute whose key is sensitive
(``http.request.header.authorization``, ``db.password``) becomes ``[REDACTED]``; a random-looking
string under a generic key becomes ``[REDACTED:generic_secret]``; every other string (and every
string in a sequence) is redacted as text -- JSON held in an attribute (``input.value``,
``gen_ai.input.messages``) included. ``session.id`` is kept (it names a conversation, not a
cookie). stepfork's own spans were redacted when they were made and are passed through.

The processor mutates the ended span it is given (its attributes, events, links and status are
replaced by redacted copies) before the next processor runs: the SDK hands every processor the
same read-only span object, and this is the one way to change what all of them receive. It relies
on the SDK's ``ReadableSpan`` fields (``_name``, ``_attributes``, ``_events``, ``_links``,
``_status``), stable since SDK 1.0; ``tests/test_redact_all_spans.py`` checks them against the
installed SDK. Going first is a patch of the SDK's private processor tuple
(``SynchronousMultiSpanProcessor._span_processors``, ``_log_record_processors``), made under its
lock through stepfork's one patching module (``stepfork_otel/_patching.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from opentelemetry import _logs as logs_api
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk._logs import LoggerProvider, LogRecordProcessor, ReadWriteLogRecord
from opentelemetry.sdk._logs._internal import SynchronousMultiLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import Link, Status

from stepfork_otel._patching import Patcher
from stepfork_otel.constants import INSTRUMENTATION_NAME
from stepfork_otel.trace.redaction import GENERIC_MARKER, KEY_MARKER, Redactor, looks_random

logger = logging.getLogger("stepfork_otel")

#: Attribute keys kept as they are although a key rule would match them.
KEPT_ATTRIBUTES = frozenset({"session.id"})

_install_lock = threading.Lock()


def _redact_value(redactor: Redactor, key: str, value: Any, texts: bool) -> Any:
    """``value`` under attribute ``key``; ``texts``: whether its strings may need redaction (the
    one scan over the whole span said so)."""
    if key in KEPT_ATTRIBUTES:
        return value
    if redactor.is_sensitive_key(key):
        return KEY_MARKER
    if isinstance(value, str):
        if redactor.is_generic_key(key) and looks_random(value):
            return GENERIC_MARKER
        return redactor.redact_text(value) if texts else value
    if texts and isinstance(value, (list, tuple)) and any(isinstance(v, str) for v in value):
        return tuple(redactor.redact_text(v) if isinstance(v, str) else v for v in value)
    return value


def redact_attributes(
    redactor: Redactor, attributes: Mapping[str, Any] | None, texts: bool = True
) -> dict[str, Any] | None:
    """A redacted copy of span (or event, or link) attributes; None stays None."""
    if attributes is None:
        return None
    return {key: _redact_value(redactor, key, value, texts) for key, value in attributes.items()}


def _strings(span: ReadableSpan) -> list[str]:
    """Every string of ``span`` that :func:`redact_span` redacts as text."""
    out = [span.name]
    sources: list[Mapping[str, Any] | None] = [span.attributes]
    for event in span.events:
        out.append(event.name)
        sources.append(event.attributes)
    sources += [link.attributes for link in span.links]
    for attributes in sources:
        for value in (attributes or {}).values():
            if isinstance(value, str):
                out.append(value)
            elif isinstance(value, (list, tuple)):
                out += (v for v in value if isinstance(v, str))
    if span.status.description:
        out.append(span.status.description)
    return out


def redact_span(redactor: Redactor, span: ReadableSpan) -> None:
    """Replace ``span``'s name, attributes, events, links and status description by redacted
    copies, in place. One RE2 scan over all its strings first: when it finds nothing, only the
    key rules apply (a sensitive attribute key, a random value under a generic key)."""
    texts = redactor.may_change_texts(_strings(span))
    if texts:
        span._name = redactor.redact_text(span.name)
    span._attributes = redact_attributes(redactor, span.attributes, texts)
    if span.events:
        span._events = tuple(
            Event(
                redactor.redact_text(event.name) if texts else event.name,
                redact_attributes(redactor, event.attributes, texts),
                event.timestamp,
            )
            for event in span.events
        )
    if span.links:
        span._links = tuple(
            Link(link.context, redact_attributes(redactor, link.attributes, texts))
            for link in span.links
        )
    description = span.status.description
    if texts and description:
        redacted = redactor.redact_message(description)
        if redacted != description:
            span._status = Status(span.status.status_code, redacted)


def _is_stepfork_span(span: ReadableSpan) -> bool:
    scope = span.instrumentation_scope
    return scope is not None and scope.name == INSTRUMENTATION_NAME


class RedactingSpanProcessor(SpanProcessor):
    """Redacts every ended span in place (see the module docstring); must run before the
    processors that export. ``redactor``: a function returning the redactor to apply (the one
    configured at the time the span ends)."""

    def __init__(self, redactor: Callable[[], Redactor]) -> None:
        self._redactor = redactor

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if _is_stepfork_span(span):
            return  # redacted at the boundary
        try:
            redact_span(self._redactor(), span)
        except Exception:  # never break the application's span pipeline
            logger.exception("stepfork_otel: could not redact span %r", span.name)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _processors(provider: TracerProvider) -> Any:
    return provider._active_span_processor


def enable_span_redaction(
    tracer_provider: trace_api.TracerProvider | None = None,
    redactor: Callable[[], Redactor] | None = None,
) -> RedactingSpanProcessor | None:
    """Put a :class:`RedactingSpanProcessor` first on ``tracer_provider`` (default: the global
    provider; when none is set yet, the embedded default that ``configure`` would install is
    installed here). Idempotent. Returns the processor, or None when the provider is not an SDK
    ``TracerProvider`` (nothing can be added to it; a warning is logged)."""
    if redactor is None:
        from stepfork_otel.config import CONFIG

        def redactor() -> Redactor:
            return CONFIG.settings.redactor

    with _install_lock:
        target = tracer_provider if tracer_provider is not None else trace_api.get_tracer_provider()
        if tracer_provider is None and isinstance(target, trace_api.ProxyTracerProvider):
            trace_api.set_tracer_provider(TracerProvider(resource=Resource.create({})))
            target = trace_api.get_tracer_provider()
        if not isinstance(target, TracerProvider):
            logger.warning(
                "stepfork_otel: redact_all_spans needs an OpenTelemetry SDK TracerProvider; %s "
                "is not one, its spans are not redacted by stepfork",
                type(target).__name__,
            )
            return None
        return _put_first(_processors(target), "_span_processors", RedactingSpanProcessor, redactor)


class _Redacting(Protocol):
    def __init__(self, redactor: Callable[[], Redactor]) -> None: ...


_P = TypeVar("_P", bound=_Redacting)


_PATCHES = Patcher("the redacting processors put first")
"""Puts the redacting processors first in the SDK's private processor tuples (and could take
them out again: :meth:`~stepfork_otel._patching.Patcher.restore`)."""


def _put_first(multi: Any, field: str, kind: type[_P], redactor: Callable[[], Redactor]) -> _P:
    """The ``kind`` processor first in the SDK's processor tuple ``field`` of ``multi`` (the one
    there already, or a new one): it runs before every exporter's processor."""
    with multi._lock:
        current: Sequence[Any] = getattr(multi, field)
        for existing in current:
            if isinstance(existing, kind):
                return existing
        processor = kind(redactor)
        _PATCHES.put_first(multi, field, processor)
        return processor


# --- log records ------------------------------------------------------------------------------


def _redact_any(redactor: Redactor, key: str | None, value: Any) -> Any:
    """A log record's body or attribute value (any OTel ``AnyValue``: text, bytes, a sequence,
    a mapping), redacted as a payload under ``key`` (None: the body, under no key)."""
    if key is not None and not isinstance(value, (dict, list, tuple, bytes)):
        return _redact_value(redactor, key, value, True)
    if isinstance(value, bytes):
        return redactor.redact_bytes(value)
    if isinstance(value, str):
        return redactor.redact_text(value)
    if isinstance(value, (dict, list, tuple)):
        redacted = redactor.redact(value if key is None else {key: value})
        redacted = redacted if key is None else next(iter(redacted.values()))
        return tuple(redacted) if isinstance(value, tuple) else redacted
    return value


def redact_log_record(redactor: Redactor, record: ReadWriteLogRecord) -> None:
    """Replace a log record's body, attributes and event name by redacted copies, in place
    (``record``: the SDK's ``ReadWriteLogRecord``)."""
    log = record.log_record
    if log.body is not None:
        log.body = _redact_any(redactor, None, log.body)
    attributes: Any = log.attributes  # (the SDK's BoundedAttributes, mutable)
    if attributes:
        for key in list(attributes):
            if key in KEPT_ATTRIBUTES:
                continue
            value = attributes[key]
            redacted = _redact_any(redactor, key, value)
            if redacted is not value and redacted != value:
                attributes[key] = redacted
    name = getattr(log, "event_name", None)
    if isinstance(name, str) and name:
        log.event_name = redactor.redact_text(name)


class RedactingLogRecordProcessor(LogRecordProcessor):
    """The log-record twin of :class:`RedactingSpanProcessor`: redacts the body, attributes and
    event name of every log record before the processors after it (the application's
    ``BatchLogRecordProcessor`` and exporters) see it. Instrumentations send message content
    as log records -- ``opentelemetry-instrumentation-openai-v2`` does by default, without
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only`` -- while their spans are
    redacted by ``redact_all_spans``. Mutates the record it is given, as the span processor
    does: the SDK hands every processor the same ``ReadWriteLogRecord``."""

    def __init__(self, redactor: Callable[[], Redactor]) -> None:
        self._redactor = redactor

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        try:
            redact_log_record(self._redactor(), log_record)
        except Exception:  # never break the application's log pipeline
            logger.exception("stepfork_otel: could not redact a log record")

    def enabled(self, **_: Any) -> bool:
        return False  # (says nothing about whether a record is wanted: the others decide)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def enable_log_redaction(
    logger_provider: Any = None, redactor: Callable[[], Redactor] | None = None
) -> RedactingLogRecordProcessor | None:
    """Put a :class:`RedactingLogRecordProcessor` first on ``logger_provider`` (default: the
    global one, ``opentelemetry._logs.get_logger_provider()``). Idempotent. Returns the
    processor, or None when the provider is not an SDK ``LoggerProvider`` whose processors run
    one after the other (no SDK logging set up: no log record is exported, nothing to redact;
    a ``ConcurrentMultiLogRecordProcessor`` runs them at once, so none can go first: a warning
    is logged)."""
    if redactor is None:
        from stepfork_otel.config import CONFIG

        def redactor() -> Redactor:
            return CONFIG.settings.redactor

    with _install_lock:
        target = logger_provider if logger_provider is not None else logs_api.get_logger_provider()
        if not isinstance(target, LoggerProvider):
            if logger_provider is not None:
                logger.warning(
                    "stepfork_otel: log redaction needs an OpenTelemetry SDK LoggerProvider; %s "
                    "is not one, its log records are not redacted by stepfork",
                    type(target).__name__,
                )
            return None
        multi = target._multi_log_record_processor
        if not isinstance(multi, SynchronousMultiLogRecordProcessor):
            logger.warning(
                "stepfork_otel: the LoggerProvider runs its processors concurrently (%s); "
                "stepfork cannot redact its log records before they are exported",
                type(multi).__name__,
            )
            return None
        return _put_first(multi, "_log_record_processors", RedactingLogRecordProcessor, redactor)
