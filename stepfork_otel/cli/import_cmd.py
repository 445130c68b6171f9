"""``stepfork import FILE... [--trace-id ID] [-o DIR] [--redaction-rules RULES] [--force]
[--json]``: rebuild bundles from spans a collector captured (OTLP JSON: the Collector's ``file``
exporter output, or OTLP/HTTP JSON request bodies).

One bundle per recorded run, written atomically as ``DIR/<trace_id>.sftrace`` the moment the last
line holding spans of its trace has been read (the import streams; see
``stepfork_otel.trace.otlp``). A second run in the same trace gets ``<trace_id>-<span_id>``,
as the bundle processor names it.

An existing bundle is not overwritten without ``--force``, as ``export`` does not overwrite a test:
a bundle is a recording that may not be made again. Each one that exists is named (``NOT
WRITTEN``), the other runs are still imported, and the command ends with one error line and exit 2.

Nothing is written silently incomplete: every bundle line says whether the run is complete, calls
whose payload was left off the span (size cap, content capture off, an attribute length limit) are
listed with what replay will do there (match an input by its fingerprint; stop at a missing
result), and every line of the input that could not be read is named.

The names of the application's own spans kept as context are redacted with the built-in rules, or
with the recording process's rules given as ``--redaction-rules`` (the JSON file
``stepfork_otel.trace.redaction.files`` describes): with the same rules, the imported bundle is the
bundle the process wrote.

Every line printed is inert (:meth:`~stepfork_otel.cli._common.Style.line`): run names, error types
and problems come from the input.

Exit 0: every run imported whole. 1: something to look at (payloads missing, a run incomplete,
lines skipped, nothing imported). 2: unreadable input (missing file, not OTLP JSON, a trace id
not in the input), or a bundle that exists (without ``--force``). ``--json`` prints the same as one
object (keys in ``docs/cli.md``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepfork_otel.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_OK,
    Style,
    add_common_arguments,
    json_text,
    print_error,
    replay_stops_at,
)
from stepfork_otel.trace.bundle import bundle_file_name
from stepfork_otel.trace.checks import missing_payloads
from stepfork_otel.trace.errors import Problem
from stepfork_otel.trace.models import Trace
from stepfork_otel.trace.otlp import ImportReport, OtlpImportError, iter_traces_from_otlp_json
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR
from stepfork_otel.trace.redaction.files import RedactionRulesError, load_redaction_rules

#: Problems listed one by one before the rest are only counted.
_MAX_PROBLEMS_SHOWN = 20


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "import",
        help="rebuild .sftrace bundles from OTLP JSON a collector captured",
        description=(
            "Rebuild .sftrace bundles from OTLP JSON (the OpenTelemetry Collector's file exporter "
            "output, or OTLP/HTTP JSON request bodies). Spans of a trace may be spread over any "
            "number of lines and files. Exit 0: all runs imported whole; 1: payloads missing, a "
            "run incomplete or input lines skipped; 2: unreadable input."
        ),
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="OTLP JSON files (.gz too)")
    parser.add_argument(
        "--trace-id", metavar="ID", help="import only this trace (32 hex digits)", default=None
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        default=".",
        help="directory for the bundles (default: the current directory)",
    )
    parser.add_argument(
        "--redaction-rules",
        metavar="RULES",
        default=None,
        help=(
            "JSON file of the extra redaction rules the recording process used "
            '({"keys": [...], "patterns": [{"name": ..., "regex": ...}]}); default: the '
            "built-in rules"
        ),
    )
    parser.add_argument("--force", action="store_true", help="overwrite existing bundles")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_common_arguments(parser)


def _bundle_path(directory: Path, trace: Trace, written: dict[str, list[bool]]) -> Path:
    """Named as the bundle processor names them (``bundle_file_name``): the first bundle of a
    trace ``<trace_id>``, a later run ``<trace_id>-<span_id>``, a later bundle of calls outside
    runs ``<trace_id>-outside-runs``, ``-outside-runs-2``, ... (``written``: per trace, whether
    each bundle written so far was of calls outside runs)."""
    before = written.setdefault(trace.trace_id, [])
    outside = trace.run.span_id is None
    before.append(outside)
    if len(before) == 1:
        tag = None
    elif not outside:
        tag = trace.run.span_id
    else:
        later = sum(before[1:])  # (the bundles of calls outside runs after the first bundle)
        tag = "outside-runs" if later == 1 else f"outside-runs-{later}"
    return directory / bundle_file_name(trace.trace_id, tag)


def _describe(trace: Trace) -> str:
    run = trace.run
    outcome: str = run.status
    if run.status == "error" and run.error_type:
        outcome = f"error ({run.error_type.rsplit('.', 1)[-1]})"
    calls = len(trace.calls)
    return f"{run.name or 'run'}, {calls} call{'s' if calls != 1 else ''}, {outcome}"


def _consequence(trace: Trace, problem: Problem) -> str:
    """What replay will do at a call whose payload is missing."""
    if replay_stops_at(trace, problem):
        return "replay stops at this call"
    return "replay matches this call by its input fingerprint"


#: Why a bundle was not written because one exists (the --force message).
EXISTS = "exists (use --force to overwrite)"


@dataclass
class Imported:
    """One run of the import: where its bundle went (or why it did not), and what to look at."""

    path: Path
    trace: Trace
    error: str | None = None
    """Why the bundle was not written (None: it was)."""
    missing: list[Problem] = field(default_factory=list)

    def lines(self, style: Style) -> list[str]:
        trace = self.trace
        if self.error is not None:
            return [f"{self.path}: {style.red('NOT WRITTEN')} -- {self.error}"]
        state = style.green("complete") if trace.complete else style.red("INCOMPLETE")
        lines = [f"{self.path}: {state} -- {_describe(trace)}"]
        if not trace.complete:
            lines.append(f"  incomplete: {trace.incomplete_reason or 'the run was cut short'}")
        lines += [
            f"  {style.yellow('missing')} {p} -- {_consequence(trace, p)}" for p in self.missing
        ]
        return lines

    def to_dict(self) -> dict[str, Any]:
        trace, run = self.trace, self.trace.run
        return {
            "path": str(self.path),
            "written": self.error is None,
            "error": self.error,
            "trace_id": trace.trace_id,
            "run": run.name,
            "status": run.status,
            "error_type": run.error_type,
            "calls": len(trace.calls),
            "complete": trace.complete,
            "incomplete_reason": trace.incomplete_reason,
            "missing": [
                {"event_id": p.event_id, "message": p.message, "replay": _consequence(trace, p)}
                for p in self.missing
            ],
        }

    @property
    def needs_a_look(self) -> bool:
        return self.error is not None or not self.trace.complete or bool(self.missing)


def _write(trace: Trace, path: Path, force: bool) -> Imported:
    if path.exists() and not force:
        return Imported(path, trace, EXISTS)
    try:
        trace.save(path)
    except ValueError as exc:  # a run that cannot be written is named; the rest go on
        return Imported(path, trace, str(exc))
    return Imported(path, trace, missing=missing_payloads(trace))


def run(args: argparse.Namespace) -> int:
    style = Style(sys.stdout)
    directory = Path(args.output)
    report = ImportReport()
    written: dict[str, list[bool]] = {}
    imported: list[dict[str, Any]] = []  # (--json) what each run came to, not its trace
    attention = False
    existing = 0
    redactor = DEFAULT_REDACTOR
    if args.redaction_rules is not None:
        try:
            redactor = load_redaction_rules(args.redaction_rules)
        except RedactionRulesError as exc:
            print_error(str(exc))
            return EXIT_BAD_INPUT
    try:
        traces = iter_traces_from_otlp_json(
            args.files, trace_id=args.trace_id, report=report, redactor=redactor
        )
        for trace in traces:
            result = _write(trace, _bundle_path(directory, trace, written), args.force)
            attention = attention or result.needs_a_look
            existing += result.error == EXISTS
            if args.json:
                imported.append(result.to_dict())
            else:
                for line in result.lines(style):
                    print(style.line(line))
    except OtlpImportError as exc:
        print_error(str(exc))
        return EXIT_BAD_INPUT
    except OSError as exc:  # the output directory cannot be written
        print_error(f"cannot write bundles to {directory}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    if report.problems or report.traces == 0:
        attention = True
    code = EXIT_BAD_INPUT if existing else EXIT_DIFFERENT if attention else EXIT_OK
    if args.json:
        print(json_text(_import_data(report, args.files, imported, code)))
    else:
        _print_summary(report, args.files, style)
    if existing:
        print_error(
            f"{existing} bundle{'s' if existing != 1 else ''} not written: "
            f"{'they exist' if existing != 1 else 'it exists'} in {directory} (use --force to "
            "overwrite)"
        )
    return code


def _import_data(
    report: ImportReport, files: list[str], imported: list[dict[str, Any]], code: int
) -> dict[str, Any]:
    return {
        "bundles": imported,
        "summary": {
            "runs": report.traces,
            "files": len(files),
            "lines": report.lines,
            "spans": report.spans,
            "ignored_traces": report.ignored_traces,
            "ignored_spans": report.ignored_spans,
            "other_signals": report.other_signals,
            "genai_log_records": report.genai_log_records,
            "skipped_spans": report.skipped_spans,
            "base64_ids": report.base64_ids,
        },
        "problems": [{"where": p.where, "message": p.message} for p in report.problems],
        "exit_code": code,
    }


def _print_summary(report: ImportReport, files: list[str], style: Style) -> None:
    parts = [
        f"{report.traces} run{'s' if report.traces != 1 else ''} imported from "
        f"{len(files)} file{'s' if len(files) != 1 else ''} "
        f"({report.lines} lines, {report.spans} spans)"
    ]
    if report.ignored_traces:
        parts.append(
            f"{report.ignored_traces} trace{'s' if report.ignored_traces != 1 else ''} without "
            f"stepfork spans or calls of a known instrumentation ignored "
            f"({report.ignored_spans} spans)"
        )
    parts += _log_records_part(report)
    if report.other_signals:
        parts.append(f"{report.other_signals} lines of logs/metrics skipped")
    if report.skipped_spans:
        parts.append(
            f"{report.skipped_spans} unreadable span{'s' if report.skipped_spans != 1 else ''} "
            "skipped"
        )
    if report.base64_ids:
        parts.append("ids were base64 (protobuf JSON) and were decoded")
    print(style.line("; ".join(parts)))
    if report.traces == 0:
        print(
            style.line(
                style.yellow(
                    "no recorded run found (no stepfork spans, nor calls of an instrumentation "
                    "the importer reads)"
                )
            )
        )
    if report.problems:
        print(style.line(style.red(f"{len(report.problems)} problems in the input:")))
        for problem in report.problems[:_MAX_PROBLEMS_SHOWN]:
            print(style.line(f"  {problem}"))
        if len(report.problems) > _MAX_PROBLEMS_SHOWN:
            print(f"  … and {len(report.problems) - _MAX_PROBLEMS_SHOWN} more")


def _log_records_part(report: ImportReport) -> list[str]:
    """The GenAI log records whose content was joined to their spans (none: nothing said)."""
    count = report.genai_log_records
    if not count:
        return []
    return [f"{count} GenAI log record{'s' if count != 1 else ''} joined to their spans"]
