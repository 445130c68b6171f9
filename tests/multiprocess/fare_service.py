"""A tool served by its own process, for ``tests/test_multiprocess.py``.

A tiny HTTP service on 127.0.0.1 (ephemeral port, printed on the first line of stdout) whose
``POST /quote`` handler runs the instrumented ``quote_fare`` tool under the W3C trace context the
client propagated, so its boundary spans join the client's trace. Its spans go over OTLP/HTTP to
wherever ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` points -- configured the usual way, by the
environment. Closing stdin stops it; shutting the provider down exports every span first.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from stepfork_otel import configure, llm_request, trace_tool

_RATES = {"EUR": 1.0, "GBP": 0.85}
_BASE_FARES = {"Paris": 89, "London": 95}

provider = TracerProvider(resource=Resource.create({"service.name": "fare-service"}))
tracer = provider.get_tracer("fare-service")


@trace_tool
def exchange_rate(currency: str) -> float:
    return _RATES[currency]


@trace_tool
def quote_fare(city: str, currency: str = "EUR") -> dict[str, Any]:
    rate = exchange_rate(currency)
    note = llm_request(
        provider="scripted",
        model="fare-notes-1",
        input={"city": city, "currency": currency},
        call=lambda: {"note": f"fares to {city} are rising"},
    )
    price = round(_BASE_FARES[city] * rate, 2)
    return {"city": city, "currency": currency, "price": price, "note": note["note"]}


class QuoteHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        context = propagate.extract(self.headers)  # the client's traceparent
        with tracer.start_as_current_span("POST /quote", context=context, kind=SpanKind.SERVER):
            data = json.dumps(quote_fare(**body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main() -> int:
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    configure(tracer_provider=provider)
    server = ThreadingHTTPServer(("127.0.0.1", 0), QuoteHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # until the test closes our stdin
    server.shutdown()
    server.server_close()
    provider.shutdown()  # exports what is still queued
    return 0


if __name__ == "__main__":
    sys.exit(main())
