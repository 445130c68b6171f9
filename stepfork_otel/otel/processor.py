"""``SftraceSpanProcessor``: turns each finished run into a `.sftrace` bundle.

It buffers spans by trace id. When a *bundle root* ends it converts the root's subtree with the one
span -> event conversion and writes the bundle atomically:

* a **run span** (opened by ``record(...)``) -> the run's bundle, at the path ``record`` was given
  (or ``<trace_id>.sftrace`` in the configured directory); the run's spans then leave the buffer,
  so a long-lived span of the application around many runs does not pile them up;
* a **local root** (no parent, or a remote parent) -> ``<trace_id>.sftrace`` in the configured
  directory, if its subtree still holds boundary spans (calls made outside any run). The
  application's own spans in the subtree are kept as context.

Design choices, and why:

* It never raises into the program (every callback goes through ``handle_internal_errors``) and
  blocks on nothing but the bundle write itself, done in ``on_end`` of the root so the file exists
  when ``with record(...)`` returns. Instrumentation is suppressed while it writes.
* Memory is bounded: at most ``max_open_traces`` traces and ``max_spans_per_trace`` buffered spans
  per trace. Beyond that spans are dropped, counted in :attr:`stats`, and a warning is logged. A
  bundle from a trace that lost spans says so (``dropped_spans``, ``complete: false``); a run whose
  whole trace was refused still gets a bundle, holding only the run and the reason. Traces whose
  spans have all ended but whose root was never seen are evicted first when the cap is reached.
* ``force_flush`` writes a snapshot of every open run (and of boundary spans outside runs, when a
  directory is configured), marked incomplete; the run keeps being buffered and its final bundle
  replaces the snapshot when it ends. ``shutdown`` flushes and then stops.
* Crash durability: while a run with a destination is recorded, each of its spans is appended
  to the run's journal (:class:`~stepfork_otel.otel.writer.RunJournal`) as it starts and as it
  ends, before the call returns; the run's bundle replaces the journal when the run ends. A
  journal left by a dead process is recovered by the next recording in that directory; at exit
  and on ``SIGTERM`` (when the program has no handler of its own) :meth:`finalise` writes the
  runs still open as incomplete bundles.
* Full payloads come from the boundaries through the in-process hand-off
  (:class:`~stepfork_otel.recording.handoff.PayloadHandoff`), so a payload left
  off the span (size cap, capture off) or cut by an ``OTEL_*ATTRIBUTE_VALUE_LENGTH_LIMIT`` is still
  whole in the local bundle.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import signal
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from stepfork_otel import constants as k
from stepfork_otel._internal import handle_internal_errors
from stepfork_otel.config import CONFIG, RecordingConfig
from stepfork_otel.otel.writer import BundleWriter, RunJournal, recover_directory
from stepfork_otel.recording.handoff import HANDOFF, PayloadHandoff
from stepfork_otel.trace import grouping
from stepfork_otel.trace.bundle import bundle_file_name
from stepfork_otel.trace.conversion import SpanRecord, is_stepfork_span, spans_to_trace
from stepfork_otel.trace.payload import Payload

logger = logging.getLogger("stepfork_otel")


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    # An open span may be written to by its thread while a flush copies it: retry a torn copy.
    for _ in range(3):
        try:
            return dict(span.attributes or {})
        except (RuntimeError, KeyError):
            continue
    return dict(span.attributes or {})


def span_record(
    span: ReadableSpan, payloads: Mapping[str, Payload] | None = None, *, copy: bool = True
) -> SpanRecord:
    """Describe an SDK span for the conversion (the processor's side of the one conversion).
    ``copy=False``: the span's own attribute mapping, for a span that has ended (and so can no
    longer change) and a record that does not outlive the call."""
    ctx = span.get_span_context()
    parent = span.parent
    return SpanRecord(
        trace_id=format(ctx.trace_id, "032x") if ctx else "0" * 32,
        span_id=format(ctx.span_id, "016x") if ctx else "0" * 16,
        parent_span_id=format(parent.span_id, "016x") if parent is not None else None,
        name=span.name,
        kind=span.kind.name,
        start_time_unix_nano=span.start_time or 0,
        end_time_unix_nano=span.end_time,
        status=span.status.status_code.name.lower(),
        attributes=_attributes(span) if copy else (span.attributes or {}),
        payloads=dict(payloads or {}),
    )


def _kind(span: ReadableSpan) -> Any:
    return (span.attributes or {}).get(k.KIND)


def _local_parent(span: ReadableSpan) -> int | None:
    parent = span.parent
    return None if parent is None or parent.is_remote else parent.span_id


@dataclass(slots=True)
class _OpenTrace:
    ended: dict[int, tuple[ReadableSpan, Mapping[str, Payload]]] = field(default_factory=dict)
    open: dict[int, Span] = field(default_factory=dict)
    dropped: int = 0
    claimed: set[Path] = field(default_factory=set)
    """Default bundle paths already given to a run of this trace."""

    def parents(self) -> dict[int, int | None]:
        parents = {span_id: _local_parent(span) for span_id, span in self.open.items()}
        parents.update((span_id, _local_parent(s)) for span_id, (s, _) in self.ended.items())
        return parents

    def kinds(self) -> dict[int, Any]:
        kinds = {span_id: _kind(span) for span_id, span in self.open.items()}
        kinds.update((span_id, _kind(s)) for span_id, (s, _) in self.ended.items())
        return kinds

    def size(self) -> int:
        return len(self.open) + len(self.ended)


@dataclass
class ProcessorStats:
    """Counters, for health checks and tests."""

    bundles_written: int = 0
    dropped_spans: int = 0
    """Spans not buffered: over ``max_spans_per_trace``, or of a trace refused as a whole."""
    dropped_traces: int = 0
    """Traces refused as a whole because ``max_open_traces`` traces were buffered."""
    evicted_traces: int = 0
    """Buffered traces whose spans had all ended but whose root was never seen, evicted at the
    open-trace cap."""
    write_errors: int = 0


@dataclass
class _Job:
    """One bundle to write (built under the lock, written outside it)."""

    trace_id: int
    root_span_id: int | None
    spans: list[tuple[ReadableSpan, Mapping[str, Payload]]]
    path: Path
    complete: bool
    reason: str | None
    dropped: int
    journal: RunJournal | None = None
    """The run's journal, removed once this (final) bundle is written."""


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
        journal: bool = True,
        fsync_interval: float | None = k.DEFAULT_FSYNC_INTERVAL,
    ) -> None:
        self.writer = BundleWriter(directory, compress=compress)
        self.journal = journal
        """Keep a journal of each run while it is recorded (crash durability, see
        :class:`~stepfork_otel.otel.writer.RunJournal`)."""
        self.fsync_interval = fsync_interval
        #: (trace id, run span id) -> the journal of a run being recorded.
        self._journals: dict[tuple[int, int], RunJournal] = {}
        self._recovered: set[Path] = set()
        if journal and self.writer.directory is not None:  # a start in that directory
            self._recovered.add(self.writer.directory)
            with handle_internal_errors(f"recovering runs cut short in {self.writer.directory}"):
                recover_directory(self.writer.directory)
        self.max_open_traces = max_open_traces
        self.max_spans_per_trace = max_spans_per_trace
        self.config = config or CONFIG
        """Whose redaction rules the conversion applies (the process's, by default)."""
        self._handoff = handoff or HANDOFF
        self.stats = ProcessorStats()
        self._lock = threading.Lock()
        self._traces: dict[int, _OpenTrace] = {}
        #: Traces refused as a whole (at the open-trace cap): trace id -> spans dropped.
        self._refused: OrderedDict[int, int] = OrderedDict()
        #: (trace id, run span id or None for the trace's own bundle) -> bundle path.
        self._destinations: dict[tuple[int, int | None], Path] = {}
        self._shutdown = False
        self._handoff.attach()

    @property
    def directory(self) -> Path | None:
        """Where bundles of traces without a ``record(path)`` destination go (None: nowhere)."""
        return self.writer.directory

    @property
    def compress(self) -> bool:
        return self.writer.compress

    # -- destinations ----------------------------------------------------------------------------

    def _default_path(self, trace_id: int, directory: Path | None) -> Path:
        return self.writer.default_path(f"{trace_id:032x}", directory)

    def _claim(self, path: Path, trace_id: int, span_id: int | None) -> Path:
        """A default path not yet used by another bundle of the same trace (caller holds lock):
        the first gets ``<trace_id>.sftrace``, a later run ``<trace_id>-<span_id>.sftrace``."""
        entry = self._traces.get(trace_id)
        if entry is None:
            return path
        if path in entry.claimed:
            tag = "outside-runs" if span_id is None else f"{span_id:016x}"
            path = path.with_name(
                bundle_file_name(f"{trace_id:032x}", tag, compressed=self.compress)
            )
        entry.claimed.add(path)
        return path

    def set_destination(
        self,
        trace_id: int,
        destination: str | os.PathLike[str] | None,
        *,
        span_id: int | None = None,
    ) -> Path:
        """Where the bundle of the run ``span_id`` (None: of the trace) goes: a file, or a
        directory (an existing one, or a path ending in a separator), named by trace id."""
        directory: Path | None = None
        if destination is not None:
            text = os.fspath(destination)
            path = Path(text)
            if path.is_dir() or text.endswith((os.sep, "/")):
                directory = path
            else:
                with self._lock:
                    self._destinations[(trace_id, span_id)] = path
                if span_id is not None:
                    self._open_journal(trace_id, span_id, path)
                return path
        with self._lock:
            path = self._claim(self._default_path(trace_id, directory), trace_id, span_id)
            self._destinations[(trace_id, span_id)] = path
        if span_id is not None:
            self._open_journal(trace_id, span_id, path)
        return path

    # -- journals --------------------------------------------------------------------------------

    def _open_journal(self, trace_id: int, run_id: int, path: Path) -> None:
        """Start the journal of a run whose bundle goes to ``path`` (after recovering what dead
        processes left in that directory, once per directory)."""
        if not self.journal or self._shutdown:
            return
        with handle_internal_errors(f"opening the run journal of {path}"):
            directory = path.parent
            if directory not in self._recovered:
                self._recovered.add(directory)
                recover_directory(directory)
            with self._lock:
                entry = self._traces.get(trace_id)
                span = None if entry is None else entry.open.get(run_id)
                if span is None or (trace_id, run_id) in self._journals:
                    return
                journal = RunJournal(
                    path, f"{trace_id:032x}", f"{run_id:016x}", self.fsync_interval
                )
                journal.append(span_record(span, self._handoff.read(run_id)))
                self._journals[(trace_id, run_id)] = journal
            _watch_for_exit(self)

    def _journals_above(
        self, trace_id: int, entry: _OpenTrace, parent: int | None
    ) -> list[RunJournal]:
        """The journals of the runs enclosing a span whose parent is ``parent`` (caller holds
        the lock)."""
        found: list[RunJournal] = []
        for _ in range(1024):  # (a parent chain is never this long; a cycle would be)
            if parent is None:
                break
            journal = self._journals.get((trace_id, parent))
            if journal is not None:
                found.append(journal)
            span: ReadableSpan | None = entry.open.get(parent)
            if span is None:
                ended = entry.ended.get(parent)
                if ended is None:
                    break
                span = ended[0]
            parent = _local_parent(span)
        return found

    def _journal_record(
        self, span: ReadableSpan, payloads: Mapping[str, Payload] | None
    ) -> SpanRecord:
        record = span_record(span, payloads, copy=span.end_time is None)
        if not is_stepfork_span(record):  # the application's span names may embed credentials
            record = dataclasses.replace(
                record, name=self.config.settings.redactor.redact_text(record.name)
            )
        return record

    def _append(self, journals: list[RunJournal], record: SpanRecord) -> None:
        for journal in journals:
            with handle_internal_errors(f"appending to the run journal {journal.path}"):
                journal.append(record)

    def finalise(self, timeout: float = 1.0) -> None:
        """At exit (``SIGTERM``, interpreter exit): write what every run still being recorded
        has, marked incomplete, and remove its journal. Gives up on a run rather than wait more
        than ``timeout`` for a lock the interrupted code holds (its journal stays, and the next
        start in that directory recovers it)."""
        with handle_internal_errors("finalising runs at exit"):
            if not self._journals or not self._lock.acquire(timeout=timeout):
                return
            try:
                jobs: list[_Job] = []
                for trace_id, entry in self._traces.items():
                    if any(key[0] == trace_id for key in self._journals):
                        jobs.extend(self._snapshot_jobs(trace_id, entry))
                journals = dict(self._journals)
                self._journals.clear()
            finally:
                self._lock.release()
            self._write_all(jobs)
            for journal in journals.values():
                journal.close(remove=journal.bundle_path.exists(), timeout=timeout)

    def _path_for(self, trace_id: int, span_id: int | None, *, final: bool) -> Path | None:
        """The bundle path of a run or of the trace (caller holds the lock); None: not written."""
        key = (trace_id, span_id)
        path = self._destinations.pop(key, None) if final else self._destinations.get(key)
        if path is not None:
            return path
        if self.directory is None:
            return None  # neither a record(...) destination nor a configured directory
        path = self._claim(self._default_path(trace_id, None), trace_id, span_id)
        if not final:
            self._destinations[key] = path
        return path

    # -- buffering -------------------------------------------------------------------------------

    def _entry(self, trace_id: int) -> _OpenTrace | None:
        """The buffer of ``trace_id``, created if the cap allows (caller holds the lock)."""
        entry = self._traces.get(trace_id)
        if entry is not None:
            return entry
        if trace_id in self._refused:
            return None  # its spans are counted as they end
        if len(self._traces) >= self.max_open_traces:
            self._evict_orphans()
        if len(self._traces) >= self.max_open_traces:
            self._refused[trace_id] = 0
            while len(self._refused) > 4 * self.max_open_traces + 16:
                self._refused.popitem(last=False)
            self.stats.dropped_traces += 1
            self._warn_dropped_trace(trace_id)
            return None
        entry = self._traces[trace_id] = _OpenTrace()
        return entry

    def _evict_orphans(self) -> None:
        orphans = {t for t, e in self._traces.items() if not e.open}
        for trace_id in orphans:
            del self._traces[trace_id]
            self.stats.evicted_traces += 1
        for key in [key for key in self._destinations if key[0] in orphans]:
            del self._destinations[key]

    def _passes_through(self, span: ReadableSpan) -> bool:
        """A boundary call made outside any span (a test replaying an agent, say) with no
        directory to write its trace to: nothing of it can end up in a bundle, so it is not
        buffered at all. (A call made inside its body still opens the trace's buffer, since a run
        could start there; its end then goes the usual way.)"""
        return self.directory is None and span.parent is None and _kind(span) in k.BOUNDARY_KINDS

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        with handle_internal_errors("tracking a started span"):
            ctx = span.get_span_context()
            if ctx is None or self._shutdown:
                return
            if self._passes_through(span):
                return
            journals: list[RunJournal] = []
            with self._lock:
                entry = self._entry(ctx.trace_id)
                if entry is None or entry.size() >= self.max_spans_per_trace:
                    return  # counted as dropped when it ends
                entry.open[ctx.span_id] = span
                if self._journals:
                    journals = self._journals_above(ctx.trace_id, entry, _local_parent(span))
            if journals:  # a call that starts and never ends is a call without an outcome
                self._append(journals, self._journal_record(span, None))

    def on_end(self, span: ReadableSpan) -> None:
        with handle_internal_errors("buffering a finished span"):
            ctx = span.get_span_context()
            if ctx is None:
                return
            # a copy: another bundle processor may read them too (see PayloadHandoff)
            payloads = self._handoff.read(ctx.span_id)
            if self._shutdown:
                return
            kind = _kind(span)
            is_local_root = _local_parent(span) is None
            is_run = kind == k.KIND_RUN
            jobs: list[_Job] = []
            journals: list[RunJournal] = []
            with self._lock:
                if (
                    self._passes_through(span)
                    and ctx.trace_id not in self._traces  # (unless a call inside it opened one)
                    and (ctx.trace_id, None) not in self._destinations
                ):
                    return
                entry = self._traces.get(ctx.trace_id)
                if self._journals and entry is not None:
                    journals = self._journals_above(ctx.trace_id, entry, _local_parent(span))
                jobs = self._buffer(
                    span, ctx.trace_id, ctx.span_id, payloads, is_run, is_local_root
                )
            if journals:  # before the bundle: a kill while it is written loses nothing
                self._append(journals, self._journal_record(span, payloads))
            self._write_all(jobs)

    def _buffer(
        self,
        span: ReadableSpan,
        trace_id: int,
        span_id: int,
        payloads: Mapping[str, Payload],
        is_run: bool,
        is_local_root: bool,
    ) -> list[_Job]:
        """Buffer an ended span; the bundles its end completes (caller holds the lock)."""
        entry = self._entry(trace_id)  # None: the trace is refused (now or earlier)
        if entry is None:
            self._refused[trace_id] += 1
            self.stats.dropped_spans += 1
            return self._refused_job(span, payloads, is_local_root)
        tracked = entry.open.pop(span_id, None) is not None
        if tracked or entry.size() < self.max_spans_per_trace:
            entry.ended[span_id] = (span, payloads)
        else:
            self._drop_span(entry, trace_id)
        jobs: list[_Job] = []
        if is_run:
            jobs.extend(self._run_job(trace_id, entry, span_id))
        if is_local_root:
            # a run that is its own local root was written above: only clean up
            jobs.extend(self._root_job(trace_id, entry, span_id, write=not is_run))
        return jobs

    def _drop_span(self, entry: _OpenTrace, trace_id: int) -> None:
        entry.dropped += 1
        self.stats.dropped_spans += 1
        if entry.dropped == 1:
            logger.warning(
                "stepfork_otel: trace %032x exceeded %d buffered spans; further spans dropped "
                "(its bundle will say it is incomplete)",
                trace_id,
                self.max_spans_per_trace,
            )

    # -- what to write (caller holds the lock) ---------------------------------------------------

    def _spans_of(
        self, entry: _OpenTrace, ids: Iterable[int]
    ) -> list[tuple[ReadableSpan, Mapping[str, Payload]]]:
        ids = set(ids)
        spans = [entry.ended[i] for i in entry.ended if i in ids]
        for span_id, span in entry.open.items():
            if span_id in ids:  # still open: its payloads stay kept for when it ends
                spans.append((span, self._handoff.read(span_id)))
        return spans

    def _job(
        self,
        trace_id: int,
        entry: _OpenTrace,
        root: int | None,
        ids: Iterable[int],
        path: Path,
        *,
        final: bool,
    ) -> _Job:
        spans = self._spans_of(entry, ids)
        complete = final and entry.dropped == 0
        if not final:
            reason: str | None = "the run had not finished when the bundle was flushed"
        elif entry.dropped:
            reason = f"{entry.dropped} span(s) of this trace were dropped (per-trace cap)"
        else:
            reason = None
        return _Job(trace_id, root, spans, path, complete, reason, entry.dropped)

    def _run_job(self, trace_id: int, entry: _OpenTrace, run_id: int) -> list[_Job]:
        path = self._path_for(trace_id, run_id, final=True)
        parents = entry.parents()
        ids = grouping.subtree(parents, run_id)
        jobs = [] if path is None else [self._job(trace_id, entry, run_id, ids, path, final=True)]
        journal = self._journals.pop((trace_id, run_id), None)
        if journal is not None:
            if jobs:
                jobs[0].journal = journal
            else:
                journal.close(remove=True)
        if grouping.enclosing_run(parents, entry.kinds(), run_id) is None:
            # a nested run's spans stay for the outer run's bundle
            for span_id in ids:
                entry.ended.pop(span_id, None)
        return jobs

    def _root_job(
        self, trace_id: int, entry: _OpenTrace, root_id: int, *, write: bool
    ) -> list[_Job]:
        if not entry.open and len(entry.ended) == 1 and root_id in entry.ended:
            ids = {root_id}  # a lone span (a call made outside any span): nothing to walk
        else:
            ids = grouping.subtree(entry.parents(), root_id)
        jobs: list[_Job] = []
        # the trace's own bundle goes to a destination set for it, or to the configured directory:
        # with neither (a boundary call outside any run, with no directory) nothing is written
        wanted = write and (self.directory is not None or (trace_id, None) in self._destinations)
        if wanted and grouping.holds_calls(entry.kinds(), ids):
            path = self._path_for(trace_id, None, final=True)
            if path is not None:
                jobs.append(self._job(trace_id, entry, root_id, ids, path, final=True))
        else:
            self._destinations.pop((trace_id, None), None)
        for span_id in ids:
            entry.ended.pop(span_id, None)
        if not entry.open:  # nothing else of this trace is running here
            del self._traces[trace_id]
            if self._destinations:
                for key in [key for key in self._destinations if key[0] == trace_id]:
                    del self._destinations[key]
        return jobs

    def _refused_job(
        self, span: ReadableSpan, payloads: Mapping[str, Payload], is_local_root: bool
    ) -> list[_Job]:
        ctx = span.get_span_context()
        assert ctx is not None
        dropped = self._refused[ctx.trace_id]
        if is_local_root:
            del self._refused[ctx.trace_id]
        if _kind(span) != k.KIND_RUN:
            return []
        path = self._path_for(ctx.trace_id, ctx.span_id, final=True)
        if path is None:
            return []
        reason = (
            f"trace not buffered: {self.max_open_traces} traces were already open "
            "(max_open_traces); only the run itself is recorded"
        )
        return [_Job(ctx.trace_id, ctx.span_id, [(span, payloads)], path, False, reason, dropped)]

    # -- flush / shutdown ------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write a snapshot of every open run (and, with a directory, of boundary spans outside
        runs), marked incomplete; the runs keep being recorded."""
        with handle_internal_errors("flushing open traces"):
            jobs: list[_Job] = []
            with self._lock:
                for trace_id, entry in self._traces.items():
                    jobs.extend(self._snapshot_jobs(trace_id, entry))
            self._write_all(jobs)
        return True

    def _snapshot_jobs(self, trace_id: int, entry: _OpenTrace) -> list[_Job]:
        jobs: list[_Job] = []
        for group in grouping.groups(entry.parents(), entry.kinds()):
            path = self._path_for(trace_id, group.run, final=False)
            if path is not None:
                jobs.append(self._job(trace_id, entry, group.run, group.members, path, final=False))
        return jobs

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self.force_flush()
        with self._lock:
            self._shutdown = True
            self._traces.clear()
            self._refused.clear()
            self._destinations.clear()
            journals = list(self._journals.values())
            self._journals.clear()
        for journal in journals:  # the flushed snapshot now holds what the journal did
            with handle_internal_errors(f"closing the run journal {journal.path}"):
                journal.close(remove=journal.bundle_path.exists())
        self._handoff.detach()

    # -- writing ---------------------------------------------------------------------------------

    def _write_all(self, jobs: list[_Job]) -> None:
        for job in jobs:
            written = False
            with handle_internal_errors(f"writing the bundle {job.path}"):
                self._write(job)
                written = True
            if job.journal is not None:  # kept when the bundle could not be written
                with handle_internal_errors(f"closing the run journal {job.journal.path}"):
                    job.journal.close(remove=written)

    def _write(self, job: _Job) -> None:
        try:
            records = [span_record(span, payloads) for span, payloads in job.spans]
            root = None if job.root_span_id is None else format(job.root_span_id, "016x")
            if root is not None and all(r.span_id != root for r in records):
                root = None  # the root itself was dropped at the per-trace cap
            trace = spans_to_trace(
                records,
                redactor=self.config.settings.redactor,
                complete=job.complete,
                incomplete_reason=job.reason,
                dropped_spans=job.dropped,
                root_span_id=root,
            )
            self.writer.write(trace, job.path)
            with self._lock:
                self.stats.bundles_written += 1
        except Exception:
            with self._lock:
                self.stats.write_errors += 1
            raise

    def _warn_dropped_trace(self, trace_id: int) -> None:
        if self.stats.dropped_traces in (1, 10, 100) or self.stats.dropped_traces % 1000 == 0:
            logger.warning(
                "stepfork_otel: %d open traces already buffered; trace %032x not recorded "
                "(%d traces dropped so far)",
                self.max_open_traces,
                trace_id,
                self.stats.dropped_traces,
            )


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
