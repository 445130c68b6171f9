"""``stepfork export pytest TRACE --entrypoint MODULE:FUNCTION [-o FILE]``: turn a recorded run
into a readable regression test.

The test replays the bundle with the pytest plugin's ``stepfork_replay`` marker (frozen, unless
live tools are named: then ``live`` with the allowlist written into the test), calls the
entrypoint with the recorded input, calls ``verify_complete()`` and asserts the recorded outcome:
the same output fingerprint (redacted canonical JSON), or the recorded failure type. It passes on
the code that produced the bundle and fails, with the same divergence report as ``stepfork
replay``, when the agent's behaviour changes.

Why the plugin and not a bare ``ReplaySession`` in the generated file: a hand-written replay test
and an exported one then fail with one report, written by one piece of code, and the generated
body shows only what a reader needs -- the agent call and the expected outcome.

Calls recorded with replay policy ``forbidden`` or ``manual`` (a payment, say) are never replayed
automatically: the generated test fails at them unless the user approves each by id
(``--approve call-6``), which writes a visible approval list into the test (manual mode; the
approved calls are substituted, their bodies never run).

A test that could not pass on the code that recorded it is not written (exit 2,
:func:`check_test_can_pass`): from a bundle whose fingerprints do not match its payloads (replay
rejects it), one whose run did not end (replay stops after its last recorded call, where the agent
goes on), or one holding a call replay stops at (no recorded result, a result left off the span,
a payload recorded as unserialisable or that is not JSON); nor a live-mode test
(``--allow-live-tool``) that does not allow-list every recorded tool live mode would run -- it
refuses the others, it does not substitute them -- or that meets a call recorded as ``forbidden``
or ``manual``, which live mode can never approve.

The generated file is valid Python whatever the bundle holds: bundle text appears only in string
literals (control and bidi characters escaped) and in the escaped docstring, and the test's module
and function names are ASCII identifiers derived from the bundle name (:func:`module_identifier`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys
import textwrap
import unicodedata
from pathlib import Path
from typing import Any

from stepfork_otel.cli._common import (
    CliError,
    abbreviate,
    add_common_arguments,
    check_arguments,
    inert_json,
    load_bundle,
    print_note,
    recorded_arguments,
    replay_stops_at,
    resolve_entrypoint,
    terminal_safe,
)
from stepfork_otel.replay.outcome import recorded_output_sha256
from stepfork_otel.trace.bundle import bundle_stem
from stepfork_otel.trace.models import CallEvent, ToolCall, Trace, call_label
from stepfork_otel.trace.policy import ReplayPolicy
from stepfork_otel.trace.redaction import holds_marker

#: Recorded outputs longer than this are not written into the test (the fingerprint is).
MAX_INLINE_OUTPUT = 2000
#: Longest name derived from a bundle name (file names stay far below the usual 255-byte limit).
MAX_IDENTIFIER_CHARS = 64
_TEMPLATE_NAMES = {
    "BUNDLE",
    "RECORDED_INPUT",
    "RECORDED_FAILURE",
    "RECORDED_OUTPUT",
    "RECORDED_OUTPUT_SHA256",
    "APPROVED_CALLS",
    "ALLOW_LIVE_TOOLS",
    "approve",
    "asyncio",
    "pytest",
    "Path",
    "ReplayPolicy",
    "ReplaySession",
    "RecordedCall",
    "assert_recorded_output",
    "expect_recorded_failure",
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    export = subparsers.add_parser(
        "export",
        help="turn a recorded run into a regression test",
        description="Turn a recorded run into a test. Kinds: pytest.",
    )
    kinds = export.add_subparsers(dest="export_kind", metavar="KIND", required=True)
    parser = kinds.add_parser(
        "pytest",
        help="write a pytest file that replays the bundle and asserts the recorded outcome",
        description=(
            "Write a pytest file that replays TRACE (frozen unless --allow-live-tool is given), "
            "calls verify_complete() and asserts the recorded outcome."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="the .sftrace bundle")
    parser.add_argument(
        "--entrypoint",
        required=True,
        metavar="MODULE:FUNCTION",
        help="trusted callable the test runs, resolved against the current directory",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write the test (default: test_replay_<bundle name>.py; '-' for stdout)",
    )
    parser.add_argument(
        "--allow-live-tool",
        action="append",
        default=[],
        dest="allow_live_tools",
        metavar="NAME",
        help="replay in live mode and let this tool run for real (repeat for more); LLM calls "
        "then run live too",
    )
    parser.add_argument(
        "--approve",
        action="append",
        default=[],
        metavar="CALL_ID",
        help="approve a recorded call with replay policy forbidden/manual (e.g. call-6): its "
        "recorded result is substituted (repeat for more)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    add_common_arguments(parser)


def _doc_safe(text: str) -> str:
    """``text`` made inert inside a triple-quoted docstring: backslashes, quotes, control and
    non-ASCII characters escaped (display only)."""
    return text.encode("unicode_escape").decode("ascii").replace('"', '\\"')


def module_identifier(text: str) -> str:
    """A bundle name as the ASCII identifier part of the default file ``test_replay_<it>.py`` and
    the test ``test_<it>_replays``: letters Unicode decomposes kept as their ASCII base (``ü`` ->
    ``u``, ``²`` -> ``2``, ``ﬁ`` -> ``fi``), lower case, every other run of characters one
    underscore, at most :data:`MAX_IDENTIFIER_CHARS`; ``run`` when nothing is left. ASCII, so the
    module imports under any file system's normalisation of its name."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    name = re.sub(r"[^a-z0-9_]+", "_", ascii_text.lower()).strip("_")
    return name[:MAX_IDENTIFIER_CHARS].rstrip("_") or "run"


