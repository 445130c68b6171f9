"""Where bundles go and how they are written: :class:`BundleWriter` names them,
:class:`BundleAppender` writes one, and one background thread (:data:`WRITER`) makes every write.

The processor (``otel/processor.py``) only queues what happened to the spans; the writer thread
takes the queue each round and the processor's bundles (``otel/bundles.py``) decide which bundle
each span belongs to -- as the SDK's ``BatchSpanProcessor`` queues spans and a ``SpanExporter``
decides where they go. Swapping the destination never touches the queueing.

A bundle is written as its run goes (:class:`BundleAppender`), so a killed process leaves its
calls on disk in a file that loads (its header is renamed over the path, so a run never destroys
the file already there before its own is on disk); :func:`recover_directory` deletes the
half-written temporary files that dead processes left in a directory.
"""

from __future__ import annotations

import contextlib
import errno
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
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

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
    bundle_file_name,
)
from stepfork_otel.trace.errors import one_line
from stepfork_otel.trace.models import Event, Trace

logger = logging.getLogger("stepfork_otel")

#: The API's suppression key (set while a bundle is written, so nothing it does is traced).
_SUPPRESS_KEY = getattr(context_api, "_SUPPRESS_INSTRUMENTATION_KEY", "suppress_instrumentation")
#: The header's reason as written (quoted), which a failed write overwrites in place.
_NO_TRAILER = orjson.dumps(NO_TRAILER_REASON)


class BundleWriter:
    """Names bundles: ``<trace_id>.sftrace`` in ``directory`` unless a run was given a path."""

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


class BundleAppender:
    """The file of one bundle, written as its run goes (see
    :class:`~stepfork_otel.trace.bundle.BundleEncoder`): created with its header when the bundle
    opens, each call's events appended after the call ends, the trailer when the bundle closes.
    So the file on disk is always a bundle that loads -- ``complete: false`` until the trailer --
    and a killed process leaves it, not nothing.

    **One thread writes.** After the header (written by whoever opens the bundle), every write
    -- and the count and fingerprint the trailer declares -- is made by the writer thread
    (:data:`WRITER`), which is never interrupted by a signal handler: it counts only what it
    writes. The recording threads only queue what happened (see ``otel/bundles.py``).

    What is added is written at the writer's next periodic round, every ``flush_interval``
    seconds (None: only when :data:`FLUSH_BUFFER_BYTES` are pending, when a recording thread
    waits, and at the end). ``fsync_interval``: seconds between fsyncs, at a write after that long
    and at close (0: every write; None: never) -- what a power cut may lose on top. A compressed
    bundle is one gzip stream, flushed (``Z_SYNC_FLUSH``) at each write, so what was written
    decompresses.

    A write that fails is logged once and ends the writing: what the file holds stays what it
    held (a bundle that loads, unless the failure cut a line), and its header says why."""

    def __init__(
        self,
        path: Path,
        encoder: BundleEncoder,
        *,
        flush_interval: float | None = DEFAULT_FLUSH_INTERVAL,
        fsync_interval: float | None = DEFAULT_FSYNC_INTERVAL,
        exclusive: bool = False,
    ) -> None:
        """Create the file with the header (on the calling thread: a failure to create it is the
        caller's to handle). ``exclusive``: never over a file already at ``path``
        (``FileExistsError``: a default name, which another bundle -- another process's, an
        older run's -- may hold); else the file there is replaced, in one step."""
        self.path = path
        self.flush_interval = flush_interval
        self.fsync_interval = fsync_interval
        self.failed = False
        """A write failed (logged): nothing more is written."""
        self.encoder = encoder
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._last_sync = time.monotonic()
        self._packer = zlib.compressobj(6, zlib.DEFLATED, 31) if path.name.endswith(".gz") else None
        head = encoder.head()
        self._reason_at = -1 if self._packer is not None else head.find(_NO_TRAILER)
        """Where the header's reason is (-1: not to be rewritten: compressed)."""
        self._fd: int | None = _create_with_header(
            path, head, self._packer, sync=fsync_interval is not None, exclusive=exclusive
        )
        WRITER.appenders.add(self)
        WRITER.arm()  # (started with the first bundle; its periodic rounds may change)

    # -- the writer thread -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Closed, failed, or left to the parent process: nothing more is written."""
        return self._fd is None

    def add(self, events: list[Event], extra: bytes = b"") -> None:
        """Encode and count ``events`` (and ``extra`` lines after them, not counted), to be
        written at the next write."""
        if self._fd is None or not (events or extra):
            return
        pieces = self._pending
        if events:
            encoded = self.encoder.encode(events)
            self.encoder.commit(encoded)
            pieces.append(encoded.data)
            self._pending_size += len(encoded.data)
        if extra:
            pieces.append(extra)
            self._pending_size += len(extra)

    def write_pending(self, *, force: bool = False, tick: bool = False) -> None:
        """Write what was added, if due: ``force``d (someone waits), at a periodic round when
        the bundle has a flush interval, or when :data:`FLUSH_BUFFER_BYTES` are pending."""
        if not self._pending or self._fd is None:
            return
        if force or (tick and self.flush_interval) or self._pending_size >= FLUSH_BUFFER_BYTES:
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_size = 0
            try:
                self._write(data)
            except Exception:
                self._fail()

    def finish(self, rest: list[Event], final: Trace) -> bool:
        """Close the bundle: ``rest`` (the calls still open, without outcome), the trailer from
        ``final`` (the header as the end knows it), written, fsynced (unless the policy is
        never) and closed. False: the writing failed (logged), or the bundle was closed."""
        if self._fd is None:
            return False
        try:
            self.add(rest)
            self._pending.append(self.encoder.trailer(final))
            data = b"".join(self._pending)
            self._pending.clear()
            self._write(data)
            self._finish()
        except Exception:
            self._fail()
            return False
        return True

    def abandon(self) -> None:
        """Close the file without a trailer (what was added is written first, if it can be):
        it loads as a bundle cut short."""
        with contextlib.suppress(Exception):
            self.write_pending(force=True)
        fd, self._fd = self._fd, None
        self._pending.clear()
        WRITER.appenders.discard(self)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def leave_to_parent(self) -> None:
        """In a forked child: write nothing more to this bundle (the parent's; the child's copy
        of the file descriptor is closed)."""
        fd, self._fd = self._fd, None
        self._pending.clear()
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

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
        WRITER.appenders.discard(self)
        try:
            if self.fsync_interval is not None:
                with contextlib.suppress(OSError):
                    os.fsync(fd)
        finally:
            os.close(fd)

    def _fail(self) -> None:
        """A write failed: log it, say why in the file if it can, close the file as it is,
        write nothing more."""
        self.failed = True
        why = sys.exc_info()[1]
        log_internal_error(f"writing the bundle {self.path}")
        fd, self._fd = self._fd, None
        self._pending.clear()
        WRITER.appenders.discard(self)
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


