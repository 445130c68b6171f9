"""``stepfork replay``, run as a subprocess against the example agent's bundles: exit codes, the
report's three parts, ``--json``, modes, manual approval on a terminal, progress and quiet pipes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_support import (
    ENTRYPOINT,
    HANG_GUARD_SECONDS,
    Bundles,
    agent_copy,
    bundles,
    stepfork,
    stepfork_on_terminal,
    tiny_copy,
)

__all__ = ["bundles"]  # the session fixture, imported so pytest finds it


def _parts(stdout: str) -> tuple[str, str, str]:
    """The report's three parts, split on their headings (each must be present, in order)."""
    one = stdout.index("1. Entrypoint execution")
    two = stdout.index("2. Dependency-call matching:")
    three = stdout.index("3. Output comparison:")
    assert one < two < three
    return stdout[one:two], stdout[two:three], stdout[three:]


def test_failure_bundle_frozen_reproduces_the_failure(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""  # piped: no progress line
    execution, matching, output = _parts(result.stdout)
    assert "called run_agent(question='Book me the cheapest flight to Paris.')" in execution
    assert "raised RecordedDependencyError:" in execution
    assert "SeatUnavailableError" in execution
    assert "[REDACTED:openai_api_key]" in execution
    assert "sk-proj-" not in result.stdout
    assert "MATCHED (4 of 4 recorded calls matched, none left over)" in matching
    for n, line in enumerate(
        [
            "substituted llm openai/gpt-4.1-mini  <- call-1",
            "substituted tool search_flights      <- call-2",
            "substituted llm openai/gpt-4.1-mini  <- call-3",
            "substituted tool book_flight         <- call-4",
        ],
        1,
    ):
        assert f"{n}. {line}" in matching
    assert "recorded failure replayed: SeatUnavailableError" in matching
    assert "3. Output comparison: REPRODUCED FAILURE" in output
    # recorded from __main__ as plain "SeatUnavailableError"; replay imports the module
    assert "the recorded run failed with SeatUnavailableError" in output
    assert "message and side effects are not compared" in output
    assert "result: reproduced the recorded failure (exit 0)" in result.stdout


def test_module_recorded_failure_also_reproduces(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.module_failure, "--entrypoint", ENTRYPOINT)
    assert result.returncode == 0, result.stdout
    assert "REPRODUCED FAILURE" in result.stdout
    assert "failed with examples.booking_agent.SeatUnavailableError" in result.stdout


def test_success_bundle_frozen_is_rejected_at_the_forbidden_charge(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT)
    assert result.returncode == 1
    execution, matching, output = _parts(result.stdout)
    assert "raised ReplayPolicyError" in execution
    assert "DIVERGED at call 6 (5 of 7 recorded calls matched)" in matching
    assert "6. rejected    tool charge_card" in matching
    assert "first divergence (ReplayPolicyError):" in matching
    assert "replay policy 'forbidden'" in matching
    assert "manual mode with an explicit approval" in matching
    assert '"card_token":"[REDACTED]"' in matching
    assert "hint: call-6 was recorded with replay policy 'forbidden': approve it with" in matching
    assert (  # the command that approves it, then the test that does (issue 27)
        f"--entrypoint {ENTRYPOINT} --approve call-6` (its recorded result is substituted), or "
        "write the approval into a test with `stepfork export pytest ... --approve call-6`"
    ) in matching
    assert "3. Output comparison: DIVERGED" in output
    assert "not compared: replay stopped the run (ReplayPolicyError at call 6)" in output


def test_forbidden_policy_is_rejected_in_live_mode_even_when_allow_listed(
    bundles: Bundles,
) -> None:
    result = stepfork(
        "replay",
        bundles.success,
        "--entrypoint",
        ENTRYPOINT,
        "--mode",
        "live",
        *("--allow-live-tool", "search_flights", "--allow-live-tool", "book_flight"),
        "--allow-live-tool",
        "charge_card",
    )
    assert result.returncode == 1
    _, matching, _ = _parts(result.stdout)
    assert "1. executed    llm openai/gpt-4.1-mini  <- call-1  ran live" in matching
    assert "2. executed    tool search_flights" in matching
    assert "6. rejected    tool charge_card" in matching
    assert "replay policy 'forbidden'" in matching


def test_json_report_is_one_object_with_the_three_parts(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["exit_code"] == 1
    assert report["mode"] == "frozen"
    assert report["execution"]["outcome"] == "raised"
    assert report["execution"]["exception_type"] == "ReplayPolicyError"
    matching = report["matching"]
    assert matching["verdict"] == "DIVERGED"
    assert [c["action"] for c in matching["calls"]] == ["substituted"] * 5 + ["rejected"]
    assert matching["not_reached"] == ["call-6", "call-7"]
    divergence = matching["first_divergence"]
    assert divergence["type"] == "ReplayPolicyError"
    assert divergence["position"] == 6
    assert divergence["expected"]["name"] == "charge_card"
    # abbreviated without --verbose, everywhere in the object
    assert divergence["expected"]["input_sha256"].endswith("…")
    assert len(divergence["expected"]["input_sha256"]) == 13
    assert report["output"]["verdict"] == "DIVERGED"


def test_json_verbose_has_full_fingerprints(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, "--json", "-v")
    report = json.loads(result.stdout)
    assert result.returncode == 0
    assert report["output"]["verdict"] == "REPRODUCED FAILURE"
    assert report["matching"]["verdict"] == "MATCHED"
    assert report["execution"]["recorded_error_type"] == "SeatUnavailableError"
    assert len(report["matching"]["calls"][0]["input_sha256"]) == 64


def test_verbose_text_shows_full_fingerprints(bundles: Bundles) -> None:
    short = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT)
    full = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT, "--verbose")
    assert "input sha256: cf92ab09a4c4…" not in full.stdout
    digest = next(
        line.split("input sha256: ")[1]
        for line in full.stdout.splitlines()
        if "input sha256: " in line
    )
    assert len(digest.strip()) == 64
    assert f"input sha256: {digest.strip()[:12]}…" in short.stdout