def _literal(value: Any, indent: int = 0) -> str:
    """A JSON value as Python source, double-quoted like ruff/black would write it; an object or
    array that does not fit on one line gets one item per line."""
    flat = _flat(value)
    if len(flat) + indent <= 72 or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{_flat(k)}: {_literal(v, indent + 4)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_literal(v, indent + 4)}," for v in value]
    return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: a file name byte that is not UTF-8
        return False
    return True


def _flat(value: Any) -> str:
    if isinstance(value, str):
        # a valid Python literal too; control and bidi characters escaped (inert_json), and all of
        # it when the text cannot be written as UTF-8
        text = inert_json(json.dumps(value, ensure_ascii=not _utf8(value)))
        if '"' in value and "'" not in value:  # as ruff/black quote it: fewer escapes
            return "'" + text[1:-1].replace('\\"', '"') + "'"
        return text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flat(k)}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    return repr(value)  # None, bool, int, float: the Python spelling


def _bundle_expression(bundle: Path, output: Path | None) -> str:
    if output is None:
        return f"Path({_flat(str(bundle.resolve()))})"
    try:
        rel = os.path.relpath(bundle.resolve(), output.resolve().parent)
    except ValueError:  # another drive
        return f"Path({_flat(str(bundle.resolve()))})"
    return f"Path(__file__).parent / {_flat(Path(rel).as_posix())}"


def _needs_approval(trace: Trace) -> list[CallEvent]:
    return [
        c for c in trace.calls if c.replay_policy in (ReplayPolicy.FORBIDDEN, ReplayPolicy.MANUAL)
    ]


def _bare_name(call: CallEvent) -> str:
    return call_label(call).removeprefix("tool ")  # a tool by its bare name


