"""stepfork dropped into the OpenTelemetry set-ups users already have (``docs/otel-setups.md``).

Each set-up is configured the way its own docs say, in a fresh subprocess (the global provider can
be set once per process), with stepfork added the way our docs say. Every test checks the same
two things: the run made inside the user's own span is a complete bundle that verifies (the user's
span kept as context), and the user's exporter receives the stepfork spans in the user's trace.
Exporters are aimed at the loopback OTLP receiver of the test suite; nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_for_json
from conftest import ROOT
from otlp_receiver import OtlpReceiver, running_receiver

PRELUDE = """
import json, logging, sys, warnings
warnings.simplefilter("error")
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
import stepfork_otel._internal as internal
internal.RAISE_INTERNAL_ERRORS = True
from pathlib import Path
from opentelemetry import trace
from stepfork_otel import Trace, configure, llm_request, record, trace_tool
from stepfork_otel.trace.checks import verify_integrity

OUT = Path(sys.argv[1])
SECRET = "sk-proj-" + "abcdefghijklmnopqrstuvwxyzABCDEF0123456789"

@trace_tool
def lookup(ssn: str, city: str) -> dict:
    return {"city": city.upper(), "password": "hunter2"}

def agent():
    lookup("078-05-1120", "paris")
    return llm_request(
        provider="openai", model="gpt-4o",
        input={"messages": [{"role": "user", "content": "my key is " + SECRET}]},
        call=lambda: "Paris is sunny",
    )

def bundle_report(path):
    bundle = Trace.load(path)
    return dict(
        trace_id=bundle.events[0].trace_id,
        context=[c.name for c in bundle.context],
        events=[e.type for e in bundle.events],
        complete=bundle.complete,
        integrity=[str(p) for p in verify_integrity(bundle)],
        text=path.read_text(),
    )

def report(**values):
    print(json.dumps(values))
