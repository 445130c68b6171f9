"""``stepfork validate TRACE... [--verify-integrity]``: is each bundle well formed and replayable,
and (with the flag) does every stored fingerprint match what it covers?

Exit 0 all valid, 1 one or more invalid (each problem listed with the event it concerns), 2 one or
more unreadable (missing, a directory, not a bundle, truncated, a newer format version). Problems
are listed exhaustively -- loading a bundle stops at the first one, so this command re-runs the
schema validation to collect every error and maps each to its event's id.

A call whose recorded output (or input) could not be serialised when it was recorded -- the
``{"$unserialisable": ...}`` marker -- is a problem (exit 1), with or without the flag: replay
cannot serve it. Calls that replay cannot serve for want of data (no recorded result, a payload
left off the span) are reported as warnings: the bundle is valid, but replay will stop at those
calls. With the flag, what an older bundle leaves unverified (no lines fingerprint, payloads
without a fingerprint) is a warning too.

Every line is printed inert (:meth:`Style.line`): an event id, a file name or a message quoting
bundle data cannot recolour, conceal or reorder the terminal.
"""

from __future__ import annotations

import argparse
import sys

from stepfork_otel.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_OK,
    Style,
    add_common_arguments,
    print_error,
)
from stepfork_otel.trace.bundle import read_trace, schema_problems
from stepfork_otel.trace.checks import (
    missing_payloads,
    unreadable_payloads,
    unreplayable_calls,
    unverified_fields,
    validate_structure,
    verify_integrity,
)
from stepfork_otel.trace.errors import BundleError, BundleVersionError, Problem
from stepfork_otel.trace.models import Trace


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check bundles: schema, structure, and (optionally) every fingerprint",
        description=(
            "Check .sftrace bundles. Exit 0: all valid; 1: a bundle is invalid (each problem "
            "listed with its event); 2: a bundle is unreadable."
        ),
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help=".sftrace bundles")
    parser.add_argument(
        "--verify-integrity",
        action="store_true",
        help=(
            "check every stored SHA-256 fingerprint: the payloads, and the lines fingerprint "
            "over every other field; and that every payload replay reads is JSON it can read"
        ),
    )
    add_common_arguments(parser)


def check(path: str, verify: bool) -> tuple[Trace | None, list[Problem], list[Problem]]:
    """(trace, problems, warnings) for one bundle; raises BundleError when it is unreadable."""
    try:
        trace = read_trace(path)
    except BundleVersionError:
        raise
    except BundleError:
        problems = schema_problems(path)
        if problems:
            return None, problems, []
        raise  # not JSON, truncated, not a bundle, lines out of place: unreadable
    problems = validate_structure(trace)
    if verify:
        problems += verify_integrity(trace)
        problems += unreadable_payloads(trace)
    problems += unreplayable_calls(trace)
    warnings = missing_payloads(trace)
    if verify:
        warnings += unverified_fields(trace)
    if not trace.complete:
        warnings.insert(
            0, Problem(None, f"incomplete run ({trace.incomplete_reason or 'cut short'})")
        )
    return trace, problems, warnings


def _label(problem: Problem) -> str:
    if problem.event_id is not None:
        return f"{problem.event_id}: {problem.message}"
    return f"run: {problem.message}" if problem.message.startswith("run ") else problem.message


def run(args: argparse.Namespace) -> int:
    style = Style(sys.stdout)
    worst = EXIT_OK
    for path in args.traces:
        try:
            trace, problems, warnings = check(path, args.verify_integrity)
        except BundleError as exc:
            print_error(str(exc))
            worst = EXIT_BAD_INPUT
            continue
        if problems:
            count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
            print(style.line(f"{path}: {style.red('INVALID')} ({count})"))
            for problem in problems:
                print(style.line(f"  {_label(problem)}"))
            worst = max(worst, EXIT_DIFFERENT)
        else:
            assert trace is not None
            checked = ", every fingerprint verified" if args.verify_integrity else ""
            print(
                style.line(
                    f"{path}: {style.green('valid')} ({len(trace.calls)} calls, "
                    f"{len(trace.events)} events{checked})"
                )
            )
        for warning in warnings:
            print(style.line(f"  {style.yellow('warning')} {_label(warning)}"))
    return worst
