"""Nothing live unless named: the network guard of a replay session.

During a replay every dependency call is meant to go through a boundary, which substitutes the
recorded answer or runs the call live only when the session says so. A call that bypasses every
boundary -- a framework whose LLM client is not instrumented, a helper that posts to a web hook --
would otherwise reach the real service, and ``verify_complete()`` would never know. So while a
:class:`NetworkGuard` is active in a context, every outbound TCP connection and HTTP request made
in that context is refused with a :class:`NetworkRefusedError` (a ``ReplayPolicyError``) that
names host, port and, where the level knows them, method and path -- before anything is sent.
Loopback is refused too: a local model server (Ollama, vLLM, an OpenAI-compatible proxy) on
127.0.0.1 is exactly a live LLM.

The API the session uses::

    guard = NetworkGuard(allow_network, on_refusal=record)   # validates the entries (ValueError)
    token = guard.activate()       # patches installed (process-wide, counted); guard set here
    ...
    with guard.live():             # an executed boundary body: the network is its own business
        ...
    live = guard.enter_live()      # the same as two calls, for a bracket opened and closed
    guard.exit_live(live)          # in two places (``begin_call`` ... ``end_call``)
    ...
    guard.deactivate(token)        # the last deactivation restores every patched attribute

``allow`` entries are ``"host"`` (any port) or ``"host:port"``; an IPv6 address is written
``"[::1]:8080"`` (or bare ``"::1"`` for any port). Names match case-insensitively and also match
the addresses they resolve to (so ``"localhost:11434"`` lets a client that resolved ``localhost``
itself connect to ``127.0.0.1:11434``), and an address entry matches a name that resolves to it.
Resolution happens only on the guarded slow path, for entries that could match. ``on_refusal``
is called with each refusal just before it is raised, so the session can record it and
``verify_complete()`` fails even when the agent swallows the error; it must not raise (if it
does, the failure is logged as an internal error and the refusal is raised all the same).

Which context is guarded. A guard made with ``whole_process=True`` (the session's, in the modes
that run nothing live: ``frozen``, ``forbidden``, ``manual``) governs every context of the
process: a framework's own exporter thread (the OpenAI Agents SDK posts its traces from one) is
refused like the agent. Otherwise the guard lives in a context variable, like the session: the
context that activated it, asyncio tasks created from it, and threads started with a copy of it
(``contextvars.copy_context().run``, ``asyncio.to_thread``) are guarded; a thread started
*without* the context (``threading.Thread``, ``ThreadPoolExecutor.submit``,
``loop.run_in_executor``) is not -- in ``hybrid`` and ``live`` mode the bodies run for real, and
their clients may use threads of their own; boundary calls from such threads are refused by the
session itself (``ReplaySessionError``). Where threads inherit the context by default
(``-X thread_inherit_context=1``, the default on free-threaded Python 3.14) they are guarded.
Several active guards all decide: traffic passes only where every guard that governs the context
allows it, and each refusing guard records the refusal. ``enter_live`` opens a context for its
own guard only. Exempt everywhere: a context where OpenTelemetry's suppress-instrumentation key
is set, which is how the SDK's span processors (``BatchSpanProcessor`` in its thread,
``SimpleSpanProcessor`` in the caller's), metric readers and log processors export: the user's
own telemetry keeps working during replay. The HTTP-only suppression key is not an exemption:
HTTP client instrumentations set it around the very requests this guard exists to refuse.

What is refused: traffic of ``AF_INET`` / ``AF_INET6`` sockets (TCP, UDP, raw), HTTP requests
whose connection would be one, and name lookups (DNS) that need a query. ``AF_UNIX`` is local
IPC (a Docker socket, a ``uds=`` transport) and is allowed. A lookup passes when it needs no
query (an address, no host, ``localhost`` and the other loopback names, a reverse lookup of a
loopback address) or looks up a name an entry names (whatever its port). An address entry allows
no name lookup: finding out whether the name resolves to it would be the query refused (the
guard's own resolution, for a name given to a "resolve, then connect" helper when an address
entry could match, is the one lookup it makes).

The floor is the interpreter's audit events (``sys.addaudithook``): ``socket.connect`` (raised in
C by ``connect`` and ``connect_ex``), ``socket.sendto`` and ``socket.sendmsg`` with an address
(TCP Fast Open, datagrams), ``socket.getaddrinfo``, ``socket.gethostbyname`` (also
``gethostbyname_ex``) and ``socket.gethostbyaddr``. They fire whatever reference the caller holds
-- a ``socket.socket.connect`` saved before the session, ``_socket.socket`` -- and an exception
from the hook aborts the call before the system call. Names host and port only (the method and
path when a level above has named the request). A hook cannot be removed: it is added once, at
the first activation, and switched on and off with the guards.

Above the floor, patches installed only while some guard is active, the HTTP ones only for a
library already imported when a guard activates (an optional library is never imported here),
through one :class:`~stepfork_otel._patching.Patcher` (the last deactivation undoes what it
replaced; a wrapper another library put around one of them since is left in place):

* ``socket.create_connection`` and ``urllib3.util.connection.create_connection`` -- the two
  "resolve, then connect" helpers (``http.client`` and ``httpcore`` use the first, ``urllib3`` and
  so ``requests`` the second): refused by the name the caller gave, before the name is resolved
  and before a socket exists. Allowed, their own lookups and connects are to that endpoint and
  are not checked again.
* ``http.client.HTTPConnection.putrequest`` -- the first step of every request of ``http.client``,
  ``urllib.request`` and ``urllib3`` (which subclasses it); nothing is sent before
  ``endheaders()``. Names method and path; refuses a request on a connection that is already open
  (keep-alive, opened before the session), which no connect would see. A fresh connection whose
  class makes its own socket (not the standard library's ``connect``) is left to the socket
  level, where an ``AF_UNIX`` connection is allowed.
* ``urllib3.connectionpool.HTTPConnectionPool.urlopen`` -- decides nothing; it names the request
  (method, URL) for whatever refuses inside it, since urllib3 connects HTTPS connections before
  the request line is written.
* ``httpx`` / ``httpx2`` ``HTTPTransport.handle_request`` and ``AsyncHTTPTransport
  .handle_async_request`` -- every request of a client on the default transport, sync and async,
  with method and path, before the connection pool picks or opens a connection (a pooled
  connection would need no connect). A transport configured with ``uds=`` is allowed (local IPC).
  ``MockTransport`` / ASGI / WSGI transports never reach the network and are not patched.

Not covered: traffic that does not go through the socket module -- C extensions that open their
own sockets (gRPC's C core, which is also why the OTLP/gRPC exporter keeps working; libcurl;
database client libraries written in C) and their own resolvers (c-ares) --, ``getnameinfo``
(its audit event does not say whether the lookup is numeric), ``send``/``sendall`` on a
connection opened before the session without one of the HTTP entry points above, event loops
that do not use the socket module (uvloop), child processes. If another audit hook refuses to let
this one be added, activation raises ``RuntimeError`` rather than guard nothing. Through a proxy,
the proxy is the endpoint checked; allowing it allows whatever is sent through it.

Cost: nothing until the first activation. Then, with no guard active, the hook reads one global
per audit event (a loopback connect measures the same with and without it:
``benchmarks/bench_network_guard.py``); while a guard is active, a socket event or patched call
in a context no guard governs costs a context-variable read and a tuple check.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

from opentelemetry import context as otel_context

from stepfork_otel._internal import handle_internal_errors
from stepfork_otel._patching import Patcher
from stepfork_otel.config import CONFIG
from stepfork_otel.replay.errors import ReplayPolicyError

__all__ = ["GuardToken", "LiveToken", "NetworkGuard", "NetworkRefusedError"]

# The SDK's SimpleSpanProcessor sets this key around an export made in the caller's thread.
_SUPPRESS_KEY = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")

_INET = (socket.AF_INET, socket.AF_INET6)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


# -- the error --------------------------------------------------------------------------------


class NetworkRefusedError(ReplayPolicyError):
    """Network traffic that no boundary serves was refused during a replay, before it was sent.

    ``host`` and ``port`` are the endpoint that was refused (what ``allow_network`` would have to
    name); ``method``, ``url`` and ``path`` describe the HTTP request when the refusing level knows
    it (query strings are never kept, and the path is redacted like any recorded text);
    ``address`` is the address given to ``connect`` when it differs from ``host``; ``via`` is the
    patch point or audit event that refused; ``lookup`` is True for a refused name lookup (DNS),
    which happens before any connection."""

    def __init__(
        self,
        host: str,
        port: int | None,
        *,
        via: str,
        method: str | None = None,
        url: str | None = None,
        path: str | None = None,
        address: str | None = None,
        lookup: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.method = method
        self.url = url
        self.path = path
        self.address = address
        self.via = via
        self.lookup = lookup
        entry = self.allow_entry
        if lookup:
            what = f"a name lookup (DNS) of {host}"
        elif method and url:
            what = f"{method} {url}"
        else:
            what = f"a connection to {entry}"
        where = [f"host {host}", f"port {port if port is not None else 'unknown'}"]
        if path is not None:
            where.append(f"path {path}")
        if address is not None and address != host:
            where.append(f"address {address}")
        super().__init__(
            f"network access refused during replay: {what} does not go through a boundary",
            details=[
                ", ".join(where),
                f"refused by the replay network guard at {via}, before anything was sent",
                "during a replay only boundaries (@trace_tool, llm_request) reach dependencies, "
                "and only the calls the session runs live; this traffic bypassed them (an "
                "uninstrumented client or framework?)",
                f"if it is meant to happen, name it: allow_network=[{entry!r}] "
                f"(CLI: --allow-network {entry})",
            ],
        )

    @property
    def allow_entry(self) -> str:
        """The ``allow_network`` entry that would let this endpoint through."""
        return _hostport(self.host, self.port)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["network"] = {
            "host": self.host,
            "port": self.port,
            "method": self.method,
            "url": self.url,
            "path": self.path,
            "address": self.address,
            "via": self.via,
            "lookup": self.lookup,
        }
        return out


# -- allow entries and addresses ----------------------------------------------------------------

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def _ip(text: str) -> str | None:
    """``text`` as a normalised IP address (an IPv4-mapped IPv6 address as IPv4, no zone), or
    None."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def _hostport(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