def check_test_can_pass(path: str, trace: Trace, live: bool) -> None:
    """A test replaying ``trace`` fails on the very code that recorded it when replay rejects the
    bundle or stops in it: :class:`CliError` naming why (the first reason; ``stepfork validate``
    lists them all). ``live``: a live-mode test, which runs the LLM calls and allow-listed tools
    rather than substituting their recorded results."""
    from stepfork_otel.trace import checks

    why: str | None = None
    integrity = checks.verify_integrity(trace)
    problems = checks.unreadable_payloads(trace) + checks.unreplayable_calls(trace)
    if integrity:
        more = f" (and {len(integrity) - 1} more)" if len(integrity) > 1 else ""
        why = (
            f"replay rejects this bundle: integrity check failed: {integrity[0]}{more}; it was "
            "edited or corrupted after it was written"
        )
    elif not trace.complete:
        why = (
            f"the recorded run is incomplete: {trace.incomplete_reason or 'cut short'}; replay "
            "stops after its last recorded call, where the agent goes on -- record the run again"
        )
    elif problems:
        why = f"{problems[0]}"
    elif not live:
        stops = [p for p in checks.missing_payloads(trace) if replay_stops_at(trace, p)]
        if stops:
            why = f"replay stops at {stops[0]}"
    if why is not None:
        raise CliError(
            f"{path}: no test written, it could never pass: {why}; `stepfork validate {path}` "
            "lists every problem"
        )


def check_live_test_can_pass(trace: Trace, allow_live_tools: list[str]) -> None:
    """A live-mode test fails on the very code that recorded it when live mode refuses one of its
    calls: a call recorded with policy ``forbidden`` or ``manual`` (nothing approves it in live
    mode), or a tool that is not allow-listed (live mode refuses it; it substitutes only tools
    recorded with policy ``frozen``). :class:`CliError` naming them and the flags that help."""
    gated = _needs_approval(trace)
    if gated:
        named = ", ".join(
            f"{c.id} ({_bare_name(c)}, replay policy '{c.replay_policy.value}')" for c in gated
        )
        approvals = " ".join(f"--approve {c.id}" for c in gated)
        raise CliError(
            f"live mode refuses {named} even when allow-listed, so this test could never pass; "
            "export a test that approves it instead (its recorded result substituted): leave out "
            f"--allow-live-tool and add {approvals}"
        )
    allowed = set(allow_live_tools)
    refused = [
        name
        for name in dict.fromkeys(
            c.name
            for c in trace.calls
            if isinstance(c, ToolCall) and c.replay_policy is ReplayPolicy.REPLAYABLE
        )
        if name not in allowed
    ]
    if refused:
        flags = " ".join(f"--allow-live-tool {name}" for name in refused)
        raise CliError(
            "live mode refuses every recorded tool that is not allow-listed, so this test could "
            f"never pass: {', '.join(refused)} would be refused (add {flags}, or leave out "
            "--allow-live-tool for a frozen test)"
        )


