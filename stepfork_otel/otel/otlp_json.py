"""Where the OTLP JSON importer used to live; it is now :mod:`stepfork_otel.trace.otlp` (it needs
no OpenTelemetry library, so it belongs with the bundle format). Kept so that imports written
against the documented ``stepfork_otel.otel.otlp_json`` keep working."""

from __future__ import annotations

from stepfork_otel.trace.otlp import (
    MAX_WHOLE_FILE_BYTES,
    ImportProblem,
    ImportReport,
    OtlpImportError,
    OtlpSource,
    decode_any_value,
    decode_attributes,
    iter_traces_from_otlp_json,
    trace_from_otlp_json,
)

__all__ = [
    "MAX_WHOLE_FILE_BYTES",
    "ImportProblem",
    "ImportReport",
    "OtlpImportError",
    "OtlpSource",
    "decode_any_value",
    "decode_attributes",
    "iter_traces_from_otlp_json",
    "trace_from_otlp_json",
]
