"""Nothing live unless named, end to end: during a replay session, network traffic that no
boundary serves is refused before it is sent (an LLM call a framework makes without going through
a boundary, say), while the bodies the session runs live on purpose reach their service. A
loopback server counts what arrives."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import stepfork
from conftest import Recording

from stepfork_otel import (
    NetworkRefusedError,
    ReplayMismatchError,
    ReplaySession,
    llm_request,
    record,
    trace_tool,
)


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_POST(self) -> None:
        self.hits.append(self.path)
        body = json.dumps({"answer": "live"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    hits: list[str] = []
    handler = type("Handler", (_Counting,), {"hits": hits})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}", hits
    finally:
        httpd.shutdown()
        httpd.server_close()


def post(url: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        return dict(json.loads(response.read()))


@trace_tool
def lookup(city: str) -> str:
    return f"{city}: sunny"


def agent(base: str, *, swallow: bool = False) -> list[Any]:
    """One LLM call through a boundary, one tool call, and one call a framework makes behind the
    boundaries' back (an un-instrumented client)."""
    reply = llm_request(
        provider="local",
        model="llama",
        input={"prompt": "weather?"},
        call=lambda: post(f"{base}/v1/chat"),
    )
    out: list[Any] = [reply, lookup("Paris")]
    try:
        out.append(post(f"{base}/v1/embeddings"))
    except NetworkRefusedError:
        if not swallow:
            raise
        out.append("refused")
    return out


@pytest.fixture
def bundle(recording: Recording, tmp_path: Path, server: tuple[str, list[str]]) -> Path:
    base, hits = server
    path = tmp_path / "weather.sftrace"
    with record(path):
        agent(base)
    assert hits == ["/v1/chat", "/v1/embeddings"]  # recorded against the live server
    hits.clear()
    return path


def test_frozen_replay_refuses_traffic_no_boundary_serves(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    base, hits = server
    port = base.rsplit(":", 1)[1]
    with pytest.raises(NetworkRefusedError) as caught, ReplaySession.from_trace(bundle):
        agent(base)
    assert hits == []  # neither the substituted LLM call nor the stray request reached it
    error = caught.value
    assert (error.host, str(error.port)) == ("127.0.0.1", port)
    assert error.path == "/v1/embeddings"
    assert f"127.0.0.1:{port}" in str(error)


def test_a_swallowed_refusal_still_fails_verify_complete(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    base, hits = server
    with ReplaySession.from_trace(bundle) as replay:
        assert agent(base, swallow=True)[-1] == "refused"
        with pytest.raises(ReplayMismatchError, match="NetworkRefusedError"):
            replay.verify_complete()
    assert hits == []


def test_allow_network_opens_the_named_host(bundle: Path, server: tuple[str, list[str]]) -> None:
    base, hits = server
    with ReplaySession.from_trace(bundle, allow_network=[base.removeprefix("http://")]) as replay:
        assert agent(base)[-1] == {"answer": "live"}
        replay.verify_complete()
    assert hits == ["/v1/embeddings"]  # the LLM call was still served from the recording


def test_a_body_run_live_on_purpose_reaches_its_service(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    base, hits = server
    with (
        pytest.raises(NetworkRefusedError),
        ReplaySession.from_trace(bundle, mode="hybrid", live_llms={"local/llama"}) as replay,
    ):
        agent(base)
    assert hits == ["/v1/chat"]  # the selected LLM ran live; the stray request did not
    assert replay.calls[0].action == "executed"


def test_the_network_is_open_again_after_the_session(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    base, hits = server
    with ReplaySession.from_trace(bundle, allow_network=["127.0.0.1"]):
        agent(base)
    assert post(f"{base}/after") == {"answer": "live"}
    assert hits == ["/v1/embeddings", "/after"]


def test_bad_allow_network_entries_are_refused_before_reading(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="http://x"):
        ReplaySession.from_trace(tmp_path / "absent.sftrace", allow_network=["http://x"])
    result = stepfork(
        "replay", tmp_path / "absent.sftrace", "--entrypoint", "m:f", "--allow-network", "a b"
    )
    assert result.returncode == 2
    assert result.stderr.startswith("stepfork: error: --allow-network: ")
    assert len(result.stderr.strip().splitlines()) == 1


# -- frozen means the whole process (issue 26) ----------------------------------------------------


def _from_a_plain_thread(call: Any) -> BaseException | None:
    """Run ``call`` in a thread started without the session's context (a library's own exporter
    thread); what it raised, or None."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert outcome, "the thread did not finish"
    return outcome[0]


@pytest.mark.parametrize("mode", ["frozen", "forbidden", "manual"])
def test_a_sealed_replay_refuses_every_thread_of_the_process(
    bundle: Path, server: tuple[str, list[str]], mode: str
) -> None:
    base, hits = server
    with ReplaySession.from_trace(bundle, mode=mode, approve=lambda call: True) as replay:
        stray = _from_a_plain_thread(lambda: post(f"{base}/v1/traces/ingest"))
        with pytest.raises(ReplayMismatchError, match="NetworkRefusedError"):
            replay.verify_complete()
    assert isinstance(stray, NetworkRefusedError)
    assert stray.path == "/v1/traces/ingest"
    assert hits == []
    assert _from_a_plain_thread(lambda: post(f"{base}/after")) is None  # open again after it
    assert hits == ["/after"]


def test_a_sealed_replay_lets_other_threads_reach_what_it_allows(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    base, hits = server
    with ReplaySession.from_trace(bundle, allow_network=[base.removeprefix("http://")]):
        assert _from_a_plain_thread(lambda: post(f"{base}/v1/traces/ingest")) is None
    assert hits == ["/v1/traces/ingest"]


def test_a_replay_that_runs_bodies_live_guards_its_own_context_only(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    """``hybrid`` and ``live`` run bodies for real, whose clients may use threads of their own:
    their guard stays the context's, as before."""
    base, hits = server
    with ReplaySession.from_trace(bundle, mode="hybrid", live_llms={"local/llama"}):
        assert _from_a_plain_thread(lambda: post(f"{base}/v1/traces/ingest")) is None
    assert hits == ["/v1/traces/ingest"]


def test_the_users_batch_exporter_keeps_working_in_a_frozen_replay(
    bundle: Path, server: tuple[str, list[str]]
) -> None:
    """The OpenTelemetry SDK exports with its suppress-instrumentation key set, in its own
    thread: the guard lets it through, whatever the thread."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    base, hits = server
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces")))
    try:
        with ReplaySession.from_trace(bundle):
            with provider.get_tracer("user").start_as_current_span("exported by the SDK"):
                pass
            assert provider.force_flush(10_000)
            stray = _from_a_plain_thread(lambda: post(f"{base}/v1/traces/ingest"))
    finally:
        provider.shutdown()
    assert isinstance(stray, NetworkRefusedError)
    assert hits == ["/v1/traces"]
