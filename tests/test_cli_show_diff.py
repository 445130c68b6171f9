"""``stepfork show`` and ``stepfork diff``, run as subprocesses against recorded bundles."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_support import (
    HANG_GUARD_SECONDS,
    Bundles,
    bundles,
    record_tiny,
    stepfork,
    stepfork_on_terminal,
    tiny_copy,
)

from stepfork_otel import Trace

__all__ = ["bundles"]


def test_show_failure_tree(bundles: Bundles) -> None:
    result = stepfork("show", bundles.failure)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run booking_agent  error SeatUnavailableError  ")
    assert "  entrypoint examples.booking_agent:run_agent (recorded hint; never executed)" in lines
    assert any(
        line.startswith('  input  {"question":"Book me the cheapest flight to Paris."}  sha256 ')
        for line in lines
    )
    assert "  output <not in bundle: not recorded>" in lines
    assert "  4 calls (2 llm, 2 tool)" in lines
    heads = [line for line in lines if line.startswith(("├─ ", "└─ "))]
    assert [h.split("  ")[0:2] for h in heads] == [
        ["├─ call-1", "llm openai/gpt-4.1-mini"],
        ["├─ call-2", "tool search_flights"],
        ["├─ call-3", "llm openai/gpt-4.1-mini"],
        ["└─ call-4", "tool book_flight"],
    ]
    assert "policy replayable" in heads[0]
    # a chat request repeats the conversation: the preview shows its last message
    assert (
        '│    in  2 messages, last: {"content":"Book me the cheapest flight to Paris.",'
        '"role":"user"}  sha256 ecae5efbe56d…' in lines
    )
    assert "error SeatUnavailableError" in heads[3]
    assert '│    in  {"city":"Paris","max_results":5}  sha256 3a95c0f3af5f…' in lines
    assert any(
        line.startswith('│    out [{"flight_id":"AF1381","airline":"Air France"') for line in lines
    )
    assert (
        "     err SeatUnavailableError: booking API (key [REDACTED:openai_api_key]) refused "
        "AF1381: no seats left" in lines
    )
    assert "\x1b[" not in result.stdout


def test_show_success_marks_the_forbidden_policy_and_output(bundles: Bundles) -> None:
    result = stepfork("show", bundles.success)
    assert result.returncode == 0
    assert result.stdout.splitlines()[0].startswith("run booking_agent  ok  ")
    assert '  output "Booked and paid: captured."  sha256 ' in result.stdout
    charge = next(line for line in result.stdout.splitlines() if "call-6" in line)
    assert "tool charge_card  ok" in charge
    assert "policy forbidden" in charge


def test_show_nesting(bundles: Bundles) -> None:
    result = stepfork("show", bundles.tiny("nested"))
    assert result.returncode == 0
    tree = [line for line in result.stdout.splitlines() if "call-" in line]
    assert tree[0].startswith("└─ call-1  tool summarise  ok")
    assert tree[1].startswith("   ├─ call-2  tool lookup  ok")
    assert tree[2].startswith("   └─ call-3  llm acme/m2  ok")


def test_show_verbose_has_full_fingerprints(bundles: Bundles) -> None:
    short = stepfork("show", bundles.failure)
    full = stepfork("show", bundles.failure, "--verbose")
    assert "sha256 3a95c0f3af5f…" in short.stdout
    assert "sha256 3a95c0f3af5f…" not in full.stdout
    assert "sha256 3a95c0f3af5f" in full.stdout


def test_show_colour_only_on_a_terminal(bundles: Bundles) -> None:
    run = stepfork_on_terminal("show", bundles.failure, stdout_on_terminal=True)
    assert run.returncode == 0
    assert "\x1b[31merror\x1b[0m SeatUnavailableError" in run.terminal
    no_colour = stepfork("show", bundles.failure, env={"NO_COLOR": "1"})
    assert "\x1b[" not in no_colour.stdout


def test_diff_failure_and_success_differ_at_the_run_input(bundles: Bundles) -> None:
    result = stepfork("diff", bundles.failure, bundles.success)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].endswith("(booking_agent, error SeatUnavailableError, 4 calls)")
    assert lines[1].endswith("(booking_agent, ok, 7 calls)")
    assert lines[2] == "different — first difference at run: run input differs"
    assert '     {"question":"Book me the cheapest flight to Paris."}' in lines
    assert '     {"question":"Book me the cheapest flight to London."}' in lines
    assert "  first difference at character 44:" in lines


def test_diff_same_run_recorded_twice_is_the_same(bundles: Bundles) -> None:
    # recorded once from `python examples/booking_agent.py` (__main__) and once via the module:
    # different trace ids, timings and error-type spelling, same run
    result = stepfork("diff", bundles.failure, bundles.module_failure)
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines()[2].startswith(
        "same: 4 calls with the same inputs and results, the same outcome and final output"
    )


def _changed_run(bundles: Bundles, tmp_path: Path, old: str, new: str, name: str) -> Path:
    directory = tiny_copy(bundles, tmp_path, old, new, name=name)
    record_tiny(directory)
    return directory / "ok.sftrace"


def test_diff_finds_a_changed_tool_result(bundles: Bundles, tmp_path: Path) -> None:
    changed = _changed_run(bundles, tmp_path, '"temp": 21', '"temp": 22', "tool_result")
    result = stepfork("diff", bundles.tiny("ok"), changed)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[2] == (
        "different — first difference at call 1 (A call-1, B call-1): tool lookup: "
        "result differs (same request)"
    )
    assert '     {"city":"Oslo","temp":21,"units":"metric"}' in lines
    assert '     {"city":"Oslo","temp":22,"units":"metric"}' in lines


def test_diff_finds_a_changed_llm_output(bundles: Bundles, tmp_path: Path) -> None:
    changed = _changed_run(bundles, tmp_path, '{"text": "sunny"', '{"text": "rainy"', "llm_output")
    result = stepfork("diff", bundles.tiny("ok"), changed)
    assert result.returncode == 1
    assert result.stdout.splitlines()[2] == (
        "different — first difference at call 2 (A call-2, B call-2): llm acme/m1: "
        "output differs (same request)"
    )
    assert '"text":"sunny"' in result.stdout
    assert '"text":"rainy"' in result.stdout


def test_diff_finds_a_changed_final_output(bundles: Bundles, tmp_path: Path) -> None:
    changed = _changed_run(
        bundles, tmp_path, 'FORMAT = "{city}: {text}"', 'FORMAT = "{city} - {text}"', "final"
    )
    result = stepfork("diff", bundles.tiny("ok"), changed)
    assert result.returncode == 1
    assert result.stdout.splitlines()[2] == (
        "different — first difference at run output: final output differs"
    )


def test_diff_finds_a_different_call(bundles: Bundles) -> None:
    result = stepfork("diff", bundles.tiny("ok"), bundles.tiny("nested"))
    assert result.returncode == 1
    assert "first difference at call 1 (A call-1, B call-1): a different call was made" in (
        result.stdout
    )
    assert "  A: call-1 tool lookup" in result.stdout
    assert "  B: call-1 tool summarise" in result.stdout


def test_diff_finds_a_left_out_call(bundles: Bundles, tmp_path: Path) -> None:
    trace = Trace.load(bundles.tiny("ok"))
    shorter = tmp_path / "shorter.sftrace"
    trace.model_copy(update={"events": trace.events[:2]}).save(shorter)
    result = stepfork("diff", bundles.tiny("ok"), shorter)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[2] == "different — first difference at call 2: A made 1 more call(s) than B"
    assert "  A only: call-2 llm acme/m1" in lines


def test_show_escapes_terminal_control_sequences_from_the_bundle(
    bundles: Bundles, tmp_path: Path
) -> None:
    """A bundle is data: its text must not retitle, clear or drive the terminal."""
    trace = Trace.load(bundles.failure)
    hostile = trace.model_copy(
        update={"run": trace.run.model_copy(update={"name": "agent\x1b]0;owned\x07\x1b[2J"})}
    )
    path = tmp_path / "hostile.sftrace"
    hostile.save(path)
    shown = stepfork("show", path)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    assert "\x07" not in shown.stdout
    assert "agent\\x1b]0;owned\\x07\\x1b[2J" in shown.stdout


_CALLS_UNDER_A_SPAN = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
import stepfork_otel as sf

provider = TracerProvider()
trace.set_tracer_provider(provider)
sf.configure(tracer_provider=provider, directory={directory!r})

@sf.trace_tool
def add(a: int, b: int) -> int:
    return a + b

with trace.get_tracer("agent").start_as_current_span("my agent"):
    add(1, 2)
    add(3, 4)
"""


