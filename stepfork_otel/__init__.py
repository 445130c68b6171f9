"""stepfork_otel: record an AI agent's tool and LLM calls as OpenTelemetry spans, keep them as
`.sftrace` bundles, and replay them strictly.

This module only re-exports the public API; ``tests/test_public_api.py`` pins it. The names are
loaded on first use (PEP 562): ``import stepfork_otel`` -- which the ``stepfork`` command and the
pytest plugin entry point also trigger in every pytest run -- then costs almost nothing until the
API is used.

It also wires the one thing a lower layer needs of a layer it may not import: a replay session
records a fork (``ReplaySession.from_trace(..., fork_at=N, record_to=...)``) with ``otel/``'s
run recorder, provided here by name (:func:`stepfork_otel._lazy.provide`; nothing is imported).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepfork_otel import _lazy
from stepfork_otel._version import __version__

_lazy.provide("fork recorder", "stepfork_otel.otel.run:fork_recorder")

if TYPE_CHECKING:
    from stepfork_otel.otel.processor import SftraceSpanProcessor
    from stepfork_otel.otel.run import RunRecorder, record
    from stepfork_otel.otel.setup import configure
    from stepfork_otel.recording.boundaries import allm_request, llm_request, trace_tool
    from stepfork_otel.recording.integrations import (
        instrument_anthropic,
        instrument_openai,
        uninstrument_anthropic,
        uninstrument_openai,
    )
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
    from stepfork_otel.replay.network import NetworkRefusedError
    from stepfork_otel.replay.results import ReplayResult
    from stepfork_otel.replay.session import ReplaySession
    from stepfork_otel.trace.canonical import UnserialisableError, canonical_json, fingerprint
    from stepfork_otel.trace.errors import BundleError, BundleVersionError
    from stepfork_otel.trace.models import (
        ErrorEvent,
        LlmRequest,
        LlmResponse,
        RunInfo,
        ToolCall,
        ToolResult,
        Trace,
    )
    from stepfork_otel.trace.otlp import (
        ImportReport,
        OtlpImportError,
        iter_traces_from_otlp_json,
    )
    from stepfork_otel.trace.policy import ReplayMode, ReplayPolicy
    from stepfork_otel.trace.redaction import Redactor, SecretPattern

#: Where each public name lives.
_EXPORTS: dict[str, str] = {
    "BundleError": "stepfork_otel.trace.errors",
    "BundleIntegrityError": "stepfork_otel.replay.errors",
    "BundleVersionError": "stepfork_otel.trace.errors",
    "ErrorEvent": "stepfork_otel.trace.models",
    "ImportReport": "stepfork_otel.trace.otlp",
    "LlmRequest": "stepfork_otel.trace.models",
    "LlmResponse": "stepfork_otel.trace.models",
    "OtlpImportError": "stepfork_otel.trace.otlp",
    "RecordedDependencyError": "stepfork_otel.replay.errors",
    "Redactor": "stepfork_otel.trace.redaction",
    "ReplayError": "stepfork_otel.replay.errors",
    "ReplayExhaustedError": "stepfork_otel.replay.errors",
    "ReplayMismatchError": "stepfork_otel.replay.errors",
    "ReplayMode": "stepfork_otel.trace.policy",
    "ReplayModeError": "stepfork_otel.replay.errors",
    "ReplayPolicy": "stepfork_otel.trace.policy",
    "ReplayPolicyError": "stepfork_otel.replay.errors",
    "ReplayResult": "stepfork_otel.replay.results",
    "ReplaySession": "stepfork_otel.replay.session",
    "ReplaySessionError": "stepfork_otel.replay.errors",
    "NetworkRefusedError": "stepfork_otel.replay.network",
    "RunInfo": "stepfork_otel.trace.models",
    "RunRecorder": "stepfork_otel.otel.run",
    "SecretPattern": "stepfork_otel.trace.redaction",
    "SftraceSpanProcessor": "stepfork_otel.otel.processor",
    "ToolCall": "stepfork_otel.trace.models",
    "ToolResult": "stepfork_otel.trace.models",
    "Trace": "stepfork_otel.trace.models",
    "UnserialisableError": "stepfork_otel.trace.canonical",
    "allm_request": "stepfork_otel.recording.boundaries",
    "canonical_json": "stepfork_otel.trace.canonical",
    "configure": "stepfork_otel.otel.setup",
    "fingerprint": "stepfork_otel.trace.canonical",
    "instrument_anthropic": "stepfork_otel.recording.integrations",
    "instrument_openai": "stepfork_otel.recording.integrations",
    "iter_traces_from_otlp_json": "stepfork_otel.trace.otlp",
    "llm_request": "stepfork_otel.recording.boundaries",
    "record": "stepfork_otel.otel.run",
    "trace_tool": "stepfork_otel.recording.boundaries",
    "uninstrument_anthropic": "stepfork_otel.recording.integrations",
    "uninstrument_openai": "stepfork_otel.recording.integrations",
}


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "BundleError",
    "BundleIntegrityError",
    "BundleVersionError",
    "ErrorEvent",
    "ImportReport",
    "LlmRequest",
    "LlmResponse",
    "NetworkRefusedError",
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
    "instrument_anthropic",
    "instrument_openai",
    "iter_traces_from_otlp_json",
    "llm_request",
    "record",
    "trace_tool",
    "uninstrument_anthropic",
    "uninstrument_openai",
]