def _name(text: str) -> str | None:
    """A host name normalised (lower case, IDNA, no trailing dot), or None if it is none."""
    name = text[:-1] if text.endswith(".") else text
    try:
        name = name.encode("idna").decode("ascii").lower()
    except (UnicodeError, ValueError):
        return None
    if len(name) > 253 or not _NAME.fullmatch(name) or name.rsplit(".", 1)[-1].isdigit():
        return None  # an all-digit last label is a malformed address, not a name
    return name


@dataclass(frozen=True, slots=True)
class _Entry:
    host: str
    """A normalised IP address or host name."""
    port: int | None
    is_ip: bool

    def __str__(self) -> str:
        return _hostport(self.host, self.port)

    def covers(self, port: int | None) -> bool:
        return self.port is None or self.port == port


def _parse_port(text: str, entry: str) -> int:
    if not text.isdigit() or not text.isascii() or not 0 < int(text) < 65536:
        raise ValueError(f"allow_network entry {entry!r}: the port must be a number 1-65535")
    return int(text)


def _parse_entry(entry: object) -> _Entry:
    if not isinstance(entry, str):
        raise TypeError(
            f"allow_network entries are strings ('host' or 'host:port'), not {type(entry).__name__}"
        )
    if not entry or any(c.isspace() for c in entry) or any(c in entry for c in "/@?#"):
        raise ValueError(
            f"allow_network entry {entry!r} is not 'host' or 'host:port' (an IPv6 address as "
            "'[::1]:8080'; no scheme, path or user)"
        )
    port: int | None = None
    if entry.startswith("["):
        host_text, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"allow_network entry {entry!r}: expected '[address]:port'")
        if rest:
            port = _parse_port(rest[1:], entry)
        ip = _ip(host_text) if ":" in host_text else None
        if ip is None:
            raise ValueError(f"allow_network entry {entry!r}: brackets hold an IPv6 address")
        return _Entry(ip, port, True)
    if entry.count(":") > 1:  # a bare IPv6 address (any port)
        ip = _ip(entry)
        if ip is None:
            raise ValueError(
                f"allow_network entry {entry!r} is not an IPv6 address (with a port: '[::1]:8080')"
            )
        return _Entry(ip, None, True)
    host_text, colon, port_text = entry.partition(":")
    if colon:
        port = _parse_port(port_text, entry)
    ip = _ip(host_text)
    if ip is not None:
        return _Entry(ip, port, True)
    name = _name(host_text)
    if name is None:
        raise ValueError(f"allow_network entry {entry!r}: {host_text!r} is no host name or address")
    return _Entry(name, port, False)