def test_show_names_calls_made_outside_a_run_after_the_users_span(tmp_path: Path) -> None:
    """Calls outside any ``record(...)``, bundled at the user's own root span: no run span, so
    no run input or output, and not "a run that did not finish"."""
    script = tmp_path / "agent.py"
    script.write_text(_CALLS_UNDER_A_SPAN.format(directory=str(tmp_path / "out")), "utf-8")
    ran = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_GUARD_SECONDS
    )
    assert ran.returncode == 0, ran.stderr
    (bundle,) = (tmp_path / "out").glob("*.sftrace")
    result = stepfork("show", bundle)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("calls under your span 'my agent'  ended  "), lines[0]
    assert lines[0].rsplit("  ", 1)[1] != "-"  # the span's own duration
    assert lines[2:4] == [
        "  2 calls (0 llm, 2 tool)",
        "  your own spans around the calls: my agent",
    ]
    assert not any(line.startswith(("  input ", "  output ")) for line in lines)
    assert "did not finish" not in result.stdout


# --- --json (issue 27) ----------------------------------------------------------------------------


def test_show_json_holds_what_the_tree_shows(bundles: Bundles) -> None:
    result = stepfork("show", "--json", bundles.failure)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data) == [
        "trace",
        "trace_id",
        "format_version",
        "complete",
        "incomplete_reason",
        "created_by",
        "forked_from",
        "run",
        "calls",
        "context_spans",
        "dropped_spans",
        "captured",
    ]
    trace = Trace.load(bundles.failure)
    assert (data["trace"], data["trace_id"], data["complete"]) == (
        str(bundles.failure),
        trace.trace_id,
        True,
    )
    run = data["run"]
    assert run["heading"] == "run booking_agent"
    assert (run["status"], run["error_type"]) == ("error", "SeatUnavailableError")
    assert run["duration_ns"] == trace.run.end_time_unix_nano - trace.run.start_time_unix_nano
    assert run["input"] == {
        "preview": '{"question":"Book me the cheapest flight to Paris."}',
        "sha256": "8770fbca491a…",
        "missing": None,
        "damaged": None,
    }
    assert run["output"] == {
        "preview": None,
        "sha256": None,
        "missing": "not_recorded",
        "damaged": None,
    }
    assert [(c["id"], c["label"], c["status"]) for c in data["calls"]] == [
        ("call-1", "llm openai/gpt-4.1-mini", "ok"),
        ("call-2", "tool search_flights", "ok"),
        ("call-3", "llm openai/gpt-4.1-mini", "ok"),
        ("call-4", "tool book_flight", "error"),
    ]
    search, book = data["calls"][1], data["calls"][3]
    assert search["input"]["preview"] == '{"city":"Paris","max_results":5}'
    assert search["input"]["sha256"] == "3a95c0f3af5f…"
    assert (search["kind"], search["name"], search["provider"]) == ("tool", "search_flights", None)
    assert book["error_type"] == "SeatUnavailableError"
    assert book["error_message"] == (
        "booking API (key [REDACTED:openai_api_key]) refused AF1381: no seats left"
    )
    assert book["output"] is None
    assert data["calls"][0]["provider"] == "openai"
    assert data["calls"][0]["input"]["preview"].startswith("2 messages, last: ")
    full = json.loads(stepfork("show", "--json", "--verbose", bundles.failure).stdout)
    assert full["calls"][1]["input"]["sha256"] == trace.calls[1].input_sha256  # the whole of it


