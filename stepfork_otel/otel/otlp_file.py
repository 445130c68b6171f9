"""Spans written as OTLP JSON lines, exactly as the OpenTelemetry Collector's ``file`` exporter
writes them (``format: json``).

The collector's file exporter writes one ``TracesData`` object per batch, one per line, in the
OTLP/JSON encoding: camelCase field names, trace and span ids as *hex* strings, 64-bit integers as
decimal strings, enums as numbers, default values left out. Protobuf's own JSON mapping
(``json_format.MessageToDict``) is the same except for the ids, which it writes as base64 -- so this
module encodes spans with the OTLP exporter's own protobuf encoder, maps the message with protobuf,
and rewrites the ids as hex. Going through the real encoder keeps the output honest: whatever the
exporter puts on the wire is what ends up in the file.

Two uses: the loopback OTLP receiver of the tests writes what it received with
:func:`request_to_json_line`, and :class:`OtlpJsonFileExporter` lets an application without a
collector write the same file itself (``stepfork import`` reads both the same way).
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from stepfork_otel._internal import handle_internal_errors

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in _ID_FIELDS:
        value = obj.get(key)
        if isinstance(value, str):
            obj[key] = base64.b64decode(value).hex()


def request_to_dict(message: Any) -> dict[str, Any]:
    """A ``TracesData``/``ExportTraceServiceRequest`` message as the collector's file exporter
    writes it (a dict ready for JSON)."""
    data: dict[str, Any] = json_format.MessageToDict(message, use_integers_for_enums=True)
    for resource_spans in data.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return data


def request_to_json_line(message: Any) -> bytes:
    """One line of the collector's file exporter output (compact JSON and a newline)."""
    return orjson.dumps(request_to_dict(message)) + b"\n"


class OtlpJsonFileExporter(SpanExporter):
    """A span exporter writing the collector's file-exporter format (OTLP JSON lines) itself.

    Each export call appends one line holding that batch, so spans of one trace spread over lines
    exactly as they do behind a collector. Use it with a ``BatchSpanProcessor`` when there is no
    collector; ``stepfork import`` reads the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._handle = self.path.open("ab")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = SpanExportResult.FAILURE
        with handle_internal_errors("writing spans as OTLP JSON"):
            line = request_to_json_line(encode_spans(spans))
            with self._lock:
                if self._handle.closed:
                    return SpanExportResult.FAILURE
                self._handle.write(line)
                self._handle.flush()
            result = SpanExportResult.SUCCESS
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if not self._handle.closed:
                self._handle.flush()
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._handle.close()
