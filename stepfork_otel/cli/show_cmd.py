"""``stepfork show TRACE [--json]``: a recorded run as a tree -- the run, then its LLM and tool
calls nested as they were made, each with status, duration, replay policy, abbreviated
fingerprints and previews of the (already redacted) payloads.

What is shown of a call is one :class:`CallRow`, made once (:func:`call_rows`) and written either
as the tree's lines (:func:`call_tree`) or as ``--json`` (:meth:`CallRow.to_dict`): a new column
is a field of the row, a piece of :func:`_call_head` and a key of the JSON.

Reading only: nothing is imported or executed, not even the recorded entrypoint (shown as a hint).
Fingerprints are not verified here (``stepfork validate --verify-integrity`` does that), so a
tampered bundle can still be looked at. Colour only on a terminal; every line is printed inert
(:meth:`~stepfork_otel.cli._common.Style.line`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
from dataclasses import dataclass
from typing import Any

import orjson

from stepfork_otel.cli._common import (
    Style,
    abbreviate,
    abbreviate_in_data,
    add_common_arguments,
    call_input_text,
    format_duration,
    has_run_span,
    json_text,
    load_bundle,
    run_heading,
)
from stepfork_otel.replay.report import report_preview
from stepfork_otel.trace.canonical import short_fingerprint
from stepfork_otel.trace.errors import one_line
from stepfork_otel.trace.models import (
    CallEvent,
    CapturedRead,
    ErrorEvent,
    ToolCall,
    Trace,
    call_label,
    payload_value,
)
from stepfork_otel.trace.policy import ReplayPolicy


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print a recorded run as a tree of calls",
        description="Print a bundle as a tree: the run, its LLM and tool calls (nested), "
        "status, durations, replay policy, fingerprints and payload previews.",
    )
    parser.add_argument("trace", metavar="TRACE", help="the .sftrace bundle")
    parser.add_argument("--json", action="store_true", help="print the run as one JSON object")
    add_common_arguments(parser)


@dataclass(frozen=True)
class Shown:
    """A payload as ``show`` shows it: a preview, or why it is not in the bundle, or why its text
    is not JSON -- and its fingerprint."""

    preview: str | None
    """The (cut) text shown; None: not in the bundle."""
    sha256: str | None
    missing: str | None = None
    """Why it is not in the bundle (``size_cap``, ``not_recorded``, ...)."""
    damaged: str | None = None
    """Why the stored text is not JSON (None: it is, or it is not in the bundle)."""

    def line(self, label: str, verbose: bool) -> str:
        fp = f"  sha256 {abbreviate(self.sha256, verbose)}" if self.sha256 else ""
        if self.preview is None:
            return f"{label} <not in bundle: {self.missing or 'not recorded'}>{fp}"
        if self.damaged is not None:
            return f"{label} <damaged: {self.damaged}> {self.preview}{fp}"
        return f"{label} {self.preview}{fp}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "preview": self.preview,
            "sha256": self.sha256,
            "missing": (self.missing or "not_recorded") if self.preview is None else None,
            "damaged": self.damaged,
        }


def shown(
    text: str | None,
    sha: str | None,
    missing: str | None,
    verbose: bool,
    stored: str | None = None,
) -> Shown:
    """A payload as shown: ``text`` is what is previewed, ``stored`` the payload as the bundle
    holds it when the preview is made from it (a chat request's last message)."""
    if text is None:
        return Shown(None, sha, missing)
    damage = _damage(text if stored is None else stored)
    if damage is not None:
        return Shown(report_preview(text if stored is None else stored, verbose), sha, None, damage)
    return Shown(report_preview(text, verbose), sha)


def _damage(text: str) -> str | None:
    """Why a payload's text is not JSON (None: it is). ``show`` does not verify fingerprints,
    so a damaged payload is shown as such, never parsed on trust."""
    try:
        payload_value(text)
    except (ValueError, TypeError, RecursionError) as exc:
        return one_line(str(exc).split("\n", 1)[0])[:80] or type(exc).__name__
    return None


def _input_text(call: CallEvent) -> str | None:
    """The call's input as previewed (:func:`call_input_text`); the stored text itself when it is
    damaged (it cannot be read as a conversation)."""
    if call.input is not None and _damage(call.input) is not None:
        return call.input
    return call_input_text(call)


def run_data(trace: Trace, verbose: bool) -> dict[str, Any]:
    """The run as ``--json`` gives it (the facts of :func:`run_lines`)."""
    run = trace.run
    name, ended, took = run_heading(trace)
    is_run = has_run_span(trace)  # (calls outside a run have no run input or output)
    return {
        "heading": name,
        "name": run.name,
        "status": ended,
        "error_type": run.error_type,
        "error_message": run.error_message,
        "duration_ns": took,
        "replay_mode": run.replay_mode,
        "entrypoint_hint": run.entrypoint,
        "input": (
            shown(run.input, run.input_sha256, run.input_missing, verbose).to_dict()
            if is_run
            else None
        ),
        "output": (
            shown(run.output, run.output_sha256, run.output_missing, verbose).to_dict()
            if is_run
            else None
        ),
    }


def run_lines(trace: Trace, style: Style, verbose: bool) -> list[str]:
    run = trace.run
    name, ended, took = run_heading(trace)
    status = style.status(ended)
    error = f" {run.error_type}" if run.error_type else ""
    duration = format_duration(took)
    replay = f"  (a replay run, mode {run.replay_mode})" if run.replay_mode else ""
    lines = [style.bold(name) + f"  {status}{error}  {duration}{replay}"]
    head = [
        f"trace {abbreviate(trace.trace_id, verbose)}",
        f"format {trace.format_version}",
        "complete" if trace.complete else style.yellow(f"INCOMPLETE ({trace.incomplete_reason})"),
    ]
    if trace.created_by:
        head.append(trace.created_by)
    lines.append("  " + " · ".join(head))
    if trace.forked_from is not None:
        lines.append("  " + forked_from_line(trace, verbose))
    if run.entrypoint:
        lines.append(f"  entrypoint {run.entrypoint} (recorded hint; never executed)")
    if has_run_span(trace):  # (calls outside a run have no run input or output)
        lines.append(
            "  "
            + shown(run.input, run.input_sha256, run.input_missing, verbose).line("input ", verbose)
        )
        if run.status == "error":
            preview = report_preview(run.error_message, verbose)
            lines.append("  " + style.red(f"error  {run.error_type}: {preview}"))
        lines.append(
            "  "
            + shown(run.output, run.output_sha256, run.output_missing, verbose).line(
                "output", verbose
            )
        )
    calls = trace.calls
    tools = sum(1 for c in calls if isinstance(c, ToolCall))
    lines.append(f"  {len(calls)} calls ({len(calls) - tools} llm, {tools} tool)")
    if run.untraced_tools:
        lines.append(
            style.yellow(
                f"  tools the model called that no span shows running: "
                f"{', '.join(run.untraced_tools)} (replay refuses them unless live and allowed)"
            )
        )
    if trace.dropped_spans:
        lines.append(style.yellow(f"  {trace.dropped_spans} spans were dropped while recording"))
    if trace.context:
        names = ", ".join(dict.fromkeys(s.name for s in trace.context))
        lines.append(
            f"  your own spans around the calls: {report_preview(names, verbose, limit=80)}"
        )
    return lines


def forked_from_line(trace: Trace, verbose: bool) -> str:
    """Where a fork comes from: the original's trace and bundle, the fork point, and which calls
    are the original's (its lines fingerprint is in ``--json``)."""
    origin = trace.forked_from
    assert origin is not None
    at = origin.at_call
    where = f" ({origin.bundle})" if origin.bundle else ""
    shared = (
        "call 1 is" if at == 2 else "none of its calls is" if at == 1 else f"calls 1-{at - 1} are"
    )
    return (
        f"forked from trace {abbreviate(origin.trace_id, verbose)}{where} at call {at}: "
        f"{shared} that run's"
    )


@dataclass(frozen=True)
class CallRow:
    """What ``show`` shows of one call: its head line's columns, then its payloads."""

    call: CallEvent
    parent_id: str | None
    """The enclosing call's id, as the tree nests it (None: at run level)."""
    status: str
    """``ok``, ``error``, ``substituted``/``executed`` (a replay run's), or ``no recorded result``."""
    error_type: str | None
    error_message: str | None
    duration_ns: int | None
    """None: no recorded result."""
    input: Shown
    output: Shown | None
    """None: no recorded result, or the call failed (``error_message``)."""

    def to_dict(self) -> dict[str, Any]:
        call = self.call
        return {
            "id": call.id,
            "parent_id": self.parent_id,
            "kind": "tool" if isinstance(call, ToolCall) else "llm",
            "name": call.name if isinstance(call, ToolCall) else call.model,
            "provider": None if isinstance(call, ToolCall) else call.provider,
            "model": None if isinstance(call, ToolCall) else call.model,
            "label": call_label(call),
            "status": self.status,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "duration_ns": self.duration_ns,
            "replay_policy": call.replay_policy.value,
            "replay_action": call.replay_action,
            "fidelity": call.fidelity,
            "unchecked": list(call.unchecked) if call.unchecked else None,
            "input": self.input.to_dict(),
            "output": None if self.output is None else self.output.to_dict(),
        }


def _fidelity(call: CallEvent, style: Style) -> str:
    """How much an imported call holds (``stepfork import`` of another instrumentation's spans):
    exact, messages-only or truncated, and what its span did not hold."""
    if call.fidelity is None:
        return ""
    shown = call.fidelity if call.fidelity == "exact" else style.yellow(call.fidelity)
    held = f" (not held: {'; '.join(call.unchecked)})" if call.unchecked else ""
    return f"  fidelity {shown}{held}"


def call_rows(trace: Trace, verbose: bool) -> list[CallRow]:
    """One row per call, in the bundle's order."""
    calls = trace.calls
    ids = {c.id for c in calls}
    rows: list[CallRow] = []
    for call in calls:
        outcome = trace.outcome_of(call)
        failed = isinstance(outcome, ErrorEvent)
        rows.append(
            CallRow(
                call=call,
                parent_id=call.parent_id if call.parent_id in ids else None,
                status="no recorded result" if outcome is None else outcome.status,
                error_type=outcome.error_type if isinstance(outcome, ErrorEvent) else None,
                error_message=(
                    report_preview(outcome.message, verbose)
                    if isinstance(outcome, ErrorEvent)
                    else None
                ),
                duration_ns=None if outcome is None else outcome.duration_ns,
                input=shown(
                    _input_text(call),
                    call.input_sha256,
                    call.input_missing,
                    verbose,
                    stored=call.input,
                ),
                output=(
                    None
                    if outcome is None or failed
                    else shown(
                        outcome.output, outcome.output_sha256, outcome.output_missing, verbose
                    )
                ),
            )
        )
    return rows


def _call_head(row: CallRow, style: Style) -> str:
    call = row.call
    if row.duration_ns is None:
        status = style.yellow(row.status)
    elif row.error_type is not None:
        status = style.red("error") + f" {row.error_type}"
    else:
        status = style.status(row.status)
    duration = format_duration(row.duration_ns) if row.duration_ns is not None else "-"
    policy = call.replay_policy.value
    if call.replay_policy is not ReplayPolicy.REPLAYABLE:
        policy = style.yellow(policy)
    action = f"  replay: {call.replay_action}" if call.replay_action else ""
    fidelity = _fidelity(call, style)
    return (
        f"{call.id}  {style.bold(call_label(call))}  {status}  {duration}  "
        f"policy {policy}{action}{fidelity}"
    )


def call_tree(rows: list[CallRow], style: Style, verbose: bool) -> list[str]:
    children: dict[str | None, list[CallRow]] = {}
    for row in rows:
        children.setdefault(row.parent_id, []).append(row)
    lines: list[str] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = children.get(parent, [])
        for n, row in enumerate(kids):
            last = n == len(kids) - 1
            lines.append(prefix + ("└─ " if last else "├─ ") + _call_head(row, style))
            body = prefix + ("   " if last else "│  ")
            pipe = "│ " if children.get(row.call.id) else "  "
            lines.append(body + pipe + row.input.line("in ", verbose))
            if row.error_type is not None:
                lines.append(body + pipe + style.red(f"err {row.error_type}: {row.error_message}"))
            elif row.output is not None:
                lines.append(body + pipe + row.output.line("out", verbose))
            walk(row.call.id, body)

    walk(None, "")
    return lines


def _read_value(read: CapturedRead, verbose: bool) -> str:
    """A captured value as people read it: clock readings also as a UTC date."""
    value = read.value
    if read.source in ("time.time", "time.time_ns") and isinstance(value, (int, float)):
        seconds = value / 1e9 if read.source == "time.time_ns" else value
        with contextlib.suppress(OverflowError, OSError, ValueError):
            when = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
            return f"{value} ({when.isoformat(sep=' ', timespec='milliseconds')})"
    if read.source.startswith("random.") and isinstance(value, list):
        return f"{len(value)} draw(s)" + (f" {value}" if verbose else "")
    return report_preview(orjson.dumps(value).decode(), verbose, limit=60)


def captured_lines(trace: Trace, style: Style, verbose: bool) -> list[str]:
    """The captured reads: served values, checked environment variables, an audit's tally."""
    values = [r for r in trace.captured if r.kind == "value"]
    env = [r for r in trace.captured if r.kind == "env"]
    audit = [r for r in trace.captured if r.kind == "audit"]
    lines: list[str] = []
    if trace.run.capture and not trace.captured:
        lines.append(f"captured ({', '.join(trace.run.capture)}): no reads")
    if values or env:
        what = ", ".join(trace.run.capture or ()) or "reads"
        lines.append(style.bold(f"captured ({what}): {len(values)} value(s), {len(env)} env"))
    for read in values:
        when = (
            "after the last call" if read.before_call is None else f"before call-{read.before_call}"
        )
        if read.thread is not None:
            when += f", in thread {read.thread}"
        lines.append(
            f"  read {read.index:<3} {read.source:<16} {_read_value(read, verbose)}"
            f"  at {read.site}, {when}"
        )
    for read in env:
        state = (
            "unset"
            if read.sha256 is None
            else f"sha256 {short_fingerprint(read.sha256, verbose=verbose)}"
        )
        lines.append(f"  env  {read.name}  {state}  (checked, not served)  at {read.site}")
    if audit:
        total = sum(r.count or 0 for r in audit)
        lines.append(
            style.bold(f"audit: {total} nondeterministic read(s) at {len(audit)} site(s)")
            + " (no values recorded; capture them with record(..., capture=...))"
        )
        lines.extend(f"  {r.source:<16} x{r.count or 0:<4} at {r.site}" for r in audit)
    return lines


def show_data(path: str, trace: Trace, rows: list[CallRow], verbose: bool) -> dict[str, Any]:
    """``--json``: the bundle's header, the run, each call (:meth:`CallRow.to_dict`) and the
    captured reads as the bundle stores them."""
    data = {
        "trace": path,
        "trace_id": trace.trace_id,
        "format_version": trace.format_version,
        "complete": trace.complete,
        "incomplete_reason": trace.incomplete_reason,
        "created_by": trace.created_by,
        "forked_from": (
            None if trace.forked_from is None else trace.forked_from.model_dump(exclude_none=True)
        ),
        "run": run_data(trace, verbose),
        "calls": [row.to_dict() for row in rows],
        "context_spans": list(dict.fromkeys(s.name for s in trace.context)),
        "dropped_spans": trace.dropped_spans,
        "captured": [read.model_dump(mode="json", exclude_none=True) for read in trace.captured],
    }
    return abbreviate_in_data(data, verbose)  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    trace = load_bundle(args.trace)
    rows = call_rows(trace, args.verbose)
    if args.json:
        print(json_text(show_data(args.trace, trace, rows, args.verbose)))
        return 0
    style = Style(sys.stdout)
    lines = [
        *run_lines(trace, style, args.verbose),
        *call_tree(rows, style, args.verbose),
        *captured_lines(trace, style, args.verbose),
    ]
    print("\n".join(style.line(line) for line in lines))
    return 0
