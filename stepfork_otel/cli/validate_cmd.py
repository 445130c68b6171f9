"""``stepfork validate TRACE... [--no-verify-integrity] [--json]``: is each bundle well formed,
intact and whole -- replayable as recorded?

Exit 0 every bundle valid and complete, 1 one or more invalid or incomplete (each problem listed
with the event it concerns), 2 one or more unreadable (missing, a directory, not a bundle,
truncated, a newer format version). Problems are listed exhaustively -- loading a bundle stops at
the first one, so this command re-runs the schema validation to collect every error and maps each
to its event's id.

**Fingerprints are verified by default.** A bundle whose stored fingerprints no longer match its
payloads is rejected by ``replay`` and ``diff``, so calling it valid because its schema holds would
be a false answer. For 100,000 calls of 2 KB payloads (about 2.5 s to read) verifying adds about
0.5 s of SHA-256 and 1-1.5 s of parsing the payloads replay reads (measured on the 2-core machine,
CPU time). ``--no-verify-integrity`` checks schema and structure only, and the line says the
fingerprints were not checked. (``--verify-integrity``, the default, is still accepted: other
messages name it.)

**An incomplete run is not "valid".** A bundle a killed process left (written as its run went,
without its trailer) loads, holds every call that returned, and ``show`` and ``replay`` read it;
but the recorded run did not end, so replay stops after its last recorded call. It is reported
``INCOMPLETE`` with the reason, exit 1 -- as ``stepfork import`` reports an incomplete run.
A bundle written whole and cut short (no end line) is unreadable: exit 2.

A call whose recorded output (or input) could not be serialised when it was recorded -- the
``{"$unserialisable": ...}`` marker -- is a problem (exit 1): replay cannot serve it. Calls that
replay cannot serve for want of data (no recorded result, a payload left off the span) are
reported as warnings: the bundle is valid, but replay will stop at those calls. What an older
bundle leaves unverified (no lines fingerprint, payloads without a fingerprint) is a warning too.

``--json`` prints one object (keys in ``docs/cli.md``); every line otherwise is printed inert
(:meth:`Style.line`): an event id, a file name or a message quoting bundle data cannot recolour,
conceal or reorder the terminal.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from stepfork_otel.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_OK,
    Style,
    add_common_arguments,
    bundle_problems,
    json_text,
    print_error,
)
from stepfork_otel.trace.bundle import read_trace, schema_problems
from stepfork_otel.trace.errors import BundleError, BundleVersionError, Problem
from stepfork_otel.trace.models import Trace


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check bundles: schema, structure, fingerprints, completeness",
        description=(
            "Check .sftrace bundles: schema, structure and every stored fingerprint. Exit 0: all "
            "valid and complete; 1: a bundle is invalid (each problem listed with its event) or "
            "its run incomplete; 2: a bundle is unreadable."
        ),
    )
    parser.add_argument("traces", nargs="+", metavar="TRACE", help=".sftrace bundles")
    parser.add_argument(
        "--verify-integrity",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=(
            "check every stored SHA-256 fingerprint (the payloads, and the lines fingerprint over "
            "every other field) and that every payload replay reads is JSON it can read "
            "(default; --no-verify-integrity checks schema and structure only)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_common_arguments(parser)


@dataclass
class Checked:
    """What ``validate`` found in one file."""

    path: str
    trace: Trace | None = None
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    error: str | None = None
    """Why the file is unreadable (None: it was read)."""

    @property
    def status(self) -> str:
        if self.error is not None:
            return "unreadable"
        if self.problems:
            return "invalid"
        assert self.trace is not None
        return "valid" if self.trace.complete else "incomplete"

    @property
    def exit_code(self) -> int:
        return {"valid": EXIT_OK, "unreadable": EXIT_BAD_INPUT}.get(self.status, EXIT_DIFFERENT)

    def to_dict(self, verified: bool) -> dict[str, Any]:
        trace = self.trace
        return {
            "path": self.path,
            "status": self.status,
            "calls": None if trace is None else len(trace.calls),
            "events": None if trace is None else len(trace.events),
            "fingerprints_verified": verified and trace is not None,
            "complete": None if trace is None else trace.complete,
            "incomplete_reason": None if trace is None else trace.incomplete_reason,
            "problems": [_problem_data(p) for p in self.problems],
            "warnings": [_problem_data(p) for p in self.warnings],
            "error": self.error,
        }


def _problem_data(problem: Problem) -> dict[str, str | None]:
    return {"event_id": problem.event_id, "message": problem.message}


def check(path: str, verify: bool) -> Checked:
    """What is wrong with one bundle (an unreadable one says why in ``error``)."""
    try:
        trace = read_trace(path)
    except BundleVersionError as exc:
        return Checked(path, error=str(exc))
    except BundleError as exc:
        problems = schema_problems(path)
        if problems:
            return Checked(path, problems=problems)
        # not JSON, truncated, not a bundle, lines out of place: unreadable
        return Checked(path, error=str(exc))
    problems, warnings = bundle_problems(trace, verify)
    if problems and not trace.complete:
        warnings.insert(0, Problem(None, f"incomplete run ({_incomplete(trace)})"))
    return Checked(path, trace, problems, warnings)


def _incomplete(trace: Trace) -> str:
    return trace.incomplete_reason or "cut short"


def _label(problem: Problem) -> str:
    if problem.event_id is not None:
        return f"{problem.event_id}: {problem.message}"
    return f"run: {problem.message}" if problem.message.startswith("run ") else problem.message


def _lines(checked: Checked, verified: bool, style: Style) -> list[str]:
    """The lines printed for one readable bundle."""
    if checked.problems:
        n = len(checked.problems)
        lines = [f"{checked.path}: {style.red('INVALID')} ({n} problem{'s' if n != 1 else ''})"]
        lines += [f"  {_label(problem)}" for problem in checked.problems]
    else:
        trace = checked.trace
        assert trace is not None
        calls = len(trace.calls)
        counts = f"{calls} call{'s' if calls != 1 else ''}, {len(trace.events)} events"
        counts += ", every fingerprint verified" if verified else "; fingerprints not checked"
        if trace.complete:
            lines = [f"{checked.path}: {style.green('valid')} ({counts})"]
        else:
            lines = [
                f"{checked.path}: {style.yellow('INCOMPLETE')} ({counts}): {_incomplete(trace)}",
                "  the recorded run did not end: replay serves these calls and stops after the "
                "last one (`stepfork show` lists them)",
            ]
    lines += [f"  {style.yellow('warning')} {_label(warning)}" for warning in checked.warnings]
    return lines


def run(args: argparse.Namespace) -> int:
    style = Style(sys.stdout)
    verified = bool(args.verify_integrity)
    worst = EXIT_OK
    found: list[dict[str, Any]] = []  # (--json) one bundle's result at a time, not its trace
    for path in args.traces:
        result = check(path, verified)
        worst = max(worst, result.exit_code)
        if args.json:
            found.append(result.to_dict(verified))
        elif result.error is not None:
            print_error(result.error)
        else:
            for line in _lines(result, verified, style):
                print(style.line(line))
    if args.json:
        print(json_text({"bundles": found, "exit_code": worst}))
    return worst