"""


def run_setup(
    tmp_path: Path,
    body: str,
    env: dict[str, str] | None = None,
    launcher: tuple[str, ...] = (sys.executable,),
) -> dict[str, Any]:
    script = tmp_path / "agent_setup.py"  # a file, not -c: logfire inspects its caller's source
    script.write_text(PRELUDE + textwrap.dedent(body))
    environment = {**os.environ, **(env or {})}
    environment.pop("OTEL_SDK_DISABLED", None)
    values, result = run_for_json([*launcher, str(script), str(tmp_path)], env=environment)
    values["stderr"] = result.stderr
    return values


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    with running_receiver(tmp_path / "collector" / "traces.jsonl") as running:
        yield running


def received_spans(receiver: OtlpReceiver) -> list[dict[str, Any]]:
    """Every span the receiver got, with its resource attributes (``resource``)."""
    spans = []
    for line in receiver.output.read_text().splitlines():
        for resource_spans in json.loads(line)["resourceSpans"]:
            resource = {
                a["key"]: a["value"].get("stringValue")
                for a in resource_spans.get("resource", {}).get("attributes", [])
            }
            for scope in resource_spans["scopeSpans"]:
                for span in scope["spans"]:
                    span["resource"] = resource
                    span["attrs"] = {
                        a["key"]: next(iter(a["value"].values()), None)
                        for a in span.get("attributes", [])
                    }
                    spans.append(span)
    return spans


def check_bundle_and_export(
    out: dict[str, Any], spans: list[dict[str, Any]], user_span: str
) -> None:
    """The bundle is complete and verifies, with the user's span as context; the exporter got the
    stepfork spans in the user's trace, under the user's span; no secret left the process."""
    bundle = out["bundle"]
    assert bundle["context"] == [user_span]
    assert bundle["events"] == ["tool_call", "tool_result", "llm_request", "llm_response"]
    assert bundle["complete"] is True
    assert bundle["integrity"] == []
    by_name = {s["name"]: s for s in spans}
    assert {"execute_tool lookup", "chat gpt-4o", user_span} <= set(by_name)
    root = by_name[user_span]
    for name in ("execute_tool lookup", "chat gpt-4o"):
        assert by_name[name]["traceId"] == root["traceId"] == bundle["trace_id"]
        assert by_name[name]["parentSpanId"] == root["spanId"]
    wire = json.dumps(spans)
    assert "abcdefghijklmnopqrstuvwxyzABCDEF0123456789" not in wire
    assert "hunter2" not in wire
    assert "abcdefghijklmnopqrstuvwxyzABCDEF0123456789" not in bundle["text"]


# --- the plain OpenTelemetry SDK -----------------------------------------------------------------


def test_plain_sdk_with_batch_exporter(tmp_path: Path, receiver: OtlpReceiver) -> None:
    out = run_setup(
        tmp_path,
        """
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": "booking-agent"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        configure(directory=OUT / "traces")

        with trace.get_tracer("app").start_as_current_span("handle request"):
            agent()
        provider.shutdown()
        (path,) = (OUT / "traces").glob("*.sftrace")
        report(bundle=bundle_report(path))
        """,
        env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint},
    )
    spans = received_spans(receiver)
    check_bundle_and_export(out, spans, "handle request")
    assert {s["resource"]["service.name"] for s in spans} == {"booking-agent"}
    assert "stepfork_otel" not in out["stderr"]  # no warning: attached to the user's provider


# --- logfire --------------------------------------------------------------------------------------


def test_logfire_provider_takes_the_bundle_processor(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """logfire's ProxyTracerProvider is not an SDK TracerProvider subclass but has
    ``add_span_processor``: stepfork attaches to it (no private provider, no warning)."""
    out = run_setup(
        tmp_path,
        """
        import logfire
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        memory = InMemorySpanExporter()
        logfire.configure(
            send_to_logfire=False, console=False,
            additional_span_processors=[SimpleSpanProcessor(memory)],
        )
        configure(directory=OUT / "traces")

        with logfire.span("handle request"):
            agent()
        logfire.force_flush()
        (path,) = (OUT / "traces").glob("*.sftrace")
        tool = next(s for s in memory.get_finished_spans() if s.name == "execute_tool lookup")
        report(
            provider=type(trace.get_tracer_provider()).__module__,
            bundle=bundle_report(path),
            memory=sorted(s.name for s in memory.get_finished_spans()),
            tool_attributes={k: v for k, v in tool.attributes.items() if isinstance(v, str)},
            bundle_tool_input=Trace.load(path).calls[0].input,
        )
        """,
        # logfire's own documented way to send to another OTel backend: OTEL_EXPORTER_OTLP_*
        env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint},
    )
    assert out["provider"].startswith("logfire.")
    assert "private SDK provider" not in out["stderr"]
    spans = received_spans(receiver)
    check_bundle_and_export(out, spans, "handle request")
    assert out["memory"] == ["chat gpt-4o", "execute_tool lookup", "handle request"]

    # logfire's scrubbing still applies to stepfork's spans on their way out: the social
    # security number that stepfork's rules keep is scrubbed by logfire's (key pattern 'ssn') ...
    attributes = out["tool_attributes"]
    assert "stepfork.input" not in attributes  # the input travels once, as input.value
    assert "[Scrubbed due to 'ssn']" in attributes["input.value"]
    assert "078-05-1120" not in json.dumps(spans)
    assert "logfire.scrubbed" in attributes
    # ... while the local bundle holds the payload as stepfork recorded and fingerprinted it.
    assert out["bundle_tool_input"] == '{"city":"paris","ssn":"078-05-1120"}'


def test_logfire_scrubbed_collector_copy_is_marked_not_kept_as_recorded(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """A payload logfire rewrote no longer matches its fingerprint: the bundle rebuilt from the
    collector's copy says the payload is missing (``truncated``) instead of keeping a changed
    value under the recorded fingerprint; payloads logfire left alone are whole and verify."""
    run_setup(
        tmp_path,
        """
        import logfire
        logfire.configure(send_to_logfire=False, console=False)
        configure()
        with logfire.span("handle request"):
            agent()
        logfire.force_flush()
        report()
        """,
        env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint},
    )
    from stepfork_otel.trace.checks import verify_integrity
    from stepfork_otel.trace.otlp import iter_traces_from_otlp_json

    (bundle,) = list(iter_traces_from_otlp_json(receiver.output))
    assert verify_integrity(bundle) == []
    tool, llm = bundle.calls
    assert tool.input is None
    assert tool.input_missing == "truncated"  # {"ssn": ...} was rewritten by logfire
    assert llm.input is None
    assert llm.input_missing == "truncated"  # "[REDACTED:openai_api_key]" matches api_key
    outputs = [bundle.outcome_of(call) for call in bundle.calls]
    assert [o.output_missing for o in outputs if o is not None] == ["truncated", None]


# --- zero-code: opentelemetry-instrument -----------------------------------------------------------

ZERO_CODE_AGENT = """
from opentelemetry import trace  # the agent's own span; no stepfork.configure(), no SDK set-up
with trace.get_tracer("app").start_as_current_span("handle request"):
    agent()
