"""The replay network guard (issue 10, item 8): while a guard is active in a context, connections
and HTTP requests made in it are refused before anything is sent -- loopback included -- at every
client level (raw sockets, ``socket.create_connection``, asyncio, ``http.client``, ``urllib``,
``urllib3``, ``requests``, ``httpx`` and ``httpx2`` sync and async); named endpoints, ``live()``
blocks, threads started without the context, Unix sockets and the SDK's suppressed exports go
through; the last deactivation restores every patched attribute.

Every server here is started by the test on 127.0.0.1, port 0, and counts what reached it. A
refusal is checked by making the same call once more where it is allowed and then counting
exactly one connection: a connection leaked by the refused call would have been accepted first.
Each test that shows something going through also shows the guard refusing in the same setting,
so every test fails when the patches are disabled."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import http.client
import http.server
import inspect
import os
import socket
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from stepfork_otel import ReplaySession, Trace
from stepfork_otel.replay import network
from stepfork_otel.replay.errors import ReplayPolicyError
from stepfork_otel.replay.network import NetworkGuard, NetworkRefusedError

TIMEOUT = 5.0
LOOPBACK = "127.0.0.1"
PATH = "/v1/chat"
_ORIGINAL_CONNECT = socket.socket.connect
_ORIGINAL_CREATE_CONNECTION = socket.create_connection

# -- servers -----------------------------------------------------------------------------------


class _CountingHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((LOOPBACK, 0), _Handler)
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: list[tuple[str, str]] = []

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self.lock:
            self.connections += 1
        return True


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so a reused connection can be tested
    timeout = TIMEOUT
    server: _CountingHTTPServer

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.server.lock:
            self.server.requests.append((self.command, self.path.split("?", 1)[0]))
        body = b"" if self.path == "/v1/traces" else b"ok"  # an OTLP answer: empty is success
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class HTTPServer:
    server: _CountingHTTPServer
    host: str = LOOPBACK

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def url(self, path: str = PATH) -> str:
        return f"http://{LOOPBACK}:{self.port}{path}"

    @property
    def connections(self) -> int:
        with self.server.lock:
            return self.server.connections

    @property
    def requests(self) -> list[tuple[str, str]]:
        with self.server.lock:
            return list(self.server.requests)


@dataclass
class TCPListener:
    """Accepts connections, counts them, answers ``ok`` to the first bytes, closes."""

    sock: socket.socket
    host: str = LOOPBACK
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.connections += 1
            with conn:
                conn.settimeout(TIMEOUT)
                with contextlib.suppress(OSError):
                    if conn.recv(64):
                        conn.sendall(b"ok")


Server = HTTPServer | TCPListener


@contextlib.contextmanager
def _http_server() -> Iterator[HTTPServer]:
    server = _CountingHTTPServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield HTTPServer(server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(TIMEOUT)


@contextlib.contextmanager
def _tcp_listener() -> Iterator[TCPListener]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    sock.listen(16)
    sock.settimeout(0.05)
    listener = TCPListener(sock)
    thread = threading.Thread(target=listener.serve)
    thread.start()
    try:
        yield listener
    finally:
        listener.stop.set()
        thread.join(TIMEOUT)
        sock.close()


@pytest.fixture
def http_server() -> Iterator[HTTPServer]:
    with _http_server() as server:
        yield server


@pytest.fixture
def other_http_server() -> Iterator[HTTPServer]:
    with _http_server() as server:
        yield server


@pytest.fixture
def tcp_listener() -> Iterator[TCPListener]:
    with _tcp_listener() as listener:
        yield listener


@pytest.fixture
def other_tcp_listener() -> Iterator[TCPListener]:
    with _tcp_listener() as listener:
        yield listener


# -- client levels -----------------------------------------------------------------------------


def _raw_exchange(sock: socket.socket) -> None:
    sock.sendall(b"ping\n")
    assert sock.recv(2) == b"ok"


def raw_connect(server: Server) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect((server.host, server.port))
        _raw_exchange(sock)


def raw_connect_ex(server: Server) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(TIMEOUT)
        assert sock.connect_ex((server.host, server.port)) == 0
        _raw_exchange(sock)


def create_connection(server: Server) -> None:
    with socket.create_connection((server.host, server.port), timeout=TIMEOUT) as sock:
        _raw_exchange(sock)


async def asyncio_open_connection(server: Server) -> None:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(server.host, server.port), TIMEOUT
    )
    try:
        writer.write(b"ping\n")
        assert await asyncio.wait_for(reader.readexactly(2), TIMEOUT) == b"ok"
    finally:
        writer.close()
        await writer.wait_closed()


async def asyncio_sock_connect(server: Server) -> None:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, (server.host, server.port)), TIMEOUT)
        await loop.sock_sendall(sock, b"ping\n")
        assert await asyncio.wait_for(loop.sock_recv(sock, 2), TIMEOUT) == b"ok"


class _Answer(asyncio.Protocol):
    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(b"ping\n")

    def data_received(self, data: bytes) -> None:
        if not self.answer.done():
            self.answer.set_result(data)


async def asyncio_create_connection(server: Server) -> None:
    loop = asyncio.get_running_loop()
    transport, protocol = await asyncio.wait_for(
        loop.create_connection(_Answer, server.host, server.port), TIMEOUT
    )
    try:
        assert await asyncio.wait_for(protocol.answer, TIMEOUT) == b"ok"
    finally:
        transport.close()


def urllib_urlopen(server: Server) -> None:
    assert isinstance(server, HTTPServer)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(server.url(), timeout=TIMEOUT) as response:
        assert response.read() == b"ok"


def http_client(server: Server) -> None:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=TIMEOUT)
    try:
        conn.request("GET", PATH)
        assert conn.getresponse().read() == b"ok"
    finally:
        conn.close()


def urllib3_pool(server: Server) -> None:
    import urllib3

    assert isinstance(server, HTTPServer)
    with urllib3.PoolManager() as pool:
        response = pool.request("GET", server.url(), timeout=TIMEOUT, retries=False)
        assert response.data == b"ok"


def requests_get(server: Server) -> None:
    import requests

    assert isinstance(server, HTTPServer)
    with requests.Session() as session:
        session.trust_env = False
        assert session.get(server.url(), timeout=TIMEOUT).content == b"ok"


def _httpx_sync(module: str) -> Callable[[Server], None]:
    def call(server: Server) -> None:
        httpx = __import__(module)
        assert isinstance(server, HTTPServer)
        with httpx.Client(trust_env=False, timeout=TIMEOUT) as client:
            assert client.get(server.url()).content == b"ok"

    return call


def _httpx_async(module: str) -> Callable[[Server], Awaitable[None]]:
    async def call(server: Server) -> None:
        httpx = __import__(module)
        assert isinstance(server, HTTPServer)
        async with httpx.AsyncClient(trust_env=False, timeout=TIMEOUT) as client:
            assert (await client.get(server.url())).content == b"ok"

    return call


@dataclass(frozen=True)
class Level:
    name: str
    call: Callable[[Server], Any]
    http: bool
    """An HTTP client (talks to the HTTP server, and the refusal names method and path)."""
    via: str
    requires: str | None = None

    def __str__(self) -> str:
        return self.name

    def prepare(self) -> None:
        """Import the client before the guard activates (only imported libraries are patched)."""
        if self.requires is not None:
            pytest.importorskip(self.requires)

    def run(self, server: Server) -> None:
        result = self.call(server)
        if inspect.isawaitable(result):
            asyncio.run(_awaited(result))  # a task in a copy of this context, as asyncio does


async def _awaited(result: Awaitable[None]) -> None:
    await result


LEVELS = [
    Level("socket.connect", raw_connect, False, "socket.socket.connect"),
    Level("socket.connect_ex", raw_connect_ex, False, "socket.socket.connect"),  # one C event
    Level("socket.create_connection", create_connection, False, "socket.create_connection"),
    Level("asyncio.open_connection", asyncio_open_connection, False, "socket.socket.connect"),
    Level("loop.sock_connect", asyncio_sock_connect, False, "socket.socket.connect"),
    Level("loop.create_connection", asyncio_create_connection, False, "socket.socket.connect"),
    Level("urllib.request", urllib_urlopen, True, "http.client.HTTPConnection.putrequest"),
    Level("http.client", http_client, True, "http.client.HTTPConnection.putrequest"),
    Level("urllib3", urllib3_pool, True, "urllib3.util.connection.create_connection", "urllib3"),
    Level("requests", requests_get, True, "urllib3.util.connection.create_connection", "requests"),
    Level("httpx", _httpx_sync("httpx"), True, "httpx.HTTPTransport.handle_request", "httpx"),
    Level(
        "httpx-async",
        _httpx_async("httpx"),
        True,
        "httpx.AsyncHTTPTransport.handle_async_request",
        "httpx",
    ),
    Level("httpx2", _httpx_sync("httpx2"), True, "httpx2.HTTPTransport.handle_request", "httpx2"),
    Level(
        "httpx2-async",
        _httpx_async("httpx2"),
        True,
        "httpx2.AsyncHTTPTransport.handle_async_request",
        "httpx2",
    ),
]


def _server_for(level: Level, http_server: HTTPServer, tcp_listener: TCPListener) -> Server:
    return http_server if level.http else tcp_listener


# -- helpers -------------------------------------------------------------------------------------


@dataclass
class Guarded:
    guard: NetworkGuard
    refusals: list[ReplayPolicyError]


@contextlib.contextmanager
def guarded(allow: tuple[str, ...] = ()) -> Iterator[Guarded]:
    refusals: list[ReplayPolicyError] = []
    guard = NetworkGuard(allow, on_refusal=refusals.append)
    token = guard.activate()
    try:
        yield Guarded(guard, refusals)
    finally:
        guard.deactivate(token)


def refused(level: Level, server: Server) -> NetworkRefusedError:
    with pytest.raises(NetworkRefusedError) as caught:
        level.run(server)
    return caught.value


def assert_names(error: NetworkRefusedError, level: Level, server: Server) -> None:
    assert isinstance(error, ReplayPolicyError)
    assert (error.host, error.port) == (LOOPBACK, server.port)
    assert error.via == level.via
    message = str(error)
    assert f"host {LOOPBACK}" in message
    assert f"port {server.port}" in message
    assert f"allow_network=['{LOOPBACK}:{server.port}']" in message
    if level.http:
        assert (error.method, error.path) == ("GET", PATH)
        assert error.url == f"http://{LOOPBACK}:{server.port}{PATH}"
        assert f"GET http://{LOOPBACK}:{server.port}{PATH}" in message
        assert f"path {PATH}" in message
    else:
        assert error.path is None


def _patched_attributes() -> dict[tuple[int, str], tuple[Any, str, Any, bool]]:
    """(owner, name) -> (owner, name, own value, whether the owner's own dict has it)."""
    import sys

    found: dict[tuple[int, str], tuple[Any, str, Any, bool]] = {}
    for point in network._PATCH_POINTS:
        module = sys.modules.get(point.module)
        owner = getattr(module, point.owner, None) if point.owner else module
        if owner is not None:
            own = vars(owner)
            found[(id(owner), point.name)] = (
                owner,
                point.name,
                own.get(point.name),
                point.name in own,
            )
    return found


# -- every level ---------------------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS, ids=str)
def test_refused_before_anything_is_sent(
    level: Level, http_server: HTTPServer, tcp_listener: TCPListener
) -> None:
    level.prepare()
    server = _server_for(level, http_server, tcp_listener)
    with guarded() as g:
        error = refused(level, server)
    assert g.refusals == [error]
    assert_names(error, level, server)
    level.run(server)  # the guard is gone: the same call goes through
    assert server.connections == 1  # only the call after the guard: the refused one never connected
    if isinstance(server, HTTPServer):
        assert server.requests == [("GET", PATH)]


@pytest.mark.parametrize("level", LEVELS, ids=str)
def test_an_allowed_endpoint_goes_through(
    level: Level,
    http_server: HTTPServer,
    tcp_listener: TCPListener,
    other_http_server: HTTPServer,
    other_tcp_listener: TCPListener,
) -> None:
    level.prepare()
    server = _server_for(level, http_server, tcp_listener)
    other = _server_for(level, other_http_server, other_tcp_listener)
    with guarded(allow=(f"{LOOPBACK}:{server.port}",)) as g:
        level.run(server)
        error = refused(level, other)  # the same host on another port is not named
    assert server.connections == 1
    assert g.refusals == [error]
    assert error.port == other.port
    level.run(other)
    assert other.connections == 1


@pytest.mark.parametrize("level", LEVELS, ids=str)
def test_a_live_block_goes_through(
    level: Level, http_server: HTTPServer, tcp_listener: TCPListener
) -> None:
    level.prepare()
    server = _server_for(level, http_server, tcp_listener)
    with guarded() as g:
        with g.guard.live():
            level.run(server)
        assert server.connections == 1
        error = refused(level, server)  # after the block, refused again
        live = g.guard.enter_live()  # the token spelling of the same bracket
        try:
            level.run(server)
        finally:
            g.guard.exit_live(live)
        assert refused(level, server).port == server.port
    assert g.refusals[0] is error
    assert len(g.refusals) == 2
    assert server.connections == 2


# -- what the refusal says -----------------------------------------------------------------------


def test_the_refusal_keeps_no_query_and_is_structured(http_server: HTTPServer) -> None:
    requests = pytest.importorskip("requests")
    with guarded() as g, requests.Session() as session:
        session.trust_env = False
        url = http_server.url(PATH + "?api_key=sk-live-0123456789abcdef&q=1")
        with pytest.raises(NetworkRefusedError) as caught:
            session.post(url, data=b"{}", timeout=TIMEOUT)
    error = caught.value
    assert g.refusals == [error]
    assert "api_key" not in str(error)
    assert "0123456789abcdef" not in str(error)
    assert error.to_dict()["network"] == {
        "host": LOOPBACK,
        "port": http_server.port,
        "method": "POST",
        "url": f"http://{LOOPBACK}:{http_server.port}{PATH}",
        "path": PATH,
        "address": None,
        "via": "urllib3.util.connection.create_connection",
        "lookup": False,
    }
    assert error.to_dict()["type"] == "NetworkRefusedError"
    assert error.position is None
    requests_get(http_server)
    assert http_server.connections == 1


# -- connections that no connect would see -------------------------------------------------------


def test_a_keep_alive_connection_opened_before_is_refused(http_server: HTTPServer) -> None:
    requests = pytest.importorskip("requests")
    httpx = pytest.importorskip("httpx")
    conn = http.client.HTTPConnection(LOOPBACK, http_server.port, timeout=TIMEOUT)
    session = requests.Session()
    session.trust_env = False
    client = httpx.Client(trust_env=False, timeout=TIMEOUT)
    try:
        conn.request("GET", PATH)
        conn.getresponse().read()
        session.get(http_server.url(), timeout=TIMEOUT)
        client.get(http_server.url())
        assert http_server.connections == 3
        with guarded() as g:
            with pytest.raises(NetworkRefusedError) as by_http_client:
                conn.request("GET", PATH)
            with pytest.raises(NetworkRefusedError) as by_requests:
                session.get(http_server.url(), timeout=TIMEOUT)
            with pytest.raises(NetworkRefusedError) as by_httpx:
                client.get(http_server.url())
        assert g.refusals == [by_http_client.value, by_requests.value, by_httpx.value]
        assert by_http_client.value.via == "http.client.HTTPConnection.putrequest"
        assert by_requests.value.via == "http.client.HTTPConnection.putrequest"
        assert by_httpx.value.via == "httpx.HTTPTransport.handle_request"
        assert all(e.value.path == PATH for e in (by_http_client, by_requests, by_httpx))
        assert len(http_server.requests) == 3  # nothing was sent on the open connections
        conn.request("GET", PATH)  # and each is still usable
        conn.getresponse().read()
        session.get(http_server.url(), timeout=TIMEOUT)
        client.get(http_server.url())
    finally:
        conn.close()
        session.close()
        client.close()
    assert len(http_server.requests) == 6
    assert http_server.connections == 4  # urllib3 drops a connection after any error in urlopen


# -- contexts: threads, tasks --------------------------------------------------------------------


def test_a_thread_with_the_copied_context_is_refused_a_plain_thread_is_not(
    http_server: HTTPServer,
) -> None:
    outcomes: dict[str, BaseException | None] = {}

    def attempt(name: str) -> None:
        try:
            http_client(http_server)
            outcomes[name] = None
        except BaseException as exc:
            outcomes[name] = exc

    with guarded() as g:
        copied = contextvars.copy_context()
        threads = [
            threading.Thread(target=copied.run, args=(attempt, "copied")),
            threading.Thread(target=attempt, args=("plain",)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
    assert isinstance(outcomes["copied"], NetworkRefusedError)
    assert g.refusals == [outcomes["copied"]]
    assert outcomes["plain"] is None
    assert http_server.requests == [("GET", PATH)]


async def test_asyncio_tasks_and_to_thread_are_refused(tcp_listener: TCPListener) -> None:
    refusals: list[ReplayPolicyError] = []
    guard = NetworkGuard(on_refusal=refusals.append)
    token = guard.activate()
    try:
        task = asyncio.create_task(asyncio_open_connection(tcp_listener))
        with pytest.raises(NetworkRefusedError):
            await task
        with pytest.raises(NetworkRefusedError):
            await asyncio.to_thread(raw_connect, tcp_listener)
        with guard.live():
            await asyncio.create_task(asyncio_open_connection(tcp_listener))
    finally:
        guard.deactivate(token)
    assert len(refusals) == 2
    assert tcp_listener.connections == 1


def test_a_context_without_the_guard_sees_no_change(http_server: HTTPServer) -> None:
    """The patches are process-wide; only the guard's own context is refused."""
    refusals: list[ReplayPolicyError] = []
    guard = NetworkGuard(on_refusal=refusals.append)
    elsewhere = contextvars.copy_context()
    token = elsewhere.run(guard.activate)
    try:
        assert socket.create_connection is not _ORIGINAL_CREATE_CONNECTION  # installed ...
        http_client(http_server)  # ... but this context holds no guard
        urllib_urlopen(http_server)
        with pytest.raises(NetworkRefusedError):
            elsewhere.run(http_client, http_server)
    finally:
        elsewhere.run(guard.deactivate, token)
    assert len(refusals) == 1
    assert http_server.requests == [("GET", PATH)] * 2
    httpx = pytest.importorskip("httpx")
    token = elsewhere.run(guard.activate)
    try:  # the wrappers look like what they wrap
        assert socket.create_connection.__name__ == "create_connection"
        assert inspect.signature(socket.create_connection) == inspect.signature(
            inspect.unwrap(socket.create_connection)
        )
        assert inspect.iscoroutinefunction(httpx.AsyncHTTPTransport.handle_async_request)
        assert socket.socket.connect_ex.__name__ == "connect_ex"
    finally:
        elsewhere.run(guard.deactivate, token)


def test_a_deactivated_guard_is_inert_where_its_context_lingers(
    http_server: HTTPServer,
) -> None:
    stale = NetworkGuard()
    token = stale.activate()
    lingering = contextvars.copy_context()  # still holds `stale` after the deactivation below
    stale.deactivate(token)
    with guarded() as other:  # the patches are installed again, by another guard
        lingering.run(http_client, http_server)
        with pytest.raises(NetworkRefusedError):
            http_client(http_server)
    assert len(other.refusals) == 1
    assert http_server.requests == [("GET", PATH)]


# -- what must keep working ------------------------------------------------------------------------


def test_the_simple_span_processor_export_reaches_the_collector(http_server: HTTPServer) -> None:
    exporter_module = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    requests = pytest.importorskip("requests")
    session = requests.Session()
    session.trust_env = False  # never a proxy from the environment
    exporter = exporter_module.OTLPSpanExporter(
        endpoint=http_server.url("/v1/traces"), session=session
    )
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with guarded() as g:
            with pytest.raises(NetworkRefusedError):  # the agent's own request to the same port
                session.post(http_server.url("/v1/traces"), data=b"", timeout=TIMEOUT)
            with provider.get_tracer("test").start_as_current_span("exported in this thread"):
                pass
    finally:
        provider.shutdown()
        session.close()
    assert len(g.refusals) == 1
    assert http_server.requests == [("POST", "/v1/traces")]


def test_only_the_suppress_instrumentation_key_exempts(tcp_listener: TCPListener) -> None:
    suppress = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")
    http_only = getattr(otel_context, "_SUPPRESS_HTTP_INSTRUMENTATION_KEY", None)
    with guarded() as g:
        token = otel_context.attach(otel_context.set_value(suppress, True))
        try:
            raw_connect(tcp_listener)
        finally:
            otel_context.detach(token)
        if http_only is not None:  # HTTP instrumentations set it around the user's requests
            token = otel_context.attach(otel_context.set_value(http_only, True))
            try:
                with pytest.raises(NetworkRefusedError):
                    raw_connect(tcp_listener)
            finally:
                otel_context.detach(token)
        with pytest.raises(NetworkRefusedError):
            raw_connect(tcp_listener)
    assert len(g.refusals) == (2 if http_only is not None else 1)
    assert tcp_listener.connections == 1


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets here")
def test_unix_sockets_are_allowed(tcp_listener: TCPListener) -> None:
    directory = tempfile.mkdtemp(prefix="sfng")  # short: a socket path has ~100 bytes at most
    path = os.path.join(directory, "s")
    served = threading.Event()

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)
        server.settimeout(TIMEOUT)

        def accept() -> None:
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                with conn:
                    conn.sendall(b"ok")
                    served.set()

        thread = threading.Thread(target=accept)
        thread.start()
        with guarded() as g:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(TIMEOUT)
                client.connect(path)
                assert client.recv(2) == b"ok"
            with pytest.raises(NetworkRefusedError):
                raw_connect(tcp_listener)
        thread.join(TIMEOUT)
    Path(path).unlink(missing_ok=True)
    os.rmdir(directory)
    assert served.is_set()
    assert len(g.refusals) == 1
    raw_connect(tcp_listener)
    assert tcp_listener.connections == 1


def test_datagrams_are_refused_connected_or_addressed() -> None:
    """A UDP ``sendto``/``sendmsg`` sends to its address, and a UDP ``connect`` names the peer
    every later ``send`` goes to (with no audit event of its own): all three are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind((LOOPBACK, 0))
        receiver.settimeout(TIMEOUT)
        address = receiver.getsockname()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            with guarded() as g:
                with pytest.raises(NetworkRefusedError) as sent:
                    udp.sendto(b"sendto", address)
                with pytest.raises(NetworkRefusedError):
                    udp.sendmsg([b"sendmsg"], [], 0, address)
                with pytest.raises(NetworkRefusedError) as connected:
                    udp.connect(address)
            udp.sendto(b"after", address)
            assert receiver.recv(64) == b"after"  # the first datagram to arrive
        assert (sent.value.host, sent.value.port) == address
        assert sent.value.via == "socket.socket.sendto"
        assert connected.value.via == "socket.socket.connect"
        assert len(g.refusals) == 3


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets here")
def test_an_httpx_unix_socket_transport_is_allowed(http_server: HTTPServer) -> None:
    httpx = pytest.importorskip("httpx")
    directory = tempfile.mkdtemp(prefix="sfng")
    path = os.path.join(directory, "h")

    class UnixHTTPServer(_CountingHTTPServer):
        address_family = socket.AF_UNIX

        def __init__(self) -> None:
            http.server.ThreadingHTTPServer.__init__(self, path, _Handler)  # type: ignore[arg-type]
            self.lock = threading.Lock()
            self.connections = 0
            self.requests = []

        def server_bind(self) -> None:  # HTTPServer's would look for a host and port
            self.socket.bind(self.server_address)

        def get_request(self) -> tuple[socket.socket, Any]:
            conn, _ = self.socket.accept()
            return conn, ("local", 0)

    unix = UnixHTTPServer()
    thread = threading.Thread(target=unix.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with guarded() as g:
            transport = httpx.HTTPTransport(uds=path)
            with httpx.Client(transport=transport, trust_env=False, timeout=TIMEOUT) as client:
                assert client.get(f"http://{LOOPBACK}:{http_server.port}{PATH}").content == b"ok"
            with pytest.raises(NetworkRefusedError), httpx.Client(trust_env=False) as client:
                client.get(http_server.url())
    finally:
        unix.shutdown()
        unix.server_close()
        thread.join(TIMEOUT)
        Path(path).unlink(missing_ok=True)
        os.rmdir(directory)
    assert unix.requests == [("GET", PATH)]
    assert len(g.refusals) == 1
    http_client(http_server)
    assert http_server.connections == 1


# -- activation, nesting, restoring ----------------------------------------------------------------


def test_deactivation_restores_every_patched_attribute(http_server: HTTPServer) -> None:
    for module in ("requests", "urllib3", "httpx", "httpx2"):  # so that every point is patched
        with contextlib.suppress(ImportError):
            __import__(module)
    before = _patched_attributes()
    assert "connect" not in vars(socket.socket)
    with guarded() as g:
        during = _patched_attributes()
        changed = [key for key in before if during[key][2] is not before[key][2]]
        assert len(changed) == len(before)  # every point found is patched
        with pytest.raises(NetworkRefusedError):
            http_client(http_server)
    after = _patched_attributes()
    for key, (owner, name, value, own) in before.items():
        assert after[key][3] is own, f"{owner.__name__}.{name} moved into/out of the owner's dict"
        assert after[key][2] is value, f"{owner.__name__}.{name} was not restored"
    assert "connect" not in vars(socket.socket)  # inherited again, not re-set
    assert socket.socket.connect is _ORIGINAL_CONNECT
    assert socket.create_connection is inspect.unwrap(socket.create_connection)
    assert http.client.HTTPConnection.putrequest is inspect.unwrap(
        http.client.HTTPConnection.putrequest
    )
    assert len(g.refusals) == 1
    http_client(http_server)
    assert http_server.requests == [("GET", PATH)]


def test_nested_guards_restore_correctly(
    http_server: HTTPServer, other_http_server: HTTPServer
) -> None:
    before = _patched_attributes()
    outer_refusals: list[ReplayPolicyError] = []
    inner_refusals: list[ReplayPolicyError] = []
    outer = NetworkGuard(on_refusal=outer_refusals.append)
    inner = NetworkGuard([f"{LOOPBACK}:{http_server.port}"], on_refusal=inner_refusals.append)
    outer_token = outer.activate()
    inner_token = inner.activate()
    http_client(http_server)  # the inner guard governs this context now
    with pytest.raises(NetworkRefusedError):
        http_client(other_http_server)
    inner.deactivate(inner_token)
    with pytest.raises(NetworkRefusedError):
        http_client(http_server)  # the outer guard again
    assert outer.active
    assert not inner.active
    outer.deactivate(outer_token)
    assert (len(outer_refusals), len(inner_refusals)) == (1, 1)
    assert _patched_attributes() == before

    # out of order: the first guard goes first, the patches stay until the second goes too
    first, second = NetworkGuard(), NetworkGuard()
    first_token, second_token = first.activate(), second.activate()
    first.deactivate(first_token)
    assert socket.create_connection is not _ORIGINAL_CREATE_CONNECTION
    with pytest.raises(NetworkRefusedError):
        http_client(http_server)  # the second guard still governs this context
    second.deactivate(second_token)
    assert _patched_attributes() == before
    http_client(http_server)
    assert http_server.requests == [("GET", PATH)] * 2
    with pytest.raises(RuntimeError):
        first.deactivate(first_token)
    with pytest.raises(ValueError, match="another NetworkGuard"):
        first.deactivate(second_token)


# -- the allow list --------------------------------------------------------------------------------


def test_a_name_entry_allows_the_addresses_it_resolves_to(
    tcp_listener: TCPListener, other_tcp_listener: TCPListener
) -> None:
    if LOOPBACK not in {info[4][0] for info in socket.getaddrinfo("localhost", None)}:
        pytest.skip("localhost does not resolve to 127.0.0.1 here")
    with guarded(allow=(f"localhost:{tcp_listener.port}",)) as g:
        raw_connect(tcp_listener)  # connect() sees 127.0.0.1, the entry says localhost
        asyncio.run(_awaited(asyncio_open_connection(tcp_listener)))
        with pytest.raises(NetworkRefusedError):
            raw_connect(other_tcp_listener)
    assert len(g.refusals) == 1
    assert tcp_listener.connections == 2


def test_allow_entries_are_validated_and_normalised(tcp_listener: TCPListener) -> None:
    guard = NetworkGuard(
        ["LocalHost.:8080", "[::1]:8080", "::1", "127.0.0.1", "[::ffff:127.0.0.1]:80", "my_host"]
    )
    assert guard.allow == (
        "localhost:8080",
        "[::1]:8080",
        "[::1]",
        "127.0.0.1",
        "127.0.0.1:80",
        "my_host",
    )
    for junk in [
        "",
        " localhost",
        "http://localhost:8080",
        "localhost:8080/v1",
        "user@host",
        "localhost:",
        "localhost:0",
        "localhost:65536",
        "localhost:http",
        "*",
        "[localhost]:80",
        "[::1",
        "[::1]8080",
        "::1:8080:x",
        "999.1.1.1",
        "a..b",
    ]:
        with pytest.raises(ValueError, match="allow_network entry"):
            NetworkGuard([junk])
    with pytest.raises(TypeError, match="not a string"):
        NetworkGuard("localhost:8080")
    with pytest.raises(TypeError, match="strings"):
        NetworkGuard([8080])  # type: ignore[list-item]
    named = ("localhost:8080", "[::1]:8080", "[::1]", "127.0.0.1:80")
    with guarded(allow=named) as g, pytest.raises(NetworkRefusedError):
        raw_connect(tcp_listener)  # none of them names this address and port
    assert len(g.refusals) == 1


def test_an_activation_that_fails_leaves_nothing_installed_nor_a_session_active(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A patch point that refuses to be set (an odd or frozen module) must not leave the other
    patches in place, nor a half-entered session that would refuse every later boundary call."""
    import types

    from stepfork_otel.recording.contract import current_session

    class Frozen(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            raise AttributeError(f"{cls.__name__} is frozen")

    class HTTPTransport(metaclass=Frozen):
        def handle_request(self, request: Any) -> Any:
            return request

    fake = types.ModuleType("httpx")
    fake.HTTPTransport = HTTPTransport  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "httpx", fake)
    monkeypatch.delitem(sys.modules, "httpx2", raising=False)
    with pytest.raises(AttributeError, match="frozen"):
        NetworkGuard().activate()
    assert socket.socket.connect is _ORIGINAL_CONNECT

    trace = Trace(trace_id="0" * 32)
    session = ReplaySession(trace)
    with pytest.raises(AttributeError, match="frozen"), session:
        pass
    assert current_session.get() is None  # ordinary recording is not refused afterwards
    assert socket.socket.connect is _ORIGINAL_CONNECT