def _target_host(host: object) -> str | None:
    """A host as a client gave it, normalised like an entry (None: not a host at all)."""
    if isinstance(host, (bytes, bytearray)):
        host = bytes(host).decode("ascii", "replace")
    if not isinstance(host, str):
        return None
    if host == "":
        return "0.0.0.0"  # connect(("", port)) is INADDR_ANY: this machine
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ip = _ip(text)
    if ip is not None:
        return ip
    return _name(text) or text.lower()


def _target_port(port: object) -> int | None:
    if isinstance(port, int):
        return port
    if isinstance(port, str) and port.isdigit():
        return int(port)
    return None


def _split_address(address: object) -> tuple[str, int | None] | None:
    if not isinstance(address, tuple) or len(address) < 2:
        return None
    host = _target_host(address[0])
    return None if host is None else (host, _target_port(address[1]))


def _request_path(target: object) -> str | None:
    """The path of a request target (origin or absolute form), without query or fragment."""
    if isinstance(target, bytes):
        target = target.decode("ascii", "replace")
    if not isinstance(target, str) or not target:
        return None
    if target == "*":
        return target
    if "://" in target:
        path = urlsplit(target).path or "/"
    elif target.startswith("/"):
        path = target.split("?", 1)[0].split("#", 1)[0]
    else:
        return None
    return CONFIG.settings.redactor.redact_text(path)


