"""Attaching stepfork to OpenTelemetry: ``configure()`` and the embedded default provider.

Three situations, three behaviours:

* **The application's provider can take span processors**: an SDK ``TracerProvider`` (its own
  exporters, sampler, resource), or anything that wraps one and has ``add_span_processor`` --
  logfire's ``ProxyTracerProvider``, Phoenix's ``register()``, the provider that
  ``opentelemetry-instrument`` configures. stepfork adds a :class:`SftraceSpanProcessor` to it
  and nothing else, beside the processors already there (Phoenix's provider replaces its own
  exporter on ``add_span_processor`` unless passed ``replace_default_processor=False``: stepfork
  passes it whenever the method takes it). Its exporters receive the stepfork spans too, in the
  application's traces. The test is by capability, not by class: logfire's provider is not an
  SDK ``TracerProvider`` subclass, and checking the class left it on a private provider, with no
  stepfork span reaching logfire and no bundle for runs inside logfire's spans.
* **No provider is set yet** (the API's proxy provider): stepfork installs the *embedded default*,
  an SDK ``TracerProvider`` with the bundle processor and no exporter (no network). The
  application can still add processors to it (``trace.get_tracer_provider().add_span_processor``).
* **A provider that cannot take processors** (an explicit ``NoOpTracerProvider``, a vendor's own
  implementation without ``add_span_processor``): stepfork then records on a *private* SDK
  provider, so bundles are still written, and logs a warning: those spans do not reach the
  application's provider or exporters. This is the only case where attaching is impossible.

``docs/otel-setups.md`` has the exact lines for each set-up and its pitfalls.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from collections.abc import Collection, Iterable
from pathlib import Path

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from stepfork_otel.config import CONFIG
from stepfork_otel.otel.processor import SftraceSpanProcessor
from stepfork_otel.otel.redacting import enable_log_redaction, enable_span_redaction
from stepfork_otel.recording.determinism import capture_groups, package_names
from stepfork_otel.trace.redaction import Redactor

logger = logging.getLogger("stepfork_otel")
_lock = threading.RLock()
#: The bundle processor that ``record(...)`` and ``configure()`` use (None until configured).
_processor: SftraceSpanProcessor | None = None


def takes_span_processors(provider: object) -> bool:
    """Whether ``provider`` can take a span processor (duck typing: ``add_span_processor``)."""
    return callable(getattr(provider, "add_span_processor", None))


def _add_processor(provider: object, processor: SftraceSpanProcessor) -> None:
    """Add the bundle processor beside the provider's own processors, never instead of one."""
    add = provider.add_span_processor  # type: ignore[attr-defined]
    try:
        keywords: Collection[str] = inspect.signature(add).parameters
    except (TypeError, ValueError):  # a builtin or C method without a signature
        keywords = ()
    if "replace_default_processor" in keywords:
        # phoenix.otel's provider drops its own exporter on the first add unless told not to:
        # with the default, register(...) followed by configure() sent nothing to Phoenix.
        add(processor, replace_default_processor=False)
    else:
        add(processor)


def _attach(provider: trace_api.TracerProvider | None, processor: SftraceSpanProcessor) -> None:
    target = provider if provider is not None else trace_api.get_tracer_provider()
    if takes_span_processors(target):
        _add_processor(target, processor)
        CONFIG.use_tracer_provider(provider)
        return
    if provider is None and isinstance(target, trace_api.ProxyTracerProvider):
        embedded = TracerProvider(resource=Resource.create({}))
        embedded.add_span_processor(processor)
        trace_api.set_tracer_provider(embedded)
        if trace_api.get_tracer_provider() is embedded:
            CONFIG.use_tracer_provider(None)
            return
        target = trace_api.get_tracer_provider()  # another thread won the race: use theirs
        if takes_span_processors(target):
            _add_processor(target, processor)
            CONFIG.use_tracer_provider(None)
            return
    logger.warning(
        "stepfork_otel: the tracer provider %s is not an OpenTelemetry SDK TracerProvider and "
        "has no add_span_processor; recording on a private SDK provider (bundles are written, "
        "but stepfork spans do not reach this provider's exporters)",
        type(target).__name__,
    )
    private = TracerProvider(resource=Resource.create({}))
    private.add_span_processor(processor)
    CONFIG.use_tracer_provider(private)