def test_changed_tool_default_diverges_at_that_call(bundles: Bundles, tmp_path: Path) -> None:
    project = agent_copy(tmp_path, "max_results: int = 5", "max_results: int = 3")
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, cwd=project)
    assert result.returncode == 1
    execution, matching, output = _parts(result.stdout)
    assert "raised ReplayMismatchError" in execution
    assert "DIVERGED at call 2 (1 of 4 recorded calls matched)" in matching
    assert "input differs from the recording" in matching
    assert '"max_results":5' in matching
    assert '"max_results":3' in matching
    assert "DIVERGED" in output


def test_agent_that_no_longer_fails_diverges(bundles: Bundles, tmp_path: Path) -> None:
    # the agent now catches the booking failure and returns: same calls, different outcome
    project = agent_copy(
        tmp_path,
        "            result = book_flight(**args)",
        "            try:\n                result = book_flight(**args)\n"
        "            except Exception:\n                return 'sorry'",
    )
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, cwd=project)
    assert result.returncode == 1
    execution, matching, output = _parts(result.stdout)
    assert 'returned "sorry"' in execution
    assert "MATCHED (4 of 4 recorded calls matched, none left over)" in matching
    assert "3. Output comparison: DIVERGED" in output
    assert "the recorded run failed with SeatUnavailableError; this run returned" in output


def test_matched_output(bundles: Bundles) -> None:
    result = stepfork(
        "replay", bundles.tiny("ok"), "--entrypoint", "tiny_agent:forecast", cwd=bundles.tiny_dir
    )
    assert result.returncode == 0, result.stdout + result.stderr
    execution, matching, output = _parts(result.stdout)
    assert 'returned "Oslo: sunny"' in execution
    assert "MATCHED (2 of 2 recorded calls matched, none left over)" in matching
    assert "3. Output comparison: MATCHED" in output
    assert "result: completed and matched the recording (exit 0)" in result.stdout


def test_changed_output_with_matching_calls_diverges(bundles: Bundles, tmp_path: Path) -> None:
    changed = tiny_copy(
        bundles, tmp_path, 'FORMAT = "{city}: {text}"', 'FORMAT = "{city} - {text}"'
    )
    result = stepfork(
        "replay", bundles.tiny("ok"), "--entrypoint", "tiny_agent:forecast", cwd=changed
    )
    assert result.returncode == 1
    _, matching, output = _parts(result.stdout)
    assert "MATCHED (2 of 2 recorded calls matched, none left over)" in matching
    assert "3. Output comparison: DIVERGED" in output
    assert "the return value differs from the recorded output" in output
    assert "result: diverged from the recording (outcome) (exit 1)" in result.stdout