@dataclass(frozen=True, slots=True)
class _Request:
    """The HTTP request being made, for a refusal raised below the level that knows it."""

    method: str
    scheme: str
    host: str
    port: int | None
    path: str | None


def _request(method: object, scheme: str, host: object, port: object, target: object) -> _Request:
    """The request, its URL from the connection -- or from an absolute target (a proxy's)."""
    if isinstance(target, str) and "://" in target:
        with contextlib.suppress(ValueError):
            parts = urlsplit(target)
            if parts.hostname:
                scheme, host = parts.scheme or scheme, parts.hostname
                port = parts.port or _DEFAULT_PORTS.get(scheme)
    shown = _target_host(host) or str(host)
    return _Request(str(method), scheme, shown, _target_port(port), _request_path(target))


# -- the guard ----------------------------------------------------------------------------------


class _Opened:
    """The value of :data:`_GUARD` in a context opened to the network: for the guard ``by`` only
    (an executed body), or for every guard (``by`` None: an endpoint every guard already allowed,
    the guard's own name resolution)."""

    __slots__ = ("by",)

    def __init__(self, by: NetworkGuard | None) -> None:
        self.by = by


_OPEN_TO_ALL = _Opened(None)
_GUARD: ContextVar[NetworkGuard | _Opened | None] = ContextVar(
    "stepfork_network_guard", default=None
)
_REQUEST: ContextVar[_Request | None] = ContextVar("stepfork_network_request", default=None)
_WHOLE_PROCESS: tuple[NetworkGuard, ...] = ()
"""The active guards that govern every context of the process (replaced, never mutated)."""


def _governing() -> tuple[NetworkGuard, ...]:
    """The active guards that decide for the current context (empty: nothing is refused here)."""
    here = _GUARD.get()
    wide = _WHOLE_PROCESS
    if here is None:
        guards = wide
    elif isinstance(here, _Opened):
        if here.by is None or not wide:
            return ()
        guards = tuple(guard for guard in wide if guard is not here.by)
    elif here in wide:
        guards = wide
    else:
        guards = (*wide, here)
    if not guards:
        return ()
    guards = tuple(guard for guard in guards if guard._activations > 0)
    if guards and otel_context.get_value(_SUPPRESS_KEY):
        return ()  # an export of the OpenTelemetry SDK: the user's own telemetry
    return guards


class GuardToken:
    """What :meth:`NetworkGuard.activate` returns; give it back to :meth:`~NetworkGuard.deactivate`."""

    __slots__ = ("_token", "guard", "used")

    def __init__(self, guard: NetworkGuard, token: Token[NetworkGuard | _Opened | None]) -> None:
        self.guard = guard
        self._token = token
        self.used = False


class LiveToken:
    """What :meth:`NetworkGuard.enter_live` returns; give it back to :meth:`~NetworkGuard.exit_live`."""

    __slots__ = ("_token",)

    def __init__(self, token: Token[NetworkGuard | _Opened | None] | None) -> None:
        self._token = token


