"""Captured reads in replay: the clock, randomness and uuids the recorded run read, served back
in recorded order, each checked against where it was asked for; the environment compared.

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


def _where(read: CapturedRead) -> str:
    when = "after the last call" if read.before_call is None else f"before call {read.before_call}"
    return f"{read.source} at {read.site} ({when})"


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
    """The captured values of one bundle and the cursor over them."""

    def __init__(self, trace: Trace, policy: CapturedPolicy) -> None:
        self.policy = policy
        self.values = [r for r in trace.captured if r.kind == "value"]
        self.env = [r for r in trace.captured if r.kind == "env"]
        groups = set(trace.run.capture or ()) | {group_of(r.source) for r in self.values}
        if k.CAPTURE_ALL in groups:
            groups.update(k.CAPTURE_SOURCES)
        self.groups = frozenset(groups - {k.CAPTURE_AUDIT, k.CAPTURE_ALL, k.CAPTURE_ENV})
        self.cursor = 0
        self.notes: list[str] = []
        self.uncaptured: list[str] = []
        self.readers: dict[tuple[str, str], set[int]] = {}
        """(source, site) -> the threads its recorded values were served to."""
        self.live = False
        """Past a fork point: every read is live (nothing is served)."""

    def fork(self, at_call: int) -> None:
        """A fork reached its fork point (call ``at_call`` runs live): from here every read is
        live. The recorded reads made from the fork point on are no longer the run's to make;
        those made before it still are (one the run skipped is left over, as in any replay)."""
        kept = self.values[self.cursor :]
        self.values[self.cursor :] = [
            r for r in kept if r.before_call is not None and r.before_call < at_call
        ]
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
        (strict)."""
        if self.live:
            return False, None
        if group not in self.groups:
            if len(self.uncaptured) < _HINT_READS:
                self.uncaptured.append(f"{source} at {site} (before call {position})")
            return False, None
        if self.cursor >= len(self.values):
            return self._diverged(
                f"this run read {source} at {site}, but the recording's "
                f"{len(self.values)} captured read(s) are used up",
                [f"this run: before call {position}"],
            )
        expected = self.values[self.cursor]
        if expected.source != source or not _same_site(expected, site):
            return self._diverged(
                f"captured read {self.cursor + 1} differs from the recording: this run read "
                f"{source} at {site}, the recording read {expected.source} at {expected.site}",
                [
                    f"recorded: {_where(expected)}",
                    f"this run: {source} at {site} (before call {position})",
                    "a captured value is served only to the read that made it: replay the "
                    "unchanged code, or record again",
                ],
            )
        self.cursor += 1
        self.readers.setdefault((source, str(site)), set()).add(threading.get_ident())
        return True, expected.value

    def cross_thread(self) -> list[str]:
        """A line for each call site whose captured values were served to several threads:
        values are served in the recorded order of the run's reads, which concurrent threads
        need not keep, so one thread may have been served another's value (the input of the
        call it makes next then differs, for that reason)."""
        return [
            f"captured reads of {source} at {site} were served to {len(threads)} threads: "
            "captured values are served in the order the recording read them, which concurrent "
            "threads need not keep, so a thread may have been served the value another thread "
            "read in the recording; make such reads in one thread (or behind a boundary)"
            for (source, site), threads in self.readers.items()
            if len(threads) > 1
        ]

    def _diverged(self, reason: str, details: list[str]) -> tuple[bool, Any]:
        details = [*details, *self.cross_thread()]
        if self.policy == "lenient":
            self.notes.append(f"read live (captured='lenient'): {reason}")
            return False, None
        raise ReplayMismatchError(reason, details=details)

    def left_over(self) -> list[CapturedRead]:
        return self.values[self.cursor :]

    def hint(self) -> list[str]:
        """Detail lines for a call mismatch that uncaptured reads -- or captured values served
        across threads -- may explain."""
        lines = self.cross_thread()
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
        return ReadsSummary(len(self.values), self.cursor, left, tuple(self.notes))
