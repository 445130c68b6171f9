"""``stepfork show TRACE``: a recorded run as a tree -- the run, then its LLM and tool calls nested
as they were made, each with status, duration, replay policy, abbreviated fingerprints and
previews of the (already redacted) payloads.

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

import orjson

from stepfork_otel.cli._common import (
    Style,
    abbreviate,
    add_common_arguments,
    call_input_text,
    format_duration,
    has_run_span,
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
    OutcomeEvent,
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
    add_common_arguments(parser)


def _payload(
    label: str,
    text: str | None,
    sha: str | None,
    missing: str | None,
    v: bool,
    stored: str | None = None,
) -> str:
    """One payload line: ``text`` is what is previewed, ``stored`` the payload as the bundle holds
    it when the preview is made from it (a chat request's last message)."""
    fp = f"  sha256 {abbreviate(sha, v)}" if sha else ""
    if text is None:
        return f"{label} <not in bundle: {missing or 'not recorded'}>{fp}"
    damage = _damage(text if stored is None else stored)
    if damage is not None:
        shown = text if stored is None else stored
        return f"{label} <damaged: {damage}> {report_preview(shown, v)}{fp}"
    return f"{label} {report_preview(text, v)}{fp}"


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
            "  " + _payload("input ", run.input, run.input_sha256, run.input_missing, verbose)
        )
        if run.status == "error":
            preview = report_preview(run.error_message, verbose)
            lines.append("  " + style.red(f"error  {run.error_type}: {preview}"))
        lines.append(
            "  " + _payload("output", run.output, run.output_sha256, run.output_missing, verbose)
        )
    calls = trace.calls
    tools = sum(1 for c in calls if isinstance(c, ToolCall))
    lines.append(f"  {len(calls)} calls ({len(calls) - tools} llm, {tools} tool)")
    if trace.dropped_spans:
        lines.append(style.yellow(f"  {trace.dropped_spans} spans were dropped while recording"))
    if trace.context:
        names = ", ".join(dict.fromkeys(s.name for s in trace.context))
        lines.append(
            f"  your own spans around the calls: {report_preview(names, verbose, limit=80)}"
        )
    return lines


def forked_from_line(trace: Trace, verbose: bool) -> str:
    """Where a fork comes from: the original's trace, bundle and lines fingerprint, the fork
    point, and which calls are the original's."""
    origin = trace.forked_from
    assert origin is not None
    at = origin.at_call
    where = f" ({origin.bundle})" if origin.bundle else ""
    shared = (
        "call 1 is" if at == 2 else "none of its calls is" if at == 1 else f"calls 1-{at - 1} are"
    )
    return (
        f"forked from trace {abbreviate(origin.trace_id, verbose)}{where} at call {at}: "
        f"{shared} that run's (its lines sha256 {abbreviate(origin.lines_sha256, verbose)})"
    )


def _call_head(call: CallEvent, outcome: OutcomeEvent | None, style: Style) -> str:
    label = call_label(call)
    if outcome is None:
        status = style.yellow("no recorded result")
    elif isinstance(outcome, ErrorEvent):
        status = style.red("error") + f" {outcome.error_type}"
    else:
        status = style.status(outcome.status)
    duration = format_duration(outcome.duration_ns) if outcome is not None else "-"
    policy = call.replay_policy.value
    if call.replay_policy is not ReplayPolicy.REPLAYABLE:
        policy = style.yellow(policy)
    action = f"  replay: {call.replay_action}" if call.replay_action else ""
    return f"{call.id}  {style.bold(label)}  {status}  {duration}  policy {policy}{action}"


def call_tree(trace: Trace, style: Style, verbose: bool) -> list[str]:
    calls = trace.calls
    ids = {c.id for c in calls}
    children: dict[str | None, list[CallEvent]] = {}
    for call in calls:
        parent = call.parent_id if call.parent_id in ids else None
        children.setdefault(parent, []).append(call)
    lines: list[str] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = children.get(parent, [])
        for n, call in enumerate(kids):
            last = n == len(kids) - 1
            outcome = trace.outcome_of(call)
            lines.append(prefix + ("└─ " if last else "├─ ") + _call_head(call, outcome, style))
            body = prefix + ("   " if last else "│  ")
            pipe = "│ " if children.get(call.id) else "  "
            lines.append(
                body
                + pipe
                + _payload(
                    "in ",
                    _input_text(call),
                    call.input_sha256,
                    call.input_missing,
                    verbose,
                    stored=call.input,
                )
            )
            if isinstance(outcome, ErrorEvent):
                lines.append(
                    body
                    + pipe
                    + style.red(
                        f"err {outcome.error_type}: {report_preview(outcome.message, verbose)}"
                    )
                )
            elif outcome is not None:
                lines.append(
                    body
                    + pipe
                    + _payload(
                        "out",
                        outcome.output,
                        outcome.output_sha256,
                        outcome.output_missing,
                        verbose,
                    )
                )
            walk(call.id, body)

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


def run(args: argparse.Namespace) -> int:
    trace = load_bundle(args.trace)
    style = Style(sys.stdout)
    lines = [
        *run_lines(trace, style, args.verbose),
        *call_tree(trace, style, args.verbose),
        *captured_lines(trace, style, args.verbose),
    ]
    print("\n".join(style.line(line) for line in lines))
    return 0
