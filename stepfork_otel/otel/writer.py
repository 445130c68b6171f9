"""Where bundles go: :class:`BundleWriter` names and writes them.

The processor (``otel/processor.py``) decides *when* a bundle is complete and which spans it holds;
the writer decides *where* it goes and how it is written -- as the SDK's ``BatchSpanProcessor``
decides when a batch is done and a ``SpanExporter`` where it goes. Swapping the destination never
touches the buffering.

A run's bundle is written as the run goes (:class:`BundleAppender`), so a killed process leaves
its calls on disk in a file that loads; :func:`recover_directory` turns what dead processes of
earlier versions left in a directory (run journals) into bundles, and deletes half-written
temporary files of atomic writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import zlib
from pathlib import Path

import orjson
from opentelemetry import context as context_api

from stepfork_otel._internal import handle_internal_errors
from stepfork_otel.constants import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_FSYNC_INTERVAL,
    FLUSH_BUFFER_BYTES,
    JOURNAL_SUFFIX,
)
from stepfork_otel.trace.bundle import TMP_SUFFIX, bundle_file_name, load_trace, save_trace
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.models import Trace

logger = logging.getLogger("stepfork_otel")

#: The API's suppression key (set while a bundle is written, so nothing it does is traced).
_SUPPRESS_KEY = getattr(context_api, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")


class BundleWriter:
    """Writes bundles atomically, named by trace id in ``directory`` unless given a path."""

    def __init__(self, directory: str | Path | None = None, *, compress: bool = False) -> None:
        self.directory = Path(directory) if directory is not None else None
        """Where bundles without a destination of their own go (None: ``./traces`` when a
        run asks for a default name, nothing for calls outside runs)."""
        self.compress = compress
        """Write ``.sftrace.gz`` files."""

    def default_path(self, trace_id: str, directory: Path | None = None) -> Path:
        """``<trace_id>.sftrace`` in ``directory``, else the writer's, else ``./traces``."""
        name = bundle_file_name(trace_id, compressed=self.compress)
        return (directory or self.directory or Path("traces")) / name

    def write(self, trace: Trace, path: Path) -> Path:
        """Write ``trace`` to ``path`` atomically, with instrumentation suppressed."""
        token = context_api.attach(context_api.set_value(_SUPPRESS_KEY, True))
        try:
            return save_trace(trace, path)
        finally:
            context_api.detach(token)


class BundleAppender:
    """The bundle of one run, written as the run goes (format 3, see
    :class:`~stepfork_otel.trace.bundle.BundleEncoder`): the file at the bundle's own path is
    created with its header when the run starts, each call's events are appended when the call
    ends, and the trailer closes it when the run ends. So the file on disk is always a bundle
    that loads -- ``complete: false`` until the trailer -- and a killed process leaves it, not
    nothing (what once took a separate run journal).

    Appends go to a buffer, written by one background thread every ``flush_interval`` seconds
    (a call's events reach the OS at most that long after it ended; 0: at once, by the ending
    thread; None: only when the buffer holds :data:`FLUSH_BUFFER_BYTES` and at the end) or by
    the appending thread when the buffer is that full. ``fsync_interval``: seconds between
    fsyncs, at a write after that long and at close (0: every write; None: never) -- what a
    power cut may lose on top. A compressed bundle is one gzip stream, flushed (``Z_SYNC_FLUSH``)
    at each write, so what was written decompresses."""

    def __init__(
        self,
        path: Path,
        head: bytes,
        *,
        flush_interval: float | None = DEFAULT_FLUSH_INTERVAL,
        fsync_interval: float | None = DEFAULT_FSYNC_INTERVAL,
    ) -> None:
        self.path = path
        self.flush_interval = flush_interval
        self.fsync_interval = fsync_interval
        self._lock = threading.Lock()
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._last_sync = time.monotonic()
        self._packer = zlib.compressobj(6, zlib.DEFLATED, 31) if path.name.endswith(".gz") else None
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self._fd: int | None = os.open(path, flags, 0o644)
        with self._lock:
            self._write(head)
        if flush_interval is not None and flush_interval > 0:
            _FLUSHER.add(self)

    def _write(self, data: bytes) -> None:
        """Write ``data`` (caller holds the lock)."""
        fd = self._fd
        if fd is None:
            return
        if self._packer is not None:
            data = self._packer.compress(data) + self._packer.flush(zlib.Z_SYNC_FLUSH)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        interval = self.fsync_interval
        if interval is not None and time.monotonic() - self._last_sync >= interval:
            os.fsync(fd)
            self._last_sync = time.monotonic()

    def append(self, data: bytes) -> None:
        with self._lock:
            if self._fd is None:
                return
            self._buffer.append(data)
            self._buffered += len(data)
            if self.flush_interval == 0 or self._buffered >= FLUSH_BUFFER_BYTES:
                self._drain()

    def _drain(self) -> None:
        if self._buffer:
            data = b"".join(self._buffer)
            self._buffer.clear()
            self._buffered = 0
            self._write(data)

    def flush(self, timeout: float = -1) -> bool:
        """Write what is buffered. False: gave up waiting ``timeout`` for the lock."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if self._fd is not None:  # (closed meanwhile: nothing left to write)
                self._drain()
        finally:
            self._lock.release()
        return True

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self, last: bytes = b"", *, timeout: float = -1) -> bool:
        """Write what is buffered and ``last`` (the trailer), fsync (unless the policy is never)
        and close. False: gave up waiting ``timeout`` for an append under way (at exit, it may
        belong to the very thread being interrupted) -- what was written stays a bundle."""
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            fd = self._fd
            if fd is None:
                return True
            self._buffer.append(last)
            self._drain()
            if self._packer is not None:
                tail = self._packer.flush()
                view = memoryview(tail)
                while view:
                    view = view[os.write(fd, view) :]
            self._fd = None
        finally:
            self._lock.release()
        _FLUSHER.discard(self)
        with contextlib.suppress(OSError):
            if self.fsync_interval is not None:
                os.fsync(fd)
        os.close(fd)
        return True


class _Flusher:
    """The one background thread that writes the buffered appends of every open run's bundle,
    at the shortest interval any of them asks for (started with the first, a daemon thread: it
    holds nothing a process exit would lose beyond the interval, and exit handlers close the
    bundles)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[BundleAppender] = set()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, appender: BundleAppender) -> None:
        with self._lock:
            self._open.add(appender)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="stepfork-bundle-flush", daemon=True
                )
                self._thread.start()
            self._wake.set()

    def discard(self, appender: BundleAppender) -> None:
        with self._lock:
            self._open.discard(appender)

    def _run(self) -> None:
        while True:
            with self._lock:
                appenders = list(self._open)
            intervals = [a.flush_interval for a in appenders if a.flush_interval]
            self._wake.wait(min(intervals) if intervals else None)
            self._wake.clear()
            if not intervals:
                continue
            with self._lock:  # the bundles open now (some closed while this thread waited);
                appenders = [a for a in self._open if a.flush_interval]  # 0: they write at once
            token = context_api.attach(context_api.set_value(_SUPPRESS_KEY, True))
            try:
                for appender in appenders:
                    with handle_internal_errors(f"writing the bundle {appender.path}"):
                        appender.flush()
            finally:
                context_api.detach(token)