(path,) = (OUT / "traces").glob("*.sftrace")
report(provider=type(trace.get_tracer_provider()).__module__, bundle=bundle_report(path))
"""


def zero_code_env(receiver: OtlpReceiver, tmp_path: Path) -> dict[str, str]:
    return {
        "OTEL_SERVICE_NAME": "booking-agent",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint,
        "STEPFORK_DIRECTORY": str(tmp_path / "traces"),
    }


def instrument_launcher() -> tuple[str, ...]:
    return (str(Path(sys.executable).with_name("opentelemetry-instrument")), sys.executable)


def test_zero_code_opentelemetry_instrument_writes_bundles(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    out = run_setup(
        tmp_path,
        ZERO_CODE_AGENT,
        env=zero_code_env(receiver, tmp_path),
        launcher=instrument_launcher(),
    )
    assert out["provider"] == "opentelemetry.sdk.trace"  # the distro's configurator made it
    spans = received_spans(receiver)  # exported at exit by the SDK's BatchSpanProcessor
    check_bundle_and_export(out, spans, "handle request")
    assert {s["resource"]["service.name"] for s in spans} == {"booking-agent"}


def test_zero_code_without_the_variable_changes_nothing(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    env = zero_code_env(receiver, tmp_path)
    del env["STEPFORK_DIRECTORY"]
    out = run_setup(
        tmp_path,
        """
        from opentelemetry import trace
        with trace.get_tracer("app").start_as_current_span("handle request"):
            agent()
        report(bundles=list(map(str, OUT.rglob("*.sftrace"))))
        """,
        env=env,
        launcher=instrument_launcher(),
    )
    assert out["bundles"] == []
    assert "execute_tool lookup" in {s["name"] for s in received_spans(receiver)}


def test_zero_code_bad_directory_never_breaks_the_program(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """A directory that cannot be created: one warning line, the program runs, its spans are
    still exported (tests/test_zero_code_directory.py: the cases)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**zero_code_env(receiver, tmp_path), "STEPFORK_DIRECTORY": str(blocker / "traces")}
    out = run_setup(
        tmp_path,
        """
        internal.RAISE_INTERNAL_ERRORS = False  # production behaviour: log, never raise
        from opentelemetry import trace
        with trace.get_tracer("app").start_as_current_span("handle request"):
            result = agent()
        report(result=result)
        """,
        env=env,
        launcher=instrument_launcher(),
    )
    assert out["result"] == "Paris is sunny"
    assert f"STEPFORK_DIRECTORY={blocker / 'traces'} cannot be written" in out["stderr"]
    assert "Traceback" not in out["stderr"]
    assert "internal error" not in out["stderr"]
    assert "execute_tool lookup" in {s["name"] for s in received_spans(receiver)}


