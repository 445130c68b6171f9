"""``stepfork validate TRACE... [--verify-integrity]``: is each bundle well formed, and (with the
flag) does every stored fingerprint match its payload?

Exit 0 all valid, 1 one or more invalid (each problem listed with the event it concerns), 2 one or
more unreadable (missing, a directory, not a bundle, truncated, a newer format version). Problems
are listed exhaustively -- loading a bundle stops at the first one, so this command re-runs the
schema validation to collect every error and maps each to its event's id.

Calls that replay cannot serve (no recorded result, a payload left off the span) are reported as
warnings: the bundle is valid, but replay will stop at those calls.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from stepfork_otel.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_OK,
    Style,
    add_common_arguments,
    print_error,
)
from stepfork_otel.constants import FORMAT_NAME
from stepfork_otel.trace.bundle import (
    BundleError,
    BundleVersionError,
    Problem,
    _read,
    missing_payloads,
    parse_trace,
    validate_structure,
    verify_integrity,
)
from stepfork_otel.trace.models import TRACE_ADAPTER, Trace


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
        help="check every stored SHA-256 fingerprint against its payload",
    )
    add_common_arguments(parser)


def _schema_problems(data: bytes, exc: ValidationError) -> list[Problem]:
    obj: Any = orjson.loads(data)
    events = obj.get("events") if isinstance(obj, dict) else None
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        event_id: str | None = None
        if len(loc) >= 2 and loc[0] == "events" and isinstance(loc[1], int):
            index = loc[1]
            raw = events[index] if isinstance(events, list) and index < len(events) else None
            raw_id = raw.get("id") if isinstance(raw, dict) else None
            event_id = raw_id if isinstance(raw_id, str) else f"events[{index}]"
            if len(loc) > 2 and isinstance(raw, dict) and loc[2] == raw.get("type"):
                loc = loc[3:]  # drop the union tag pydantic puts in the location
            else:
                loc = loc[2:]
        where = ".".join(str(p) for p in loc) or "event"
        problems.append(Problem(event_id, f"{where}: {err['msg']}"))
    return problems


def _is_bundle_json(data: bytes) -> bool:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and obj.get("format") == FORMAT_NAME


def check(path: str, verify: bool) -> tuple[Trace | None, list[Problem], list[Problem]]:
    """(trace, problems, warnings) for one bundle; raises BundleError when it is unreadable."""
    data = _read(Path(path))
    try:
        trace = parse_trace(data, path)
    except BundleVersionError:
        raise
    except BundleError:
        if not _is_bundle_json(data):
            raise  # not JSON, truncated, not a bundle: unreadable
        try:
            TRACE_ADAPTER.validate_json(data)
        except ValidationError as exc:
            return None, _schema_problems(data, exc), []
        raise
    problems = validate_structure(trace)
    if verify:
        problems += verify_integrity(trace)
    warnings = missing_payloads(trace)
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
            print(f"{path}: {style.red('INVALID')} ({count})")
            for problem in problems:
                print(f"  {_label(problem)}")
            worst = max(worst, EXIT_DIFFERENT)
        else:
            assert trace is not None
            checked = ", every fingerprint verified" if args.verify_integrity else ""
            print(
                f"{path}: {style.green('valid')} ({len(trace.calls)} calls, "
                f"{len(trace.events)} events{checked})"
            )
        for warning in warnings:
            print(f"  {style.yellow('warning')} {_label(warning)}")
    return worst
