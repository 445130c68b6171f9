"""Recording configuration: one object, built once, changed through :func:`stepfork_otel.configure`.

:class:`RecordingSettings` says *how* boundaries record (redaction rules, the span payload cap,
content capture); :class:`RecordingConfig` holds the settings in force and the tracer that
boundary spans are started on. The process has one :data:`CONFIG`; the parts that need settings
are handed a config (the bundle processor, replay sessions) or read the process's one at call
time (the boundaries, which users call as plain functions). Nothing reaches into it: settings are
replaced whole (:meth:`RecordingConfig.update`) and tests start from defaults with
:meth:`RecordingConfig.reset`, never by assigning module attributes.

Only the OpenTelemetry *API* is imported here: which provider the tracer comes from is decided by
``stepfork_otel.otel.setup`` (:meth:`RecordingConfig.use_tracer_provider`), lazily, the first time
a span is needed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace as trace_api

from stepfork_otel._version import __version__
from stepfork_otel.constants import DEFAULT_MAX_SPAN_PAYLOAD_BYTES, INSTRUMENTATION_NAME
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR, Redactor


@dataclass(frozen=True)
class RecordingSettings:
    """How boundaries record. Immutable: a change makes a new one."""

    redactor: Redactor = DEFAULT_REDACTOR
    """Redaction rules applied to every payload, exception message and span name kept."""
    max_span_payload_bytes: int = DEFAULT_MAX_SPAN_PAYLOAD_BYTES
    """Payloads larger than this (canonical JSON bytes) are left off the span (hash, size and
    preview stay); the local bundle keeps them whole."""
    capture_content: bool = True
    """When False, no payload text goes on spans (fingerprints and sizes do); bundles keep them."""
    capture: tuple[str, ...] = ()
    """What runs capture by default (``configure(capture=...)``): clock, randomness, uuid,
    secrets and environment reads, ``("all",)`` or ``("audit",)``; ``record(capture=...)`` overrides."""
    capture_packages: tuple[str, ...] = ()
    """Packages whose reads count as the run's own code even where they are installed
    (``site-packages``): an agent deployed as a package (``configure(capture_packages=...)``)."""


class RecordingConfig:
    """The settings in force and the tracer for boundary spans. Thread-safe; reads take no lock
    (an attribute read is atomic, and settings are immutable)."""

    def __init__(self, settings: RecordingSettings | None = None) -> None:
        self._lock = threading.Lock()
        self._settings = settings or RecordingSettings()
        self._tracer_provider: trace_api.TracerProvider | None = None
        self._tracer: trace_api.Tracer | None = None

    @property
    def settings(self) -> RecordingSettings:
        return self._settings

    def update(self, **changes: Any) -> RecordingSettings:
        """Replace the named settings (see :class:`RecordingSettings`); returns the new ones."""
        with self._lock:
            self._settings = replace(self._settings, **changes)
            return self._settings

    def use_tracer_provider(self, provider: trace_api.TracerProvider | None) -> None:
        """Start boundary spans on ``provider`` (None: the global provider)."""
        with self._lock:
            self._tracer_provider = provider
            self._tracer = None

    def tracer(self) -> trace_api.Tracer:
        current = self._tracer
        if current is None:
            provider = self._tracer_provider or trace_api.get_tracer_provider()
            current = self._tracer = provider.get_tracer(INSTRUMENTATION_NAME, __version__)
        return current

    def reset(self) -> None:
        """Back to the defaults: default settings, the global tracer provider."""
        with self._lock:
            self._settings = RecordingSettings()
            self._tracer_provider = None
            self._tracer = None


CONFIG = RecordingConfig()
"""The process's recording configuration."""
