"""Where bundles go: :class:`BundleWriter` names and writes them.

The processor (``otel/processor.py``) decides *when* a bundle is complete and which spans it holds;
the writer decides *where* it goes and how it is written -- as the SDK's ``BatchSpanProcessor``
decides when a batch is done and a ``SpanExporter`` where it goes. Swapping the destination never
touches the buffering.

While a run is recorded its spans also go to a :class:`RunJournal` next to the bundle, so a killed
process leaves its calls on disk; :func:`recover_directory` turns what dead processes left in a
directory (journals, half-written temporary files) into bundles, or deletes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from pathlib import Path

import orjson
from opentelemetry import context as context_api

from stepfork_otel._internal import handle_internal_errors
from stepfork_otel.constants import DEFAULT_FSYNC_INTERVAL, JOURNAL_SUFFIX
from stepfork_otel.trace.bundle import TMP_SUFFIX, bundle_file_name, load_trace, save_trace
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.journal import journal_header, journal_line
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


class RunJournal:
    """The journal of one run being recorded (:mod:`stepfork_otel.trace.journal`): spans are
    appended as they start and end, with one unbuffered ``write`` each, so after ``SIGKILL`` the
    file holds every span that ended before the kill (the OS has it). ``fsync_interval``: seconds
    between fsyncs, done at the first append after that long and at close (0: every append;
    None: never) -- what a power cut may lose."""

    def __init__(
        self,
        bundle_path: Path,
        trace_id: str,
        run_span_id: str,
        fsync_interval: float | None = DEFAULT_FSYNC_INTERVAL,
    ) -> None:
        self.bundle_path = bundle_path
        self.path = journal_path(bundle_path)
        self.fsync_interval = fsync_interval
        self._lock = threading.Lock()
        self._last_sync = time.monotonic()
        bundle_path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        self._fd: int | None = os.open(self.path, flags, 0o600)
        self._write(journal_header(bundle_path.name, trace_id, run_span_id, os.getpid()))

    def _write(self, data: bytes) -> None:
        fd = self._fd
        if fd is None:
            return
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        interval = self.fsync_interval
        if interval is not None and time.monotonic() - self._last_sync >= interval:
            os.fsync(fd)
            self._last_sync = time.monotonic()

    def append(self, record: SpanRecord) -> None:
        line = journal_line(record)
        with self._lock:
            self._write(line)

    def close(self, *, remove: bool, timeout: float = -1) -> None:
        """Stop appending; ``remove``: the bundle now holds everything, delete the journal.
        ``timeout``: give up (leaving the journal open) rather than wait longer for an append
        under way -- at exit, that append may belong to the very thread being interrupted."""
        if not self._lock.acquire(timeout=timeout):
            return
        try:
            fd, self._fd = self._fd, None
        finally:
            self._lock.release()
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if not remove and self.fsync_interval is not None:
                os.fsync(fd)
        os.close(fd)
        if remove:
            self.path.unlink(missing_ok=True)


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
