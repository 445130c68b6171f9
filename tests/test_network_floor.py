"""The network guard's floor (issues 28 and 26): traffic that bypasses ``socket.socket.connect``
in Python -- TCP Fast Open (``sendto``/``sendmsg`` with an address), a ``connect`` saved before the
guard activated, a ``_socket.socket`` -- and name lookups are refused through the interpreter's
audit events; a whole-process guard refuses them from every thread, not only the guarded context.

Every server here is a listener on 127.0.0.1, port 0, that counts the connections it accepted.
A refusal is checked by making one allowed connection afterwards and counting exactly one: a
connection leaked by the refused call would have been accepted first."""

from __future__ import annotations

import _socket
import contextlib
import contextvars
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import context as otel_context

from stepfork_otel.replay.errors import ReplayPolicyError
from stepfork_otel.replay.network import NetworkGuard, NetworkRefusedError

TIMEOUT = 5.0
LOOPBACK = "127.0.0.1"
SAVED_CONNECT = socket.socket.connect  # saved at import, as a library may do
SAVED_GETADDRINFO = socket.getaddrinfo
NOWHERE = "api.stepfork-test.invalid"  # .invalid never resolves; a lookup would still be a query


class Listener:
    def __init__(self) -> None:
        self.sock = socket.create_server((LOOPBACK, 0))
        self.sock.settimeout(0.05)
        self.port: int = self.sock.getsockname()[1]
        self.address = (LOOPBACK, self.port)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def connections(self) -> int:
        """Accepted so far, after one allowed connection made now has been accepted too."""
        with socket.create_connection(self.address, timeout=TIMEOUT) as probe:
            probe.settimeout(TIMEOUT)
            probe.recv(1)  # the server closes it once accepted
        return self.accepted

    def close(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def guarded(
    allow: tuple[str, ...] = (), *, whole_process: bool = False
) -> Iterator[list[ReplayPolicyError]]:
    refusals: list[ReplayPolicyError] = []
    guard = NetworkGuard(allow, on_refusal=refusals.append, whole_process=whole_process)
    token = guard.activate()
    try:
        yield refusals
    finally:
        guard.deactivate(token)


def in_plain_thread(call: Any, *args: Any) -> BaseException | None:
    """Run ``call`` in a thread started without this context; what it raised, or None."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call(*args)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(TIMEOUT)
    assert outcome, "the thread did not finish"
    return outcome[0]


# -- connections that never call socket.socket.connect in Python -----------------------------


@pytest.mark.skipif(not hasattr(socket, "MSG_FASTOPEN"), reason="no TCP Fast Open here")
def test_tcp_fast_open_is_refused(listener: Listener) -> None:
    with guarded() as refusals, socket.socket() as sock:
        with pytest.raises(NetworkRefusedError) as sent:
            sock.sendto(b"GET / HTTP/1.0\r\n\r\n", socket.MSG_FASTOPEN, listener.address)
        with pytest.raises(NetworkRefusedError) as sent_msg:
            sock.sendmsg([b"GET / HTTP/1.0\r\n\r\n"], [], socket.MSG_FASTOPEN, listener.address)
    assert (sent.value.host, sent.value.port) == listener.address
    assert sent.value.via == "socket.socket.sendto"
    assert sent_msg.value.via == "socket.socket.sendmsg"
    assert refusals == [sent.value, sent_msg.value]
    assert listener.connections() == 1


def test_a_connect_saved_before_the_guard_and_a_bare_socket_are_refused(
    listener: Listener,
) -> None:
    with guarded() as refusals:
        with socket.socket() as sock, pytest.raises(NetworkRefusedError) as saved:
            SAVED_CONNECT(sock, listener.address)
        bare = _socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            with pytest.raises(NetworkRefusedError):
                bare.connect(listener.address)
            with pytest.raises(NetworkRefusedError):
                bare.connect_ex(listener.address)  # an error code would pass for a failure
        finally:
            bare.close()
    assert saved.value.via == "socket.socket.connect"
    assert f"allow_network=['{LOOPBACK}:{listener.port}']" in str(saved.value)
    assert len(refusals) == 3
    assert listener.connections() == 1


# -- name lookups --------------------------------------------------------------------------------


def test_name_lookups_are_refused_with_the_name() -> None:
    lookups = [
        lambda: socket.getaddrinfo(NOWHERE, 443),
        lambda: SAVED_GETADDRINFO(NOWHERE, 443),
        lambda: socket.gethostbyname(NOWHERE),
        lambda: socket.gethostbyname_ex(NOWHERE),
        lambda: socket.gethostbyaddr("192.0.2.1"),  # a reverse lookup is a query too
    ]
    with guarded() as refusals:
        errors = []
        for lookup in lookups:
            with pytest.raises(NetworkRefusedError) as caught:
                lookup()
            errors.append(caught.value)
    assert [e.host for e in errors] == [NOWHERE] * 4 + ["192.0.2.1"]
    assert all(e.lookup for e in errors)
    assert errors[0].port == 443
    assert str(errors[0]).startswith(
        f"network access refused during replay: a name lookup (DNS) of {NOWHERE} does not go"
    )
    assert f"allow_network=['{NOWHERE}:443']" in str(errors[0])
    assert errors[0].to_dict()["network"]["lookup"] is True
    assert refusals == errors


def test_lookups_that_need_no_query_or_are_allowed_go_through() -> None:
    with guarded((f"{NOWHERE}:443",)) as refusals:
        assert socket.getaddrinfo("localhost", 80)  # loopback names: the hosts file
        assert socket.getaddrinfo(LOOPBACK, 80, type=socket.SOCK_STREAM)  # numeric
        assert socket.getaddrinfo("::1", 80, type=socket.SOCK_STREAM)
        assert socket.getaddrinfo(None, 80, type=socket.SOCK_STREAM)  # no host at all
        assert socket.gethostbyname("localhost")
        with contextlib.suppress(OSError):
            socket.gethostbyaddr(LOOPBACK)
        with pytest.raises(OSError) as caught:  # allowed by name (any port): really looked up
            socket.getaddrinfo(NOWHERE, 80)
        assert not isinstance(caught.value, NetworkRefusedError)
        with pytest.raises(NetworkRefusedError):
            socket.getaddrinfo("other." + NOWHERE, 443)
    assert len(refusals) == 1


def test_a_suppressed_export_may_look_names_up() -> None:
    suppress = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")
    with guarded(whole_process=True) as refusals:
        token = otel_context.attach(otel_context.set_value(suppress, True))
        try:
            with pytest.raises(OSError) as caught:
                socket.getaddrinfo(NOWHERE, 443)
            assert not isinstance(caught.value, NetworkRefusedError)
        finally:
            otel_context.detach(token)
    assert refusals == []


# -- the whole process ---------------------------------------------------------------------------


def test_a_whole_process_guard_refuses_every_thread(listener: Listener) -> None:
    def connect() -> None:
        with socket.create_connection(listener.address, timeout=TIMEOUT):
            pass

    with guarded(whole_process=True) as refusals:
        connected = in_plain_thread(connect)
        looked_up = in_plain_thread(socket.getaddrinfo, NOWHERE, 443)
        with socket.socket() as sock:
            saved = in_plain_thread(SAVED_CONNECT, sock, listener.address)
    assert isinstance(connected, NetworkRefusedError)
    assert connected.via == "socket.create_connection"
    assert isinstance(looked_up, NetworkRefusedError)
    assert isinstance(saved, NetworkRefusedError)
    assert refusals == [connected, looked_up, saved]
    assert listener.connections() == 1
    assert in_plain_thread(connect) is None  # deactivated: the process is open again
    assert listener.connections() == 3


def test_a_context_guard_leaves_other_threads_alone(listener: Listener) -> None:
    def connect() -> None:
        with socket.socket() as sock:
            SAVED_CONNECT(sock, listener.address)

    with guarded() as refusals:
        assert in_plain_thread(connect) is None
        copied = contextvars.copy_context()
        assert isinstance(in_plain_thread(copied.run, connect), NetworkRefusedError)
    assert len(refusals) == 1
    assert listener.connections() == 2


def test_a_whole_process_guard_allows_what_it_names_in_every_thread(listener: Listener) -> None:
    def connect() -> None:
        with socket.create_connection(("localhost", listener.port), timeout=TIMEOUT):
            pass

    with guarded((f"localhost:{listener.port}",), whole_process=True) as refusals:
        assert in_plain_thread(connect) is None
        with socket.socket() as sock:
            assert in_plain_thread(SAVED_CONNECT, sock, listener.address) is None  # resolved
    assert refusals == []
    assert listener.connections() == 3