def configure(
    directory: str | Path | None = None,
    *,
    tracer_provider: trace_api.TracerProvider | None = None,
    redactor: Redactor | None = None,
    max_span_payload_bytes: int | None = None,
    capture_content: bool | None = None,
    max_open_traces: int | None = None,
    max_spans_per_trace: int | None = None,
    redact_all_spans: bool | None = None,
    flush_interval: float | None = None,
    fsync_interval: float | None = None,
    capture: str | Iterable[str] | None = None,
    capture_packages: str | Iterable[str] | None = None,
) -> SftraceSpanProcessor:
    """Attach stepfork to OpenTelemetry and set recording options; returns the bundle processor.

    ``directory``: where every trace holding boundary spans is written as ``<trace_id>.sftrace``
    -- as its calls end, complete when its local root span ends (``record(path)`` runs go to
    their own path). Calling
    ``configure`` again replaces the options and, if ``directory`` or ``tracer_provider`` is given,
    the processor. ``max_open_traces`` (default 1000) and ``max_spans_per_trace`` (default
    10,000; for a run, spans open at once: its bundle is written as it goes) are safety valves on
    the processor's memory, logged when they act (see :class:`SftraceSpanProcessor`).
    ``redact_all_spans``: also redact, with the same rules, the attributes, events and status of
    *every* span of the provider before any processor exports it -- spans of other
    instrumentations (OpenAI, OpenInference, HTTP clients) included (see
    :mod:`stepfork_otel.otel.redacting`) -- and the log records of the global SDK
    ``LoggerProvider`` when one is set (for another provider, or one set later:
    ``stepfork_otel.otel.redacting.enable_log_redaction(logger_provider)``).
    ``flush_interval`` (default 1 s; 0: as each call ends) bounds how long a finished call may
    wait in memory before its run's bundle, written as the run goes, has it on disk (what a
    ``SIGKILL`` can lose); ``fsync_interval`` (default 1 s; 0: every write; ``math.inf``: never)
    what a power cut can lose on top (see ``docs/guarantees.md``).
    ``capture``: what every run captures unless ``record(capture=...)`` says otherwise --
    ``"time"``, ``"random"``, ``"uuid"``, ``"secrets"``, ``"env"``, ``"all"`` or ``"audit"`` (see
    :mod:`stepfork_otel.recording.determinism`); ``()`` captures nothing again.
    ``capture_packages``: the import names of your own packages (``"my_agent"``, covering
    ``my_agent.*``) whose reads are captured even when they run from ``site-packages`` -- an
    agent deployed as an installed package; code installed there is otherwise a library's, and
    its reads are not the run's. Set the same in the process that replays (``()``: none again).
    """
    for name, cap in (
        ("max_open_traces", max_open_traces),
        ("max_spans_per_trace", max_spans_per_trace),
    ):
        if cap is not None and cap < 1:
            raise ValueError(f"{name} must be >= 1")
    for name, interval in (("flush_interval", flush_interval), ("fsync_interval", fsync_interval)):
        if interval is not None and not interval >= 0:
            raise ValueError(f"{name} must be >= 0 seconds")
    if flush_interval is not None and math.isinf(flush_interval):
        raise ValueError("flush_interval must be finite")
    durability: dict[str, float | None] = {}
    if flush_interval is not None:
        durability["flush_interval"] = flush_interval
    if fsync_interval is not None:
        durability["fsync_interval"] = None if math.isinf(fsync_interval) else fsync_interval
    changes: dict[str, object] = {}
    if redactor is not None:
        changes["redactor"] = redactor
    if max_span_payload_bytes is not None:
        if max_span_payload_bytes < 0:
            raise ValueError("max_span_payload_bytes must be >= 0")
        changes["max_span_payload_bytes"] = max_span_payload_bytes
    if capture_content is not None:
        changes["capture_content"] = capture_content
    if capture is not None:
        capture_groups(capture)  # a wrong name is refused here, not at the first run
        changes["capture"] = (capture,) if isinstance(capture, str) else tuple(capture)
    if capture_packages is not None:
        changes["capture_packages"] = package_names(capture_packages)
    if changes:
        CONFIG.update(**changes)
    if redact_all_spans:
        enable_span_redaction(tracer_provider)
        enable_log_redaction()  # (the global LoggerProvider, when it is an SDK one)
    global _processor
    with _lock:
        current = _processor
        if current is not None and directory is None and tracer_provider is None:
            if max_open_traces is not None:
                current.max_open_traces = max_open_traces
            if max_spans_per_trace is not None:
                current.max_spans_per_trace = max_spans_per_trace
            for name, value in durability.items():
                setattr(current, name, value)
            return current
        if current is not None:
            current.shutdown()  # detaches from the hand-off; the provider keeps a no-op
        processor = SftraceSpanProcessor(
            directory,
            max_open_traces=1000 if max_open_traces is None else max_open_traces,
            max_spans_per_trace=10_000 if max_spans_per_trace is None else max_spans_per_trace,
            **durability,  # type: ignore[arg-type]
        )
        _attach(tracer_provider, processor)
        _processor = processor
        return processor


def ensure_bundle_processor() -> SftraceSpanProcessor:
    """The configured bundle processor, configuring the defaults first if needed."""
    processor = _processor
    return processor if processor is not None else configure()


def reset() -> None:
    """Undo ``configure()``: shut the bundle processor down (it stays on its provider as a
    no-op) and go back to the default recording settings and the global tracer provider. For
    tests, and for a program that wants to start over."""
    global _processor
    with _lock:
        processor, _processor = _processor, None
        if processor is not None:
            processor.shutdown()
        CONFIG.reset()
