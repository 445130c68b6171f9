"""``stepfork replay TRACE --entrypoint MODULE:FUNCTION``: re-run the agent's own code with every
recorded dependency call served from the bundle, and say whether it still does what it did.

The report has three separate parts, because they answer different questions and fail for
different reasons: (1) what the entrypoint did (returned / raised what), (2) whether every
dependency call matched the recording (per call: substituted / executed / rejected, and the first
divergence in full), (3) whether the outcome matches the recorded one (MATCHED / DIVERGED / NOT
RECORDED / REPRODUCED FAILURE; see :mod:`stepfork_otel.replay.outcome`). Part 2 is
:func:`stepfork_otel.replay.report.format_report`, the text a failing replay test shows too.

Exit codes: 0 matched (or reproduced the recorded failure), 1 diverged, 2 bad input.

Manual mode needs an approval for every call. On a terminal the command asks for each one; in CI
``--approve CALL_ID`` (repeatable) gives them up front -- the calls recorded with policy
``replayable`` and each call named (one recorded ``forbidden`` or ``manual``) -- the same rule
``stepfork export pytest --approve`` writes into a test, so a replay and the exported test agree;
``--approve-all`` approves every call. Either one means ``--mode manual``. An approved call's
recorded result is substituted: its body never runs.

The entrypoint is trusted code named by the user and resolved against the working directory;
nothing named in the bundle is imported (its recorded entrypoint is shown as a hint only). With
``--json`` the entrypoint's own prints go to stderr so stdout stays one JSON object.

Replay errors are worded for the Python API (``allow_live_tools``, ``ReplaySession(...,
approve=...)``); printed here they name this command's flags instead (:data:`CLI_WORDING`, applied
to the reason of each error the command shows, never to payload text).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stepfork_otel.cli._common import (
    EXIT_DIFFERENT,
    EXIT_OK,
    CliError,
    Progress,
    Style,
    abbreviate,
    abbreviate_in_data,
    add_common_arguments,
    call_input_text,
    call_text,
    check_arguments,
    has_run_span,
    is_terminal,
    json_text,
    load_bundle,
    recorded_arguments,
    resolve_entrypoint,
    run_heading,
    terminal_safe,
)
from stepfork_otel.replay import fork
from stepfork_otel.replay.errors import (
    RecordedDependencyError,
    ReplayError,
    ReplayModeError,
    ReplayPolicyError,
)
from stepfork_otel.replay.network import NetworkGuard
from stepfork_otel.replay.outcome import OutcomeComparison, compare_outcome, describe_exception
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.replay.report import (
    abbreviate_in_text,
    format_report,
    report_data,
    report_preview,
)
from stepfork_otel.replay.session import ReplayResult, ReplaySession, parse_mode
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.models import Trace, call_label
from stepfork_otel.trace.policy import ReplayMode, ReplayPolicy
from stepfork_otel.trace.redaction import holds_marker


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="re-run an entrypoint against a recorded bundle and compare",
        description=(
            "Re-run a trusted entrypoint with every recorded tool and LLM call served from the "
            "bundle. Exit 0: matched or reproduced the recorded failure; 1: diverged; "
            "2: bad mode, unreadable bundle or unresolvable entrypoint."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="the .sftrace bundle")
    parser.add_argument(
        "--entrypoint",
        required=True,
        metavar="MODULE:FUNCTION",
        help="trusted callable to run, resolved against the current directory",
    )
    parser.add_argument(
        "--mode",
        default=None,
        metavar="MODE",
        help="replay mode: frozen, live, hybrid, forbidden, manual (default: frozen; live with "
        "--fork-at; manual with --approve or --approve-all)",
    )
    parser.add_argument(
        "--approve",
        action="append",
        default=[],
        metavar="CALL_ID",
        help="manual mode without asking: approve the calls recorded with policy replayable and "
        "this one (a call recorded forbidden/manual, e.g. call-6); repeat for more",
    )
    parser.add_argument(
        "--approve-all",
        action="store_true",
        help="manual mode without asking: approve every recorded call",
    )
    parser.add_argument(
        "--allow-live-tool",
        action="append",
        default=[],
        dest="allow_live_tools",
        metavar="NAME",
        help="with --mode live: a tool that may run for real (repeat for more)",
    )
    parser.add_argument(
        "--allow-network",
        action="append",
        default=[],
        dest="allow_network",
        metavar="HOST[:PORT]",
        help="a host the entrypoint may still connect to outside the boundaries (everything "
        "else is refused during the replay; repeat for more)",
    )
    parser.add_argument(
        "--live-llm",
        action="append",
        default=[],
        dest="live_llms",
        metavar="PROVIDER/MODEL",
        help="with --mode hybrid: an LLM that runs again ('provider/model', 'provider/*' or "
        "'model'; repeat for more)",
    )
    parser.add_argument(
        "--captured",
        choices=("strict", "lenient"),
        default="strict",
        help="a clock/random/uuid read that departs from the recording: strict (default) "
        "fails at the read, lenient reads live and notes it",
    )
    parser.add_argument(
        "--fork-at",
        type=int,
        default=None,
        metavar="N",
        help="fork the run at call N (as stepfork show numbers it): the calls before it replayed "
        "frozen and matched, the run live from it (LLMs run; tools as --allow-live-tool and "
        "their policies say)",
    )
    parser.add_argument(
        "--record",
        default=None,
        metavar="PATH",
        help="with --fork-at: keep the fork as a bundle of its own at PATH",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_common_arguments(parser)


# --- the command's wording of replay errors -------------------------------------------------------

#: How a replay error written for the Python API reads when this command prints it: the API's
#: parameters become the flags that set them. Applied in order to an error's reason.
CLI_WORDING: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"named in allow_live_tools \(--allow-live-tool ([^)]*)\)"),
        r"named with --allow-live-tool \1",
    ),
    (  # manual mode with nothing to ask: stdin or stderr is not a terminal
        re.compile(
            r"for every call and no approval callback was given "
            r"\(ReplaySession\(\.\.\., approve=\.\.\.\)\)"
        ),
        "for every call: give them with --approve CALL_ID or --approve-all, or run on a "
        "terminal to be asked",
    ),
    (  # a call recorded with policy manual/forbidden, in a mode that asks nothing
        re.compile(
            r" and no approval callback was given \(ReplaySession\(\.\.\., approve=\.\.\.\)\)"
        ),
        ", and stepfork replay approves calls only in manual mode (--approve CALL_ID)",
    ),
    (re.compile(r"\(this session is '(\w+)'\)"), r"(this replay is --mode \1)"),
    (re.compile(r"leave the mode out, or say 'live'"), "leave --mode out, or say --mode live"),
    (re.compile(r"\bfork_at=(\d+)"), r"--fork-at \1"),
    (
        re.compile(r"record_to records a fork \(fork_at=N\)"),
        "--record records a fork (--fork-at N)",
    ),
    (re.compile(r"^mode '(\w+)' needs live_llms\b"), r"--mode \1 needs --live-llm"),
    (re.compile(r"\bonly applies to mode '(\w+)'"), r"only applies to --mode \1"),
    # whatever else names them
    (re.compile(r"\ballow_live_tools\b"), "--allow-live-tool"),
    (re.compile(r"\blive_llms\b"), "--live-llm"),
    (re.compile(r"\bfork_at\b"), "--fork-at"),
    (re.compile(r"ReplaySession\(\.\.\., approve=\.\.\.\)"), "--approve CALL_ID"),
)


def cli_wording(reason: str) -> str:
    """A replay error's reason in this command's terms (:data:`CLI_WORDING`)."""
    for pattern, replacement in CLI_WORDING:
        reason = pattern.sub(replacement, reason)
    return reason


class _Reworder:
    """Rewrites, in the text the command prints, the reason of each given error in its CLI wording
    (the reason's exact text is replaced: a payload that merely contains a parameter's name is
    shown as it is)."""

    def __init__(self, errors: list[BaseException | None]) -> None:
        reasons = {e.reason for e in errors if isinstance(e, ReplayError)}
        self._changes = [(r, cli_wording(r)) for r in sorted(reasons, key=len, reverse=True)]
        self._changes = [(old, new) for old, new in self._changes if old != new]

    def __call__(self, text: str) -> str:
        for old, new in self._changes:
            text = text.replace(old, new)
        return text

    def data(self, value: Any) -> Any:
        """Every string of a JSON-ready structure reworded."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.data(v) for v in value]
        return value


