"""A real Phoenix server (PyPI ``arize-phoenix``) on loopback, fed by recorded agent runs.

Used by ``tests/test_phoenix.py`` and ``docs/images/make_screenshots.py``. Phoenix is not a dev
extra (it is large and its dependencies could move the suite's pins): ``.ci/run`` installs it into
``.venv-phoenix`` and runs the Phoenix test there.

Every listener is on 127.0.0.1. ``PHOENIX_HOST`` binds the HTTP server (UI, REST, GraphQL, OTLP
over HTTP at ``/v1/traces``), but Phoenix 20's gRPC receiver always binds ``[::]``; there is no
setting for its address, so the launcher below rewrites that one address to ``127.0.0.1`` before
Phoenix starts (grpc's ``Server.add_insecure_port``, the one call that binds it). The database is
SQLite in a temporary ``PHOENIX_WORKING_DIR``; telemetry and external resources (web fonts, the
WASM sandbox download) are off.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cli_support import ROOT, run_for_json

#: How long Phoenix may take to run its migrations and start (a bound, not an expectation:
#: it starts in about 15 s on a loaded 2-core machine).
START_DEADLINE_S = 240.0

_LAUNCHER = """
import sys
import grpc.aio._server as grpc_server

_bind = grpc_server.Server.add_insecure_port

def add_insecure_port(self, address):
    return _bind(self, address.replace("[::]", "127.0.0.1"))

grpc_server.Server.add_insecure_port = add_insecure_port
from phoenix.server.main import main

sys.argv = ["phoenix", "serve"]
main()
"""


def phoenix_installed() -> bool:
    """Whether this Python has the Phoenix server (``arize-phoenix``; ``arize-phoenix-otel``, a dev
    extra, has only ``phoenix.otel``). Asked of the metadata: importing ``phoenix`` here would
    load the whole server into the test process."""
    try:
        importlib.metadata.distribution("arize-phoenix")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Phoenix:
    """A running Phoenix: its ports, working directory and REST API."""

    def __init__(self, working_dir: Path, process: subprocess.Popen[bytes], log: Path) -> None:
        self.working_dir = working_dir
        self.process = process
        self.log = log
        self.port = 0
        self.grpc_port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def http_endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span Phoenix stored in ``project`` (REST ``/v1/projects/{name}/spans``)."""
        spans: list[dict[str, Any]] = []
        cursor = ""
        while True:
            page = self.get(f"/v1/projects/{project}/spans?limit=1000{cursor}")
            spans.extend(page["data"])
            if not page.get("next_cursor"):
                return spans
            cursor = f"&cursor={page['next_cursor']}"

    def wait_for_spans(self, project: str, count: int, deadline_s: float = 120.0) -> None:
        """Until Phoenix has stored ``count`` spans in ``project`` (it inserts in batches)."""
        end = time.monotonic() + deadline_s
        while True:
            try:
                if len(self.spans(project)) >= count:
                    return
            except urllib.error.HTTPError as exc:  # the project does not exist yet
                if exc.code != 404:
                    raise
            if time.monotonic() > end:
                raise TimeoutError(f"Phoenix stored fewer than {count} spans in {project!r}")
            time.sleep(0.5)

    def database_bytes(self) -> bytes:
        """Every file of the SQLite database (main file, write-ahead log, shared memory)."""
        return b"".join(
            p.read_bytes() for p in sorted(self.working_dir.glob("phoenix.db*")) if p.is_file()
        )

    def listening_addresses(self) -> list[str]:
        """The local addresses of the server's listening TCP sockets (Linux ``/proc``)."""
        inodes = set()
        for fd in Path(f"/proc/{self.process.pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        addresses = []
        for table, width in (("tcp", 8), ("tcp6", 32)):
            for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    addresses.append(_address(fields[1], width))
        return addresses


def _address(field: str, width: int) -> str:
    """``/proc/net/tcp*``'s ``HEXADDR:HEXPORT`` as ``address:port``."""
    raw, port = field.split(":")
    assert len(raw) == width
    data = bytes.fromhex(raw)
    words = b"".join(data[i : i + 4][::-1] for i in range(0, len(data), 4))  # host order
    if width == 8:
        host = socket.inet_ntop(socket.AF_INET, words)
    else:
        host = socket.inet_ntop(socket.AF_INET6, words)
    return f"{host}:{int(port, 16)}"


@contextmanager
def running_phoenix(working_dir: Path, python: str = sys.executable) -> Iterator[Phoenix]:
    """Start Phoenix with ``python`` (it must have ``arize-phoenix``), wait until its REST API
    answers, and stop it at the end."""
    working_dir.mkdir(parents=True, exist_ok=True)
    env = {key: v for key, v in os.environ.items() if not key.startswith(("PHOENIX_", "OTEL_"))}
    port, grpc_port = free_port(), free_port()
    env.update(
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
        PHOENIX_WORKING_DIR=str(working_dir),
        PHOENIX_TELEMETRY_ENABLED="false",
        PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
    )
    log = working_dir / "phoenix.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [python, "-c", _LAUNCHER], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    phoenix = Phoenix(working_dir, process, log)
    phoenix.port, phoenix.grpc_port = port, grpc_port
    try:
        end = time.monotonic() + START_DEADLINE_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"Phoenix exited ({process.returncode}):\n{_tail(log)}")
            try:
                phoenix.get("/v1/projects")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > end:
                    raise TimeoutError(f"Phoenix did not start:\n{_tail(log)}") from None
                time.sleep(0.5)
        yield phoenix
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:])


