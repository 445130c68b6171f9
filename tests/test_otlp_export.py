"""OTLP export beside the bundle processor: the standard exporters on a ``BatchSpanProcessor`` of
the same provider. A collector that is down or slow must never block or break the agent: calls
return, the local bundle is written, and what cannot be sent is dropped from a bounded queue with a
log line. No timing is asserted: only completion, bundles and what the collector received."""

from __future__ import annotations

import logging
import socket
import threading
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
from otlp_receiver import running_receiver

from stepfork_otel import record, trace_tool
from stepfork_otel.trace.models import Trace

PROTOCOLS = ["grpc", "http/protobuf"]


def exporter_for(protocol: str, host_port: str, timeout: float) -> SpanExporter:
    if protocol == "grpc":
        return GrpcSpanExporter(endpoint=host_port, insecure=True, timeout=timeout)
    return HttpSpanExporter(endpoint=f"http://{host_port}/v1/traces", timeout=timeout)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@trace_tool
def step(n: int) -> int:
    return n * 2


def run_agent(path: Path, calls: int) -> int:
    with record(path, input={"calls": calls}, name="stepper") as run:
        total = sum(step(n) for n in range(calls))
        run.set_output(total)
    return total


def reset_sdk_duplicate_log_filter() -> None:
    # The SDK logs "Queue full" once per 20 s per message (DuplicateFilter); let this test see it.
    for handler_filter in logging.getLogger("opentelemetry.sdk._shared_internal").filters:
        vars(handler_filter).pop("last_log", None)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_collector_down_never_breaks_the_agent(
    recording: Any, tmp_path: Path, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = exporter_for(protocol, f"127.0.0.1:{closed_port()}", timeout=0.5)
    processor = BatchSpanProcessor(exporter, schedule_delay_millis=10)
    recording.provider.add_span_processor(processor)
    with caplog.at_level(logging.WARNING):
        assert run_agent(tmp_path / "run.sftrace", calls=5) == 20
        processor.shutdown()  # the last export attempt fails; shutdown still returns
    bundle = Trace.load(tmp_path / "run.sftrace")
    assert bundle.complete
    assert [c.name for c in bundle.calls] == ["step"] * 5
    failures = [r for r in caplog.records if r.name.startswith("opentelemetry.exporter.otlp.proto")]
    assert failures, "the failed export must be logged"
    assert all(r.levelno >= logging.WARNING for r in failures)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_slow_collector_fills_a_bounded_queue_and_the_agent_never_waits(
    recording: Any, tmp_path: Path, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    hold = threading.Event()
    reset_sdk_duplicate_log_filter()
    with running_receiver(tmp_path / "collector.jsonl", hold=hold) as receiver:
        host_port = (
            receiver.grpc_endpoint if protocol == "grpc" else f"127.0.0.1:{receiver.http_port}"
        )
        # the timeout is never reached: the collector is released below, once the agent is done
        exporter = exporter_for(protocol, host_port, timeout=60)
        processor = BatchSpanProcessor(
            exporter, max_queue_size=4, max_export_batch_size=2, schedule_delay_millis=1
        )
        recording.provider.add_span_processor(processor)
        with caplog.at_level(logging.WARNING):
            assert run_agent(tmp_path / "run.sftrace", calls=40) == 40 * 39
            # the agent finished while the collector had not accepted a single span
            assert receiver.spans == 0
            bundle = Trace.load(tmp_path / "run.sftrace")
            assert bundle.complete
            assert len(bundle.calls) == 40
            hold.set()
            processor.shutdown()
    # one batch in flight (2) + a full queue (4) at most were kept; the rest were dropped, logged
    assert 0 < receiver.spans <= 2 + 4
    assert any(r.getMessage().startswith("Queue full, dropping") for r in caplog.records)