# --- manual approval -------------------------------------------------------------------------------


def listed_approver(approved: list[str], every: bool) -> Callable[[RecordedCall], bool]:
    """``--approve``/``--approve-all``: the calls recorded ``replayable`` and those named (every
    call with ``every``) -- the rule ``stepfork export pytest --approve`` writes into a test."""
    named = set(approved)

    def approve(rc: RecordedCall) -> bool:
        gated = rc.policy in (ReplayPolicy.FORBIDDEN, ReplayPolicy.MANUAL)
        return every or not gated or rc.event.id in named

    return approve


def _approvals_note(args: argparse.Namespace) -> str:
    if args.approve_all:
        return "every call approved (--approve-all): recorded results substituted"
    return (
        f"approved: {', '.join(dict.fromkeys(args.approve))} (--approve) and every call recorded "
        "with policy replayable: recorded results substituted"
    )


def prompt_approver(verbose: bool) -> Callable[[RecordedCall], bool]:
    """Ask on the terminal (stderr + stdin) before each recorded call is substituted."""

    def approve(rc: RecordedCall) -> bool:
        event = rc.event
        label = call_label(event)
        outcome = rc.outcome
        out = sys.stderr
        lines = [
            f"recorded call {event.id}: {label} (replay policy {event.replay_policy.value})",
            f"  input:  {report_preview(call_input_text(event), verbose)}",
        ]
        if outcome is not None:
            lines.append(f"  result: {report_preview(outcome.output, verbose)}")
        print("", *(terminal_safe(line) for line in lines), sep="\n", file=out)
        out.write("substitute the recorded result (the call's body does not run)? [y/N] ")
        out.flush()
        answer = sys.stdin.readline()
        return answer.strip().lower() in ("y", "yes")

    return approve