def render_test(
    trace: Trace,
    *,
    trace_arg: str,
    bundle: Path,
    output: Path | None,
    entrypoint: str,
    is_async: bool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    allow_live_tools: list[str],
    approved: list[str],
) -> str:
    """The text of the test module."""
    run = trace.run
    module, _, attr_path = entrypoint.partition(":")
    first, _, rest = attr_path.partition(".")
    imported = first if first not in _TEMPLATE_NAMES else "agent_entrypoint"
    import_line = (
        f"from {module} import {first}"
        if imported == first
        else f"from {module} import {first} as {imported}"
    )
    target = imported + (f".{rest}" if rest else "")
    call_args = "**RECORDED_INPUT" if kwargs else ("RECORDED_INPUT" if args else "")
    call = f"{target}({call_args})"
    if is_async:
        call = f"asyncio.run({call})"
    mode = "manual" if approved else "live" if allow_live_tools else "frozen"
    stem = module_identifier(bundle_stem(bundle.name))
    failed = run.status == "error"
    output_sha = recorded_output_sha256(run)

    if failed:
        expectation = (
            f"no longer fails with {run.error_type} (only the exception type is compared, not "
            "its message or side effects)"
        )
    elif output_sha is not None:
        expectation = "returns a different output (compared by fingerprint, after redaction)"
    else:
        expectation = "(the recorded run has no final output, so the return value is not checked)"
    mode_text = {
        "frozen": 'mode "frozen": no model, no side effects',
        "live": 'mode "live": LLM calls and the tools in ALLOW_LIVE_TOOLS RUN FOR REAL',
        "manual": 'mode "manual": the calls in APPROVED_CALLS are approved explicitly below',
    }[mode]
    status = f"failed with {run.error_type}" if failed else "completed"
    rerun = f"stepfork export pytest {trace_arg} --entrypoint {entrypoint}"
    rerun += "".join(f" --allow-live-tool {t}" for t in allow_live_tools)
    rerun += "".join(f" --approve {a}" for a in approved)
    paragraph = (
        "The test runs the agent's own code again with every recorded tool and LLM call served "
        f"from the bundle ({mode_text}) and fails, with the divergence report, when the agent "
        f"makes a different call, skips a recorded one, or {expectation}."
    )
    doc_lines = [
        f"Replay regression test, exported by `stepfork export pytest` from {bundle.name}.",
        "",
        f"Recorded run: {run.name or 'run'}, {status}, {len(trace.calls)} calls "
        f"(trace {abbreviate(trace.trace_id)}).",
        *textwrap.wrap(paragraph, 92),
        "",
        "Needs the stepfork pytest plugin (installed with stepfork-otel). Run it from the",
        f"directory `{module}` is imported from:  python -m pytest <this file>",
        "Exported with:",
        f"    {rerun}",
    ]
    # Names and types come from the bundle, which is data: they must never close the docstring
    # or reach the generated code as anything but text.
    doc = ['"""' + _doc_safe(doc_lines[0]), *(_doc_safe(line) for line in doc_lines[1:]), '"""']
    imports = ["from __future__ import annotations", ""]
    if is_async:
        imports.append("import asyncio")
    imports += ["from pathlib import Path", "", "import pytest", "", import_line]
    stepfork_names = ["ReplaySession"] + (["ReplayPolicy"] if approved else [])
    imports.append(f"from stepfork_otel import {', '.join(sorted(stepfork_names))}")
    helper = "expect_recorded_failure" if failed else "assert_recorded_output"
    if failed or output_sha is not None:
        imports.append(f"from stepfork_otel.pytest_plugin import {helper}")
    if approved:
        imports.append("from stepfork_otel.replay.plan import RecordedCall")

    constants = [f"BUNDLE = {_bundle_expression(bundle, output)}"]
    if args or kwargs:
        if run.input is not None and holds_marker(run.input):
            constants.append(
                "# The recorded input had secrets; they were redacted, and the agent gets the markers."
            )
        value = kwargs if kwargs else args[0]
        constants.append(f"RECORDED_INPUT = {_literal(value)}")
    if failed:
        constants.append(f"RECORDED_FAILURE = {_flat(run.error_type)}")
    elif output_sha is not None:
        shown = (
            run.output if run.output is not None and len(run.output) <= MAX_INLINE_OUTPUT else None
        )
        constants.append(
            "#: The recorded run output (redacted canonical JSON) and its fingerprint."
        )
        constants.append(f"RECORDED_OUTPUT = {_flat(shown)}")
        constants.append(f"RECORDED_OUTPUT_SHA256 = {_flat(output_sha)}")
    if allow_live_tools:
        constants.append("#: Tools that run for real in this test (their side effects happen).")
        constants.append(f"ALLOW_LIVE_TOOLS = {_flat(sorted(set(allow_live_tools)))}")

    approval: list[str] = []
    if approved:
        approval = [
            "",
            "#: Recorded calls with replay policy forbidden/manual that this test approves: their",
            "#: recorded results are substituted, their bodies never run.",
            "APPROVED_CALLS = {" + ", ".join(_flat(a) for a in sorted(set(approved))) + "}",
            "",
            "",
            "def approve(call: RecordedCall) -> bool:",
            '    """Manual mode asks for every call: approve the ordinary ones and those listed."""',
            "    if call.policy in (ReplayPolicy.FORBIDDEN, ReplayPolicy.MANUAL):",
            "        return call.event.id in APPROVED_CALLS",
            "    return True",
        ]

    marker_args = [f'BUNDLE, mode="{mode}"']
    if allow_live_tools:
        marker_args.append("allow_live_tools=ALLOW_LIVE_TOOLS")
    if approved:
        marker_args.append("approve=approve")
    body: list[str]
    if failed:
        body = [
            "    with expect_recorded_failure(RECORDED_FAILURE):",
            f"        {call}",
            "    stepfork_replay.verify_complete()",
        ]
    elif output_sha is not None:
        body = [
            f"    output = {call}",
            "    stepfork_replay.verify_complete()",
            "    assert_recorded_output(output, RECORDED_OUTPUT_SHA256, RECORDED_OUTPUT)",
        ]
    else:
        body = [
            "    # the recorded run has no final output (run.set_output(...) was not called):",
            "    # only the dependency calls are checked",
            f"    {call}",
            "    stepfork_replay.verify_complete()",
        ]
    test = [
        "",
        "",
        f"@pytest.mark.stepfork_replay({', '.join(marker_args)})",
        f"def test_{stem}_replays(stepfork_replay: ReplaySession) -> None:",
        *body,
    ]
    return "\n".join([*doc, "", *imports, "", *constants, *approval, *test]) + "\n"