class NetworkGuard:
    """Refuses outbound network traffic made in the context of an active replay session -- or,
    with ``whole_process=True``, in every context of the process.

    See the module docstring for what is refused, where, and what is not covered."""

    def __init__(
        self,
        allow: Iterable[str] = (),
        on_refusal: Callable[[ReplayPolicyError], None] | None = None,
        *,
        whole_process: bool = False,
    ) -> None:
        if isinstance(allow, str):
            raise TypeError(
                "allow_network takes a collection of 'host[:port]' entries, not a string"
            )
        self._entries = tuple(dict.fromkeys(_parse_entry(entry) for entry in allow))
        self._names = frozenset(entry.host for entry in self._entries if not entry.is_ip)
        self._on_refusal = on_refusal
        self.whole_process = whole_process
        self._activations = 0  # changed under _PATCHES' lock
        self._resolved: dict[str, frozenset[str]] = {}

    @property
    def allow(self) -> tuple[str, ...]:
        """The allowed endpoints, normalised (``host``, ``host:port``, ``[v6]:port``)."""
        return tuple(str(entry) for entry in self._entries)

    @property
    def active(self) -> bool:
        """Whether the guard is activated (in some context)."""
        return self._activations > 0

    # -- activation ---------------------------------------------------------------------------

    def activate(self) -> GuardToken:
        """Install the patches (once per process, counted) and make this guard the one of the
        current context (and of every context, for a whole-process guard). Undo with
        :meth:`deactivate`, in the same context."""
        _PATCHES.acquire(self)
        return GuardToken(self, _GUARD.set(self))

    def deactivate(self, token: GuardToken) -> None:
        """Undo :meth:`activate`. The guard stops refusing at once, in every context that still
        holds it (a copied context, or this one when another guard was activated here since and
        is still active: that one keeps governing); the last deactivation in the process restores
        every patched attribute."""
        if token.guard is not self:
            raise ValueError("this token was returned by another NetworkGuard's activate()")
        if token.used:
            raise RuntimeError("this NetworkGuard token was already deactivated")
        token.used = True
        try:
            if _GUARD.get() is self:  # else another guard was activated here since: keep it
                with contextlib.suppress(ValueError):  # a token of another context: inert below
                    _GUARD.reset(token._token)
        finally:
            _PATCHES.release(self)

    def narrow(self) -> None:
        """Stop governing every context of the process: from now on only the contexts that carry
        the guard (a fork past its fork point, whose run is live)."""
        global _WHOLE_PROCESS
        with _PATCHES.lock:
            self.whole_process = False
            _WHOLE_PROCESS = tuple(g for g in _WHOLE_PROCESS if g is not self)

    def enter_live(self) -> LiveToken:
        """Let this context reach the network until :meth:`exit_live` (an executed boundary body).
        Does nothing in a context this guard does not guard. Another session's whole-process
        guard still governs the context."""
        if _GUARD.get() is not self:
            return LiveToken(None)
        return LiveToken(_GUARD.set(_Opened(self)))

    def exit_live(self, token: LiveToken) -> None:
        """Undo :meth:`enter_live` (same context)."""
        inner, token._token = token._token, None
        if inner is not None:
            _GUARD.reset(inner)

    @contextmanager
    def live(self) -> Iterator[None]:
        """The network is allowed in this context while the block runs."""
        token = self.enter_live()
        try:
            yield
        finally:
            self.exit_live(token)

    # -- decisions (only ever reached for a guard that governs the current context) ------------

    def _addresses(self, name: str) -> frozenset[str]:
        found = self._resolved.get(name)
        if found is None:
            token = _GUARD.set(_OPEN_TO_ALL)  # the guard's own lookup is not refused
            try:
                infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
            except (OSError, UnicodeError):
                infos = []
            finally:
                _GUARD.reset(token)
            found = frozenset(ip for info in infos if (ip := _ip(str(info[4][0]))) is not None)
            self._resolved[name] = found
        return found

    def _allows(self, host: str, port: int | None) -> bool:
        entries = [entry for entry in self._entries if entry.covers(port)]
        if not entries:
            return False
        if any(entry.host == host for entry in entries):
            return True
        if _ip(host) is not None:  # an address: is it one an allowed name resolves to?
            return any(host in self._addresses(e.host) for e in entries if not e.is_ip)
        addresses = [entry.host for entry in entries if entry.is_ip]  # a name: does it resolve
        return bool(addresses) and not self._addresses(host).isdisjoint(addresses)  # to one?

    def _allows_lookup(self, host: str) -> bool:
        """A name lookup: only a name entry (any port) allows it. An address entry does not,
        since finding out whether the name resolves to it would be the very query refused."""
        return host in self._names