def test_async_entrypoint(bundles: Bundles) -> None:
    result = stepfork(
        "replay",
        bundles.tiny("async"),
        "--entrypoint",
        "tiny_agent:aforecast",
        cwd=bundles.tiny_dir,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "substituted llm acme/m1" in result.stdout
    assert "3. Output comparison: MATCHED" in result.stdout


def test_no_recorded_output_is_not_recorded(bundles: Bundles) -> None:
    result = stepfork(
        "replay",
        bundles.tiny("no_output"),
        "--entrypoint",
        "tiny_agent:forecast",
        cwd=bundles.tiny_dir,
    )
    assert result.returncode == 0, result.stdout
    assert "3. Output comparison: NOT RECORDED" in result.stdout
    assert "has no final output" in result.stdout


def test_positional_input(bundles: Bundles) -> None:
    result = stepfork(
        "replay",
        bundles.tiny("positional"),
        "--entrypoint",
        "tiny_agent:forecast",
        cwd=bundles.tiny_dir,
    )
    assert result.returncode == 0, result.stdout
    assert "called forecast('Oslo')" in result.stdout


def test_redacted_input_is_passed_as_its_marker(bundles: Bundles) -> None:
    result = stepfork(
        "replay",
        bundles.tiny("secret_input"),
        "--entrypoint",
        "tiny_agent:forecast_with_key",
        cwd=bundles.tiny_dir,
    )
    assert result.returncode == 0, result.stdout
    assert "api_key='[REDACTED]'" in result.stdout
    assert "the entrypoint receives the [REDACTED…] markers" in result.stdout


def test_forbidden_mode_rejects_the_first_call(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "forbidden")
    assert result.returncode == 1
    assert "1. rejected    llm openai/gpt-4.1-mini" in result.stdout
    assert "replay mode 'forbidden' rejects every dependency call" in result.stdout


def test_live_mode_runs_allow_listed_tools(bundles: Bundles) -> None:
    result = stepfork(
        "replay",
        bundles.failure,
        "--entrypoint",
        ENTRYPOINT,
        "--mode",
        "live",
        *("--allow-live-tool", "search_flights", "--allow-live-tool", "book_flight"),
    )
    # book_flight really ran and really raised SeatUnavailableError (its message is redacted)
    assert result.returncode == 0, result.stdout
    assert "4. executed    tool book_flight" in result.stdout
    assert "raised examples.booking_agent.SeatUnavailableError: booking API (key [REDACTED" in (
        result.stdout
    )
    assert "sk-proj-" not in result.stdout
    assert "REPRODUCED FAILURE" in result.stdout


def test_live_mode_refuses_a_tool_not_allow_listed(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "live")
    assert result.returncode == 1
    assert "2. rejected    tool search_flights" in result.stdout
    assert "--allow-live-tool search_flights" in result.stdout


def test_hybrid_mode_runs_the_selected_llm(bundles: Bundles) -> None:
    result = stepfork(
        "replay",
        bundles.failure,
        "--entrypoint",
        ENTRYPOINT,
        *("--mode", "hybrid", "--live-llm", "openai/gpt-4.1-mini"),
    )
    assert result.returncode == 0, result.stdout
    assert "1. executed    llm openai/gpt-4.1-mini" in result.stdout
    assert "2. substituted tool search_flights" in result.stdout


def test_manual_mode_without_a_terminal_approves_nothing(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "manual")
    assert result.returncode == 1
    assert "manual mode: stdin is not a terminal, so no call could be approved" in result.stdout
    assert "1. rejected    llm openai/gpt-4.1-mini" in result.stdout


def test_manual_mode_on_a_terminal_approves_the_forbidden_charge(bundles: Bundles) -> None:
    run = stepfork_on_terminal(
        "replay", bundles.success, "--entrypoint", ENTRYPOINT, "--mode", "manual", typed="y\n" * 7
    )
    assert run.returncode == 0, run.stdout + run.terminal
    assert "recorded call call-6: tool charge_card (replay policy forbidden)" in run.terminal
    assert run.terminal.count("[y/N]") == 7
    assert "6. substituted tool charge_card" in run.stdout
    assert "3. Output comparison: MATCHED" in run.stdout


def test_manual_mode_refusal_on_a_terminal(bundles: Bundles) -> None:
    run = stepfork_on_terminal(
        "replay",
        bundles.success,
        "--entrypoint",
        ENTRYPOINT,
        *("--mode", "manual"),
        typed="y\n" * 5 + "n\n",
    )
    assert run.returncode == 1
    assert "6. rejected    tool charge_card" in run.stdout
    assert "was not approved" in run.stdout


def test_progress_on_a_terminal_only(bundles: Bundles) -> None:
    run = stepfork_on_terminal("replay", bundles.failure, "--entrypoint", ENTRYPOINT)
    assert run.returncode == 0
    assert "replaying (frozen)" in run.terminal
    assert "\x1b[" not in run.stdout  # stdout piped: no colour
    coloured = stepfork_on_terminal(
        "replay", bundles.failure, "--entrypoint", ENTRYPOINT, stdout_on_terminal=True
    )
    assert "\x1b[32mREPRODUCED FAILURE\x1b[0m" in coloured.terminal


def test_calls_inside_a_substituted_tool_are_skipped(bundles: Bundles) -> None:
    result = stepfork(
        "replay", bundles.tiny("nested"), "--entrypoint", "tiny_agent:nested", cwd=bundles.tiny_dir
    )
    assert result.returncode == 0, result.stdout
    assert "1. substituted tool summarise  <- call-1" in result.stdout
    assert (
        "MATCHED (1 of 3 recorded calls matched, 2 skipped inside substituted calls, "
        "none left over)" in result.stdout
    )
    assert "skipped (inside substituted calls, their bodies did not run): call-2 tool lookup, " in (
        result.stdout
    )


# --- approvals given up front (issue 27) ---------------------------------------------------------


def test_approve_replays_the_forbidden_charge_without_a_terminal(bundles: Bundles) -> None:
    """``--approve call-6`` is manual mode with the approval written on the command line: what
    ``export pytest --approve call-6`` writes into a test (the calls recorded ``replayable`` and
    the one named), so CI can replay the run the hint names."""
    result = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT, "--approve", "call-6")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == f"   entrypoint {ENTRYPOINT} · mode manual"
    assert lines[3] == (
        "   note: approved: call-6 (--approve) and every call recorded with policy replayable: "
        "recorded results substituted"
    )
    _, matching, output = _parts(result.stdout)
    assert "MATCHED (7 of 7 recorded calls matched, none left over)" in matching
    assert "6. substituted tool charge_card         <- call-6" in matching
    assert "3. Output comparison: MATCHED" in output
    assert result.stderr == ""  # nothing asked