def test_show_json_nesting_is_the_trees(bundles: Bundles) -> None:
    data = json.loads(stepfork("show", "--json", bundles.tiny("nested")).stdout)
    assert [(c["id"], c["parent_id"]) for c in data["calls"]] == [
        ("call-1", None),
        ("call-2", "call-1"),
        ("call-3", "call-1"),
    ]


def test_diff_json(bundles: Bundles, tmp_path: Path) -> None:
    different = stepfork("diff", "--json", bundles.failure, bundles.success)
    assert different.returncode == 1
    data = json.loads(different.stdout)
    assert data["a"] == {
        "path": str(bundles.failure),
        "name": "booking_agent",
        "status": "error",
        "error_type": "SeatUnavailableError",
        "calls": 4,
    }
    assert (data["b"]["status"], data["b"]["calls"], data["same"]) == ("ok", 7, False)
    assert data["difference"] == {
        "where": "run",
        "call": None,
        "a_call_id": None,
        "b_call_id": None,
        "what": "run input differs",
        "details": [
            "A: run input  sha256 8770fbca491a…",
            '   {"question":"Book me the cheapest flight to Paris."}',
            "B: run input  sha256 57b0fbd43a54…",
            '   {"question":"Book me the cheapest flight to London."}',
            "first difference at character 44:",
            '  A: …ook me the cheapest flight to Paris."}…',
            '  B: …ook me the cheapest flight to London."}…',
        ],
    }
    assert data["exit_code"] == 1

    same = stepfork("diff", "--json", bundles.failure, bundles.module_failure)
    assert same.returncode == 0
    assert json.loads(same.stdout)["same"] is True
    assert json.loads(same.stdout)["difference"] is None

    trace = Trace.load(bundles.tiny("ok"))
    shorter = tmp_path / "shorter.sftrace"
    trace.model_copy(update={"events": trace.events[:2]}).save(shorter)
    left_out = json.loads(stepfork("diff", "--json", bundles.tiny("ok"), shorter).stdout)
    assert {key: left_out["difference"][key] for key in ("call", "a_call_id", "b_call_id")} == {
        "call": 2,
        "a_call_id": "call-2",
        "b_call_id": None,
    }
    changed = json.loads(
        stepfork("diff", "--json", bundles.tiny("ok"), bundles.tiny("nested")).stdout
    )
    assert changed["difference"]["where"] == "call 1 (A call-1, B call-1)"
    assert (changed["difference"]["call"], changed["difference"]["a_call_id"]) == (1, "call-1")