# --- feeding it ----------------------------------------------------------------------------------

#: An agent on the OpenAI SDK (``examples/openai_agent.py``) against the loopback fake API, traced
#: the way ``docs/otel-setups.md`` says for Phoenix (``register(...)``, then ``configure()``),
#: then replayed from its bundle with no run around the replay. The API key and the question
#: carry a secret made up here. Prints what the test needs to know, as JSON.
SDK_AGENT = """
import json, os, secrets, string, sys
from pathlib import Path

import openai
from phoenix.otel import register

import stepfork_otel
from stepfork_otel import ReplaySession, record
from examples.fake_llm import FakeLLM
from examples.openai_agent import run_agent

endpoint, out = sys.argv[1], Path(sys.argv[2])
alphabet = string.ascii_letters + string.digits
secret = "sk-proj-" + "".join(secrets.choice(alphabet) for _ in range(40))

tracer_provider = register(project_name="support-agent", endpoint=endpoint, batch=True, verbose=False)
stepfork_otel.configure(directory=out / "traces")  # after register
stepfork_otel.instrument_openai()

question = f"Where is order 2? My key is {secret}"
with FakeLLM() as llm:
    client = openai.OpenAI(base_url=llm.openai_url, api_key=secret)
    with record(out / "run.sftrace", input={"question": question}, name="support_agent") as run:
        run.set_output(run_agent(client, question))
with ReplaySession.from_trace(out / "run.sftrace") as replay:  # the fake API is gone
    run_agent(client, question)
    replay.verify_complete()
tracer_provider.shutdown()
print(json.dumps({"secret": secret}))
"""

#: The booking agent (``examples/booking_agent.py``, ``llm_request`` and ``@trace_tool``) on the
#: plain SDK, exporting over OTLP/gRPC as ``docs/collectors.md`` says, its Phoenix project named
#: by the ``openinference.project.name`` resource attribute.
GRPC_AGENT = """
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import stepfork_otel
from stepfork_otel import record
from examples import booking_agent

endpoint, out = sys.argv[1], Path(sys.argv[2])
provider = TracerProvider(resource=Resource.create({
    "service.name": "booking-agent",
    "openinference.project.name": "booking-agent",
}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
trace.set_tracer_provider(provider)
stepfork_otel.configure(directory=out / "traces")

question = "Book me the cheapest flight to London."
with record(out / "booking.sftrace", input={"question": question}, name="booking_agent") as run:
    run.set_output(booking_agent.run_agent(question))
provider.shutdown()
print("{}")
"""


def feed(
    script: str, endpoint: str, out: Path, python: str = sys.executable, **env: str
) -> dict[str, Any]:
    """Run one of the agents above in a fresh process (the global provider can be set once)."""
    out.mkdir(parents=True, exist_ok=True)
    environment = {
        key: v for key, v in os.environ.items() if not key.startswith(("PHOENIX_", "OTEL_"))
    }
    environment.update(env)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), environment.get("PYTHONPATH", "")) if p
    )
    values, _ = run_for_json(
        [python, "-c", script, endpoint, str(out)], env=environment, timeout=180
    )
    return values
