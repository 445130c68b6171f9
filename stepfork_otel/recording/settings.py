"""Process-wide recording settings, changed through :func:`stepfork_otel.configure`.

The boundaries import only the OpenTelemetry *API*; which provider they end up on is decided
here, lazily, the first time a span is needed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace as trace_api

from stepfork_otel.constants import DEFAULT_MAX_SPAN_PAYLOAD_BYTES, INSTRUMENTATION_NAME
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, Redactor

if TYPE_CHECKING:
    from stepfork_otel.otel.processor import SftraceSpanProcessor


@dataclass(frozen=True)
class RecordingSettings:
    """How boundaries record. Immutable; :func:`stepfork_otel.configure` swaps in a new one."""

    redactor: Redactor = DEFAULT_REDACTOR
    """Redaction rules applied to every payload and exception message."""
    max_span_payload_bytes: int = DEFAULT_MAX_SPAN_PAYLOAD_BYTES
    """Payloads larger than this (canonical JSON bytes) are left off the span (hash, size and
    preview stay); the local bundle keeps them whole."""
    capture_content: bool = True
    """When False, no payload text goes on spans (fingerprints and sizes do); bundles keep them."""


_lock = threading.Lock()
_settings = RecordingSettings()
_tracer_provider: trace_api.TracerProvider | None = None
_tracer: trace_api.Tracer | None = None
#: The bundle processor that ``record(...)`` and ``configure()`` use (None until configured).
bundle_processor: SftraceSpanProcessor | None = None


def settings() -> RecordingSettings:
    return _settings


def update_settings(**changes: Any) -> RecordingSettings:
    global _settings
    with _lock:
        _settings = replace(_settings, **changes)
    return _settings


def set_tracer_provider(provider: trace_api.TracerProvider | None) -> None:
    """Make stepfork's spans go to ``provider`` (None: the global provider)."""
    global _tracer_provider, _tracer
    with _lock:
        _tracer_provider = provider
        _tracer = None


def tracer() -> trace_api.Tracer:
    global _tracer
    current = _tracer
    if current is None:
        from stepfork_otel import __version__

        provider = _tracer_provider or trace_api.get_tracer_provider()
        current = _tracer = provider.get_tracer(INSTRUMENTATION_NAME, __version__)
    return current