def test_zero_code_hook_logs_its_own_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import stepfork_otel._internal as internal
    from stepfork_otel.otel import zero_code

    def broken(**_: Any) -> None:
        raise RuntimeError("deliberate")

    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)
    monkeypatch.setattr(zero_code, "configure", broken)
    monkeypatch.setenv("STEPFORK_DIRECTORY", "bundles")
    assert zero_code.post_instrument() is None
    assert "internal error while attaching stepfork under opentelemetry-instrument" in caplog.text
    monkeypatch.setenv("STEPFORK_DIRECTORY", "  ")
    caplog.clear()
    zero_code.post_instrument()  # blank: nothing to do, configure not called
    assert caplog.text == ""


# --- Phoenix (arize-phoenix-otel) ----------------------------------------------------------------


def test_phoenix_register(tmp_path: Path, receiver: OtlpReceiver) -> None:
    pytest.importorskip("phoenix.otel", reason="arize-phoenix-otel needs Python 3.11")
    out = run_setup(
        tmp_path,
        """
        from phoenix.otel import register

        tracer_provider = register(
            endpoint=sys.argv[2], project_name="booking-agent", batch=True, verbose=False
        )
        configure(directory=OUT / "traces")

        with trace.get_tracer("app").start_as_current_span("handle request"):
            agent()
        tracer_provider.shutdown()
        (path,) = (OUT / "traces").glob("*.sftrace")
        report(provider=type(tracer_provider).__module__, bundle=bundle_report(path))
        """.replace("sys.argv[2]", repr(receiver.http_endpoint)),
        env={"PHOENIX_COLLECTOR_ENDPOINT": receiver.http_endpoint},
    )
    assert out["provider"].startswith("phoenix.otel")
    spans = received_spans(receiver)
    check_bundle_and_export(out, spans, "handle request")
    # the Phoenix project comes from the provider's resource, set by register(project_name=...)
    assert {s["resource"]["openinference.project.name"] for s in spans} == {"booking-agent"}
    kinds = {s["name"]: s["attrs"].get("openinference.span.kind") for s in spans}
    assert kinds["execute_tool lookup"] == "TOOL"
    assert kinds["chat gpt-4o"] == "LLM"


# --- Langfuse (its OpenTelemetry-based SDK) -------------------------------------------------------


@pytest.mark.parametrize("stepfork_first", [False, True], ids=["after", "before"])
def test_langfuse_client_provider(
    tmp_path: Path, receiver: OtlpReceiver, stepfork_first: bool
) -> None:
    """``Langfuse(...)`` installs a global SDK provider with its LangfuseSpanProcessor (an OTLP
    exporter to ``{base_url}/api/public/otel/v1/traces``; here the export path is aimed at the
    loopback receiver), or adds that processor to the global provider already set (stepfork's
    embedded default, when ``configure()`` came first). Its default filter exports Langfuse
    spans and spans with ``gen_ai.*`` attributes: every stepfork span has them."""
    pytest.importorskip("langfuse", reason="langfuse needs Python 3.11")
    out = run_setup(
        tmp_path,
        f"""
        from langfuse import Langfuse

        if {stepfork_first}:
            configure(directory=OUT / "traces")
        langfuse = Langfuse(
            public_key="pk-lf-local", secret_key="sk-lf-local", base_url=sys.argv[2]
        )
        if not {stepfork_first}:
            configure(directory=OUT / "traces")

        with langfuse.start_as_current_observation(as_type="span", name="handle request"):
            agent()
        langfuse.flush()
        langfuse.shutdown()
        (path,) = (OUT / "traces").glob("*.sftrace")
        report(provider=type(trace.get_tracer_provider()).__module__, bundle=bundle_report(path))
        """.replace("sys.argv[2]", repr(f"http://127.0.0.1:{receiver.http_port}")),
        env={
            "LANGFUSE_OTEL_TRACES_EXPORT_PATH": "/v1/traces",
            "LANGFUSE_TRACING_ENVIRONMENT": "test",
        },
    )
    assert out["provider"] == "opentelemetry.sdk.trace"
    spans = received_spans(receiver)
    check_bundle_and_export(out, spans, "handle request")


