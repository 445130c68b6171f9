"""Captured reads in replay: the clock, randomness and uuids the recorded run read, served back
to the thread that read them, in its recorded order, each checked against where it was asked for;
the environment compared.

Each thread of the run has its own values (``CapturedRead.thread``, numbered as the run's code
started its threads: ``recording/determinism.py``), so threads that read at one call site in
another interleaving than recorded still get their own; a read the recording made in another
thread is reported as such, never served the other thread's value.

The interception is ``recording/determinism.py``; it asks the session (``serve_read``), which asks
the :class:`ReadServer` here, under the session's lock. Why strict by default: a value served to a
read from another place (a new ``datetime.now()`` above the recorded one) would be the wrong
value, silently -- the very thing replay promises never to do. ``captured="lenient"`` trades that
for reading live with a note.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

from stepfork_otel import constants as k
from stepfork_otel.recording.contract import Site
from stepfork_otel.replay.errors import ReplayMismatchError, ReplayModeError
from stepfork_otel.trace.captured import env_fingerprint, group_of
from stepfork_otel.trace.models import CapturedRead, Trace

CapturedPolicy = Literal["strict", "lenient"]

#: How many reads of uncaptured sources a session remembers to explain a later mismatch.
_HINT_READS = 8


def parse_policy(captured: str) -> CapturedPolicy:
    if captured not in ("strict", "lenient"):
        raise ReplayModeError(f"captured must be 'strict' or 'lenient', not {captured!r}")
    return "strict" if captured == "strict" else "lenient"


def _same_site(read: CapturedRead, site: Site) -> bool:
    """Same module and function, and the same line counted from the function's start (the
    absolute line when the recording did not say)."""
    if (read.module, read.function) != (site.module, site.function):
        return False
    if read.offset is None:
        return read.line == site.line
    return read.offset == site.offset


def thread_label(thread: str | None) -> str:
    """How a message names one of the run's threads (``CapturedRead.thread``, ``Site.thread``)."""
    return "the thread the run started in" if thread is None else f"thread {thread}"


def _where(read: CapturedRead) -> str:
    when = "after the last call" if read.before_call is None else f"before call {read.before_call}"
    thread = "" if read.thread is None else f" in thread {read.thread}"
    return f"{read.source} at {read.site}{thread} ({when})"


#: Why a value is not served to a read made in another thread, and how threads are told apart.
_THREADS_RULE = (
    "a captured value is served only to the thread that read it, and threads are numbered in the "
    "order the run's own code started them (copy_context, create_task, gather, a TaskGroup, "
    "to_thread): replay the unchanged code, or record again"
)


@dataclass(frozen=True)
class ReadsSummary:
    """What replay did with the captured reads (part of ``ReplayResult``)."""

    recorded: int
    """Values the bundle holds to serve."""
    served: int
    left_over: tuple[str, ...]
    """The recorded reads the run never made (``source at site``)."""
    notes: tuple[str, ...]
    """Lenient fall-throughs, environment differences, reads the recording did not capture."""


NO_READS = ReadsSummary(0, 0, (), ())
"""The summary of a replay whose bundle captured nothing."""


