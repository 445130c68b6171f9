"""Pins the public surface: nothing leaks into, or vanishes from, ``stepfork_otel.__all__``."""

from __future__ import annotations

import stepfork_otel

EXPECTED = {
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
}


def test_public_api_is_pinned() -> None:
    assert set(stepfork_otel.__all__) == EXPECTED
    for name in stepfork_otel.__all__:
        assert hasattr(stepfork_otel, name), name


def test_error_hierarchy() -> None:
    from stepfork_otel import (
        RecordedDependencyError,
        ReplayError,
        ReplayExhaustedError,
        ReplayMismatchError,
        ReplayPolicyError,
    )

    assert issubclass(ReplayMismatchError, ReplayError)
    assert issubclass(ReplayExhaustedError, ReplayMismatchError)
    assert issubclass(ReplayPolicyError, ReplayError)
    assert issubclass(RecordedDependencyError, ReplayError)
    assert not issubclass(ReplayPolicyError, ReplayMismatchError)
    assert issubclass(stepfork_otel.ReplayModeError, ReplayError)
    assert issubclass(stepfork_otel.ReplayModeError, ValueError)
    assert issubclass(stepfork_otel.ReplaySessionError, ReplayError)
    assert issubclass(stepfork_otel.BundleIntegrityError, stepfork_otel.BundleError)
    assert issubclass(stepfork_otel.BundleIntegrityError, ReplayError)
