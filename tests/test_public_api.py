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
}


def test_public_api_is_pinned() -> None:
    assert set(stepfork_otel.__all__) == EXPECTED
    assert set(stepfork_otel._EXPORTS) == EXPECTED - {"__version__"}  # every name loads lazily
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
    assert issubclass(stepfork_otel.NetworkRefusedError, ReplayPolicyError)
    assert issubclass(stepfork_otel.BundleIntegrityError, stepfork_otel.BundleError)
    assert issubclass(stepfork_otel.BundleIntegrityError, ReplayError)


def test_import_is_light() -> None:
    """`import stepfork_otel` (also what the pytest11 entry point costs every pytest run) loads
    neither the OpenTelemetry SDK nor pydantic until the API is used."""
    import subprocess
    import sys

    code = (
        "import sys, stepfork_otel.pytest_plugin; "
        "print(sorted(m for m in ('opentelemetry.sdk.trace', 'pydantic', 'orjson') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_record_is_the_function_and_subpackages_import_normally() -> None:
    """`record` is the public function; the recording code lives in `stepfork_otel.recording`,
    so importing a submodule by its dotted path works in every form (`record()` itself is in
    `stepfork_otel.otel.run`: it attaches the SDK processor)."""
    import subprocess
    import sys

    code = (
        "import stepfork_otel.recording.boundaries as b; "
        "from stepfork_otel import record; import stepfork_otel as s; "
        "print(record.__module__, s.record is record, b.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "stepfork_otel.otel.run",
        "True",
        "stepfork_otel.recording.boundaries",
    ]
