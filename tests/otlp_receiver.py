"""A real OTLP trace receiver on loopback, for the integration tests.

It speaks the two transports the standard ``opentelemetry-exporter-otlp`` exporters use -- the gRPC
``TraceService/Export`` call and ``POST /v1/traces`` with a protobuf body (optionally gzip) --
decodes the real ``ExportTraceServiceRequest`` messages with ``opentelemetry-proto``, and appends
each one as a line to a file in the Collector's ``file`` exporter format (OTLP JSON, hex ids; see
``stepfork_otel.otel.otlp_file``). The tests import that file exactly as they would a collector's.

``hold`` makes it a *slow* collector: every request waits until the event is set, so a test can
show that the agent does not wait with it. Only 127.0.0.1; ephemeral ports unless given.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan

from stepfork_otel.otel.otlp_file import request_to_json_line

#: The collector's default gRPC receive limit (``max_recv_msg_size_mib`` defaults to 4).
DEFAULT_MAX_RECV_MIB = 4


class OtlpReceiver:
    """gRPC and HTTP/protobuf OTLP trace receiver writing file-exporter JSON lines."""

    def __init__(
        self,
        output: Path,
        *,
        max_recv_msg_size_mib: int = DEFAULT_MAX_RECV_MIB,
        hold: threading.Event | None = None,
        grpc_port: int = 0,
        http_port: int = 0,
    ) -> None:
        self.output = output
        self.max_recv_msg_size_mib = max_recv_msg_size_mib
        self.hold = hold
        self.requests = {"grpc": 0, "http": 0}
        self.spans = 0
        self._lock = threading.Lock()
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self.grpc_port = grpc_port
        self.http_port = http_port

    # -- endpoints in the forms the exporters take -------------------------------------------------

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    # -- receiving ---------------------------------------------------------------------------------

    def receive(self, request: Any, transport: str) -> None:
        """Record one decoded ``ExportTraceServiceRequest`` (one file line, like one batch)."""
        if self.hold is not None:
            self.hold.wait()
        line = request_to_json_line(request)
        count = sum(
            len(scope.spans)
            for resource in request.resource_spans
            for scope in resource.scope_spans
        )
        with self._lock:
            with self.output.open("ab") as handle:
                handle.write(line)
            self.requests[transport] += 1
            self.spans += count

    def start(self) -> OtlpReceiver:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        self.output.touch()
        limit = self.max_recv_msg_size_mib * 1024 * 1024
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_receive_message_length", limit)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(self), server)
        self.grpc_port = server.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        server.start()
        self._grpc = server
        handler = type("_Handler", (_HttpHandler,), {"receiver": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", self.http_port), handler)
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, name="otlp-http-receiver", daemon=True
        )
        self._http_thread.start()
        return self

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()  # let blocked requests finish
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait()
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._http_thread is not None:
            self._http_thread.join()
            self._http_thread = None


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request: Any, context: Any) -> Any:
        self.receiver.receive(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


class _HttpHandler(BaseHTTPRequestHandler):
    receiver: OtlpReceiver
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        if self.path != "/v1/traces":
            self._reply(404, b"")
            return
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        encoding = self.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        if self.headers.get("Content-Type", "") != "application/x-protobuf":
            self._reply(415, b"only application/x-protobuf is accepted")
            return
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.receiver.receive(request, "http")
        self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


@contextmanager
def running_receiver(output: Path, **options: Any) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(output, **options).start()
    try:
        yield receiver
    finally:
        receiver.stop()


def collector_lines(spans: Sequence[ReadableSpan], batch_size: int) -> list[bytes]:
    """``spans`` as the collector's file exporter would write them in batches of ``batch_size``
    (the SDK's own OTLP encoder, then the file exporter's JSON form)."""
    return [
        request_to_json_line(encode_spans(spans[i : i + batch_size]))
        for i in range(0, len(spans), batch_size)
    ]


if __name__ == "__main__":  # a stand-in collector for trying the import path by hand
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        description="loopback OTLP receiver writing file-exporter JSON"
    )
    parser.add_argument("output", type=Path)
    parser.add_argument("--grpc-port", type=int, default=4317)
    parser.add_argument("--http-port", type=int, default=4318)
    parser.add_argument("--max-recv-msg-size-mib", type=int, default=DEFAULT_MAX_RECV_MIB)
    options = parser.parse_args()
    with running_receiver(
        options.output,
        grpc_port=options.grpc_port,
        http_port=options.http_port,
        max_recv_msg_size_mib=options.max_recv_msg_size_mib,
    ) as running:
        print(f"OTLP gRPC on {running.grpc_endpoint}, HTTP on {running.http_endpoint}", flush=True)
        sys.stdin.read()  # until stdin closes (Ctrl-D)
