"""``stepfork import FILE... [--trace-id ID] [-o DIR] [--redaction-rules RULES]``: rebuild
bundles from spans a collector captured (OTLP JSON: the Collector's ``file`` exporter output, or
OTLP/HTTP JSON request bodies).

One bundle per recorded run, written atomically as ``DIR/<trace_id>.sftrace`` the moment the last
line holding spans of its trace has been read (the import streams; see
``stepfork_otel.trace.otlp``). A second run in the same trace gets ``<trace_id>-<span_id>``,
as the bundle processor names it.

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
not in the input).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepfork_otel.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_DIFFERENT,
    EXIT_OK,
    Style,
    add_common_arguments,
    print_error,
)
from stepfork_otel.trace.bundle import bundle_file_name
from stepfork_otel.trace.checks import missing_payloads
from stepfork_otel.trace.errors import Problem
from stepfork_otel.trace.models import LlmRequest, ToolCall, Trace
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
    add_common_arguments(parser)


def _bundle_path(directory: Path, trace: Trace, written: set[str]) -> Path:
    """Named as the bundle processor names it (``bundle_file_name``)."""
    again = trace.trace_id in written and trace.run.span_id
    name = bundle_file_name(trace.trace_id, trace.run.span_id if again else None)
    written.add(trace.trace_id)
    return directory / name


def _describe(trace: Trace) -> str:
    run = trace.run
    outcome: str = run.status
    if run.status == "error" and run.error_type:
        outcome = f"error ({run.error_type.rsplit('.', 1)[-1]})"
    calls = len(trace.calls)
    return f"{run.name or 'run'}, {calls} call{'s' if calls != 1 else ''}, {outcome}"


def _consequence(trace: Trace, problem: Problem) -> str:
    """What replay will do at a call whose payload is missing."""
    event = next((e for e in trace.events if e.id == problem.event_id), None)
    if (
        isinstance(event, (ToolCall, LlmRequest))
        and event.input is None
        and event.input_sha256
        and problem.message.startswith("input")
    ):
        return "replay matches this call by its input fingerprint"
    return "replay stops at this call"


def run(args: argparse.Namespace) -> int:
    style = Style(sys.stdout)
    directory = Path(args.output)
    report = ImportReport()
    written: set[str] = set()
    attention = False
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
            path = _bundle_path(directory, trace, written)
            try:
                trace.save(path)
            except ValueError as exc:  # a run that cannot be written is named; the rest go on
                attention = True
                print(style.line(f"{path}: {style.red('NOT WRITTEN')} -- {exc}"))
                continue
            state = style.green("complete") if trace.complete else style.red("INCOMPLETE")
            print(style.line(f"{path}: {state} -- {_describe(trace)}"))
            if not trace.complete:
                attention = True
                print(
                    style.line(
                        f"  incomplete: {trace.incomplete_reason or 'the run was cut short'}"
                    )
                )
            for problem in missing_payloads(trace):
                attention = True
                print(
                    style.line(
                        f"  {style.yellow('missing')} {problem} -- {_consequence(trace, problem)}"
                    )
                )
    except OtlpImportError as exc:
        print_error(str(exc))
        return EXIT_BAD_INPUT
    except OSError as exc:  # the output directory cannot be written
        print_error(f"cannot write bundles to {directory}: {exc.strerror or exc}")
        return EXIT_BAD_INPUT
    _print_summary(report, args.files, style)
    if report.problems or report.traces == 0:
        attention = True
    return EXIT_DIFFERENT if attention else EXIT_OK


def _print_summary(report: ImportReport, files: list[str], style: Style) -> None:
    parts = [
        f"{report.traces} run{'s' if report.traces != 1 else ''} imported from "
        f"{len(files)} file{'s' if len(files) != 1 else ''} "
        f"({report.lines} lines, {report.spans} spans)"
    ]
    if report.ignored_traces:
        parts.append(
            f"{report.ignored_traces} trace{'s' if report.ignored_traces != 1 else ''} without "
            f"stepfork spans ignored ({report.ignored_spans} spans)"
        )
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
        print(style.line(style.yellow("no recorded run found (no spans with stepfork attributes)")))
    if report.problems:
        print(style.line(style.red(f"{len(report.problems)} problems in the input:")))
        for problem in report.problems[:_MAX_PROBLEMS_SHOWN]:
            print(style.line(f"  {problem}"))
        if len(report.problems) > _MAX_PROBLEMS_SHOWN:
            print(f"  … and {len(report.problems) - _MAX_PROBLEMS_SHOWN} more")