# --- running the entrypoint ------------------------------------------------------------------------


@dataclass
class Execution:
    """What the entrypoint did."""

    called: str
    returned: Any = None
    raised: BaseException | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "called": self.called,
            "outcome": "raised" if self.raised is not None else "returned",
        }
        if self.raised is not None:
            data["exception"] = describe_exception(self.raised)
            data["exception_type"] = type(self.raised).__name__
            if isinstance(self.raised, RecordedDependencyError):
                data["recorded_error_type"] = self.raised.error_type
        return data


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def execute(
    session: ReplaySession,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    execution: Execution,
    *,
    progress: bool,
    stdout_to_stderr: bool,
) -> None:
    """Run the entrypoint inside the session (``async def`` entrypoints on a fresh event loop,
    which sees the session through the copied context), then check for left-over calls."""

    def describe() -> str:
        calls = session.calls
        last = calls[-1] if calls else None
        now = f"call {last.position}: {last.action} {last.kind} {last.name}" if last else "starting"
        return f"replaying ({session.mode.value}) … {now}"

    redirect = (
        contextlib.redirect_stdout(sys.stderr) if stdout_to_stderr else contextlib.nullcontext()
    )
    ticker = Progress(describe) if progress else contextlib.nullcontext()
    try:  # (what the agent raised leaves the session: a fork's run records it as its failure)
        with session, redirect, ticker:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = asyncio.run(_await(value))
            execution.returned = value
            if session.record_to is not None:
                session.set_output(value)  # the fork's output, in its bundle
    except (Exception, SystemExit) as exc:  # what the agent raised is part of the report
        execution.raised = exc
    if not session.errors:
        with contextlib.suppress(ReplayError):
            session.verify_complete()


# --- the report ------------------------------------------------------------------------------------


