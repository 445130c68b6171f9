"""``SftraceSpanProcessor``: turns each run into a `.sftrace` bundle, written as the run goes.

Shaped like the SDK's ``BatchSpanProcessor``: ``on_start`` and ``on_end`` put the span on a queue
and return; one background thread (``otel/writer.py``) takes the queue every ``flush_interval``
and feeds the bundles (``otel/bundles.py``: which span goes to which bundle, each built by the one
bundle builder, ``trace/builder.py``), then writes them. What a recorded call costs the program's
own thread is two queue appends and the hand-off read.

Which spans are queued:

* spans of a trace with a run being recorded (``record(...)``), from the run's start;
* with a directory configured (``configure(directory=...)``, the zero-code path), every span: the
  calls outside any run are written there too, and finding the local root they hang under needs
  the application's spans;
* nothing else: a span that is not stepfork's, in a trace with no run, costs one attribute
  lookup and one dict lookup (the tax on every other span of the application); a call outside
  any run with no directory to go to is not queued at all.

Design choices, and why:

* It never raises into the program (every callback goes through ``handle_internal_errors``) and
  blocks on nothing but the writer: when a run ends (the file is complete when ``with
  record(...)`` returns), after each call with ``flush_interval=0`` (its events are on disk
  before the call returns), and when more than :data:`~stepfork_otel.constants.
  FLUSH_BUFFER_BYTES` of payloads are queued (a bound on memory).
* A run's bundle is created with its header when the run starts, on the run's thread (a file
  that cannot be created is said at once); its calls are appended as they end, its trailer when
  it ends. The file on disk is always a bundle that loads (``complete: false`` until the
  trailer): after ``SIGKILL`` it holds every call that ended more than ``flush_interval`` (1 s)
  before the kill. Memory holds what is open, not the run.
* An interrupt (``KeyboardInterrupt``, a signal handler's ``sys.exit``) can land between any two
  bytecodes of the program's thread; here that is before or after one atomic ``deque.append``,
  so a call's end is queued or not -- not queued, it is written as a call still open when its
  bundle closes. The writer thread, which counts and writes, is never interrupted so.
* ``force_flush`` waits until everything queued is written (each bundle is its own snapshot);
  ``shutdown`` flushes, then closes the bundles still open, marked incomplete.
* Crash durability: at exit and on ``SIGTERM`` (when the program has no handler of its own)
  :meth:`finalise` closes the bundles still open, their open calls without an outcome.
* Full payloads come from the boundaries through the in-process hand-off
  (:class:`~stepfork_otel.recording.handoff.PayloadHandoff`), read in ``on_end``, so a payload
  left off the span (size cap, capture off) or cut by an ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT``
  is still whole in the local bundle.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import threading
import weakref
from collections import OrderedDict
from pathlib import Path

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors, internal_error
from stepfork_otel.config import CONFIG, RecordingConfig
from stepfork_otel.otel.bundles import (
    Bundles,
    ProcessorStats,
    attributes_of,
    span_record,
)
from stepfork_otel.otel.writer import _WRITER, BundleAppender, BundleWriter, recover_directory
from stepfork_otel.recording.handoff import HANDOFF, PayloadHandoff
from stepfork_otel.trace.bundle import BundleEncoder, bundle_file_name
from stepfork_otel.trace.conversion import run_info
from stepfork_otel.trace.models import Trace

__all__ = ["ProcessorStats", "SftraceSpanProcessor", "span_record"]

logger = logging.getLogger("stepfork_otel")

#: How long a run's end waits for the writer to close its bundle before it gives up (logged):
#: the file is then closed by the writer when it can.
_RUN_END_WAIT = 30.0
#: Traces with calls outside runs remembered (for their local roots' ends).
_REMEMBERED_TRACES = 4096


class _Followed:
    """A trace with runs being recorded here: how many, and how many write each call at once."""

    __slots__ = ("at_once", "runs")

    def __init__(self) -> None:
        self.runs = 0
        self.at_once = 0


class SftraceSpanProcessor(SpanProcessor):
    """Writes one bundle per run. Add it to any SDK ``TracerProvider`` (``configure()`` does)."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        max_open_traces: int = 1000,
        max_spans_per_trace: int = 10_000,
        compress: bool = False,
        config: RecordingConfig | None = None,
        handoff: PayloadHandoff | None = None,
        background_flush: bool = True,
        fsync_interval: float | None = k.DEFAULT_FSYNC_INTERVAL,
        flush_interval: float | None = k.DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        self.writer = BundleWriter(directory, compress=compress)
        self.background_flush = background_flush
        """Crash durability: write each run's bundle every ``flush_interval`` seconds while it is
        recorded. False: only when 1 MiB is pending and when the run ends."""
        self.fsync_interval = fsync_interval
        """Seconds between fsyncs of a bundle being written (0: every write; None: never)."""
        self.flush_interval = flush_interval
        """Seconds at most between a call's end and its events reaching the OS (0: at once)."""
        self._recovered: set[Path] = set()
        if self.writer.directory is not None:  # a start in that directory
            self._recovered.add(self.writer.directory)
            with handle_internal_errors(f"recovering runs cut short in {self.writer.directory}"):
                recover_directory(self.writer.directory)
        self.config = config or CONFIG
        """Whose redaction rules the conversion applies (the process's, by default)."""
        self._handoff = handoff or HANDOFF
        self.stats = ProcessorStats()
        #: Traces with a run being recorded (read without a lock: one dict lookup).
        self._followed: dict[int, _Followed] = {}
        #: With a directory: traces that made calls outside runs (the last ones), each with the
        #: name reserved for its first bundle of them (None: taken); their local roots' ends
        #: wait for the writer.
        self._with_calls: OrderedDict[int, Path | None] = OrderedDict()
        #: Default bundle paths given per trace (any thread: a run's start, the writer).
        self._claimed: dict[int, set[Path]] = {}
        #: For ``_followed`` and ``_claimed``. Reentrant: the SIGTERM handler may land in the
        #: middle of a run's start.
        self._lock = threading.RLock()
        self._shutdown = False
        self.bundles = Bundles(
            self.writer,
            redactor=lambda: self.config.settings.redactor,
            handoff=self._handoff,
            stats=self.stats,
            open_file=self._appender,
            claim=self._claim,
            reserved=self._reserved,
            max_open_traces=max_open_traces,
            max_spans_per_trace=max_spans_per_trace,
        )
        self._handoff.attach()
        if self.writer.directory is not None:
            _watch_for_exit(self)

    @property
    def directory(self) -> Path | None:
        """Where bundles of traces without a ``record(path)`` destination go (None: nowhere)."""
        return self.writer.directory

    @property
    def compress(self) -> bool:
        return self.writer.compress

    @property
    def max_open_traces(self) -> int:
        return self.bundles.max_open_traces

    @max_open_traces.setter
    def max_open_traces(self, value: int) -> None:
        self.bundles.max_open_traces = value

    @property
    def max_spans_per_trace(self) -> int:
        return self.bundles.max_spans_per_trace

    @max_spans_per_trace.setter
    def max_spans_per_trace(self, value: int) -> None:
        self.bundles.max_spans_per_trace = value

    # -- the program's threads: queue, and wait when asked to -------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:  # (try/except, not a context manager: the cost of every span of the application)
            kind = attributes_of(span).get(k.KIND)
            trace_id = span.context.trace_id
            if kind == k.KIND_RUN:  # followed from here (its bundle opens with set_destination)
                if self._shutdown:
                    return
                with self._lock:
                    self._followed.setdefault(trace_id, _Followed()).runs += 1
            elif trace_id not in self._followed:
                if self.writer.directory is None or self._shutdown:
                    return  # nothing of it can reach a bundle
                if kind is not None and trace_id not in self._with_calls:
                    self._reserve(trace_id)
            self.bundles.put((span,))
        except Exception:
            internal_error("queueing a started span")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            kind = attributes_of(span).get(k.KIND)
            trace_id = span.context.trace_id
            followed = self._followed.get(trace_id)
            if followed is None and (self.writer.directory is None or self._shutdown):
                return
            bundles = self.bundles
            if kind is None:
                bundles.put((span, None))
                parent = span.parent
                if (parent is None or parent.is_remote) and self._with_calls:
                    self._local_root_ended(trace_id)
                return
            # a copy: another bundle processor may read them too (see PayloadHandoff)
            payloads = self._handoff.read(span.context.span_id)
            bundles.put((span, payloads))
            if kind == k.KIND_RUN:
                self._run_ended(trace_id)
                return
            if span.parent is None and self._with_calls:  # a call outside any span
                self._local_root_ended(trace_id)
                return
            size = 512 + sum(p.size for p in payloads.values())
            bundles.queued += size
            at_once = self.flush_interval == 0 or (followed is not None and followed.at_once)
            if at_once or bundles.queued >= k.FLUSH_BUFFER_BYTES:
                bundles.wait()
        except Exception:
            internal_error("queueing a finished span")

    def _reserve(self, trace_id: int) -> None:
        """With a directory, the first call outside runs of a trace: its bundle's name is taken
        now, in the order the program made it (the writer opens the bundle later), and the
        local roots of the trace will wait for the writer when they end."""
        with self._lock:
            if trace_id in self._with_calls:
                return
            path = self.writer.default_path(f"{trace_id:032x}")
            self._with_calls[trace_id] = self._claim(path, trace_id, None)
            while len(self._with_calls) > _REMEMBERED_TRACES:
                self._with_calls.popitem(last=False)

    def _reserved(self, trace_id: int) -> Path | None:
        """(The writer thread.) The name reserved for the trace's first bundle of calls outside
        runs, once (None: taken, or none reserved)."""
        with self._lock:
            path = self._with_calls.get(trace_id)
            if path is not None:
                self._with_calls[trace_id] = None
            return path

    def _local_root_ended(self, trace_id: int) -> None:
        """With a directory, a local root of a trace that made calls outside runs ended: wait
        until the writer has closed its bundle (the file is whole once the request is over)."""
        if trace_id in self._with_calls:
            self.bundles.wait(_RUN_END_WAIT)

    def _run_ended(self, trace_id: int) -> None:
        """A run span ended: wait until its bundle is closed, so that the file is whole when
        ``with record(...)`` returns; stop following its trace when no run of it is left."""
        try:
            if not self.bundles.wait(_RUN_END_WAIT):
                logger.warning(
                    "stepfork_otel: the bundle writer did not close a run's bundle within %.0f s "
                    "(a slow disk?); it is closed when the writer can",
                    _RUN_END_WAIT,
                )
        finally:
            with self._lock:
                followed = self._followed.get(trace_id)
                if followed is not None:
                    followed.runs -= 1
                    if followed.runs <= 0:
                        del self._followed[trace_id]

    # -- destinations ----------------------------------------------------------------------------

    def _claim(self, path: Path, trace_id: int, span_id: int | None) -> Path:
        """A default path not yet used by another bundle of the same trace: the first gets
        ``<trace_id>.sftrace``, a later run ``<trace_id>-<span_id>.sftrace``, later bundles of
        calls outside runs ``<trace_id>-outside-runs[-N].sftrace``."""
        with self._lock:
            claimed = self._claimed.setdefault(trace_id, set())
            if path in claimed:
                tag = "outside-runs" if span_id is None else f"{span_id:016x}"
                n, named = 1, tag
                while True:
                    path = path.with_name(
                        bundle_file_name(f"{trace_id:032x}", named, compressed=self.compress)
                    )
                    if path not in claimed:
                        break
                    n += 1
                    named = f"{tag}-{n}"
            claimed.add(path)
            while len(self._claimed) > _REMEMBERED_TRACES:  # (bounded: the oldest traces' names
                del self._claimed[next(iter(self._claimed))]  # are forgotten)
            return path

    def set_destination(
        self,
        trace_id: int,
        destination: str | os.PathLike[str] | None,
        *,
        span_id: int,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
        span: object = None,
    ) -> Path | None:
        """Start the bundle of the run ``span_id`` (its span: ``span``) at ``destination``: a
        file, or a directory (an existing one, or a path ending in a separator) where it is
        named by trace id (None: the configured directory, else ``./traces``). Its header is
        written now; its calls as they end. ``flush_interval`` / ``fsync_interval``: the run's
        own (None: the processor's; ``math.inf``: never). Returns the path (None: the file could
        not be created -- logged)."""
        if self._shutdown or not isinstance(span, ReadableSpan):
            return None
        text = None if destination is None else os.fspath(destination)
        if text is not None and not (Path(text).is_dir() or text.endswith((os.sep, "/"))):
            path = Path(text)
        else:
            directory = None if text is None else Path(text)
            path = self._claim(
                self.writer.default_path(f"{trace_id:032x}", directory), trace_id, span_id
            )
        with handle_internal_errors(f"writing the bundle {path}"):
            try:
                if path.parent not in self._recovered:
                    self._recovered.add(path.parent)
                    recover_directory(path.parent)
                record = span_record(span, self._handoff.read(span_id))
                created = record.attributes.get(k.SDK_VERSION)
                start = Trace(
                    trace_id=record.trace_id,
                    created_by=created if isinstance(created, str) and created else None,
                    run=run_info(record, None),
                )
                appender = self._appender(
                    path, BundleEncoder(start), flush_interval, fsync_interval
                )
            except Exception:
                self.stats.write_errors += 1
                raise
            if flush_interval == 0:
                with self._lock:
                    followed = self._followed.get(trace_id)
                    if followed is not None:
                        followed.at_once += 1
            self.bundles.open_run(span, appender)
            _watch_for_exit(self)
            return path
        return None

    def _appender(
        self,
        path: Path,
        encoder: BundleEncoder,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
    ) -> BundleAppender:
        """The file of a bundle, its header written (``*_interval``: a run's own, None: the
        processor's; ``math.inf``: never)."""
        flush = self.flush_interval if flush_interval is None else flush_interval
        fsync = self.fsync_interval if fsync_interval is None else fsync_interval
        return BundleAppender(
            path,
            encoder,
            flush_interval=flush if self.background_flush and not math.isinf(flush or 0) else None,
            fsync_interval=None if fsync is None or math.isinf(fsync) else fsync,
        )

    # -- flush / shutdown / exit -----------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every call queued is in its bundle's file (each bundle is written as its
        run goes: the file is its own snapshot, ``complete: false`` until its trailer). False:
        not within the timeout."""
        with handle_internal_errors("flushing the bundles"):
            return self.bundles.wait(max(0.0, timeout_millis / 1000))
        return True

    def shutdown(self) -> None:
        if self._shutdown:
            return
        with handle_internal_errors("closing the bundles of runs still open"):
            self.bundles.wait(5.0, close="the tracer provider shut down before the run ended")
        with self._lock:
            self._shutdown = True
            self._followed.clear()
        self._handoff.detach()

    def finalise(self, timeout: float = 1.0) -> None:
        """At exit (``SIGTERM``, interpreter exit): close the bundle of every run still being
        recorded with what it holds, marked incomplete (its open calls without an outcome).
        Waits for the writer thread at most ``timeout`` seconds: what the bundles already hold
        stays on disk whatever happens."""
        with handle_internal_errors("finalising runs at exit"):
            if not self._shutdown and _WRITER.thread is not None:
                self.bundles.wait(timeout, close="the process exited before the run ended")


# -- exit handling ---------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[SftraceSpanProcessor] = weakref.WeakSet()
_exit_lock = threading.Lock()
_exit_watched = False


def _finalise_all() -> None:
    for processor in list(_LIVE):
        processor.finalise()


def _on_sigterm(signum: int, frame: object) -> None:
    """Finalise the runs being recorded, then die of the signal as if nothing was installed."""
    _finalise_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _watch_for_exit(processor: SftraceSpanProcessor) -> None:
    """Finalise ``processor``'s runs at interpreter exit, and on ``SIGTERM`` -- only when nothing
    handles ``SIGTERM`` yet (the default action would kill the process without running exit
    handlers): a handler of the program's own is never replaced, and it usually exits through
    ``sys.exit``, which runs the exit handler. Installed from the main thread only (Python's
    rule for signal handlers); from another thread, exit is still covered."""
    global _exit_watched
    _LIVE.add(processor)
    with _exit_lock:
        if _exit_watched:
            return
        _exit_watched = True
        atexit.register(_finalise_all)
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                    signal.signal(signal.SIGTERM, _on_sigterm)