_FLUSHER = _Flusher()


def journal_path(bundle_path: Path) -> Path:
    return bundle_path.with_name(bundle_path.name + JOURNAL_SUFFIX)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (it exists, and belongs to someone else)
        return True
    return True


_TMP_NAME = re.compile(r"^\..+\.(\d+)\.[^.]+" + re.escape(TMP_SUFFIX) + "$")


def recover_directory(directory: Path) -> list[Path]:
    """What dead processes left in ``directory``: each run journal becomes its bundle (marked
    incomplete, unless the bundle was written whole before the journal could be removed) and is
    deleted; half-written temporary files of atomic writes are deleted. Files of processes that
    are still running are left alone (same host: the pid in the name or header tells). Returns
    the bundles recovered. Never raises: a file it cannot handle is logged and left."""
    recovered: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return recovered
    for name in names:
        path = directory / name
        if name.endswith(JOURNAL_SUFFIX) and not name.startswith("."):
            with handle_internal_errors(f"recovering the run journal {path}"):
                done = _recover_journal(path)
                if done is not None:
                    recovered.append(done)
        elif name.startswith(".") and name.endswith(TMP_SUFFIX):
            match = _TMP_NAME.match(name)
            if match is not None and not _alive(int(match.group(1))):
                with contextlib.suppress(OSError):
                    path.unlink()
    return recovered


def _recover_journal(path: Path) -> Path | None:
    try:
        with path.open("rb") as handle:
            first = handle.readline(64 << 10)
        head = orjson.loads(first)
        pid = int(head["pid"])
        bundle_name = str(head["bundle"])
    except (OSError, ValueError, KeyError, TypeError):
        logger.warning("stepfork_otel: %s is not a readable run journal; left as it is", path)
        return None
    if _alive(pid):
        return None  # a run of a live process
    bundle = path.with_name(bundle_name)
    if bundle_name != os.path.basename(bundle_name) or journal_path(bundle) != path:
        logger.warning("stepfork_otel: %s names another file; left as it is", path)
        return None
    with contextlib.suppress(BundleError):
        if load_trace(bundle).complete:
            path.unlink(missing_ok=True)  # killed between the final write and the removal
            return None
    try:
        trace = load_trace(path)
    except BundleError as exc:
        logger.warning("stepfork_otel: run journal not recovered: %s", exc)
        return None
    save_trace(trace, bundle)
    path.unlink(missing_ok=True)
    logger.warning(
        "stepfork_otel: recovered %s from the journal of a run cut short (%d calls; "
        "complete: false)",
        bundle,
        len(trace.calls),
    )
    return bundle