@dataclass
class ReplayReport:
    trace_path: str
    entrypoint: str
    trace: Trace
    mode: ReplayMode
    execution: Execution
    result: ReplayResult
    outcome: OutcomeComparison
    notes: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        matched = self.result.ok
        if self.result.fork_at is not None:  # a fork's output is its own: compared, not judged
            return EXIT_OK if matched else EXIT_DIFFERENT
        return EXIT_OK if matched and self.outcome.ok else EXIT_DIFFERENT

    def recorded_summary(self) -> str:
        run = self.trace.run
        if not has_run_span(self.trace):
            name, ended, _ = run_heading(self.trace)
            return f"{name}, {ended}, {len(self.trace.calls)} calls"
        status = (
            f"failed with {run.error_type}"
            if run.status == "error"
            else "completed"
            if run.status == "ok"
            else "did not finish"
        )
        return f"{run.name or 'run'}, {status}, {len(self.trace.calls)} calls"

    def conclusion(self) -> str:
        fork_at = self.result.fork_at
        if fork_at is not None:
            if self.exit_code == EXIT_OK:
                return f"forked at call {fork_at}: the calls before it replayed, the rest ran live"
            if self.result.forked_after is None:
                return f"the fork point (call {fork_at}) was not reached"
            return f"forked at call {fork_at}, and the live run was refused a call"
        if self.exit_code == EXIT_OK:
            if self.outcome.verdict == "REPRODUCED FAILURE":
                return "reproduced the recorded failure"
            return "completed and matched the recording"
        if not self.result.ok:
            return "diverged from the recording (dependency calls)"
        return "diverged from the recording (outcome)"

    def reworder(self) -> _Reworder:
        """The CLI wording of the errors this report shows."""
        return _Reworder([*self.result.errors, self.execution.raised])

    def to_dict(self, verbose: bool) -> dict[str, Any]:
        run = self.trace.run
        data = {
            "trace": self.trace_path,
            "trace_id": self.trace.trace_id,
            "entrypoint": self.entrypoint,
            "mode": self.mode.value,
            "fork_at": self.result.fork_at,
            "recorded_run": {
                "name": run.name,
                "status": run.status,
                "error_type": run.error_type,
                "calls": len(self.trace.calls),
                "output_sha256": self.outcome.recorded_sha256,
                "entrypoint_hint": run.entrypoint,
            },
            "execution": self.execution.to_dict(),
            "matching": report_data(self.result, len(self.trace.calls)),
            "output": self.outcome.to_dict(),
            "notes": self.notes,
            "hints": self.hints,
            "result": self.conclusion(),
            "exit_code": self.exit_code,
        }
        return abbreviate_in_data(self.reworder().data(data), verbose)  # type: ignore[no-any-return]

    def render(self, style: Style, verbose: bool) -> str:
        """The report as printed: each line in the CLI wording and inert (``style.line``)."""
        reword = self.reworder()
        return "\n".join(style.line(reword(line)) for line in self._lines(style, verbose))

    def _lines(self, style: Style, verbose: bool) -> list[str]:
        i = "   "
        lines = [
            style.bold(f"stepfork replay {self.trace_path}"),
            f"{i}entrypoint {self.entrypoint} · mode {self.mode.value}"
            + ("" if self.result.fork_at is None else f" · forked at call {self.result.fork_at}"),
            f"{i}recorded run: {self.recorded_summary()} "
            f"(trace {abbreviate(self.trace.trace_id, verbose)})",
        ]
        lines.extend(f"{i}note: {note}" for note in self.notes)
        ex = self.execution
        lines += ["", style.bold("1. Entrypoint execution"), f"{i}called {ex.called}"]
        if ex.raised is None:
            lines.append(f"{i}returned {report_preview(self.outcome.replayed_preview, verbose)}")
        else:
            lines.append(f"{i}raised {abbreviate_in_text(describe_exception(ex.raised), verbose)}")
        matching = format_report(
            self.result,
            len(self.trace.calls),
            verbose=verbose,
            heading="2. Dependency-call matching: ",
            indent=i,
            style=style,
        )
        lines += [
            "",
            *matching.split("\n"),
            *(f"{i}hint: {hint}" for hint in self.hints),
            "",
            style.bold("3. Output comparison: ") + style.status(self.outcome.verdict),
            f"{i}{self.outcome.detail}",
        ]
        if self.result.fork_at is not None:
            lines.append(
                f"{i}(a fork's output is its own: compared with the original's, not judged)"
            )
        if self.outcome.recorded_sha256 or self.outcome.replayed_sha256:
            lines.append(
                f"{i}recorded output sha256 {abbreviate(self.outcome.recorded_sha256, verbose)}"
                f" · this run {abbreviate(self.outcome.replayed_sha256, verbose)}"
            )
        lines += ["", f"result: {self.conclusion()} (exit {self.exit_code})"]
        return lines


def _policy_hint(trace: Trace, result: ReplayResult, args: argparse.Namespace) -> list[str]:
    """How to get past a call that must be approved (a ``forbidden``/``manual`` policy)."""
    first = result.errors[0] if result.errors else None
    if not isinstance(first, ReplayPolicyError) or first.expected is None:
        return []
    event = next((c for c in trace.calls if c.id == first.expected.event_id), None)
    if event is None or event.replay_policy not in (ReplayPolicy.FORBIDDEN, ReplayPolicy.MANUAL):
        return []
    return [
        f"{event.id} was recorded with replay policy '{event.replay_policy.value}': approve it "
        f"with `stepfork replay {args.trace} --entrypoint {args.entrypoint} --approve "
        f"{event.id}` (its recorded result is substituted), or write the approval into a test "
        f"with `stepfork export pytest ... --approve {event.id}`"
    ]


