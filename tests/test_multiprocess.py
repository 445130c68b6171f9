"""Two processes, one trace: the agent (this process) calls a tool served by another real process
(``tests/multiprocess/fare_service.py``); W3C trace context propagation puts both processes' spans
in one trace, both export over OTLP (gRPC here, HTTP there) to the loopback receiver, and importing
its file assembles one bundle with every call in the order it started, the remote tool's calls
nested under the client-side call. That bundle then replays the agent with the service gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from otlp_receiver import OtlpReceiver, running_receiver

from stepfork_otel import ReplaySession, llm_request, record, trace_tool
from stepfork_otel.trace.checks import validate_structure
from stepfork_otel.trace.models import CallEvent, LlmRequest, ToolCall, Trace
from stepfork_otel.trace.otlp import ImportReport, iter_traces_from_otlp_json

SERVICE = Path(__file__).resolve().parent / "multiprocess" / "fare_service.py"


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    with running_receiver(tmp_path / "collector" / "traces.jsonl") as running:
        yield running


@pytest.fixture
def fare_service(receiver: OtlpReceiver) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.http_endpoint}
    env.pop("OTEL_SDK_DISABLED", None)
    process = subprocess.Popen(
        [sys.executable, str(SERVICE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def stop(process: subprocess.Popen[str]) -> None:
    """Close the service's stdin: it stops serving and exports its spans before exiting."""
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr


def label(call: CallEvent) -> str:
    return call.name if isinstance(call, ToolCall) else call.model


def make_agent(port: int) -> Any:
    @trace_tool
    def get_fare_quote(city: str, currency: str) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        propagate.inject(headers)  # W3C traceparent: the service's spans join this trace
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/quote",
            data=json.dumps({"city": city, "currency": currency}).encode(),
            headers=headers,
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            result: dict[str, Any] = json.loads(response.read())
        return result

    def agent(city: str) -> str:
        plan = llm_request(
            provider="scripted",
            model="planner-1",
            input={"ask": f"quote a fare to {city} in pounds"},
            call=lambda: {"tool": "get_fare_quote", "currency": "GBP"},
        )
        quote = get_fare_quote(city, plan["currency"])
        return f"{quote['city']}: {quote['price']} {quote['currency']} ({quote['note']})"

    return agent


def test_calls_served_by_another_process_import_as_one_ordered_nested_run(
    recording: Any,
    receiver: OtlpReceiver,
    fare_service: subprocess.Popen[str],
    tmp_path: Path,
) -> None:
    assert fare_service.stdout is not None
    port = int(fare_service.stdout.readline())
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=receiver.grpc_endpoint, insecure=True))
    recording.provider.add_span_processor(processor)
    agent = make_agent(port)
    with record(tmp_path / "agent.sftrace", input={"city": "London"}, name="fare_agent") as run:
        answer = agent("London")
        run.set_output(answer)
    assert answer == "London: 80.75 GBP (fares to London are rising)"
    processor.shutdown()  # exports everything; the replay below is not exported
    stop(fare_service)
    assert receiver.requests["grpc"] > 0
    assert receiver.requests["http"] > 0

    report = ImportReport()
    (imported,) = iter_traces_from_otlp_json(receiver.output, report=report)
    assert report.problems == []
    local = Trace.load(tmp_path / "agent.sftrace")  # this process only saw its own calls
    assert imported.trace_id == local.trace_id
    assert [label(c) for c in local.calls] == ["planner-1", "get_fare_quote"]

    calls = {label(c): c for c in imported.calls}
    assert [label(c) for c in imported.calls] == [
        "planner-1",
        "get_fare_quote",
        "quote_fare",  # served by the other process
        "exchange_rate",
        "fare-notes-1",
    ]
    assert calls["planner-1"].parent_id is None
    assert calls["get_fare_quote"].parent_id is None
    assert calls["quote_fare"].parent_id == calls["get_fare_quote"].id
    assert calls["exchange_rate"].parent_id == calls["quote_fare"].id
    assert calls["fare-notes-1"].parent_id == calls["quote_fare"].id
    assert isinstance(calls["fare-notes-1"], LlmRequest)
    assert [s.name for s in imported.context] == ["POST /quote"]
    assert imported.context[0].kind == "SERVER"
    assert validate_structure(imported) == []
    assert imported.complete
    assert imported.run == local.run
    for name in ("planner-1", "get_fare_quote"):  # the agent's own calls are the same events
        mine = next(c for c in local.calls if label(c) == name)
        assert calls[name].model_dump(exclude={"id", "seq"}) == mine.model_dump(
            exclude={"id", "seq"}
        )

    # the service is gone: frozen replay serves get_fare_quote and skips what ran remotely
    with ReplaySession.from_trace(imported) as replay:
        assert agent("London") == answer
        replay.verify_complete()