GATED_AGENT = """
from stepfork_otel import trace_tool


@trace_tool
def look(city: str) -> str:
    return "seen " + city


@trace_tool(replay_policy="manual")
def confirm(city: str) -> str:
    return "confirmed " + city


@trace_tool(replay_policy="manual")
def notify(city: str) -> str:
    return "notified " + city


def run(city: str) -> str:
    return look(city) + ", " + confirm(city) + ", " + notify(city)
"""

RECORD_GATED = """
from stepfork_otel import record
import gated_agent

with record("gated.sftrace", input={"city": "Oslo"}) as run:
    run.set_output(gated_agent.run("Oslo"))
"""


def test_approve_approves_only_the_gated_calls_it_names(tmp_path: Path) -> None:
    """Two calls recorded ``manual``: naming one leaves the other refused (the ordinary call is
    approved); naming both, or ``--approve-all``, replays the run."""
    (tmp_path / "gated_agent.py").write_text(GATED_AGENT)
    recorded = subprocess.run(
        [sys.executable, "-c", RECORD_GATED], cwd=tmp_path, capture_output=True, text=True,
        timeout=HANG_GUARD_SECONDS,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    replay = ("replay", "gated.sftrace", "--entrypoint", "gated_agent:run")
    one = stepfork(*replay, "--approve", "call-2", cwd=tmp_path)
    assert one.returncode == 1, one.stdout
    _, matching, _ = _parts(one.stdout)
    assert "1. substituted tool look" in matching
    assert "2. substituted tool confirm" in matching
    assert "3. rejected    tool notify" in matching
    assert "tool notify needs an explicit approval (manual mode) and was not approved" in matching
    both = stepfork(*replay, "--approve", "call-2", "--approve", "call-3", cwd=tmp_path)
    assert both.returncode == 0, both.stdout
    every = stepfork(*replay, "--approve-all", cwd=tmp_path)
    assert every.returncode == 0, every.stdout
    assert "note: every call approved (--approve-all): recorded results substituted" in (
        every.stdout
    )


def test_approve_errors_are_exit_2(bundles: Bundles) -> None:
    unknown = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT, "--approve", "call-9")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == (
        f"stepfork: error: --approve call-9: no such recorded call in {bundles.success}\n"
    )
    frozen = stepfork(
        "replay", bundles.success, "--entrypoint", ENTRYPOINT, "--mode", "frozen",
        "--approve", "call-6",
    )  # fmt: skip
    assert frozen.returncode == 2
    assert frozen.stderr == (
        "stepfork: error: --approve only applies to --mode manual (this replay is --mode "
        "frozen); leave out --mode: --approve replays in manual mode\n"
    )


def test_without_approvals_manual_mode_says_how_to_give_them(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.success, "--entrypoint", ENTRYPOINT, "--mode", "manual")
    assert result.returncode == 1
    assert (
        "   note: manual mode: stdin is not a terminal, so no call could be approved (give the "
        "approvals with --approve CALL_ID or --approve-all)" in result.stdout.splitlines()
    )