def _refuse(
    guards: Iterable[NetworkGuard],
    host: str,
    port: int | None,
    via: str,
    *,
    request: _Request | None = None,
    address: str | None = None,
    lookup: bool = False,
) -> NoReturn:
    """Raise the refusal, after each refusing guard's ``on_refusal`` has recorded it."""
    request = request or _REQUEST.get()
    method = url = path = None
    if request is not None and not lookup:
        method, path = request.method, request.path
        url = f"{request.scheme}://{_hostport(request.host, request.port)}{path or ''}"
    error = NetworkRefusedError(
        host, port, via=via, method=method, url=url, path=path, address=address, lookup=lookup
    )
    for guard in guards:
        callback = guard._on_refusal
        if callback is not None:
            with handle_internal_errors("recording a refused network connection"):
                callback(error)
    raise error


def _check(
    guards: tuple[NetworkGuard, ...],
    host: str,
    port: int | None,
    via: str,
    *,
    request: _Request | None = None,
    address: str | None = None,
) -> None:
    refusing = [guard for guard in guards if not guard._allows(host, port)]
    if refusing:
        _refuse(refusing, host, port, via, request=request, address=address)


def _vet_socket(guards: tuple[NetworkGuard, ...], sock: object, address: object, via: str) -> None:
    try:
        family = sock.family  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return
    if family not in _INET:
        return  # AF_UNIX (local IPC), and families that are no Internet traffic
    target = _split_address(address)
    if target is None:  # not an address connect() takes: let it fail its own way
        return
    host, port = target
    given = address[0] if isinstance(address, tuple) else None
    _check(guards, host, port, via, address=given if isinstance(given, str) else None)


def _vet_endpoint(guards: tuple[NetworkGuard, ...], address: object, via: str) -> bool:
    """True: checked and allowed by every guard (the caller may connect unchecked below);
    False: nothing checked. Raises to refuse."""
    target = _split_address(address)
    if target is None:
        return False
    host, port = target
    _check(guards, host, port, via)
    return True


def _vet_lookup(guards: tuple[NetworkGuard, ...], name: object, port: object, via: str) -> None:
    """A name resolution: refused unless it needs no query (an address, no host, a loopback
    name) or a guard-allowed name is looked up."""
    if name is None:
        return  # a passive or local lookup: no host at all
    host = _target_host(name)
    if host is None or _ip(host) is not None or _loopback_name(host):
        return  # numeric: resolved without a query
    refusing = [guard for guard in guards if not guard._allows_lookup(host)]
    if refusing:
        _refuse(refusing, host, _target_port(port), via, lookup=True)


def _loopback_name(host: str) -> bool:
    return host in _LOOPBACK_NAMES or host.endswith(".localhost")


_LOOPBACK_NAMES = frozenset(("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"))


def _vet_reverse(guards: tuple[NetworkGuard, ...], address: object, via: str) -> None:
    """A reverse lookup (address to name): refused unless for a loopback address or an address
    a guard allows."""
    host = _target_host(address)
    if host is None:
        return
    ip = _ip(host)
    if ip is None:  # gethostbyaddr also takes a name, and resolves it first
        _vet_lookup(guards, host, None, via)
        return
    if ipaddress.ip_address(ip).is_loopback:
        return
    refusing = [g for g in guards if not any(e.host == ip for e in g._entries)]
    if refusing:
        _refuse(refusing, ip, None, via, lookup=True)


def _vet_http_client(
    guards: tuple[NetworkGuard, ...], conn: Any, method: object, url: object
) -> None:
    sock = getattr(conn, "sock", None)
    if sock is None:
        module = sys.modules.get("http.client")
        own = tuple(
            getattr(getattr(module, name, None), "connect", None)
            for name in ("HTTPConnection", "HTTPSConnection")
        )
        if getattr(type(conn), "connect", None) not in own:
            return  # it makes its own socket: the socket level decides (AF_UNIX is allowed)
    elif getattr(sock, "family", None) not in (None, *_INET):
        return  # an open Unix-socket connection
    host, port = _target_host(getattr(conn, "host", None)), _target_port(conn.port)
    if host is None:
        return
    scheme = "https" if getattr(conn, "default_port", None) == 443 else "http"
    refusing = [guard for guard in guards if not guard._allows(host, port)]
    if refusing:
        request = _request(method, scheme, host, port, url)
        _refuse(refusing, host, port, "http.client.HTTPConnection.putrequest", request=request)