#: Default names tried for a bundle whose name another file holds.
NAME_TRIES = 16


def open_at_a_free_name(
    next_name: Callable[[], Path],
    open_file: Callable[[Path], BundleAppender],
    trace_id: str,
    first: Path | None = None,
) -> BundleAppender:
    """Create a bundle at a default name (``first``, else ``next_name()``), never over another
    file: while the name is taken (``FileExistsError``), the next name claimed."""
    path = first
    for _ in range(NAME_TRIES):
        try:
            return open_file(path if path is not None else next_name())
        except FileExistsError:
            path = None
    raise FileExistsError(f"no free name for a bundle of trace {trace_id}")


def _create_with_header(
    path: Path, head: bytes, packer: zlib._Compress | None, *, sync: bool, exclusive: bool = False
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
        if exclusive:
            _link_new(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd


def _link_new(tmp: Path, path: Path) -> None:
    """``tmp`` renamed to ``path`` only if nothing is there (``FileExistsError`` otherwise): a
    hard link, which fails on an existing name, then the temporary name removed. A file system
    without hard links gets a rename after a look (not atomic against another process)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:
        if path.exists():
            raise FileExistsError(errno.EEXIST, "a bundle is already there", str(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


class Wait:
    """A marker queued for the writer thread, which a recording thread waits on until the writer
    is past it. A bare lock, held until then: waiting is one interruptible C call, where an
    ``Event``'s condition would be Python code that an interrupt can leave half done.
    ``close``: the writer closes every open bundle of the queue first, with this reason."""

    __slots__ = ("_done", "close")

    def __init__(self, close: str | None = None) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.close = close

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # (set once already)
            self._done.release()

    def wait(self, timeout: float = -1) -> bool:
        if not self._done.acquire(timeout=timeout):
            return False
        with contextlib.suppress(RuntimeError):  # (left released, for any other waiter; set
            self._done.release()  # once more meanwhile: released already)
        return True


class Feed(Protocol):
    """What the writer thread serves: a queue of what happened, drained each round."""

    def flush_interval(self) -> float | None:
        """The shortest flush interval of its open bundles (None: none asks for rounds)."""

    def round(self, tick: bool) -> None:
        """Take what is queued and write it (``tick``: a periodic round)."""

    def leave_to_parent(self) -> None:
        """In a forked child: drop what is queued, write nothing more to the parent's bundles."""


class _Writer:
    """The one background thread that writes every open bundle: every ``flush_interval`` (the
    shortest any open bundle asks for) and whenever a recording thread waits. A daemon thread:
    it holds nothing a process exit would lose beyond the interval -- exit handlers close the
    bundles through it, and wait for it.

    No recording thread takes a lock the writer needs: work is queued on each feed's deque, the
    writer woken through a ``SimpleQueue`` (its ``put`` is reentrant: a signal handler may wake
    the writer while the thread it interrupted is waking it), names are taken with one atomic
    ``setdefault`` each, and the hand-off is read without its lock -- so an exit handler that
    interrupted a recording thread can wait for the writer. (The one exception is logging: a
    warning the writer logs takes the logging handlers' locks.) In a forked child the writer
    starts afresh, and the bundles the child inherited are left to the parent: the child writes
    none of them."""

    def __init__(self) -> None:
        self._reset()
        self.feeds: weakref.WeakSet[Feed] = weakref.WeakSet()
        """Every feed (processor queue) the writer serves."""
        self.appenders: weakref.WeakSet[BundleAppender] = weakref.WeakSet()
        """Every bundle file not yet closed (for a forked child to leave them alone)."""

    def _reset(self) -> None:
        #: Only for starting the thread; reentrant: a signal handler may start it while the code
        #: it interrupted is starting it.
        self._start_lock = threading.RLock()
        self._wake: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def add(self, feed: Feed) -> None:
        self.feeds.add(feed)

    def wake(self) -> None:
        """A round now (a thread waits, or a queue is long)."""
        self._start()
        self._wake.put(None)

    def arm(self) -> None:
        """A queue that was empty has work: the writer's periodic rounds (re)start, no round now
        (a round per call would hand each call to the writer and back)."""
        self._start()
        self._wake.put(_ARM)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

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
        self._reset()
        for feed in list(self.feeds):
            feed.leave_to_parent()
        for appender in list(self.appenders):
            appender.leave_to_parent()
        self.appenders = weakref.WeakSet()

    def _run(self) -> None:
        context_api.attach(context_api.set_value(_SUPPRESS_KEY, True))  # (for good: its thread)
        next_tick: float | None = None
        while self._thread is threading.current_thread():  # (a start cut off may have left
            # another: only the one started last keeps writing, one round at a time)
            intervals = [i for i in (f.flush_interval() for f in list(self.feeds)) if i]
            now = time.monotonic()
            if intervals:  # (a round a waiting thread asked for does not delay the next tick)
                soonest = now + min(intervals)
                next_tick = soonest if next_tick is None else min(next_tick, soonest)
            else:
                next_tick = None
            now_due = False
            with contextlib.suppress(queue.Empty):
                woken = self._wake.get(
                    timeout=None if next_tick is None else max(0.0, next_tick - now)
                )
                now_due = woken is not _ARM
            with contextlib.suppress(queue.Empty):  # (before the round: a wake during it is
                while True:  # the next round's)
                    now_due = self._wake.get_nowait() is not _ARM or now_due
            tick = next_tick is not None and time.monotonic() >= next_tick
            if tick:
                next_tick = None
            elif not now_due:
                continue  # (armed only: its tick is counted from now, above)
            for feed in list(self.feeds):
                try:
                    feed.round(tick)
                except Exception:  # (never the end of the thread)
                    log_internal_error("writing bundles")


_ARM = object()
"""What :meth:`_Writer.arm` sends the writer thread."""

WRITER = _Writer()
"""The one writer thread of the process: every processor's queue and every open bundle are served
by it."""
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WRITER.after_fork_in_child)


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
