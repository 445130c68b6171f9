"""The production path end to end, on loopback: the example agent exports its spans with the real
``opentelemetry-exporter-otlp`` exporters (configured through ``OTEL_EXPORTER_OTLP_*`` environment
variables, as in production) to a real OTLP receiver that writes the collector's file-exporter
format; ``stepfork import`` rebuilds bundles equal to the ones the processor wrote locally, and
``stepfork replay`` replays the example agent from them with exit 0."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from otlp_receiver import OtlpReceiver, running_receiver

import examples.booking_agent as booking
from stepfork_otel import cli
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.models import Trace

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[OtlpReceiver]:
    with running_receiver(tmp_path / "collector" / "traces.jsonl") as running:
        yield running


def exporter_from_environment(
    protocol: str, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> SpanExporter:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "10")
    if protocol == "grpc":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{receiver.grpc_endpoint}")
        return GrpcSpanExporter()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.http_endpoint)
    return HttpSpanExporter()


def replay_cli(bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "stepfork_otel.cli", "replay", str(bundle)),
            *("--entrypoint", "examples.booking_agent:run_agent"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(("protocol", "transport"), [("grpc", "grpc"), ("http/protobuf", "http")])
def test_example_agent_over_otlp_imports_equal_to_local_and_replays(
    recording: Any,
    receiver: OtlpReceiver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    protocol: str,
    transport: str,
) -> None:
    processor = BatchSpanProcessor(exporter_from_environment(protocol, receiver, monkeypatch))
    recording.provider.add_span_processor(processor)
    booking.main(str(tmp_path / "local"))
    processor.force_flush()
    local = {n: Trace.load(tmp_path / "local" / f"{n}.sftrace") for n in ("failure", "success")}
    assert receiver.requests[transport] > 0
    assert receiver.spans == sum(len(t.calls) + 1 for t in local.values())
    capsys.readouterr()

    out = tmp_path / "imported"
    assert cli.main(["import", str(receiver.output), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 runs imported from 1 file" in printed
    for name, bundle in local.items():
        path = out / f"{bundle.trace_id}.sftrace"
        imported = Trace.load(path)
        assert imported == bundle, name
        assert dump_trace(imported) == dump_trace(bundle)
        assert f"{path}: complete" in printed

    # the failing run, replayed from what the collector captured, with the CLI from the repo root
    # (the imported bundles load equal to the local ones, so they replay the same way)
    replayed = replay_cli(out / f"{local['failure'].trace_id}.sftrace")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "Dependency-call matching: MATCHED" in replayed.stdout
    assert "Output comparison: REPRODUCED FAILURE" in replayed.stdout