def _vet_httpx(guards: tuple[NetworkGuard, ...], transport: Any, request: Any, via: str) -> None:
    if getattr(getattr(transport, "_pool", None), "_uds", None):
        return  # a Unix-socket transport: local IPC
    url = request.url
    scheme = str(url.scheme)
    host = _target_host(url.host)
    port = url.port if url.port is not None else _DEFAULT_PORTS.get(scheme)
    if host is None:
        return
    refusing = [guard for guard in guards if not guard._allows(host, port)]
    if refusing:
        described = _request(request.method, scheme, host, port, url.path)
        _refuse(refusing, host, port, via, request=described)


# -- the floor: the interpreter's audit events --------------------------------------------------
#
# ``socket.socket.connect`` patched in Python misses every caller holding the C method itself (a
# reference saved at import time, ``_socket.socket``), and ``sendto``/``sendmsg`` with an address
# (TCP Fast Open, datagrams) connect without it. The interpreter raises an audit event in C for
# each of these calls, whatever reference was used, and an exception raised by a hook aborts the
# call before the system call is made. A hook cannot be removed, so it is added once, at the first
# activation, and costs one global read per audit event while no guard is active.

_HOOK_ON = False
"""Whether some guard is active (the hook's only read while none is)."""
_HOOK_INSTALLED = False
_HOOK_SEEN = False
_PROBE = "stepfork.network_guard.probe"


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _HOOK_ON:
        handler = _AUDITED.get(event)
        if handler is not None:
            handler(args)


def _on_probe(args: tuple[Any, ...]) -> None:
    global _HOOK_SEEN
    _HOOK_SEEN = True


def _audited_socket(via: str) -> Callable[[tuple[Any, ...]], None]:
    def handler(args: tuple[Any, ...]) -> None:
        if len(args) >= 2 and args[1] is not None:  # sendmsg without an address: connected
            guards = _governing()
            if guards:
                _vet_socket(guards, args[0], args[1], via)

    return handler


def _audited_lookup(args: tuple[Any, ...]) -> None:
    guards = _governing()
    if guards and args:
        _vet_lookup(guards, args[0], args[1] if len(args) > 1 else None, "socket.getaddrinfo")


def _audited_by_name(args: tuple[Any, ...]) -> None:
    guards = _governing()
    if guards and args:
        _vet_lookup(guards, args[0], None, "socket.gethostbyname")


def _audited_reverse(args: tuple[Any, ...]) -> None:
    guards = _governing()
    if guards and args:
        _vet_reverse(guards, args[0], "socket.gethostbyaddr")


_AUDITED: dict[str, Callable[[tuple[Any, ...]], None]] = {
    "socket.connect": _audited_socket("socket.socket.connect"),  # connect and connect_ex
    "socket.sendto": _audited_socket("socket.socket.sendto"),
    "socket.sendmsg": _audited_socket("socket.socket.sendmsg"),
    "socket.getaddrinfo": _audited_lookup,
    "socket.gethostbyname": _audited_by_name,  # gethostbyname and gethostbyname_ex
    "socket.gethostbyaddr": _audited_reverse,
    _PROBE: _on_probe,
}


# -- the patches ----------------------------------------------------------------------------------


def _wrap_create_connection(original: Any, via: str) -> Any:
    @functools.wraps(original)
    def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
        guards = _governing()
        if not guards or not _vet_endpoint(guards, address, via):
            return original(address, *args, **kwargs)
        token = _GUARD.set(_OPEN_TO_ALL)  # allowed by name: its lookup and connects are to it
        try:
            return original(address, *args, **kwargs)
        finally:
            _GUARD.reset(token)

    return create_connection