class ReadServer:
    """The captured values of one bundle, by the thread that read them, and a cursor over each
    thread's values."""

    def __init__(self, trace: Trace, policy: CapturedPolicy) -> None:
        self.policy = policy
        self.values = [r for r in trace.captured if r.kind == "value"]
        self.env = [r for r in trace.captured if r.kind == "env"]
        groups = set(trace.run.capture or ()) | {group_of(r.source) for r in self.values}
        if k.CAPTURE_ALL in groups:
            groups.update(k.CAPTURE_SOURCES)
        self.groups = frozenset(groups - {k.CAPTURE_AUDIT, k.CAPTURE_ALL, k.CAPTURE_ENV})
        self.threads: dict[str | None, list[CapturedRead]] = {}
        """Each thread's recorded values, in the order it read them."""
        for read in self.values:
            self.threads.setdefault(read.thread, []).append(read)
        self.cursors: dict[str | None, int] = dict.fromkeys(self.threads, 0)
        self.served = 0
        self.reader: dict[str | None, int] = {}
        """The OS thread each thread's first value was served to."""
        self.readers: dict[str | None, set[int]] = {}
        """The threads whose values were served to several OS threads, and those OS threads
        (threads the run's own code did not start share a number)."""
        self.notes: list[str] = []
        self.uncaptured: list[str] = []
        self.live = False
        """Past a fork point: every read is live (nothing is served)."""

    def fork(self, at_call: int) -> None:
        """A fork reached its fork point (call ``at_call`` runs live): from here every read is
        live. The recorded reads made from the fork point on are no longer the run's to make;
        those made before it still are (one the run skipped is left over, as in any replay)."""

        def before(read: CapturedRead) -> bool:
            return read.before_call is not None and read.before_call < at_call

        for thread, reads in self.threads.items():
            cursor = self.cursors[thread]
            reads[cursor:] = [read for read in reads[cursor:] if before(read)]
        self.values = [read for read in self.values if before(read)]
        self.live = True

    def environment_notes(self) -> list[str]:
        """How this process's environment differs from the recorded one (names, never values)."""
        notes = []
        for read in self.env:
            name = read.name or "?"
            live = env_fingerprint(os.environ.get(name), read.value)
            if live == read.sha256:
                continue
            if read.sha256 is None:
                what = "is set here, unset when recorded"
            elif live is None:
                what = "is unset here, set when recorded"
            else:
                what = "differs from the recorded value (its fingerprint)"
            notes.append(f"environment: {name} {what} (read at {read.site})")
        self.notes.extend(notes)
        return notes

    def serve(self, group: str, source: str, site: Site, position: int) -> tuple[bool, Any]:
        """``(True, value)`` to serve, ``(False, None)`` to read live; raises on a divergence
        (strict). The value is the next one the reading thread (``site.thread``) read."""
        if self.live:
            return False, None
        if group not in self.groups:
            if len(self.uncaptured) < _HINT_READS:
                self.uncaptured.append(f"{source} at {site} (before call {position})")
            return False, None
        thread = site.thread
        reads = self.threads.get(thread)
        expected = None
        if reads is not None:
            cursor = self.cursors[thread]
            if cursor < len(reads):
                expected = reads[cursor]
                if expected.source == source and _same_site(expected, site):
                    self.cursors[thread] = cursor + 1
                    self.served += 1
                    ident = threading.get_ident()
                    if self.reader.setdefault(thread, ident) != ident:
                        self.readers.setdefault(thread, {self.reader[thread]}).add(ident)
                    return True, expected.value
        return self._unmatched(source, site, position, expected)

    def _unmatched(
        self, source: str, site: Site, position: int, expected: CapturedRead | None
    ) -> tuple[bool, Any]:
        """A read the reading thread's next recorded value is not for: made by another thread in
        the recording, from another site, or one more than the recording has."""
        thread = site.thread
        this_run = (
            f"this run: {source} at {site} in {thread_label(thread)} (before call {position})"
        )
        other = self._pending_elsewhere(source, site)
        if other is not None:
            if expected is not None:
                own = f"its own next recorded read is {expected.source} at {expected.site}"
            elif thread in self.threads:
                own = "its own recorded reads are used up"
            else:
                own = "it made no captured reads in the recording"
            return self._diverged(
                f"captured read by another thread: this run read {source} at {site} in "
                f"{thread_label(thread)}, but the recording read it there in "
                f"{thread_label(other.thread)} (read {other.index}); {own}",
                [f"recorded: read {other.index} {_where(other)}", this_run, _THREADS_RULE],
            )
        if expected is not None:
            return self._diverged(
                f"captured read {expected.index} differs from the recording: this run read "
                f"{source} at {site}, the recording read {expected.source} at {expected.site}",
                [
                    f"recorded: {_where(expected)}",
                    this_run,
                    "a captured value is served only to the read that made it: replay the "
                    "unchanged code, or record again",
                ],
            )
        if thread in self.threads or (thread is None and not self.threads):
            count = len(self.threads.get(thread, ()))
            whose = "" if len(self.threads) < 2 else f" in {thread_label(thread)}"
            return self._diverged(
                f"this run read {source} at {site}, but the recording's {count} captured "
                f"read(s){whose} are used up",
                [this_run],
            )
        made = ", ".join(thread_label(t) for t in self.threads)
        return self._diverged(
            f"this run read {source} at {site} in {thread_label(thread)}, which made no captured "
            f"reads in the recording (they were made by {made})",
            [this_run, _THREADS_RULE],
        )

    def _pending_elsewhere(self, source: str, site: Site) -> CapturedRead | None:
        """A recorded read of ``source`` at ``site`` by another thread, not served yet: one that
        is its thread's next read first, else the earliest."""
        found: CapturedRead | None = None
        for thread, reads in self.threads.items():
            if thread == site.thread:
                continue
            for at in range(self.cursors[thread], len(reads)):
                read = reads[at]
                if read.source == source and _same_site(read, site):
                    if at == self.cursors[thread]:
                        return read
                    if found is None or read.index < found.index:
                        found = read
                    break
        return found

    def shared(self) -> list[str]:
        """A line for each thread whose values were served to several OS threads: threads the
        run's own code did not start share the number of the one that started them, and are
        served in the recorded order of their reads, which they need not keep."""
        return [
            f"the captured values of {thread_label(thread)} were served to {len(idents)} OS "
            "threads: a thread started where the run's own code does not copy the context (by a "
            "library, such as anyio.to_thread) has the number of the thread that started it, so "
            "a value it was served may be another such thread's; copy the context in your own "
            "code (contextvars.copy_context().run) to give it its own"
            for thread, idents in self.readers.items()
        ]

    def _diverged(self, reason: str, details: list[str]) -> tuple[bool, Any]:
        details = [*details, *self.shared()]
        if self.policy == "lenient":
            self.notes.append(f"read live (captured='lenient'): {reason}")
            return False, None
        raise ReplayMismatchError(reason, details=details)

    def left_over(self) -> list[CapturedRead]:
        left = [read for t, reads in self.threads.items() for read in reads[self.cursors[t] :]]
        return sorted(left, key=lambda read: read.index)

    def hint(self) -> list[str]:
        """Detail lines for a call mismatch that uncaptured reads -- or values served to threads
        that share a number -- may explain."""
        lines = self.shared()
        if not self.uncaptured:
            return lines
        lines.append(
            "before this, the run read values the recording did not capture: "
            + ", ".join(self.uncaptured)
        )
        groups = sorted({group_of(entry.split(" ", 1)[0]) for entry in self.uncaptured})
        lines.append(
            "if the input differs because of them, record with "
            f"record(..., capture={tuple(groups)!r}) and they are replayed too"
        )
        return lines

    def leftover_error(self) -> ReplayMismatchError | None:
        left = self.left_over()
        if not left or self.policy == "lenient":
            return None
        return ReplayMismatchError(
            f"{len(left)} captured read(s) were never made by this run",
            details=["not read: " + ", ".join(f"read {r.index} {_where(r)}" for r in left)],
        )

    def summary(self) -> ReadsSummary:
        left = tuple(f"read {r.index} {_where(r)}" for r in self.left_over())
        return ReadsSummary(len(self.values), self.served, left, tuple(self.notes))
