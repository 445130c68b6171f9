"""``configure()`` and ``record()`` against the process-wide OpenTelemetry provider.

The global provider can be set only once per process, so each situation runs in a fresh
subprocess: no provider yet (the embedded default), the application's own SDK provider and
exporter, and a provider that is not the SDK's."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_for_json
from conftest import Recording

from stepfork_otel import SftraceSpanProcessor, configure
from stepfork_otel.config import CONFIG

PRELUDE = """
import json, logging, sys, warnings
warnings.simplefilter("error")
import stepfork_otel._internal as internal
internal.RAISE_INTERNAL_ERRORS = True
from pathlib import Path
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from stepfork_otel import Trace, configure, llm_request, record, trace_tool

OUT = Path(sys.argv[1])

@trace_tool
def lookup(key: str) -> str:
    return key.upper()

def report(**values):
    print(json.dumps(values))
"""


def run_script(tmp_path: Path, body: str) -> dict[str, Any]:
    script = PRELUDE + textwrap.dedent(body)
    values, result = run_for_json([sys.executable, "-c", script, str(tmp_path)])
    values["stderr"] = result.stderr
    return values


def test_record_with_no_prior_configuration(tmp_path: Path) -> None:
    out = run_script(
        tmp_path,
        """
        assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
        with record(OUT / "first.sftrace", input={"q": 1}) as run:
            run.set_output(lookup("a"))
        provider = trace.get_tracer_provider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))  # still possible afterwards
        with record(OUT / "second.sftrace"):
            lookup("b")
        first = Trace.load(OUT / "first.sftrace")
        report(
            provider=type(provider).__module__ + "." + type(provider).__name__,
            first_calls=[c.input for c in first.calls],
            first_output=first.run.output,
            exported=sorted(s.name for s in exporter.get_finished_spans()),
            second_calls=[c.input for c in Trace.load(OUT / "second.sftrace").calls],
        )
        """,
    )
    assert out["provider"] == "opentelemetry.sdk.trace.TracerProvider"
    assert out["first_calls"] == ['{"key":"a"}']
    assert out["first_output"] == '"A"'
    assert out["exported"] == ["execute_tool lookup", "invoke_agent agent"]
    assert out["second_calls"] == ['{"key":"b"}']


def test_configure_adds_to_the_applications_own_provider(tmp_path: Path) -> None:
    out = run_script(
        tmp_path,
        """
        provider = TracerProvider()
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        configure(directory=OUT / "traces")
        tracer = trace.get_tracer("app")
        with tracer.start_as_current_span("handle request") as root:
            with tracer.start_as_current_span("plan"):
                lookup("x")
                llm_request(provider="p", model="m", input="q", call=lambda: "r")
            provider.force_flush()  # (written as the calls go: within 1 s, or now)
            (during,) = (OUT / "traces").glob("*")
            assert not Trace.load(during).complete  # until the local root ends
        with tracer.start_as_current_span("no boundaries"):
            pass
        trace_id = format(root.get_span_context().trace_id, "032x")
        files = sorted(p.name for p in (OUT / "traces").iterdir())
        bundle = Trace.load(OUT / "traces" / f"{trace_id}.sftrace")
        report(
            same_provider=trace.get_tracer_provider() is provider,
            files=files,
            trace_id=trace_id,
            exported=sorted(s.name for s in exporter.get_finished_spans()),
            context=[c.name for c in bundle.context],
            calls=[e.type for e in bundle.calls],
            parents=[c.parent_span_id == bundle.context[1].span_id for c in bundle.calls],
        )
        """,
    )
    assert out["same_provider"] is True
    assert out["files"] == [f"{out['trace_id']}.sftrace"]
    assert out["exported"] == [
        "chat m",
        "execute_tool lookup",
        "handle request",
        "no boundaries",
        "plan",
    ]
    assert out["context"] == ["handle request", "plan"]
    assert out["calls"] == ["tool_call", "llm_request"]
    assert out["parents"] == [True, True]


def test_configure_with_no_provider_installs_the_embedded_default(tmp_path: Path) -> None:
    out = run_script(
        tmp_path,
        """
        processor = configure(directory=OUT / "traces")
        provider = trace.get_tracer_provider()
        lookup("solo")
        files = list((OUT / "traces").glob("*.sftrace"))
        report(
            provider=type(provider).__name__,
            has_processor=processor in provider._active_span_processor._span_processors,
            files=len(files),
            calls=[c.input for c in Trace.load(files[0]).calls],
        )
        """,
    )
    assert out["provider"] == "TracerProvider"
    assert out["has_processor"] is True
    assert out["files"] == 1
    assert out["calls"] == ['{"key":"solo"}']


def test_a_non_sdk_provider_still_gets_bundles_and_a_warning(tmp_path: Path) -> None:
    out = run_script(
        tmp_path,
        """
        from opentelemetry.trace import NoOpTracerProvider
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        trace.set_tracer_provider(NoOpTracerProvider())
        configure(directory=OUT / "traces")
        with record(OUT / "run.sftrace"):
            lookup("noop")
        report(
            provider=type(trace.get_tracer_provider()).__name__,
            calls=[c.input for c in Trace.load(OUT / "run.sftrace").calls],
        )
        """,
    )
    assert out["provider"] == "NoOpTracerProvider"
    assert out["calls"] == ['{"key":"noop"}']
    assert "is not an OpenTelemetry SDK TracerProvider" in out["stderr"]
    assert "recording on a private SDK provider" in out["stderr"]


def test_setup_docstring_describes_the_three_situations() -> None:
    import stepfork_otel.otel.setup as setup

    doc = setup.__doc__ or ""
    assert "embedded default" in doc
    assert "NoOpTracerProvider" in doc
    assert "private" in doc


# --- in-process: options -------------------------------------------------------------------------


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="max_span_payload_bytes must be >= 0"):
        configure(max_span_payload_bytes=-1)
    with pytest.raises(ValueError, match="max_open_traces must be >= 1"):
        configure(max_open_traces=0)
    with pytest.raises(ValueError, match="max_spans_per_trace must be >= 1"):
        configure(max_spans_per_trace=0)


def test_configure_again_keeps_the_processor_and_applies_options(recording: Recording) -> None:
    again = configure(max_span_payload_bytes=10, capture_content=False, max_open_traces=7)
    assert again is recording.processor
    assert isinstance(again, SftraceSpanProcessor)
    assert again.max_open_traces == 7
    assert CONFIG.settings.max_span_payload_bytes == 10
    assert CONFIG.settings.capture_content is False
