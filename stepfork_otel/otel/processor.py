"""``SftraceSpanProcessor``: turns each finished run into a `.sftrace` bundle.

It buffers finished spans by trace id. When a *bundle root* ends -- the run span opened by
``record(...)``, or the local root of a trace (no parent, or a remote parent) -- it converts the
buffered spans with the one span -> event conversion and writes the bundle atomically, if the trace
holds any boundary span. The user's own spans in the trace are kept as context.

Design choices, and why:

* It never raises into the program and never blocks on anything but the bundle write itself
  (done in ``on_end`` of the root, so the file exists when ``with record(...)`` returns).
  Instrumentation is suppressed while it writes.
* Memory is bounded: at most ``max_open_traces`` traces and ``max_spans_per_trace`` spans per trace
  are buffered; beyond that spans are dropped, counted in :attr:`stats`, and a warning is logged
  (once per trace). A bundle from a trace that lost spans says so (``dropped_spans``, incomplete).
* ``force_flush``/``shutdown`` write every open trace that holds boundary spans, marked incomplete,
  so a run cut short (or a process shutting down) still leaves a bundle that loads and says so.
* Full payloads come from the boundaries through an in-process side channel, so a payload left
  off the span (size cap, capture off) or cut by an ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` is still
  whole in the local bundle.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import context as context_api
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors
from stepfork_otel.otel.conversion import SpanRecord, spans_to_trace
from stepfork_otel.record import boundaries
from stepfork_otel.record.payload import Payload
from stepfork_otel.trace.bundle import save_trace

logger = logging.getLogger("stepfork_otel")

#: The API's suppression key (set while the processor writes, so nothing it does is traced).
_SUPPRESS_KEY = getattr(context_api, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")


def span_record(span: ReadableSpan, payloads: Mapping[str, Payload] | None = None) -> SpanRecord:
    """Describe an SDK span for the conversion (the processor's side of the one conversion)."""
    ctx = span.get_span_context()
    parent = span.parent
    return SpanRecord(
        trace_id=format(ctx.trace_id, "032x") if ctx else "0" * 32,
        span_id=format(ctx.span_id, "016x") if ctx else "0" * 16,
        parent_span_id=format(parent.span_id, "016x") if parent is not None else None,
        name=span.name,
        kind=span.kind.name,
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time,
        status=span.status.status_code.name.lower(),
        attributes=dict(span.attributes or {}),
        payloads=dict(payloads or {}),
    )


@dataclass
class _OpenTrace:
    ended: list[tuple[ReadableSpan, dict[str, Payload]]] = field(default_factory=list)
    open: dict[int, Span] = field(default_factory=dict)
    dropped: int = 0
    has_boundary: bool = False


@dataclass
class ProcessorStats:
    """Counters, for health checks and tests."""

    bundles_written: int = 0
    dropped_spans: int = 0
    dropped_traces: int = 0
    write_errors: int = 0


class SftraceSpanProcessor(SpanProcessor):
    """Writes one bundle per run. Add it to any SDK ``TracerProvider`` (``configure()`` does)."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        max_open_traces: int = 1000,
        max_spans_per_trace: int = 10_000,
        compress: bool = False,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_open_traces = max_open_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.compress = compress
        self.stats = ProcessorStats()
        self._lock = threading.Lock()
        self._traces: dict[int, _OpenTrace] = {}
        self._destinations: dict[int, Path] = {}
        self._shutdown = False
        with boundaries._side_lock:
            boundaries.side_channel_listeners += 1

    # -- destinations ----------------------------------------------------------------------------

    def _default_path(self, trace_id: int, directory: Path | None) -> Path:
        suffix = k.BUNDLE_SUFFIX + (".gz" if self.compress else "")
        return (directory or self.directory or Path("traces")) / f"{trace_id:032x}{suffix}"

    def set_destination(self, trace_id: int, destination: str | os.PathLike[str] | None) -> Path:
        """Where the bundle of ``trace_id`` goes: a file, or a directory (named by trace id)."""
        if destination is None:
            path = self._default_path(trace_id, None)
        else:
            path = Path(destination)
            if path.is_dir():
                path = self._default_path(trace_id, path)
        with self._lock:
            self._destinations[trace_id] = path
        return path

    # -- SpanProcessor ---------------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        with handle_internal_errors("tracking a started span"):
            ctx = span.get_span_context()
            if ctx is None or self._shutdown:
                return
            with self._lock:
                entry = self._traces.get(ctx.trace_id)
                if entry is None:
                    if len(self._traces) >= self.max_open_traces:
                        self.stats.dropped_traces += 1
                        self._warn_dropped_trace(ctx.trace_id)
                        return
                    entry = self._traces[ctx.trace_id] = _OpenTrace()
                if len(entry.open) + len(entry.ended) >= self.max_spans_per_trace:
                    return
                entry.open[ctx.span_id] = span

    def on_end(self, span: ReadableSpan) -> None:
        with handle_internal_errors("buffering a finished span"):
            ctx = span.get_span_context()
            if ctx is None:
                return
            with boundaries._side_lock:
                payloads = boundaries.side_payloads.pop(ctx.span_id, {})
            attributes = span.attributes or {}
            kind = attributes.get(k.KIND)
            is_bundle_root = span.parent is None or span.parent.is_remote or kind == k.KIND_RUN
            with self._lock:
                entry = self._traces.get(ctx.trace_id)
                if entry is None:
                    return  # dropped at start (too many open traces) or after shutdown
                entry.open.pop(ctx.span_id, None)
                if len(entry.ended) >= self.max_spans_per_trace:
                    entry.dropped += 1
                    self.stats.dropped_spans += 1
                    if entry.dropped == 1:
                        logger.warning(
                            "stepfork_otel: trace %032x exceeded %d spans; further spans dropped",
                            ctx.trace_id,
                            self.max_spans_per_trace,
                        )
                else:
                    entry.ended.append((span, payloads))
                    entry.has_boundary = entry.has_boundary or kind in (
                        k.KIND_TOOL,
                        k.KIND_LLM,
                        k.KIND_RUN,
                    )
                if not is_bundle_root:
                    return
                del self._traces[ctx.trace_id]
                destination = self._destinations.pop(ctx.trace_id, None)
            if entry.has_boundary:
                self._write(
                    ctx.trace_id,
                    entry,
                    destination,
                    complete=entry.dropped == 0,
                    reason=f"{entry.dropped} spans dropped (per-trace cap)"
                    if entry.dropped
                    else None,
                )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write every open trace that holds boundary spans, marked incomplete."""
        with handle_internal_errors("flushing open traces"):
            with self._lock:
                pending = [
                    (trace_id, entry, self._destinations.pop(trace_id, None))
                    for trace_id, entry in self._traces.items()
                    if entry.has_boundary
                    or any((s.attributes or {}).get(k.KIND) for s in entry.open.values())
                ]
                for trace_id, _, _ in pending:
                    del self._traces[trace_id]
            for trace_id, entry, destination in pending:
                self._write(
                    trace_id,
                    entry,
                    destination,
                    complete=False,
                    reason="the run had not finished when the processor was flushed",
                )
        return True

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self.force_flush()
        self._shutdown = True
        with boundaries._side_lock:
            boundaries.side_channel_listeners -= 1

    # -- writing ---------------------------------------------------------------------------------

    def _write(
        self,
        trace_id: int,
        entry: _OpenTrace,
        destination: Path | None,
        *,
        complete: bool,
        reason: str | None,
    ) -> None:
        if destination is None and self.directory is None:
            return  # not a record(...) run and no directory configured: nothing to write
        token = context_api.attach(context_api.set_value(_SUPPRESS_KEY, True))
        try:
            records = [span_record(span, payloads) for span, payloads in entry.ended]
            with boundaries._side_lock:
                for span_id in entry.open:
                    payloads = boundaries.side_payloads.pop(span_id, {})
                    records.append(span_record(entry.open[span_id], payloads))
            trace = spans_to_trace(
                records, complete=complete, incomplete_reason=reason, dropped_spans=entry.dropped
            )
            save_trace(trace, destination or self._default_path(trace_id, None))
            self.stats.bundles_written += 1
        except Exception:
            self.stats.write_errors += 1
            raise
        finally:
            context_api.detach(token)

    def _warn_dropped_trace(self, trace_id: int) -> None:
        if self.stats.dropped_traces in (1, 10, 100) or self.stats.dropped_traces % 1000 == 0:
            logger.warning(
                "stepfork_otel: %d open traces already buffered; trace %032x not recorded "
                "(%d traces dropped so far)",
                self.max_open_traces,
                trace_id,
                self.stats.dropped_traces,
            )