# --- OpenLLMetry / Traceloop ----------------------------------------------------------------------


def test_traceloop_init(tmp_path: Path, receiver: OtlpReceiver) -> None:
    """Not a dev extra: traceloop-sdk does not resolve beside the OpenTelemetry the rest of the
    suite uses (docs/otel-setups.md says why). Runs wherever it is installed."""
    pytest.importorskip("traceloop.sdk", reason="traceloop-sdk is not installed (not a dev extra)")
    out = run_setup(
        tmp_path,
        """
        with warnings.catch_warnings():  # its pydantic models use the deprecated class Config
            warnings.simplefilter("ignore", DeprecationWarning)
            from traceloop.sdk import Traceloop
            from traceloop.sdk.decorators import workflow

        Traceloop.init(
            app_name="booking-agent", api_endpoint=sys.argv[2],
            disable_batch=True, telemetry_enabled=False,
        )
        configure(directory=OUT / "traces")

        @workflow(name="handle request")
        def handle():
            agent()

        handle()
        trace.get_tracer_provider().force_flush()
        (path,) = (OUT / "traces").glob("*.sftrace")
        report(bundle=bundle_report(path))
        """.replace("sys.argv[2]", repr(f"http://127.0.0.1:{receiver.http_port}")),
    )
    check_bundle_and_export(out, received_spans(receiver), "handle request.workflow")


# --- detection, in-process -------------------------------------------------------------------------


def test_detection_is_by_capability_not_class() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

    from stepfork_otel.otel.setup import takes_span_processors

    class Wrapper:  # like logfire's: not an SDK subclass, but takes processors
        def add_span_processor(self, processor: object) -> None: ...

    assert takes_span_processors(TracerProvider())
    assert takes_span_processors(Wrapper())
    assert not takes_span_processors(ProxyTracerProvider())
    assert not takes_span_processors(NoOpTracerProvider())


def test_a_provider_that_would_replace_its_exporter_keeps_it(tmp_path: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from stepfork_otel import configure

    class ReplacingProvider(TracerProvider):  # the shape of phoenix.otel's provider
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[bool] = []

        def add_span_processor(  # type: ignore[override]
            self, processor: Any, replace_default_processor: bool = True
        ) -> None:
            self.calls.append(replace_default_processor)
            super().add_span_processor(processor)

    provider = ReplacingProvider()
    configure(directory=tmp_path, tracer_provider=provider)
    assert provider.calls == [False]
    provider.shutdown()


def test_logfire_keep_markers_recipe_makes_the_collector_copy_whole(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """The recipe of docs/otel-setups.md, run as it stands there: logfire keeps what stepfork
    already redacted, so the collector's copy rebuilds into a whole bundle that verifies."""
    import re

    from stepfork_otel.trace.checks import verify_integrity
    from stepfork_otel.trace.otlp import iter_traces_from_otlp_json

    page = (ROOT / "docs" / "otel-setups.md").read_text()
    found = re.search(r"<!-- snippet: id=logfire-keep-markers -->\n```python\n(.*?)```", page, re.S)
    assert found, "the recipe block is gone from docs/otel-setups.md"
    script = tmp_path / "recipe.py"
    script.write_text(found.group(1))
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    wire = receiver.output.read_text()
    assert "s-1234" not in wire
    assert "Xf3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jK" not in wire
    (bundle,) = list(iter_traces_from_otlp_json(receiver.output))
    assert verify_integrity(bundle) == []
    assert [c.input for c in bundle.calls] == [
        '{"session_id":"[REDACTED]"}',
        '{"messages":[{"content":"my key is [REDACTED:openai_api_key]","role":"user"}]}',
    ]
    assert all(c.input_missing is None for c in bundle.calls)
