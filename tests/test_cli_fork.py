"""``stepfork replay --fork-at N --record PATH``, then ``stepfork show`` and ``stepfork diff`` of
the fork, run as subprocesses against the example agent's bundles -- the agent fixed in a copy of
the project, as a user tries a fix from the step that went wrong."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cli_support import ENTRYPOINT, ROOT, Bundles, agent_copy, bundles, stepfork

from stepfork_otel import Trace
from stepfork_otel.trace.bundle import bundle_fingerprint

__all__ = ["bundles"]  # the session fixture, imported so pytest finds it

FIX = (  # full flights never reach the model
    "            result: Any = search_flights(**args)",
    '            result: Any = [f for f in search_flights(**args) if f["seats_left"]]',
)


def fork_at_3(
    bundles: Bundles, fork: Path, *extra: str, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``stepfork replay`` of the failed run forked at call 3 into ``fork``."""
    args = ("--entrypoint", ENTRYPOINT, "--fork-at", "3", "--record", fork, *extra)
    return stepfork("replay", bundles.failure, *args, cwd=cwd)


def test_a_fork_is_recorded_shown_and_diffed_from_its_fork_point(
    bundles: Bundles, tmp_path: Path
) -> None:
    project = agent_copy(tmp_path, *FIX)
    fork = tmp_path / "fixed.sftrace"
    result = fork_at_3(bundles, fork, "--allow-live-tool", "book_flight", cwd=project)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr  # the live run reached charge_card
    assert "entrypoint examples.booking_agent:run_agent · mode live · forked at call 3" in out
    assert f"note: the fork's bundle: {fork}" in out
    assert (
        "2. Dependency-call matching: REFUSED at call 6 (forked at call 3: 2 call(s) before it "
        "replayed as recorded, 4 live from there)"
    ) in out
    assert "  1. substituted llm openai/gpt-4.1-mini  <- call-1" in out
    assert "  4. executed    tool book_flight         (after the fork point)  ran live" in out
    assert "tool charge_card has replay policy 'forbidden': after the fork point (call 3)" in out
    assert "result: forked at call 3, and the live run was refused a call (exit 1)" in out

    original = Trace.load(bundles.failure)
    shown = stepfork("show", fork)
    assert shown.returncode == 0, shown.stderr
    assert (
        f"  forked from trace {original.trace_id[:12]}… (failure.sftrace) at call 3: calls 1-2 "
        "are that run's"
    ) in shown.stdout
    assert "call-4  tool book_flight  ok" in shown.stdout
    data = json.loads(stepfork("show", "--json", "--verbose", fork).stdout)
    assert data["forked_from"] == {
        "trace_id": original.trace_id,
        "lines_sha256": bundle_fingerprint(original),
        "at_call": 3,
        "span_id": original.run.span_id,
        "bundle": "failure.sftrace",
    }

    diff = stepfork("diff", bundles.failure, fork)
    assert diff.returncode == 1
    lines = diff.stdout.splitlines()
    assert lines[2] == (
        "B was forked from A at call 3: the calls before it are A's own, compared from call 3"
    )
    assert lines[3].startswith(
        "different — first difference at call 3 (A call-3, B call-3): llm openai/gpt-4.1-mini: "
        "request (prompt) differs"
    )
    compared = json.loads(stepfork("diff", "--json", bundles.failure, fork).stdout)
    assert compared["compared_from_call"] == 3
    assert compared["shared"] == lines[2]
    assert compared["difference"]["call"] == 3
    # the other way round, and a bundle that is not the one forked says so
    assert "A was forked from B at call 3" in stepfork("diff", fork, bundles.failure).stdout
    other = stepfork("diff", bundles.module_failure, fork).stdout.splitlines()
    assert other[2].startswith("different — first difference at call 3")  # no fork line: from 1


def test_two_forks_of_one_run_are_compared_from_their_fork_point(
    bundles: Bundles, tmp_path: Path
) -> None:
    forks = []
    for name, fix in (("plain", None), ("fixed", FIX)):
        project = agent_copy(tmp_path / name, *(fix or ("", "")))
        path = tmp_path / f"{name}.sftrace"
        result = fork_at_3(bundles, path, "--allow-live-tool", "book_flight", cwd=project)
        assert path.exists(), result.stdout + result.stderr
        forks.append(path)
    diff = stepfork("diff", *forks)
    assert diff.stdout.splitlines()[2].startswith("both were forked from trace ")
    assert diff.stdout.splitlines()[2].endswith(
        " at call 3: the calls before it are that run's, compared from call 3"
    )


def test_a_fork_that_reproduces_the_recorded_failure_exits_0(
    bundles: Bundles, tmp_path: Path
) -> None:
    fork = tmp_path / "again.sftrace"
    result = fork_at_3(bundles, fork, "--allow-live-tool", "book_flight", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["fork_at"] == 3
    assert report["matching"]["verdict"] == "FORKED"
    assert report["matching"]["after_fork"] == ["call-3", "call-4"]
    assert [c["action"] for c in report["matching"]["calls"]] == [
        "substituted",
        "substituted",
        "executed",
        "executed",
    ]
    assert report["result"] == "forked at call 3: the calls before it replayed, the rest ran live"
    assert Trace.load(fork).run.error_type == "examples.booking_agent.SeatUnavailableError"


def test_fork_options_are_checked_before_anything_runs(bundles: Bundles, tmp_path: Path) -> None:
    cases = {
        ("--record", str(tmp_path / "x.sftrace")): "--record records a fork (--fork-at N)",
        ("--fork-at", "9"): "--fork-at 9: the bundle has 4 call(s), numbered 1 to 4",
        ("--fork-at", "3", "--mode", "frozen"): "leave --mode out, or say --mode live",
    }
    for extra, message in cases.items():
        result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, *extra)
        assert result.returncode == 2, result.stdout
        assert message in result.stderr
    assert not (tmp_path / "x.sftrace").exists()


def test_a_fork_whose_prefix_diverges_writes_no_bundle(bundles: Bundles, tmp_path: Path) -> None:
    project = agent_copy(tmp_path, "max_results: int = 5", "max_results: int = 3")
    fork = tmp_path / "never.sftrace"
    result = fork_at_3(bundles, fork, cwd=project)
    assert result.returncode == 1
    assert "DIVERGED at call 2 (1 of 2 recorded calls matched)" in result.stdout
    assert "the fork point was not reached" in result.stdout
    assert (
        "note: no fork bundle was written: the run ended before call 3, the fork point"
        in result.stdout
    )
    assert "result: the fork point (call 3) was not reached (exit 1)" in result.stdout
    assert not fork.exists()
    assert not fork.with_name("never.sftrace.partial").exists()