def _wrap_putrequest(original: Any, via: str) -> Any:
    @functools.wraps(original)
    def putrequest(self: Any, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
        guards = _governing()
        if guards:
            _vet_http_client(guards, self, method, url)
        return original(self, method, url, *args, **kwargs)

    return putrequest


def _wrap_urlopen(original: Any, via: str) -> Any:
    @functools.wraps(original)
    def urlopen(self: Any, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
        if not _governing():
            return original(self, method, url, *args, **kwargs)
        scheme = str(getattr(self, "scheme", None) or "http")
        token = _REQUEST.set(_request(method, scheme, self.host, self.port, url))
        try:
            return original(self, method, url, *args, **kwargs)
        finally:
            _REQUEST.reset(token)

    return urlopen


def _wrap_handle_request(original: Any, via: str) -> Any:
    @functools.wraps(original)
    def handle_request(self: Any, request: Any) -> Any:
        guards = _governing()
        if guards:
            _vet_httpx(guards, self, request, via)
        return original(self, request)

    return handle_request


def _wrap_handle_async_request(original: Any, via: str) -> Any:
    @functools.wraps(original)
    async def handle_async_request(self: Any, request: Any) -> Any:
        guards = _governing()
        if guards:
            _vet_httpx(guards, self, request, via)
        return await original(self, request)

    return handle_async_request


@dataclass(frozen=True, slots=True)
class _PatchPoint:
    module: str
    """Patched only when this module is already imported."""
    owner: str
    """The class in the module ("" for the module itself)."""
    name: str
    wrap: Callable[[Any, str], Any]

    @property
    def via(self) -> str:
        return ".".join(part for part in (self.module, self.owner, self.name) if part)

    def make(self, current: Any) -> Any:
        """The guard's wrapper of ``current``, the attribute it replaces."""
        return self.wrap(current, self.via)


_PATCH_POINTS: tuple[_PatchPoint, ...] = (
    _PatchPoint("socket", "", "create_connection", _wrap_create_connection),
    _PatchPoint("urllib3.util.connection", "", "create_connection", _wrap_create_connection),
    _PatchPoint("http.client", "HTTPConnection", "putrequest", _wrap_putrequest),
    _PatchPoint("urllib3.connectionpool", "HTTPConnectionPool", "urlopen", _wrap_urlopen),
    *(
        _PatchPoint(module, owner, name, wrap)
        for module in ("httpx", "httpx2")  # httpx2 may alias itself as httpx: patched once
        for owner, name, wrap in (
            ("HTTPTransport", "handle_request", _wrap_handle_request),
            ("AsyncHTTPTransport", "handle_async_request", _wrap_handle_async_request),
        )
    ),
)


class _Patches:
    """The process-wide patches, installed while any guard is active (counted), and the audit
    hook, added once and switched on while any guard is active."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        """Held while the guards and patches change (a guard narrowing takes it too)."""
        self._count = 0
        self._patcher = Patcher("the replay network guard")

    def acquire(self, guard: NetworkGuard) -> None:
        with self.lock:
            self._count += 1
            guard._activations += 1
            try:
                self._switch_on(guard)
                self._install_missing()  # also libraries imported since the first activation
            except BaseException:  # a patch point that cannot be set: leave nothing behind
                self._leave(guard)
                raise

    def release(self, guard: NetworkGuard) -> None:
        with self.lock:
            self._leave(guard)

    def _leave(self, guard: NetworkGuard) -> None:
        global _HOOK_ON, _WHOLE_PROCESS
        guard._activations -= 1
        self._count -= 1
        if guard._activations == 0 and guard in _WHOLE_PROCESS:
            _WHOLE_PROCESS = tuple(g for g in _WHOLE_PROCESS if g is not guard)
        if self._count == 0:
            _HOOK_ON = False
            self._restore()

    def _switch_on(self, guard: NetworkGuard) -> None:
        global _HOOK_ON, _HOOK_INSTALLED, _WHOLE_PROCESS
        _HOOK_ON = True
        if not _HOOK_INSTALLED:
            sys.addaudithook(_audit)
            sys.audit(_PROBE)
            if not _HOOK_SEEN:  # another hook refused ours (sys.addaudithook raised RuntimeError)
                raise RuntimeError(
                    "the replay network guard could not add its audit hook (sys.addaudithook "
                    "was refused by another hook), so it cannot refuse the network"
                )
            _HOOK_INSTALLED = True
        if guard.whole_process and guard not in _WHOLE_PROCESS:
            _WHOLE_PROCESS = (*_WHOLE_PROCESS, guard)

    def _install_missing(self) -> None:
        for point in _PATCH_POINTS:
            module = sys.modules.get(point.module)
            owner = getattr(module, point.owner, None) if point.owner else module
            if owner is not None:  # (httpx2 aliased as httpx: the same owner, patched once)
                self._patcher.wrap(owner, point.name, point.make)

    def _restore(self) -> None:
        self._patcher.restore_all()  # (patched over since: theirs is left, ours in it inert)


_PATCHES = _Patches()
