"""The dependency-call matching report: what replay did with each call, what was left over, and
the first divergence in full.

One function writes it, :func:`format_report`, and both readers call it: ``stepfork replay`` (part 2
of its report, coloured on a terminal) and the pytest plugin (the failure message of a replay
test), so a failure read in a terminal and in a test run look the same. :func:`report_data` is the
same report as JSON-ready data (``stepfork replay --json``).

Also here, because the report needs them and the CLI shows payloads and fingerprints the same way:
:func:`report_preview` (a payload cut to one line) and :func:`abbreviate_in_text` (every SHA-256 in
a text shortened with :func:`~stepfork_otel.trace.canonical.short_fingerprint`).

Replay knowledge (layer L4): no terminal, no pytest. Colour comes from the caller, as a
:class:`Highlight` (the CLI passes its ``Style``); by default the text is plain.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from stepfork_otel import constants as k
from stepfork_otel.constants import REPORT_PREVIEW_CHARS, VERBOSE_PREVIEW_CHARS
from stepfork_otel.replay.errors import ReplayError, ReplayPolicyError, preview
from stepfork_otel.trace.canonical import short_fingerprint
from stepfork_otel.trace.errors import one_line
from stepfork_otel.trace.models import call_label

if TYPE_CHECKING:  # annotations only: the CLI's previews need no session loaded
    from stepfork_otel.replay.plan import RecordedCall
    from stepfork_otel.replay.session import ReplayedCall, ReplayResult

__all__ = [
    "PLAIN",
    "Highlight",
    "abbreviate_in_text",
    "format_report",
    "report_data",
    "report_preview",
]

#: The heading of the report, as the pytest plugin prints it.
HEADING = "Dependency-call matching: "
#: Characters of a call's error shown on its line.
_CALL_ERROR_CHARS = 80

_SHA256 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


class Highlight(Protocol):
    """How the report marks its heading and each status (the CLI's ``Style`` is one)."""

    def bold(self, text: str) -> str: ...

    def status(self, status: str) -> str: ...


class _Plain:
    """No marking at all: the text of a test failure, a pipe, a log."""

    def bold(self, text: str) -> str:
        return text

    def status(self, status: str) -> str:
        return status


PLAIN: Highlight = _Plain()


def report_preview(text: str | None, verbose: bool = False, limit: int | None = None) -> str:
    """A (redacted) payload's text cut to one readable line: newlines written ``\\n``, ``…``
    marking the cut, ``<not recorded>`` when absent. ``limit`` defaults to
    :data:`~stepfork_otel.constants.REPORT_PREVIEW_CHARS` (``verbose``:
    :data:`~stepfork_otel.constants.VERBOSE_PREVIEW_CHARS`)."""
    limit = limit or (VERBOSE_PREVIEW_CHARS if verbose else REPORT_PREVIEW_CHARS)
    return preview(None if text is None else text.replace("\n", "\\n"), limit)


def abbreviate_in_text(text: str, verbose: bool = False) -> str:
    """Every SHA-256 hex digest inside ``text`` abbreviated (e.g. a ``ReplayError`` message);
    ``text`` unchanged when ``verbose``."""
    if verbose:
        return text
    return _SHA256.sub(lambda m: short_fingerprint(m.group(0)), text)


def _recorded(rc: RecordedCall) -> str:
    # bundle text: escaped, so a line break in an id or a name is not one of the report's
    return one_line(f"{rc.event.id} {call_label(rc.event)}")


def _matched(result: ReplayResult) -> int:
    counts = result.counts()
    return counts[k.ACTION_SUBSTITUTED] + counts[k.ACTION_EXECUTED]


def _forked(result: ReplayResult) -> str:
    before = result.forked_after or 0
    skipped = f", {len(result.skipped)} skipped inside them" if result.skipped else ""
    return (
        f"{before} call(s) before it replayed as recorded{skipped}, "
        f"{len(result.calls) - before} live from there"
    )


def _headline(result: ReplayResult, recorded_calls: int) -> str:
    if result.fork_at is not None:  # only the calls before the fork point are replayed
        recorded_calls = result.fork_at - 1
        first = result.first_divergence
        after = result.forked_after
        if first is not None and first.position and after is not None and first.position > after:
            return f"REFUSED at call {first.position} (forked at call {result.fork_at}: {_forked(result)})"
    matched = _matched(result)
    skipped = f", {len(result.skipped)} skipped inside substituted calls" if result.skipped else ""
    first = result.first_divergence
    if first is not None and first.position:
        return (
            f"DIVERGED at call {first.position} ({matched} of {recorded_calls} recorded calls "
            f"matched{skipped})"
        )
    if result.pending:
        return f"DIVERGED ({result.pending} of {recorded_calls} recorded calls never made{skipped})"
    if first is not None:
        return f"DIVERGED ({matched} of {recorded_calls} recorded calls matched{skipped})"
    if result.reads.left_over:
        return (
            f"DIVERGED ({len(result.reads.left_over)} of {result.reads.recorded} captured reads "
            "never made)"
        )
    if result.fork_at is not None and result.forked_after is not None:
        return f"FORKED at call {result.fork_at} ({_forked(result)})"
    return (
        f"MATCHED ({matched} of {recorded_calls} recorded calls matched{skipped}, none left over)"
    )


def _call_suffix(call: ReplayedCall) -> str:
    error = call.error  # replay redacts every message it keeps
    shown = report_preview(error, limit=_CALL_ERROR_CHARS)
    if call.action == k.ACTION_SUBSTITUTED and call.status == "error":
        return f"  recorded failure replayed: {shown}"
    if call.action == k.ACTION_EXECUTED:
        return f"  ran live: {shown}" if call.status == "error" else "  ran live"
    return ""


def _call_lines(result: ReplayResult, style: Highlight, indent: str) -> list[str]:
    """One line per call the run made, then the recorded calls it never reached."""
    lines: list[str] = []
    labels = [c.label for c in result.calls]
    width = max((len(label) for label in labels), default=0)
    expected_at = {  # a refused call: the recorded call replay expected there, if any
        error.position: error.expected.event_id
        for error in result.errors
        if error.position is not None and error.expected is not None
    }
    refused_unmatched = {  # refused by the mode before any recorded call was matched
        error.position
        for error in result.errors
        if isinstance(error, ReplayPolicyError) and error.expected is None
    }
    live_after = result.forked_after if result.forked_after is not None else len(result.calls)
    for call, label in zip(result.calls, labels, strict=True):
        action = style.status(f"{call.action:<11}")
        if call.position > live_after:
            rec = "(after the fork point)"
        elif call.recorded_id:
            rec = f"<- {one_line(call.recorded_id)}"
        elif expected_at.get(call.position):
            rec = f"(expected {one_line(expected_at[call.position] or '')})"
        elif call.position in refused_unmatched:
            rec = "(refused before matching)"
        else:
            rec = "(matched no recorded call)"
        fidelity = f"  fidelity {call.fidelity}" if call.fidelity else ""
        lines.append(
            f"{indent}{call.position:>3}. {action} {label:<{width}}  {rec}{fidelity}"
            + _call_suffix(call)
        )
        lines.extend(f"{indent}       note: {one_line(note)}" for note in call.notes)
    if result.pending:
        lines.append(
            f"{indent}not reached: " + ", ".join(_recorded(rc) for rc in result.pending_calls)
        )
    if result.skipped:
        lines.append(
            f"{indent}skipped (inside substituted calls, their bodies did not run): "
            + ", ".join(_recorded(rc) for rc in result.skipped)
        )
    if result.after_fork:
        lines.append(
            f"{indent}recorded from the fork point on (not replayed: the fork ran live): "
            + ", ".join(_recorded(rc) for rc in result.after_fork)
        )
    return lines


def _divergence_lines(error: ReplayError, verbose: bool, indent: str) -> list[str]:
    """The first divergence in full: the error's own message (fingerprints abbreviated unless
    verbose), indented under a line naming its type."""
    text = abbreviate_in_text(str(error), verbose)
    out = [f"{indent}first divergence ({type(error).__name__}):"]
    out.extend(f"{indent}  {line}" for line in text.splitlines())
    return out


def _read_lines(result: ReplayResult, indent: str) -> list[str]:
    """The captured clock/random/uuid reads: how many were served, which were never made, and
    the notes (environment differences, reads taken live)."""
    reads = result.reads
    lines: list[str] = []
    if reads.recorded:
        lines.append(f"{indent}captured reads: {reads.served} of {reads.recorded} served")
    lines.extend(f"{indent}  not read: {entry}" for entry in reads.left_over)
    lines.extend(f"{indent}note: {note}" for note in reads.notes)
    return lines


def format_report(
    result: ReplayResult,
    recorded_calls: int,
    *,
    verbose: bool = False,
    heading: str = HEADING,
    indent: str = "   ",
    style: Highlight = PLAIN,
) -> str:
    """The dependency-call matching report of a replay, as text (lines joined by ``\\n``).

    ``result`` is what the replay did (``session.summary``), ``recorded_calls`` how many calls the
    bundle holds. The first line is ``heading`` followed by the verdict: ``MATCHED`` when every
    call matched and none was left over, else ``DIVERGED`` -- a replay error was raised (even one
    the agent caught) or recorded calls were never made. Then one line per call the run made
    (``substituted`` / ``executed`` / ``rejected``, its label, the recorded call it matched),
    the notes replay made on it, the recorded calls not reached or skipped inside substituted
    calls, and the first divergence in full. Fingerprints are abbreviated unless ``verbose``;
    every payload shown is the redacted text already in the bundle. ``style`` marks the heading
    (``bold``) and each status (``status``); the default marks nothing.

    Example (the example agent, recorded with ``max_results=5``, replayed after its default
    became 3)::

        Dependency-call matching: DIVERGED at call 2 (1 of 4 recorded calls matched)
             1. substituted llm openai/gpt-4.1-mini  <- call-1
             2. rejected    tool search_flights      (expected call-2)
           not reached: call-2 tool search_flights, call-3 llm openai/gpt-4.1-mini, call-4 tool book_flight
           first divergence (ReplayMismatchError):
             at call 2 of this run: input differs from the recording (arguments are normalised with their defaults: a changed default counts)
               expected (recorded): tool search_flights (call-2)
                   input: {"city":"Paris","max_results":5}
                   input sha256: 3a95c0f3af5f…
                   recorded output sha256: 072444d80e9d…
               actual (this run):   tool search_flights
                   input: {"city":"Paris","max_results":3}
                   input sha256: c35c04d98efa…
               first difference at character 30:
                 recorded: …{"city":"Paris","max_results":5}…
                 this run: …{"city":"Paris","max_results":3}…
    """
    verdict, _, rest = _headline(result, recorded_calls).partition(" ")
    lines = [style.bold(heading) + style.status(verdict) + f" {rest}"]
    lines += _call_lines(result, style, indent)
    lines += _read_lines(result, indent)
    first = result.first_divergence
    if first is not None:
        lines += _divergence_lines(first, verbose, indent)
    return "\n".join(lines)


def report_data(result: ReplayResult, recorded_calls: int) -> dict[str, Any]:
    """:func:`format_report` as JSON-ready data (fingerprints in full: the caller abbreviates)."""
    first = result.first_divergence
    return {
        "verdict": _headline(result, recorded_calls).split(" ", 1)[0],
        "recorded_calls": recorded_calls,
        "fork_at": result.fork_at,
        "matched": _matched(result),
        "calls": [
            {
                "position": c.position,
                "kind": c.kind,
                "name": c.name,
                "provider": c.provider,
                "model": c.model,
                "action": c.action,
                "recorded_id": c.recorded_id,
                "status": c.status,
                "error": c.error,
                "input_sha256": c.input_sha256,
                "fidelity": c.fidelity,
                "notes": list(c.notes),
            }
            for c in result.calls
        ],
        "not_reached": [rc.event.id for rc in result.pending_calls],
        "skipped": [rc.event.id for rc in result.skipped],
        "after_fork": [rc.event.id for rc in result.after_fork],
        "captured_reads": {
            "recorded": result.reads.recorded,
            "served": result.reads.served,
            "not_read": list(result.reads.left_over),
            "notes": list(result.reads.notes),
        },
        "first_divergence": None if first is None else first.to_dict(),
    }
