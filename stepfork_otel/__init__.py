"""stepfork_otel: record an AI agent's tool and LLM calls as OpenTelemetry spans, keep them as
`.sftrace` bundles, and replay them strictly.

This module only re-exports the public API; ``tests/test_public_api.py`` pins it.
"""

from __future__ import annotations

__version__ = "0.1.0"

from stepfork_otel.otel.otlp_json import ImportReport, OtlpImportError, iter_traces_from_otlp_json
from stepfork_otel.otel.processor import SftraceSpanProcessor
from stepfork_otel.otel.setup import configure
from stepfork_otel.record.boundaries import allm_request, llm_request, trace_tool
from stepfork_otel.record.run import RunRecorder, record
from stepfork_otel.replay.errors import (
    BundleIntegrityError,
    RecordedDependencyError,
    ReplayError,
    ReplayExhaustedError,
    ReplayMismatchError,
    ReplayModeError,
    ReplayPolicyError,
    ReplaySessionError,
)
from stepfork_otel.replay.session import ReplayResult, ReplaySession
from stepfork_otel.trace.bundle import BundleError, BundleVersionError
from stepfork_otel.trace.canonical import UnserialisableError, canonical_json, fingerprint
from stepfork_otel.trace.models import (
    ErrorEvent,
    LlmRequest,
    LlmResponse,
    RunInfo,
    ToolCall,
    ToolResult,
    Trace,
)
from stepfork_otel.trace.policy import ReplayMode, ReplayPolicy
from stepfork_otel.trace.redaction import Redactor, SecretPattern

__all__ = [
    "BundleError",
    "BundleIntegrityError",
    "BundleVersionError",
    "ErrorEvent",
    "ImportReport",
    "LlmRequest",
    "LlmResponse",
    "OtlpImportError",
    "RecordedDependencyError",
    "Redactor",
    "ReplayError",
    "ReplayExhaustedError",
    "ReplayMismatchError",
    "ReplayMode",
    "ReplayModeError",
    "ReplayPolicy",
    "ReplayPolicyError",
    "ReplayResult",
    "ReplaySession",
    "ReplaySessionError",
    "RunInfo",
    "RunRecorder",
    "SecretPattern",
    "SftraceSpanProcessor",
    "ToolCall",
    "ToolResult",
    "Trace",
    "UnserialisableError",
    "__version__",
    "allm_request",
    "canonical_json",
    "configure",
    "fingerprint",
    "iter_traces_from_otlp_json",
    "llm_request",
    "record",
    "trace_tool",
]
