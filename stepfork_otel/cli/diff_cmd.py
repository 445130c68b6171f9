"""``stepfork diff A.sftrace B.sftrace [--json]``: the first point where two runs differ.

Compared in the order things happened: the run input, then call by call -- nesting, kind, tool
name or LLM provider/model, the input, and the *outcome*: a tool's result or an LLM's output
(compared by fingerprint of the redacted canonical payload, so a changed search result or model
answer is found even when every request was the same), or the recorded failure type -- and
finally the run's outcome and output. Ids, timestamps and durations are not compared.

A fork and its original (or two forks of one run at the same call) share the calls before the
fork point, byte for byte: the comparison starts at the fork point, and says so.

Why stop at the first difference: everything after it usually differs *because of* it (a changed
tool result changes the next prompt), so the first point is the one worth reading.

Why both bundles are verified first: payloads are compared by their *stored* fingerprints, so a
payload edited after the bundle was written would compare as unchanged. A side whose fingerprints
do not match its payloads is refused, as ``stepfork replay`` refuses it. Exit 0 same, 1 different,
2 unreadable or failing the integrity check. ``--json`` prints the same as one object (keys in
``docs/cli.md``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from stepfork_otel.cli._common import (
    EXIT_DIFFERENT,
    EXIT_OK,
    CliError,
    Style,
    abbreviate,
    abbreviate_in_data,
    add_common_arguments,
    json_text,
    load_bundle,
)
from stepfork_otel.replay.errors import BundleIntegrityError, first_difference
from stepfork_otel.replay.outcome import same_type_name
from stepfork_otel.replay.report import report_preview
from stepfork_otel.trace.bundle import bundle_fingerprint
from stepfork_otel.trace.canonical import stored_or_sha256
from stepfork_otel.trace.checks import verify_integrity
from stepfork_otel.trace.models import (
    ErrorEvent,
    LlmRequest,
    OutcomeEvent,
    Trace,
    call_label,
)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="the first point where two recorded runs differ",
        description="Compare two bundles: run input, call sequence, call inputs, tool results "
        "and LLM outputs, then the final output. Both bundles' fingerprints are verified first. "
        "Exit 0: same; 1: different; 2: unreadable, or a fingerprint does not match its payload.",
    )
    parser.add_argument("a", metavar="A", help="first .sftrace bundle")
    parser.add_argument("b", metavar="B", help="second .sftrace bundle")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_common_arguments(parser)


@dataclass
class Difference:
    """The first difference: where, what, and the two sides as lines."""

    where: str
    what: str
    lines: list[str]
    call: int | None = None
    """The position of the calls that differ (None: the run's input, outcome or output)."""
    ids: tuple[str | None, str | None] = field(default=(None, None))
    """The ids of those calls in A and B (None: that side has no call there)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "call": self.call,
            "a_call_id": self.ids[0],
            "b_call_id": self.ids[1],
            "what": self.what,
            "details": self.lines,
        }


def _payload_difference(
    where: str,
    what: str,
    a: tuple[str, str | None, str | None],
    b: tuple[str, str | None, str | None],
    verbose: bool,
    call: tuple[int, str, str] | None = None,
) -> Difference:
    """Two payloads that differ: each side's label, fingerprint and preview, then where the
    texts first differ (when both are in the bundles). ``call``: (position, A's id, B's id)."""
    lines = []
    for side, (label, text, sha) in (("A", a), ("B", b)):
        lines.append(f"{side}: {label}  sha256 {abbreviate(sha, verbose)}")
        lines.append(f"   {report_preview(text, verbose)}")
    if a[1] is not None and b[1] is not None:
        lines.extend(first_difference(a[1], b[1], labels=("A", "B")))
    if call is None:
        return Difference(where, what, lines)
    return Difference(where, what, lines, call[0], (call[1], call[2]))


def _same_outcome(a: OutcomeEvent | None, b: OutcomeEvent | None) -> tuple[bool, bool]:
    """(same kind of outcome, same payload). A recorded failure is compared by type name --
    tolerating ``__main__`` against the module, as replay does -- and redacted message."""
    if a is None or b is None:
        return a is None and b is None, True
    if isinstance(a, ErrorEvent) or isinstance(b, ErrorEvent):
        if not (isinstance(a, ErrorEvent) and isinstance(b, ErrorEvent)):
            return False, False
        return same_type_name(a.error_type, b.error_type), a.message == b.message
    return True, stored_or_sha256(a.output, a.output_sha256) == stored_or_sha256(
        b.output, b.output_sha256
    )


def _describe_outcome(outcome: OutcomeEvent | None) -> str:
    if outcome is None:
        return "no recorded result"
    if isinstance(outcome, ErrorEvent):
        return f"failed with {outcome.error_type}"
    return "returned"


def shared_prefix(a: Trace, b: Trace, verbose: bool) -> tuple[int, str | None]:
    """Where the comparison starts -- the fork point when one bundle is a fork of the other, or
    both are forks of one run at the same call (their calls before it are that run's, byte for
    byte) -- and the line that says so; ``(1, None)`` for other runs. Forks are told by the
    original's trace id *and* its bundle's lines fingerprint: a fork of another recording of
    the same trace is compared from the start."""
    fa, fb = a.forked_from, b.forked_from
    for fork, origin, name, other in ((fb, a, "B", "A"), (fa, b, "A", "B")):
        if fork is None or fork.trace_id != origin.trace_id:
            continue
        if fork.lines_sha256 != bundle_fingerprint(origin):
            return 1, (
                f"{name} names {other}'s trace as the run it was forked from, but not this "
                f"bundle of it (lines sha256 {abbreviate(fork.lines_sha256, verbose)}): "
                "compared from the start"
            )
        return fork.at_call, (
            f"{name} was forked from {other} at call {fork.at_call}: the calls before it are "
            f"{other}'s own, compared from call {fork.at_call}"
        )
    if (
        fa is not None
        and fb is not None
        and (fa.trace_id, fa.lines_sha256, fa.at_call) == (fb.trace_id, fb.lines_sha256, fb.at_call)
    ):
        return fa.at_call, (
            f"both were forked from trace {abbreviate(fa.trace_id, verbose)} at call "
            f"{fa.at_call}: the calls before it are that run's, compared from call {fa.at_call}"
        )
    return 1, None


def compare(a: Trace, b: Trace, verbose: bool, start: int = 1) -> Difference | None:
    """The first difference between two runs, or None when they are the same. ``start``: the
    first call compared (:func:`shared_prefix`: the calls before a fork point are the same)."""
    ra, rb = a.run, b.run
    sa, sb = (
        stored_or_sha256(ra.input, ra.input_sha256),
        stored_or_sha256(rb.input, rb.input_sha256),
    )
    if sa != sb:
        return _payload_difference(
            "run",
            "run input differs",
            ("run input", ra.input, sa),
            ("run input", rb.input, sb),
            verbose,
        )
    calls_a, calls_b = a.calls, b.calls
    pos_a = {c.id: n for n, c in enumerate(calls_a, 1)}
    pos_b = {c.id: n for n, c in enumerate(calls_b, 1)}
    for n, (ca, cb) in enumerate(zip(calls_a, calls_b, strict=False), 1):
        if n < start:
            continue
        where = f"call {n} (A {ca.id}, B {cb.id})"
        at = (n, ca.id, cb.id)
        head = [f"A: {ca.id} {call_label(ca)}", f"B: {cb.id} {call_label(cb)}"]
        if call_label(ca) != call_label(cb):
            return Difference(where, "a different call was made", head, n, (ca.id, cb.id))
        parent_a = pos_a.get(ca.parent_id or "")
        parent_b = pos_b.get(cb.parent_id or "")
        if parent_a != parent_b:
            return Difference(
                where,
                "made at a different nesting level",
                [
                    f"A: inside call {parent_a}" if parent_a else "A: at run level",
                    f"B: inside call {parent_b}" if parent_b else "B: at run level",
                ],
                n,
                (ca.id, cb.id),
            )
        ia, ib = (
            stored_or_sha256(ca.input, ca.input_sha256),
            stored_or_sha256(cb.input, cb.input_sha256),
        )
        if ia != ib:
            what = "request (prompt) differs" if isinstance(ca, LlmRequest) else "arguments differ"
            return _payload_difference(
                where,
                f"{call_label(ca)}: {what}",
                (ca.id, ca.input, ia),
                (cb.id, cb.input, ib),
                verbose,
                at,
            )
        oa, ob = a.outcome_of(ca), b.outcome_of(cb)
        same_kind, same_payload = _same_outcome(oa, ob)
        if not same_kind:
            return Difference(
                where,
                f"{call_label(ca)}: a different outcome",
                [f"A: {_describe_outcome(oa)}", f"B: {_describe_outcome(ob)}"],
                n,
                (ca.id, cb.id),
            )
        if not same_payload and oa is not None and ob is not None:
            what = (
                "failure message differs"
                if isinstance(oa, ErrorEvent)
                else "output differs"
                if isinstance(ca, LlmRequest)
                else "result differs"
            )
            return _payload_difference(
                where,
                f"{call_label(ca)}: {what} (same request)",
                (f"{ca.id} outcome", oa.output, stored_or_sha256(oa.output, oa.output_sha256)),
                (f"{cb.id} outcome", ob.output, stored_or_sha256(ob.output, ob.output_sha256)),
                verbose,
                at,
            )
    if len(calls_a) != len(calls_b):
        n = min(len(calls_a), len(calls_b)) + 1
        longer, side, other = (
            (calls_a, "A", "B") if len(calls_a) > len(calls_b) else (calls_b, "B", "A")
        )
        extra = longer[n - 1 :]
        return Difference(
            f"call {n}",
            f"{side} made {len(extra)} more call(s) than {other}",
            [f"A: {len(calls_a)} calls", f"B: {len(calls_b)} calls"]
            + [f"{side} only: {c.id} {call_label(c)}" for c in extra[:5]]
            + ([f"{side} only: … {len(extra) - 5} more"] if len(extra) > 5 else []),
            n,
            (extra[0].id, None) if side == "A" else (None, extra[0].id),
        )
    if ra.status != rb.status or not same_type_name(ra.error_type or "", rb.error_type or ""):
        return Difference(
            "run outcome",
            "the runs ended differently",
            [
                f"A: {ra.status}" + (f" {ra.error_type}" if ra.error_type else ""),
                f"B: {rb.status}" + (f" {rb.error_type}" if rb.error_type else ""),
            ],
        )
    oa_sha, ob_sha = (
        stored_or_sha256(ra.output, ra.output_sha256),
        stored_or_sha256(rb.output, rb.output_sha256),
    )
    if oa_sha != ob_sha:
        return _payload_difference(
            "run output",
            "final output differs",
            ("run output", ra.output, oa_sha),
            ("run output", rb.output, ob_sha),
            verbose,
        )
    return None


def _summary(trace: Trace) -> str:
    run = trace.run
    status = f"error {run.error_type}" if run.status == "error" else run.status
    return f"{run.name or 'run'}, {status}, {len(trace.calls)} calls"


def _side(path: str, trace: Trace) -> dict[str, Any]:
    run = trace.run
    return {
        "path": path,
        "name": run.name,
        "status": run.status,
        "error_type": run.error_type,
        "calls": len(trace.calls),
    }


def check_integrity(a: tuple[str, Trace], b: tuple[str, Trace]) -> None:
    """Refuse (exit 2) when a stored fingerprint of either side does not match its payload: the
    comparison reads the stored fingerprints, so an edited payload would compare as unchanged.
    Names the side, the file and the first event that fails (and the other side if it fails too)."""
    failed = [
        (side, path, problems)
        for side, (path, trace) in zip("AB", (a, b), strict=True)
        if (problems := verify_integrity(trace))
    ]
    if not failed:
        return
    side, path, problems = failed[0]
    message = f"{side}: {BundleIntegrityError(path, [str(p) for p in problems])}"
    if len(failed) > 1:
        other_side, other_path, other = failed[1]
        message += f" ({other_side}: {other_path} fails the integrity check too ({other[0]}))"
    raise CliError(message)


def run(args: argparse.Namespace) -> int:
    a = load_bundle(args.a)
    b = load_bundle(args.b)
    check_integrity((args.a, a), (args.b, b))
    start, shared = shared_prefix(a, b, args.verbose)
    difference = compare(a, b, args.verbose, start)
    code = EXIT_OK if difference is None else EXIT_DIFFERENT
    if args.json:
        data = {
            "a": _side(args.a, a),
            "b": _side(args.b, b),
            "compared_from_call": start,
            "shared": shared,
            "same": difference is None,
            "difference": None if difference is None else difference.to_dict(),
            "exit_code": code,
        }
        print(json_text(abbreviate_in_data(data, args.verbose)))
        return code
    style = Style(sys.stdout)
    lines = [f"A: {args.a}  ({_summary(a)})", f"B: {args.b}  ({_summary(b)})"]
    if shared is not None:
        lines.append(shared)
    if difference is None:
        lines.append(
            style.green("same")
            + f": {len(a.calls)} calls with the same inputs and results, the same outcome and "
            "final output (ids and timings not compared)"
        )
    else:
        lines.append(
            style.red("different") + f" — first difference at {difference.where}: {difference.what}"
        )
        lines.extend(f"  {line}" for line in difference.lines)
    print("\n".join(style.line(line) for line in lines))
    return code