def run(args: argparse.Namespace) -> int:
    bundle = Path(args.trace)
    trace = load_bundle(bundle)
    check_test_can_pass(args.trace, trace, live=bool(args.allow_live_tools))
    fn = resolve_entrypoint(args.entrypoint)
    call_args, call_kwargs = recorded_arguments(trace)
    check_arguments(fn, args.entrypoint, call_args, call_kwargs)
    if args.approve and args.allow_live_tools:
        raise CliError(
            "--approve (manual mode: nothing runs) and --allow-live-tool (live mode) cannot be "
            "combined"
        )
    ids = {c.id: c for c in trace.calls}
    for call_id in args.approve:
        if call_id not in ids:
            raise CliError(f"--approve {call_id}: no such recorded call in {args.trace}")
    tools = {c.name for c in trace.calls if isinstance(c, ToolCall)}
    for name in args.allow_live_tools:
        if name not in tools:
            print_note(f"--allow-live-tool {name}: no recorded call of that tool")
    if args.allow_live_tools:
        check_live_test_can_pass(trace, args.allow_live_tools)
    for call in _needs_approval(trace):
        if call.id not in args.approve:
            print_note(
                f"{call.id} ({_bare_name(call)}) has replay policy "
                f"'{call.replay_policy.value}': the exported test fails at it unless approved "
                f"with --approve {call.id}"
            )
    output = (
        None
        if args.output == "-"
        else Path(args.output or f"test_replay_{module_identifier(bundle_stem(bundle.name))}.py")
    )
    text = render_test(
        trace,
        trace_arg=args.trace,
        bundle=bundle,
        output=output,
        entrypoint=args.entrypoint,
        is_async=inspect.iscoroutinefunction(fn),
        args=call_args,
        kwargs=call_kwargs,
        allow_live_tools=args.allow_live_tools,
        approved=args.approve,
    )
    if output is None:
        sys.stdout.write(text)
        return 0
    if output.exists() and not args.force:
        raise CliError(f"{output} already exists (use --force to overwrite)")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
    mode = "manual" if args.approve else "live" if args.allow_live_tools else "frozen"
    expects = (
        f"expects {trace.run.error_type}"
        if trace.run.status == "error"
        else "expects the recorded output"
        if recorded_output_sha256(trace.run)
        else "checks the calls (no recorded output)"
    )
    print(terminal_safe(f"wrote {output} ({mode} replay of {args.trace}; {expects})"))
    print(terminal_safe(f"run it: python -m pytest {output}"))
    return 0
