"""The dependency-call matching report: what replay did with each call, what was left over, and
the first divergence in full.

Shared by ``stepfork replay`` (part 2 of its report) and the pytest plugin (the failure message of
a replay test), so a failure read in a terminal and in a test run look the same.
"""

from __future__ import annotations

from typing import Any

from stepfork_otel.cli._common import Style, abbreviate_in_text, preview
from stepfork_otel.replay.errors import ReplayError
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.replay.session import ReplayedCall, ReplayResult


def recorded_label(rc: RecordedCall) -> str:
    return f"{rc.event.id} {rc.describe().label()}"


def matching_verdict(result: ReplayResult) -> str:
    """``MATCHED`` or ``DIVERGED``: a divergence raised (caught by the agent or not), or recorded
    calls left over."""
    return "MATCHED" if result.ok else "DIVERGED"


def _matched(result: ReplayResult) -> int:
    counts = result.counts()
    return counts["substituted"] + counts["executed"]


def matching_headline(result: ReplayResult, recorded_calls: int) -> str:
    matched = _matched(result)
    skipped = f", {len(result.skipped)} skipped inside substituted calls" if result.skipped else ""
    first = result.errors[0] if result.errors else None
    if first is not None and first.position:
        return (
            f"DIVERGED at call {first.position} ({matched} of {recorded_calls} recorded calls "
            f"matched{skipped})"
        )
    if result.pending:
        return (
            f"DIVERGED ({len(result.pending)} of {recorded_calls} recorded calls never made"
            f"{skipped})"
        )
    if first is not None:
        return f"DIVERGED ({matched} of {recorded_calls} recorded calls matched{skipped})"
    return (
        f"MATCHED ({matched} of {recorded_calls} recorded calls matched{skipped}, none left over)"
    )


def _call_suffix(call: ReplayedCall) -> str:
    error = call.error  # replay redacts every message it keeps
    if call.action == "substituted" and call.status == "error":
        return f"  recorded failure replayed: {preview(error, limit=80)}"
    if call.action == "executed":
        return f"  ran live: {preview(error, limit=80)}" if call.status == "error" else "  ran live"
    return ""


def call_lines(result: ReplayResult, style: Style, indent: str = "   ") -> list[str]:
    """One line per call the run made, then the recorded calls it never reached."""
    lines: list[str] = []
    labels = [c.label for c in result.calls]
    width = max((len(label) for label in labels), default=0)
    expected_at = {  # a refused call: the recorded call replay expected there, if any
        error.position: error.expected.event_id
        for error in result.errors
        if error.position is not None and error.expected is not None
    }
    for call, label in zip(result.calls, labels, strict=True):
        action = style.status(f"{call.action:<11}")
        if call.recorded_id:
            rec = f"<- {call.recorded_id}"
        elif expected_at.get(call.position):
            rec = f"(expected {expected_at[call.position]})"
        else:
            rec = "(matched no recorded call)"
        lines.append(
            f"{indent}{call.position:>3}. {action} {label:<{width}}  {rec}{_call_suffix(call)}"
        )
        lines.extend(f"{indent}       note: {note}" for note in call.notes)
    if result.pending:
        lines.append(
            f"{indent}not reached: " + ", ".join(recorded_label(rc) for rc in result.pending)
        )
    if result.skipped:
        lines.append(
            f"{indent}skipped (inside substituted calls, their bodies did not run): "
            + ", ".join(recorded_label(rc) for rc in result.skipped)
        )
    return lines


def divergence_lines(error: ReplayError, verbose: bool, indent: str = "   ") -> list[str]:
    """The first divergence in full: the error's own message (fingerprints abbreviated unless
    verbose), indented under a line naming its type."""
    text = abbreviate_in_text(str(error), verbose)
    out = [f"{indent}first divergence ({type(error).__name__}):"]
    out.extend(f"{indent}  {line}" for line in text.splitlines())
    return out


def matching_section(
    result: ReplayResult, style: Style, verbose: bool, indent: str = "   "
) -> list[str]:
    """Call lines plus, when there is one, the first divergence in full."""
    lines = call_lines(result, style, indent)
    if result.errors:
        lines.extend(divergence_lines(result.errors[0], verbose, indent))
    return lines


def matching_data(result: ReplayResult, recorded_calls: int) -> dict[str, Any]:
    """The same as JSON-ready data (fingerprints full; the caller abbreviates)."""
    first = result.errors[0] if result.errors else None
    divergence: dict[str, Any] | None = None
    if first is not None:
        divergence = first.to_dict()
    return {
        "verdict": matching_verdict(result),
        "recorded_calls": recorded_calls,
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
                "notes": list(c.notes),
            }
            for c in result.calls
        ],
        "not_reached": [rc.event.id for rc in result.pending],
        "skipped": [rc.event.id for rc in result.skipped],
        "first_divergence": divergence,
    }
