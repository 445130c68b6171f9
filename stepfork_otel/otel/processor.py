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

* It never raises into the program (an internal error is logged) and blocks on nothing but the
  writer: when a run ends (the file is complete when ``with record(...)`` returns), with a
  directory when a local root of a trace that made calls ends (the same, for its bundle), after
  each call with ``flush_interval=0`` (its events are on disk before the call returns), and
  when more than :data:`~stepfork_otel.constants.FLUSH_BUFFER_BYTES` of payloads are queued (a
  bound on memory). The writer takes the queue every ``flush_interval`` while it holds
  anything, and at once past a few thousand spans (a flood of the application's spans).
* A run's bundle is created with its header when the run starts, on the run's thread (a file
  that cannot be created is said at once); its calls are appended as they end, its trailer when
  it ends. The file on disk is always a bundle that loads (``complete: false`` until the
  trailer): after ``SIGKILL`` it holds every call that ended more than ``flush_interval`` (1 s)
  before the kill. Memory holds what is open, not the run.
* An interrupt (``KeyboardInterrupt``, a signal handler's ``sys.exit``) can land between any two
  bytecodes of the program's thread. A span's end cut off before it was queued is queued on
  the way out (without the hand-off copy: the writer then takes the payloads from the span),
  so a run's bundle still gets its trailer; a call's start cut off makes no call. The writer
  thread, which counts and writes, is never interrupted so, and takes no lock of the program's
  threads: the exit handler that interrupted one can wait for it.
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
from stepfork_otel.otel.writer import (
    BundleAppender,
    BundleWriter,
    open_at_a_free_name,
    recover_directory,
)
from stepfork_otel.recording.handoff import HANDOFF, PayloadHandoff
from stepfork_otel.trace.bundle import BundleEncoder, bundle_file_name
from stepfork_otel.trace.conversion import created_by_of, run_info
from stepfork_otel.trace.models import Trace

__all__ = ["ProcessorStats", "SftraceSpanProcessor", "span_record"]

logger = logging.getLogger("stepfork_otel")

#: How long a span's end waits for the writer (to close a run's bundle, or to write what is
#: queued) before it gives up, logged: the writer does it when it can.
_WRITER_WAIT = 30.0
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
        #: Of the runs being recorded, those that write each call at once (flush_interval=0).
        self._at_once: set[int] = set()
        #: With a directory: the traces that made calls (the last ones): their local roots'
        #: ends wait for the writer. Single dict operations, no lock.
        self._with_calls: dict[int, None] = {}
        #: Default bundle paths given (the last ones), in any thread -- a run's start, the
        #: writer -- each taken with one atomic ``setdefault``: no lock the writer could wait on.
        self._names: dict[Path, object] = {}
        #: For ``_followed`` and ``_at_once`` (the program's threads only; never the writer's).
        #: Reentrant: the SIGTERM handler may land in the middle of a run's start.
        self._lock = threading.RLock()
        self._shutdown = False
        self.bundles = Bundles(
            self.writer,
            redactor=lambda: self.config.settings.redactor,
            handoff=self._handoff,
            stats=self.stats,
            open_file=lambda path, encoder: self._appender(path, encoder, exclusive=True),
            claim=self._claim,
            interval=self._background_interval,
            max_open_traces=max_open_traces,
            max_spans_per_trace=max_spans_per_trace,
        )
        self._handoff.attach()
        _ALL.add(self)
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
            elif trace_id not in self._followed and (
                self.writer.directory is None or self._shutdown
            ):
                return  # nothing of it can reach a bundle
            if kind in k.BOUNDARY_KINDS and self.writer.directory is not None:
                name = self._first_name(trace_id)
                if name is not None:  # the trace's first call: with the name its first bundle
                    self.bundles.put(("name", span, name))  # of calls outside runs will have
                    return
            self.bundles.put((span,))
        except Exception:
            internal_error("queueing a started span")

    def on_end(self, span: ReadableSpan) -> None:
        settled = False  # the end is queued, or need not be
        kind = None
        try:
            kind = attributes_of(span).get(k.KIND)
            trace_id = span.context.trace_id
            followed = self._followed.get(trace_id)
            if followed is None and (self.writer.directory is None or self._shutdown):
                settled = True
                return
            bundles = self.bundles
            if kind is None:
                bundles.put((span, None))
                settled = True
                self._local_root_ended(span, trace_id)
                return
            # a copy: another bundle processor may read them too (see PayloadHandoff)
            payloads = self._handoff.read(span.context.span_id)
            bundles.put((span, payloads))
            settled = True
            if kind == k.KIND_RUN:
                self._run_ended(span)
                return
            if self._local_root_ended(span, trace_id):
                return
            size = 512 + sum(p.size for p in payloads.values())
            bundles.queued += size
            at_once = self.flush_interval == 0 or (followed is not None and followed.at_once)
            if at_once or bundles.queued >= k.FLUSH_BUFFER_BYTES:
                self._wait_for_writer("write the calls queued")
        except Exception:
            internal_error("queueing a finished span")
        finally:
            if not settled:  # cut off (an interrupt, an internal error) before its end was
                # queued: queued as it is -- the writer decides; its payloads come from the span
                self.bundles.put((span, None))
                if kind == k.KIND_RUN:
                    self._unfollow(span)

    def _first_name(self, trace_id: int) -> Path | None:
        """With a directory, at a trace's first call: the name its first bundle of calls outside
        runs will have, taken now, in the order the program made it (the writer opens the
        bundle later, perhaps after a run of the trace took a name); from then on the trace's
        local roots wait for the writer as they end. None: an earlier call of the trace took it.
        (Two threads making a trace's first call at once take two names: one goes unused.)"""
        calls = self._with_calls
        if trace_id in calls:
            return None
        calls[trace_id] = None
        if len(calls) > _REMEMBERED_TRACES:  # (bounded: the oldest traces are forgotten)
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del calls[next(iter(calls))]
        return self._claim(self.writer.default_path(f"{trace_id:032x}"), trace_id, None)

    def _local_root_ended(self, span: ReadableSpan, trace_id: int) -> bool:
        """With a directory, a local root of a trace that made calls ended: wait until the
        writer has closed the bundle it rooted (the file is whole once the request is over)."""
        parent = span.parent
        if (parent is None or parent.is_remote) and trace_id in self._with_calls:
            self._wait_for_writer("close the bundle of a request")
            return True
        return False

    def _wait_for_writer(self, what: str) -> None:
        """Wait until the writer has done what is queued; a writer stalled longer (a hung disk)
        is logged, and the program goes on."""
        if not self.bundles.wait(_WRITER_WAIT):
            logger.warning(
                "stepfork_otel: the bundle writer did not %s within %g s (a slow disk?); "
                "it does when it can",
                what,
                _WRITER_WAIT,
            )

    def _run_ended(self, span: ReadableSpan) -> None:
        """A run span ended: wait until its bundle is closed, so that the file is whole when
        ``with record(...)`` returns; stop following its trace when no run of it is left."""
        try:
            self._wait_for_writer("close a run's bundle")
        finally:
            self._unfollow(span)

    def _unfollow(self, span: ReadableSpan) -> None:
        ctx = span.get_span_context()
        if ctx is None:
            return
        with self._lock:
            followed = self._followed.get(ctx.trace_id)
            if followed is None:
                return
            if ctx.span_id in self._at_once:
                self._at_once.discard(ctx.span_id)
                followed.at_once -= 1
            followed.runs -= 1
            if followed.runs <= 0:
                del self._followed[ctx.trace_id]

    def _background_interval(self) -> float | None:
        """How often the writer takes the queue while it holds something (None: only when asked)."""
        interval = self.flush_interval
        if not self.background_flush or interval is None or math.isinf(interval):
            return None
        return interval or None

    # -- destinations ----------------------------------------------------------------------------

    def _claim(self, path: Path, trace_id: int, span_id: int | None) -> Path:
        """A default path not given to another bundle: the first bundle of a trace gets
        ``<trace_id>.sftrace``, a later run ``<trace_id>-<span_id>.sftrace``, later bundles of
        calls outside runs ``<trace_id>-outside-runs[-N].sftrace``. Any thread; no lock (one
        ``setdefault`` per name tried). A file already on disk under the name is never replaced
        (the bundle is created exclusively, and takes the next name)."""
        names = self._names
        mine = object()
        tag = "outside-runs" if span_id is None else f"{span_id:016x}"
        n, candidate = 1, path
        while names.setdefault(candidate, mine) is not mine:
            named = tag if n == 1 else f"{tag}-{n}"
            candidate = path.with_name(
                bundle_file_name(f"{trace_id:032x}", named, compressed=self.compress)
            )
            n += 1
        if len(names) > 4 * _REMEMBERED_TRACES:  # (bounded: the oldest names are forgotten)
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del names[next(iter(names))]
        return candidate

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
        named = text is not None and not (Path(text).is_dir() or text.endswith((os.sep, "/")))
        directory = None if text is None or named else Path(text)
        path = (
            Path(text)
            if named and text is not None
            else self._default(trace_id, span_id, directory)
        )
        with handle_internal_errors(f"writing the bundle {path}"):
            try:
                if path.parent not in self._recovered:
                    self._recovered.add(path.parent)
                    recover_directory(path.parent)
                record = span_record(span, self._handoff.read(span_id))
                start = Trace(
                    trace_id=record.trace_id,
                    created_by=created_by_of(record.attributes),
                    run=run_info(record, None),
                )

                def create(at: Path) -> BundleAppender:
                    return self._appender(
                        at,
                        BundleEncoder(start),
                        flush_interval,
                        fsync_interval,
                        exclusive=not named,
                    )

                appender = (
                    create(path)
                    if named  # (a name of the program's: replaced, as it asked)
                    else open_at_a_free_name(
                        lambda: self._default(trace_id, span_id, directory),
                        create,
                        record.trace_id,
                        path,
                    )
                )
                path = appender.path
            except Exception:
                self.stats.write_errors += 1
                raise
            if flush_interval == 0:
                with self._lock:
                    followed = self._followed.get(trace_id)
                    if followed is not None and span_id not in self._at_once:
                        self._at_once.add(span_id)
                        followed.at_once += 1
            self.bundles.open_run(span, appender)
            _watch_for_exit(self)
            return path
        return None

    def _default(self, trace_id: int, span_id: int | None, directory: Path | None) -> Path:
        return self._claim(
            self.writer.default_path(f"{trace_id:032x}", directory), trace_id, span_id
        )

    def _appender(
        self,
        path: Path,
        encoder: BundleEncoder,
        flush_interval: float | None = None,
        fsync_interval: float | None = None,
        *,
        exclusive: bool = False,
    ) -> BundleAppender:
        """The file of a bundle, its header written (``*_interval``: a run's own, None: the
        processor's; ``math.inf``: never; ``exclusive``: a default name, never over another
        file)."""
        flush = self.flush_interval if flush_interval is None else flush_interval
        fsync = self.fsync_interval if fsync_interval is None else fsync_interval
        return BundleAppender(
            path,
            encoder,
            flush_interval=flush if self.background_flush and not math.isinf(flush or 0) else None,
            fsync_interval=None if fsync is None or math.isinf(fsync) else fsync,
            exclusive=exclusive,
        )

    # -- flush / shutdown / exit -----------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait until every call queued is in its bundle's file (each bundle is written as its
        run goes: the file is its own snapshot, ``complete: false`` until its trailer). False:
        not within the timeout."""
        with handle_internal_errors("flushing the bundles"):
            return self.bundles.wait(max(0.0, timeout_millis / 1000))
        return False  # (stepfork failed: logged)

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
            if not self._shutdown and self.bundles.busy():
                self.bundles.wait(timeout, close="the process exited before the run ended")


# -- exit handling ---------------------------------------------------------------------------------

_LIVE: weakref.WeakSet[SftraceSpanProcessor] = weakref.WeakSet()
"""Processors with bundles to close at exit."""
_ALL: weakref.WeakSet[SftraceSpanProcessor] = weakref.WeakSet()
"""Every processor (for a forked child)."""
_exit_lock = threading.Lock()
_exit_watched = False


def _after_fork_in_child() -> None:
    """A forked child records nothing of its parent's runs (their bundles are the parent's,
    left alone by the writer), and its locks start free (another thread of the parent may have
    held one at the fork)."""
    global _exit_lock
    _exit_lock = threading.Lock()
    for processor in list(_ALL):
        processor._lock = threading.RLock()
        processor._followed.clear()
        processor._at_once.clear()
        processor._with_calls.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
