"""Where bundles go: :class:`BundleWriter` names and writes them.

The processor (``otel/processor.py``) decides *when* a bundle is complete and which spans it holds;
the writer decides *where* it goes and how it is written -- as the SDK's ``BatchSpanProcessor``
decides when a batch is done and a ``SpanExporter`` where it goes. Swapping the destination never
touches the buffering.

A run's bundle is written as the run goes (:class:`BundleAppender`), so a killed process leaves
its calls on disk in a file that loads (its header is renamed over the path, so a run never
destroys the file already there before its own is on disk); :func:`recover_directory` deletes the
half-written temporary files of atomic writes that dead processes left in a directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import secrets
import sys
import threading
import time
import weakref
import zlib
from collections import deque
from pathlib import Path
from typing import NamedTuple

import orjson
from opentelemetry import context as context_api

from stepfork_otel._internal import log_internal_error
from stepfork_otel.constants import (
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_FSYNC_INTERVAL,
    FLUSH_BUFFER_BYTES,
)
from stepfork_otel.trace.bundle import (
    NO_TRAILER_REASON,
    TMP_SUFFIX,
    WRITE_FAILED_REASON,
    BundleEncoder,
    Encoded,
    bundle_file_name,
    save_trace,
)
from stepfork_otel.trace.conversion import SpanRecord, span_events
from stepfork_otel.trace.errors import one_line
from stepfork_otel.trace.models import Trace

logger = logging.getLogger("stepfork_otel")

#: The API's suppression key (set while a bundle is written, so nothing it does is traced).
_SUPPRESS_KEY = getattr(context_api, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")
#: The header's reason as written (quoted), which a failed write overwrites in place.
_NO_TRAILER = orjson.dumps(NO_TRAILER_REASON)


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
    """The bundle of one run, written as the run goes (see
    :class:`~stepfork_otel.trace.bundle.BundleEncoder`): the file at the bundle's own path is
    created with its header when the run starts, each call's events are appended when the call
    ends, and the trailer closes it when the run ends. So the file on disk is always a bundle
    that loads -- ``complete: false`` until the trailer -- and a killed process leaves it, not
    nothing.

    **One thread writes.** After the header, every write -- and the count and fingerprint the
    trailer declares -- is made by one background thread. The recording threads only queue
    (one atomic ``deque.append``) what they encoded. A signal handler runs in the main thread
    and may raise there between any two bytecodes (``KeyboardInterrupt`` at Ctrl-C, a program's
    ``SIGTERM`` handler calling ``sys.exit``): were the main thread writing, it could be stopped
    between counting an event and writing it, and the trailer would declare one the file lacks.
    The writer thread is never interrupted so, and it counts only what it writes.

    The writer writes what is queued every ``flush_interval`` seconds (a call's events reach
    the OS at most that long after it ended). With 0, each call waits until its events are
    written, so they are on disk before it returns. With None, it writes only when
    :data:`FLUSH_BUFFER_BYTES` are queued (then the queueing thread waits, as a bound on memory)
    and at the end. ``fsync_interval``: seconds between fsyncs, at a write after that long and at
    close (0: every write; None: never) -- what a power cut may lose on top. A compressed bundle
    is one gzip stream, flushed (``Z_SYNC_FLUSH``) at each write, so what was written
    decompresses.

    A write that fails is logged once and ends the writing: what the file holds stays what it
    held (a bundle that loads, unless the failure cut a line)."""

    def __init__(
        self,
        path: Path,
        encoder: BundleEncoder,
        *,
        flush_interval: float | None = DEFAULT_FLUSH_INTERVAL,
        fsync_interval: float | None = DEFAULT_FSYNC_INTERVAL,
    ) -> None:
        """Create the file with the header (on the calling thread: a failure to create it is the
        caller's to handle)."""
        self.path = path
        self.flush_interval = flush_interval
        self.fsync_interval = fsync_interval
        self.failed = False
        """A write failed (logged): nothing more is written."""
        self.lost = 0
        """Calls the writer thread could not convert (logged; the trailer says so)."""
        self._encoder = encoder
        self._queue: deque[_Item] = deque()
        self._queued = 0
        """Bytes queued since the writer last took them (approximate: a trigger only)."""
        self._due = False
        self._closing = False
        self._close: _Wait | None = None
        self._last_sync = time.monotonic()
        self._packer = zlib.compressobj(6, zlib.DEFLATED, 31) if path.name.endswith(".gz") else None
        head = encoder.head()
        self._reason_at = -1 if self._packer is not None else head.find(_NO_TRAILER)
        """Where the header's reason is (-1: not to be rewritten: compressed)."""
        self._fd: int | None = _create_with_header(
            path, head, self._packer, sync=fsync_interval is not None
        )
        _WRITER.add(self)

    # -- the recording threads: queue, and wait when asked to ----------------------------------

    def append(self, call: Encoded | QueuedCall, extra: bytes = b"") -> None:
        """Queue a call: its events encoded, or the call as it ended, which the writer thread
        converts to its events (``extra``: lines written after them, not counted)."""
        if self._closing or self._fd is None:  # (closed, failed, or the parent's)
            return
        self._queue.append((call, extra))
        self._queued += call.size() + len(extra)
        if self.flush_interval == 0 or self._queued >= FLUSH_BUFFER_BYTES:
            self._wait(_Wait())

    def flush(self, timeout: float = -1) -> bool:
        """Wait until what is queued is written. False: not within ``timeout`` seconds."""
        return self._closing or self._wait(_Wait(), timeout)

    def close(self, rest: list[Encoded], final: Trace, *, timeout: float = -1) -> bool:
        """Queue the last events and the trailer, and wait until the writer has written them,
        fsynced (unless the policy is never) and closed the file. ``rest``: the calls still
        open, each on its own, left out if the call was written already (queued, then cut off
        before it was taken off the open calls). ``final``: the header as the run's end knows
        it. False: not within ``timeout`` seconds (at exit: the writer still finishes it while
        the process lives), or the writing failed."""
        if self._closing or self._fd is None:
            return False
        done = self._close = _Wait(rest, final)
        self._queue.append(done)
        self._closing = True  # (after: cut off between the two, a caller queues it once more)
        return self._wait(done, timeout, queued=True) and not self.failed

    def wait_closed(self, timeout: float = -1) -> bool:
        """Wait until the trailer queued by :meth:`close` is written (True: it is, or none is
        queued)."""
        if self._close is None:
            return True
        self._due = True  # (the closing thread may have been cut off before it woke the writer)
        _WRITER.wake()
        return self._close.wait(timeout)

    def leave_to_parent(self) -> None:
        """In a forked child: write nothing more to this bundle (the parent's; the child's copy
        of the file descriptor is closed)."""
        fd, self._fd = self._fd, None
        self._queue.clear()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def closing(self) -> bool:
        """The trailer is queued (or written): nothing more goes in."""
        return self._closing

    def _wait(self, item: _Wait, timeout: float = -1, *, queued: bool = False) -> bool:
        if not queued:
            self._queue.append(item)
        if self._fd is None:  # closed (or failed) meanwhile: the writer may be past its last
            item.set()  # look at the queue (it sets ``_fd`` to None before that look)
        self._due = True
        _WRITER.wake()
        return item.wait(timeout)

    # -- the writer thread ---------------------------------------------------------------------

    def write_queued(self, tick: bool) -> None:
        """Write what is queued (the writer thread; ``tick``: a periodic round, which leaves a
        bundle without a flush interval alone until it is due)."""
        if not (self._due or (tick and self.flush_interval)):
            return
        self._due = False
        self._queued = 0
        items: list[_Item] = []
        queue = self._queue
        while queue:
            items.append(queue.popleft())
        pieces: list[bytes] = []
        last: _Wait | None = None
        try:
            for item in items:
                if isinstance(item, tuple):
                    if last is None:  # (queued after the run's end: too late)
                        encoded = self._encoded(item[0])
                        if encoded is not None:
                            self._encoder.commit(encoded)
                            pieces += (encoded.data, item[1])
                elif item.final is not None and last is None:
                    last = item
                    for rest in item.rest:
                        if not self._encoder.committed(rest):
                            self._encoder.commit(rest)
                            pieces.append(rest.data)
                    pieces.append(self._encoder.trailer(self._final(item.final)))
            if self._fd is not None:
                self._write(b"".join(pieces))
                if last is not None:
                    self._finish()
        except Exception:
            self._fail()
        finally:
            for item in items:
                if isinstance(item, _Wait):
                    item.set()

    def _encoded(self, call: Encoded | QueuedCall) -> Encoded | None:
        """A queued call's events as bytes: the one conversion's per-span step, run here, off
        the recording thread. A call it fails on is logged and counted (the trailer then says
        the bundle is incomplete), never the end of the bundle."""
        if isinstance(call, Encoded):
            return call
        try:
            events = [e for e in span_events(call.record, *call.call) if e is not None]
            return self._encoder.encode(events)
        except Exception:
            self.lost += 1
            log_internal_error(f"converting call {call.call[1]} for the bundle {self.path}")
            return None

    def _final(self, final: Trace) -> Trace:
        if not self.lost or not final.complete:
            return final
        reason = f"{self.lost} call(s) could not be written (internal error, logged)"
        return final.model_copy(update={"complete": False, "incomplete_reason": reason})

    def _write(self, data: bytes) -> None:
        fd = self._fd
        if fd is None or not data:
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

    def _finish(self) -> None:
        fd = self._fd
        assert fd is not None
        if self._packer is not None:
            tail = self._packer.flush()
            view = memoryview(tail)
            while view:
                view = view[os.write(fd, view) :]
        self._fd = None
        self._release()
        try:
            if self.fsync_interval is not None:
                with contextlib.suppress(OSError):
                    os.fsync(fd)
        finally:
            os.close(fd)

    def _release(self) -> None:
        """Once ``_fd`` is None: no more rounds; free whoever queued a wait meanwhile."""
        _WRITER.discard(self)
        queue = self._queue
        while queue:
            item = queue.popleft()
            if isinstance(item, _Wait):
                item.set()

    def _fail(self) -> None:
        """A write failed: log it, say why in the file if it can, close the file as it is,
        write nothing more."""
        self.failed = True
        why = sys.exc_info()[1]
        log_internal_error(f"writing the bundle {self.path}")
        fd, self._fd = self._fd, None
        self._release()
        if fd is not None:
            if why is not None and self._reason_at >= 0:
                self._say_why(fd, why)
            with contextlib.suppress(OSError):
                os.close(fd)

    def _say_why(self, fd: int, why: BaseException) -> None:
        """The header's reason (``the recording stopped before the run ended``, untrue when the
        run went on) overwritten in place by why the writing stopped, padded with spaces
        outside the string to the same length: no byte moves, and on a full disk the write
        needs no new block. Best effort (a failure is left as it is)."""
        text = WRITE_FAILED_REASON + one_line(str(why))
        quoted = orjson.dumps(text)
        while len(quoted) > len(_NO_TRAILER):
            text = text[:-2] + "…"
            quoted = orjson.dumps(text)
        with contextlib.suppress(OSError):
            os.pwrite(fd, quoted.ljust(len(_NO_TRAILER)), self._reason_at)


def _create_with_header(
    path: Path, head: bytes, packer: zlib._Compress | None, *, sync: bool
) -> int:
    """The bundle's file, holding ``head``, open for appending: the header is written to a
    temporary file in the same directory (named as :func:`recover_directory` knows: the pid
    tells a dead process's), fsynced, and renamed over ``path``. So a file already at ``path`` --
    the previous run's bundle -- stays whole until the new one, header and all, replaces it in
    one step: a kill at any moment leaves one or the other, never an empty file. ``sync``: fsync
    the header before the rename (unless the fsync policy is never: then a power cut -- not a
    kill -- may leave the name on an empty file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:  # (O_EXCL: a name taken is tried again; 0o644 less the umask, as any file)
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}{TMP_SUFFIX}"
        try:
            fd = os.open(tmp, flags, 0o644)
            break
        except FileExistsError:
            continue
    try:
        data = head if packer is None else packer.compress(head) + packer.flush(zlib.Z_SYNC_FLUSH)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


class _Wait:
    """A queued marker the queueing thread waits on; with ``final``, the run's end. A bare lock,
    held until the writer is past it: waiting is one interruptible C call, where an
    ``Event``'s condition would be Python code that an interrupt can leave half done."""

    __slots__ = ("_done", "final", "rest")

    def __init__(self, rest: list[Encoded] | None = None, final: Trace | None = None) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.rest = rest or []
        self.final = final

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # (set once already)
            self._done.release()

    def wait(self, timeout: float = -1) -> bool:
        if not self._done.acquire(timeout=timeout):
            return False
        with contextlib.suppress(RuntimeError):  # (left released, for any other waiter; set
            self._done.release()  # once more meanwhile: released already)
        return True


#: What a recording thread queues: a call's events and the lines after them, or a marker.
class QueuedCall(NamedTuple):
    """A call that ended, queued as it is: the writer thread converts it to its bundle events
    (:func:`~stepfork_otel.trace.conversion.span_events`), so the recording thread pays for a
    queue append, not for the conversion."""

    record: SpanRecord
    call: tuple[str, int, str | None]
    """Its call id, call number and the call it is nested in."""

    def size(self) -> int:
        """About the bytes it will take (a trigger for the writer, not an account)."""
        return 512 + sum(p.size for p in self.record.payloads.values())


_Item = tuple[Encoded | QueuedCall, bytes] | _Wait


class _Writer:
    """The one background thread that writes every open bundle (:class:`BundleAppender`): every
    ``flush_interval`` (the shortest any open bundle asks for) and whenever a recording thread
    waits. A daemon thread: it holds nothing a process exit would lose beyond the interval --
    exit handlers close the bundles through it, and wait for it.

    No recording thread takes a lock the writer needs: bundles are handed over, and the writer
    woken, through a ``SimpleQueue`` (its ``put`` is reentrant: a signal handler may wake the
    writer while the thread it interrupted is waking it), and the set of open bundles is the
    writer thread's own. In a forked child the writer starts afresh, and the bundles the child
    inherited are left to the parent: the child writes none of them."""

    def __init__(self) -> None:
        self._reset()
        self._all: weakref.WeakSet[BundleAppender] = weakref.WeakSet()
        """Every bundle not yet closed (for a forked child to leave them alone)."""

    def _reset(self) -> None:
        #: Only for starting the thread; reentrant: a signal handler may start it while the code
        #: it interrupted is starting it.
        self._start_lock = threading.RLock()
        self._open: set[BundleAppender] = set()
        """The writer thread's own: the bundles it writes."""
        self._wake: queue.SimpleQueue[BundleAppender | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._round = threading.Lock()
        """Held by the writer thread through a round (only ever by writer threads)."""

    def add(self, appender: BundleAppender) -> None:
        self._all.add(appender)
        self._start()
        self._wake.put(appender)

    def discard(self, appender: BundleAppender) -> None:
        """(The writer thread, as it closes ``appender``.)"""
        self._open.discard(appender)
        self._all.discard(appender)

    def wake(self) -> None:
        self._start()
        self._wake.put(None)

    def _start(self) -> None:
        thread = self._thread
        if thread is None or not thread.is_alive():
            with self._start_lock:  # (started with the first bundle, again in a forked child)
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="stepfork-bundle-writer", daemon=True
                    )
                    self._thread.start()

    def after_fork_in_child(self) -> None:
        """Start afresh (the parent's writer thread is not in the child, and its locks and queue
        may have been mid-use), leaving the parent's bundles to the parent."""
        inherited = list(self._all)
        self._reset()
        self._all = weakref.WeakSet()
        for appender in inherited:
            appender.leave_to_parent()

    def _take(self, item: BundleAppender | None) -> None:
        if item is not None:
            self._open.add(item)

    def _run(self) -> None:
        context_api.attach(context_api.set_value(_SUPPRESS_KEY, True))  # (for good: its thread)
        next_tick: float | None = None
        while self._thread is threading.current_thread():  # (a start cut off may have left
            # another: only the one started last keeps writing, one round at a time)
            intervals = [a.flush_interval for a in self._open if a.flush_interval]
            now = time.monotonic()
            if intervals:  # (a round a waiting thread asked for does not delay the next tick)
                soonest = now + min(intervals)
                next_tick = soonest if next_tick is None else min(next_tick, soonest)
            else:
                next_tick = None
            with contextlib.suppress(queue.Empty):
                self._take(
                    self._wake.get(timeout=None if next_tick is None else max(0.0, next_tick - now))
                )
            with contextlib.suppress(queue.Empty):  # (before the round: a wake during it is
                while True:  # the next round's)
                    self._take(self._wake.get_nowait())
            tick = next_tick is not None and time.monotonic() >= next_tick
            if tick:
                next_tick = None
            with self._round:
                for appender in list(self._open):
                    try:
                        appender.write_queued(tick)
                    except Exception:  # (never the end of the thread)
                        log_internal_error(f"writing the bundle {appender.path}")


_WRITER = _Writer()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WRITER.after_fork_in_child)


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


def recover_directory(directory: Path) -> None:
    """What dead processes left in ``directory``: half-written temporary files of atomic writes
    (a bundle saved whole, or the header of a run's bundle before its rename) are deleted (a bundle written as its run went needs no recovery: it loads as it is). Files
    of processes that are still running are left alone (the pid in the name tells). Never
    raises: a file it cannot handle is left."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = directory / name
        if name.startswith(".") and name.endswith(TMP_SUFFIX):
            match = _TMP_NAME.match(name)
            if match is not None and not _alive(int(match.group(1))):
                with contextlib.suppress(OSError):
                    path.unlink()