def _notes(
    trace: Trace, spec: str, mode: ReplayMode, interactive: bool, args: argparse.Namespace
) -> list[str]:
    notes: list[str] = []
    run = trace.run
    if run.input is not None and holds_marker(run.input):
        notes.append(
            "the recorded input contains redacted values; the entrypoint receives the "
            "[REDACTED…] markers, not the original secrets"
        )
    if run.entrypoint and run.entrypoint != spec:
        notes.append(f"the bundle was recorded from {run.entrypoint} (a hint; not used)")
    if not trace.complete:
        notes.append(f"the bundle is incomplete ({trace.incomplete_reason or 'run cut short'})")
    if args.approve or args.approve_all:
        notes.append(_approvals_note(args))
    elif mode is ReplayMode.MANUAL and not interactive:
        notes.append(
            "manual mode: stdin is not a terminal, so no call could be approved (give the "
            "approvals with --approve CALL_ID or --approve-all)"
        )
    return notes


def _mode(args: argparse.Namespace) -> ReplayMode:
    """The replay mode: ``--mode``, else manual when approvals are given, live for a fork
    (``--fork-at``), else frozen; and the fork options checked against it."""
    approving = bool(args.approve) or args.approve_all
    default = "manual" if approving else "live" if args.fork_at is not None else "frozen"
    try:
        mode = parse_mode(args.mode or default)
    except ReplayModeError as exc:
        raise CliError(str(exc)) from None
    if approving and mode is not ReplayMode.MANUAL:
        flag = "--approve-all" if args.approve_all else "--approve"
        raise CliError(
            f"{flag} only applies to --mode manual (this replay is --mode {mode.value}); leave "
            f"out --mode: {flag} replays in manual mode"
        )
    try:
        fork.check_options(mode, args.fork_at, args.record)
    except ReplayModeError as exc:
        raise CliError(cli_wording(str(exc))) from None
    return mode


def run(args: argparse.Namespace) -> int:
    mode = _mode(args)  # before anything is read or imported
    try:
        allow_network = NetworkGuard(args.allow_network).allow
    except ValueError as exc:  # an entry that is not HOST[:PORT]
        raise CliError(f"--allow-network: {exc}") from None
    trace = load_bundle(args.trace)
    fn = resolve_entrypoint(args.entrypoint)
    call_args, call_kwargs = recorded_arguments(trace)
    check_arguments(fn, args.entrypoint, call_args, call_kwargs)
    for call_id in args.approve:
        if call_id not in {c.id for c in trace.calls}:
            raise CliError(f"--approve {call_id}: no such recorded call in {args.trace}")
    interactive = is_terminal(sys.stdin) and is_terminal(sys.stderr)
    listed = bool(args.approve) or args.approve_all
    asks = mode is ReplayMode.MANUAL and interactive and not listed
    approve: Callable[[RecordedCall], bool] | None = None
    if listed:
        approve = listed_approver(args.approve, args.approve_all)
    elif asks:
        approve = prompt_approver(args.verbose)
    try:
        session = ReplaySession(
            trace,
            mode,
            allow_live_tools=args.allow_live_tools,
            live_llms=args.live_llms,
            approve=approve,
            allow_network=allow_network,
            captured=args.captured,
            fork_at=args.fork_at,
            record_to=args.record,
            source=args.trace,
        )
    except BundleError as exc:  # tampered bundle
        raise CliError(str(exc)) from None
    except ReplayModeError as exc:  # options that do not fit the mode
        raise CliError(cli_wording(str(exc))) from None
    execution = Execution(call_text(args.entrypoint, call_args, call_kwargs))
    execute(
        session,
        fn,
        call_args,
        call_kwargs,
        execution,
        progress=not asks,  # (a progress line would overwrite the questions)
        stdout_to_stderr=args.json,
    )
    outcome = compare_outcome(trace.run, returned=execution.returned, raised=execution.raised)
    report = ReplayReport(
        trace_path=args.trace,
        entrypoint=args.entrypoint,
        trace=trace,
        mode=mode,
        execution=execution,
        result=session.summary,
        outcome=outcome,
        notes=_notes(trace, args.entrypoint, mode, interactive, args),
    )
    if mode is not ReplayMode.MANUAL:
        report.hints = _policy_hint(trace, report.result, args)
    if args.record is not None:
        report.notes.append(
            f"the fork's bundle: {session.fork_bundle}"
            if session.fork_bundle is not None
            else f"no fork bundle was written: {session.fork_bundle_missing}"
        )
    if args.json:
        print(json_text(report.to_dict(args.verbose)))
    else:
        print(report.render(Style(sys.stdout), args.verbose))
    return report.exit_code
