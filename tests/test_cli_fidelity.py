"""The ``stepfork`` command does what was asked and shows bundle data as inert text (issue 10:
items 7, 10, 11, 12, 13 and 15).

- ``diff`` verifies both bundles before comparing: a tampered side is named, exit 2;
- ``export pytest`` never writes a live-mode test that live mode would fail;
- bundle text reaches the terminal escaped: no control character (C0, DEL, C1), no bidi control;
- any stdout encoding: characters it cannot encode degrade to escapes;
- an exported test's module and function names are valid for any bundle name;
- replay errors printed by the command name its flags, not the Python API's parameters.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import (
    ENTRYPOINT,
    HANG_GUARD_SECONDS,
    ROOT,
    Bundles,
    bundles,
    stepfork,
    stepfork_on_terminal,
)

from stepfork_otel import ReplaySession, Trace
from stepfork_otel.replay.errors import ReplayModeError

__all__ = ["bundles"]

#: What must never reach the terminal from a bundle: C0 (a newline only as the output's own line
#: structure), DEL, C1 and the bidi controls.
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: A run name that hides its status on a terminal (``8m`` is "conceal").
CONCEALING_NAME = "booking_agent  ok\x1b[8m"
#: Text with every kind of character that drives or reorders a terminal.
HOSTILE_TEXT = (
    "A\nB\rC\tD\x1b[8mE\x1b]0;owned\x07F\x9b31mG\x7fH\u202eI\u2066J\u2069K\u061cL\u200eM\x85N"
)

HOSTILE_AGENT = f"""
from __future__ import annotations

from stepfork_otel import llm_request, trace_tool

TEXT = {HOSTILE_TEXT!r}

Boom = type("Boom\\x1b[8m", (Exception,), {{}})


@trace_tool
def lookup(city: str) -> dict:
    return {{"city": city, "note": TEXT}}


@trace_tool
def book(city: str) -> str:
    raise Boom(TEXT)


@trace_tool(replay_policy="manual")
def confirm(city: str) -> str:
    return "confirmed " + city


def run_agent(city: str) -> str:
    lookup(city)
    llm_request(provider="acme", model="m1", input={{"q": TEXT}}, call=lambda: {{"text": TEXT}})
    return book(city)


def run_confirmed(city: str) -> str:
    return confirm(city)
"""

RECORD_HOSTILE = f"""
import sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from stepfork_otel import configure, record
from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter
import hostile_agent as h

out = sys.argv[1]
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(f"{{out}}/spans.jsonl")))
configure(tracer_provider=provider)
for name, city in (("hostile", h.TEXT), ("other", h.TEXT + "!")):
    try:
        with record(f"{{out}}/{{name}}.sftrace", name={CONCEALING_NAME!r}, input={{"city": city}}):
            h.run_agent(city)
    except Exception:
        pass
with record(f"{{out}}/confirmed.sftrace", name="confirmed", input={{"city": "Oslo"}}) as run:
    run.set_output(h.run_confirmed("Oslo"))
provider.shutdown()
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``hostile_agent.py``, its bundles (``hostile``, ``other``: the same run
    with another input; ``confirmed``: a call with replay policy ``manual``) and the same runs as
    OTLP JSON (``spans.jsonl``)."""
    directory = tmp_path_factory.mktemp("hostile")
    (directory / "hostile_agent.py").write_text(HOSTILE_AGENT)
    done = subprocess.run(
        [sys.executable, "-c", RECORD_HOSTILE, str(directory)],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return directory


def _assert_inert(text: str) -> None:
    found = sorted({f"U+{ord(c):04X}" for c in UNSAFE.findall(text)})
    assert not found, f"unescaped {found} in:\n{text}"


def _tampered(bundles: Bundles, tmp_path: Path) -> Path:
    """The failure bundle with "Paris" changed to "Qaris" in one payload (call-2's input)."""
    text = bundles.failure.read_text()
    old = '{"input":{"city":"Paris","max_results":5}}'
    assert text.count(old) == 1
    tampered = tmp_path / "tampered.sftrace"
    tampered.write_text(text.replace(old, old.replace("Paris", "Qaris")))
    return tampered


# --- 7. diff verifies before comparing ------------------------------------------------------------


def test_diff_rejects_a_tampered_side_naming_it_and_the_event(
    bundles: Bundles, tmp_path: Path
) -> None:
    tampered = _tampered(bundles, tmp_path)
    for args, side, path in (
        ((bundles.failure, tampered), "B", tampered),
        ((tampered, bundles.failure), "A", tampered),
    ):
        result = stepfork("diff", *args)
        assert result.returncode == 2, result.stdout
        assert result.stdout == ""
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith(
            f"stepfork: error: {side}: {path}: bundle rejected, integrity check failed: "
            "call-2: input fingerprint mismatch: stored 3a95c0f3af5f…, payload hashes to "
        ), result.stderr
    both = stepfork("diff", tampered, tampered)
    assert both.returncode == 2
    assert both.stderr.startswith(f"stepfork: error: A: {tampered}: bundle rejected")
    assert f"B: {tampered} fails the integrity check too (call-2" in both.stderr


def test_diff_of_intact_bundles_is_unchanged(bundles: Bundles) -> None:
    same = stepfork("diff", bundles.failure, bundles.module_failure)
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout.splitlines()[2].startswith("same: 4 calls")


# --- 10. an exported test must be able to pass ----------------------------------------------------


def test_export_refuses_a_live_test_that_live_mode_would_fail(
    bundles: Bundles, tmp_path: Path
) -> None:
    out = tmp_path / "test_live.py"
    result = stepfork(
        "export", "pytest", bundles.failure, "--entrypoint", ENTRYPOINT, "-o", out,
        "--allow-live-tool", "book_flight",
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (
        "stepfork: error: live mode refuses every recorded tool that is not allow-listed, so "
        "this test could never pass: search_flights would be refused (add --allow-live-tool "
        "search_flights, or leave out --allow-live-tool for a frozen test)\n"
    )
    assert not out.exists()


def test_export_refuses_a_live_test_with_a_forbidden_call(bundles: Bundles, tmp_path: Path) -> None:
    out = tmp_path / "test_live.py"
    tools = ("search_flights", "book_flight", "charge_card")
    result = stepfork(
        "export", "pytest", bundles.success, "--entrypoint", ENTRYPOINT, "-o", out,
        *(arg for tool in tools for arg in ("--allow-live-tool", tool)),
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (
        "stepfork: error: live mode refuses call-6 (charge_card, replay policy 'forbidden') "
        "even when allow-listed, so this test could never pass; export a test that approves it "
        "instead (its recorded result substituted): leave out --allow-live-tool and add "
        "--approve call-6\n"
    )
    assert not out.exists()


# --- 11. terminal output is inert -----------------------------------------------------------------


def test_terminal_safe_escapes_every_control_and_bidi_character() -> None:
    from stepfork_otel.cli._common import terminal_safe

    assert terminal_safe("plain · text … ü") == "plain · text … ü"
    assert terminal_safe("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert terminal_safe("\x00\x1b[8m\x7f\x85\x9b") == "\\x00\\x1b[8m\\x7f\\x85\\x9b"
    bidi = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    assert terminal_safe(bidi) == "".join(f"\\u{ord(c):04x}" for c in bidi)
    everything = "".join(map(chr, range(0x3000)))
    _assert_inert(terminal_safe(everything).replace("\n", ""))


def test_show_escapes_bundle_text(hostile: Path) -> None:
    shown = stepfork("show", hostile / "hostile.sftrace")
    assert shown.returncode == 0, shown.stderr
    _assert_inert(shown.stdout)
    first = shown.stdout.splitlines()[0]
    assert first.startswith("run booking_agent  ok\\x1b[8m  error hostile_agent.Boom\\x1b[8m  ")
    escaped = "A\\nB\\rC\\tD\\x1b[8mE\\x1b]0;owned\\x07F\\x9b31mG\\x7fH\\u202e"
    assert f"err hostile_agent.Boom\\x1b[8m: {escaped}" in shown.stdout


def test_show_on_a_terminal_colours_but_never_conceals(hostile: Path) -> None:
    run = stepfork_on_terminal("show", hostile / "hostile.sftrace", stdout_on_terminal=True)
    assert run.returncode == 0
    assert "\x1b[1mrun booking_agent  ok\\x1b[8m\x1b[0m" in run.terminal  # our bold, escaped name
    assert "\x1b[31merror\x1b[0m hostile_agent.Boom\\x1b[8m" in run.terminal
    for forbidden in ("\x1b[8m", "\x1b]", "\x9b", "\u202e", "\x07"):
        assert forbidden not in run.terminal


def test_replay_escapes_bundle_text(hostile: Path) -> None:
    result = stepfork(
        "replay", hostile / "hostile.sftrace", "--entrypoint", "hostile_agent:run_agent",
        cwd=hostile,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_inert(result.stdout + result.stderr)
    assert (
        "recorded run: booking_agent  ok\\x1b[8m, failed with hostile_agent.Boom\\x1b[8m"
        in result.stdout
    )
    assert "raised RecordedDependencyError: at call 3 of this run: recorded failure replayed: " in (
        result.stdout
    )
    assert "Boom\\x1b[8m: A\\nB\\rC\\tD\\x1b[8mE" in result.stdout
    assert "3. Output comparison: REPRODUCED FAILURE" in result.stdout


def test_replay_json_escapes_what_json_leaves_raw(hostile: Path) -> None:
    import json

    result = stepfork(
        "replay", hostile / "hostile.sftrace", "--entrypoint", "hostile_agent:run_agent",
        "--json", cwd=hostile,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_inert(result.stdout.replace("\n", ""))
    report = json.loads(result.stdout)  # the same data, escaped the JSON way
    assert report["recorded_run"]["name"] == CONCEALING_NAME
    assert report["matching"]["calls"][2]["error"] == f"hostile_agent.Boom\x1b[8m: {HOSTILE_TEXT}"


def test_diff_escapes_bundle_text(hostile: Path) -> None:
    result = stepfork("diff", hostile / "hostile.sftrace", hostile / "other.sftrace")
    assert result.returncode == 1, result.stdout + result.stderr
    _assert_inert(result.stdout)
    lines = result.stdout.splitlines()
    assert lines[0].endswith(
        "(booking_agent  ok\\x1b[8m, error hostile_agent.Boom\\x1b[8m, 3 calls)"
    )
    assert lines[2] == "different — first difference at run: run input differs"
    assert '     {"city":"A\\nB\\rC\\tD\\u001b[8mE' in result.stdout  # JSON's own escapes
    assert "G\\x7fH\\u202eI" in result.stdout


def test_import_escapes_bundle_text(hostile: Path, tmp_path: Path) -> None:
    result = stepfork("import", hostile / "spans.jsonl", "-o", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_inert(result.stdout + result.stderr)
    assert "complete -- booking_agent  ok\\x1b[8m, 3 calls, error (Boom\\x1b[8m)" in result.stdout


def test_exported_source_is_inert_and_means_the_recorded_text(hostile: Path) -> None:
    """Bundle text in the generated test (string literals, the docstring) carries no raw control
    or bidi character -- none to drive a terminal, none to make the code read differently than it
    runs -- and the literals still mean the recorded values."""
    exported = stepfork(
        "export", "pytest", hostile / "hostile.sftrace", "--entrypoint", "hostile_agent:run_agent",
        "-o", "-", cwd=hostile,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    _assert_inert(exported.stdout.replace("\n", ""))
    constants = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(exported.stdout).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.startswith("RECORDED_")
    }  # fmt: skip
    assert constants == {
        "RECORDED_INPUT": {"city": HOSTILE_TEXT},
        "RECORDED_FAILURE": "hostile_agent.Boom\x1b[8m",
    }


def test_errors_and_notes_on_stderr_are_escaped(hostile: Path, tmp_path: Path) -> None:
    missing = stepfork("show", tmp_path / "no\x1b[8mpe\u202e.sftrace")
    assert missing.returncode == 2
    assert missing.stderr.startswith("stepfork: error: ")
    _assert_inert(missing.stderr[:-1])
    assert "no\\x1b[8mpe\\u202e.sftrace: no such file" in missing.stderr
    exported = stepfork(
        "export", "pytest", hostile / "confirmed.sftrace", "--entrypoint",
        "hostile_agent:run_confirmed", "-o", tmp_path / "test_x.py",
        "--allow-live-tool", "no\x1b[8mtool", cwd=hostile,
    )  # fmt: skip
    _assert_inert(exported.stderr.replace("\n", ""))
    assert "--allow-live-tool no\\x1b[8mtool: no recorded call of that tool" in exported.stderr


# --- 12. any stdout encoding ----------------------------------------------------------------------


def _ascii_cases(
    bundles: Bundles, hostile: Path, tmp_path: Path
) -> dict[str, tuple[tuple[str | Path, ...], Path, int]]:
    """(arguments, working directory, exit code) of each command, each printing non-ASCII text."""
    umlaut = shutil.copyfile(bundles.tiny("ok"), tmp_path / "wetter_zürich.sftrace")
    tiny = bundles.tiny_dir
    return {
        "replay": (("replay", bundles.failure, "--entrypoint", ENTRYPOINT), ROOT, 0),
        "validate": (("validate", _tampered(bundles, tmp_path), "--verify-integrity"), ROOT, 1),
        "export": (
            (
                "export",
                "pytest",
                umlaut,
                "--entrypoint",
                "tiny_agent:forecast",
                "-o",
                tmp_path / "test_ü.py",
            ),
            tiny,
            0,
        ),
        "export-stdout": (
            ("export", "pytest", umlaut, "--entrypoint", "tiny_agent:forecast", "-o", "-"),
            tiny,
            0,
        ),
        "show": (("show", bundles.failure), ROOT, 0),
        "diff": (("diff", bundles.failure, bundles.success), ROOT, 1),
        "import": (("import", hostile / "spans.jsonl", "-o", tmp_path / "bündel"), ROOT, 0),
        "error": (("show", tmp_path / "fehlt-ü.sftrace"), ROOT, 2),
        "help": (("--help",), ROOT, 0),
    }


@pytest.mark.parametrize(
    "case",
    ["replay", "validate", "export", "export-stdout", "show", "diff", "import", "error", "help"],
)
def test_every_command_degrades_to_escapes_on_an_ascii_stdout(
    case: str, bundles: Bundles, hostile: Path, tmp_path: Path
) -> None:
    args, cwd, code = _ascii_cases(bundles, hostile, tmp_path)[case]
    result = stepfork(*args, cwd=cwd, env={"PYTHONIOENCODING": "ascii"})
    assert "UnicodeEncodeError" not in result.stderr, result.stderr
    assert result.returncode == code, result.stdout + result.stderr
    printed = result.stdout + result.stderr
    assert printed.isascii()
    if case != "help":
        assert re.search(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4})", printed), printed
    if case == "export-stdout":  # still valid Python: the escape is inside a string literal
        assert 'BUNDLE = Path("' in result.stdout
        compile(result.stdout, "test_exported.py", "exec")


# --- 13. exported module and test names -----------------------------------------------------------

HOSTILE_NAMES = {
    "superscripts": ("ü²³", "test_replay_u23.py", "test_u23_replays"),
    "cjk": ("日本語", "test_replay_run.py", "test_run_replays"),
    "digits and dashes": (
        "2nd run-v1.2",
        "test_replay_2nd_run_v1_2.py",
        "test_2nd_run_v1_2_replays",
    ),
    "keyword": ("class", "test_replay_class.py", "test_class_replays"),
    "quotes": ('it\'s "q"', "test_replay_it_s_q.py", "test_it_s_q_replays"),
    "undecodable byte": (
        "caf\udce9",  # b"caf\xe9": not UTF-8; Python names it with a surrogate
        "test_replay_caf.py",
        "test_caf_replays",
    ),
    "long": ("a" * 240, f"test_replay_{'a' * 64}.py", f"test_{'a' * 64}_replays"),
}


@pytest.mark.parametrize(
    ("stem", "identifier"),
    [
        ("ü²³", "u23"),
        ("Ångström", "angstrom"),
        ("日本語", "run"),
        ("x\x1b[8m", "x_8m"),
        ("__init__", "init"),
        ("İstanbul", "istanbul"),
        ("ﬁle", "file"),
        ("", "run"),
    ],
)
def test_module_identifier(stem: str, identifier: str) -> None:
    from stepfork_otel.cli.export_cmd import module_identifier

    assert module_identifier(stem) == identifier
    assert f"test_{module_identifier(stem)}_replays".isidentifier()
    assert module_identifier(stem).isascii()


def test_exported_tests_of_hostile_bundle_names_compile_and_are_collected(
    bundles: Bundles, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copyfile(bundles.tiny_dir / "tiny_agent.py", project / "tiny_agent.py")
    (project / "pytest.ini").write_text(
        "[pytest]\nfilterwarnings = error\nasyncio_default_fixture_loop_scope = function\n"
    )
    expected_ids = []
    for stem, module_file, function in HOSTILE_NAMES.values():
        bundle = shutil.copyfile(bundles.tiny("ok"), project / f"{stem}.sftrace")
        before = set(project.glob("*.py"))
        exported = stepfork(
            "export", "pytest", bundle.name, "--entrypoint", "tiny_agent:forecast", cwd=project
        )
        assert exported.returncode == 0, (stem, exported.stderr)
        [written] = set(project.glob("*.py")) - before
        tree = ast.parse(written.read_text(encoding="utf-8"), written.name)  # parses
        compile(tree, written.name, "exec")
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert functions == [function]
        assert written.name == module_file
        assert exported.stdout.startswith(f"wrote {module_file} (frozen replay of ")
        expected_ids.append(f"{module_file}::{function}")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "."],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{len(HOSTILE_NAMES)} passed" in run.stdout
    for test_id in expected_ids:
        assert f"PASSED {test_id}" in run.stdout


# --- 15. error messages ---------------------------------------------------------------------------

PYTHON_SPELLINGS = ("live_llms", "allow_live_tools", "ReplaySession(", "approve=")


def _option_messages(bundles: Bundles) -> list[str]:
    trace = Trace.load(bundles.failure)
    messages = []
    for mode, options in (
        ("frozen", {"allow_live_tools": ["book_flight"]}),
        ("frozen", {"live_llms": ["openai/gpt-4.1-mini"]}),
        ("hybrid", {}),
    ):
        with pytest.raises(ReplayModeError) as caught:
            ReplaySession(trace, mode, **options)  # type: ignore[arg-type]
        messages.append(str(caught.value))
    return messages


def test_cli_wording_of_each_replay_message(bundles: Bundles) -> None:
    from stepfork_otel.cli.replay_cmd import cli_wording

    translated = [cli_wording(m) for m in _option_messages(bundles)]
    assert translated == [
        "--allow-live-tool only applies to --mode live (this replay is --mode frozen): no tool "
        "runs for real in any other mode",
        "--live-llm only applies to --mode hybrid (this replay is --mode frozen)",
        "--mode hybrid needs --live-llm: the LLMs to run again, as 'provider/model', "
        "'provider/*' or 'model' (without them it would be a frozen replay)",
    ]
    assert cli_wording(
        "tool 'book_flight' may not run live: live mode executes a tool only when it is named in "
        "allow_live_tools (--allow-live-tool book_flight); its body did not run"
    ) == (
        "tool 'book_flight' may not run live: live mode executes a tool only when it is named "
        "with --allow-live-tool book_flight; its body did not run"
    )
    assert cli_wording(
        "replay mode 'manual' needs an explicit approval for every call and no approval callback "
        "was given (ReplaySession(..., approve=...))"
    ) == (  # (the approvals are given with --approve since issue 27; asked on a terminal)
        "replay mode 'manual' needs an explicit approval for every call: give them with "
        "--approve CALL_ID or --approve-all, or run on a terminal to be asked"
    )
    assert cli_wording(
        "tool confirm needs an explicit approval (recorded policy 'manual') and no approval "
        "callback was given (ReplaySession(..., approve=...))"
    ) == (
        "tool confirm needs an explicit approval (recorded policy 'manual'), and stepfork replay "
        "approves calls only in manual mode (--approve CALL_ID)"
    )
    for message in _option_messages(bundles):
        assert not any(s in cli_wording(message) for s in PYTHON_SPELLINGS)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--allow-live-tool", "book_flight"), "--allow-live-tool only applies to --mode live"),
        (("--live-llm", "openai/gpt-4.1-mini"), "--live-llm only applies to --mode hybrid"),
        (("--mode", "hybrid"), "--mode hybrid needs --live-llm: the LLMs to run again"),
    ],
)
def test_replay_option_errors_name_the_flags(
    bundles: Bundles, options: tuple[str, ...], says: str
) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, *options)
    assert result.returncode == 2
    assert result.stderr.startswith(f"stepfork: error: {says}"), result.stderr
    assert not any(s in result.stderr for s in PYTHON_SPELLINGS), result.stderr


@pytest.mark.parametrize("json_output", [False, True])
@pytest.mark.parametrize(
    ("case", "says"),
    [
        (
            "live",
            "live mode executes a tool only when it is named with --allow-live-tool book_flight",
        ),
        ("manual", "every call: give them with --approve CALL_ID or --approve-all, or run on a"),
        ("policy", "and stepfork replay approves calls only in manual mode (--approve CALL_ID)"),
    ],
)
def test_replay_report_errors_name_the_flags(
    bundles: Bundles, hostile: Path, case: str, says: str, json_output: bool
) -> None:
    args = {
        "live": (bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "live",
                 "--allow-live-tool", "search_flights"),
        "manual": (bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "manual"),
        "policy": (hostile / "confirmed.sftrace", "--entrypoint", "hostile_agent:run_confirmed"),
    }[case]  # fmt: skip
    result = stepfork("replay", *args, *(("--json",) if json_output else ()), cwd=hostile)
    assert result.returncode == 1, result.stdout + result.stderr
    assert says in result.stdout
    assert not any(s in result.stdout + result.stderr for s in PYTHON_SPELLINGS), result.stdout


def test_a_call_refused_by_forbidden_mode_is_not_labelled_unmatched(bundles: Bundles) -> None:
    result = stepfork("replay", bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "forbidden")
    assert result.returncode == 1
    assert "     1. rejected    llm openai/gpt-4.1-mini  (refused before matching)" in (
        result.stdout.splitlines()
    )
    assert "matched no recorded call" not in result.stdout


PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00"
    b"\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00"
    b"\x00IEND\xaeB`\x82"
)


@pytest.mark.parametrize("command", ["show", "replay", "validate"])
def test_a_png_is_not_a_bundle(command: str, tmp_path: Path) -> None:
    picture = tmp_path / "picture.png"
    picture.write_bytes(PNG)
    extra = ("--entrypoint", ENTRYPOINT) if command == "replay" else ()
    result = stepfork(command, picture, *extra)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"stepfork: error: {picture}: not a .sftrace bundle")
    for orjson_words in ("UTF-8", "surrogates", "line 1 column", "char 0"):
        assert orjson_words not in result.stderr


def test_a_line_break_in_a_recorded_id_is_not_a_line_of_the_replay_report(
    bundles: Bundles, tmp_path: Path
) -> None:
    trace = Trace.load(bundles.failure)
    forged = "call-2\nresult: completed and matched the recording (exit 0)"
    events = [
        e.model_copy(
            update={
                **({"id": forged} if e.id == "call-2" else {}),
                **({"parent_id": forged} if e.parent_id == "call-2" else {}),
            }
        )
        for e in trace.events
    ]
    path = tmp_path / "forged_id.sftrace"
    trace.model_copy(update={"events": events}).save(path)
    for mode in ("frozen", "forbidden"):
        result = stepfork("replay", path, "--entrypoint", ENTRYPOINT, "--mode", mode)
        assert result.returncode in (0, 1), result.stderr
        results = [line for line in result.stdout.splitlines() if line.startswith("result:")]
        assert len(results) == 1, result.stdout
        assert "call-2\\nresult: completed and matched the recording (exit 0)" in result.stdout


def test_validate_escapes_bundle_text(bundles: Bundles, tmp_path: Path) -> None:
    trace = Trace.load(bundles.failure)
    hostile_id = "call-2\u202e\x9b[8m"
    events = [
        e.model_copy(update={"id": hostile_id}) if e.id == "call-2" else e for e in trace.events
    ]
    path = tmp_path / "bidi_id.sftrace"
    trace.model_copy(update={"events": events}).save(path)
    result = stepfork("validate", path)
    assert result.returncode == 1
    _assert_inert(result.stdout)
    assert "  warning call-2\\u202e\\x9b[8m: no recorded result" in result.stdout.splitlines()


@pytest.mark.parametrize(
    "selector", ["openai/gpt-4.1", "anthropic/claude-3", "*", "bad/selector/x"]
)
def test_a_live_llm_that_selects_no_recorded_call_is_exit_2(
    bundles: Bundles, selector: str
) -> None:
    """It used to give a frozen replay reported MATCHED (exit 0): the typo went unnoticed."""
    result = stepfork(
        "replay", bundles.failure, "--entrypoint", ENTRYPOINT, "--mode", "hybrid",
        "--live-llm", selector,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(f"stepfork: error: --live-llm selector '{selector}' ")
    assert "recorded LLMs: openai/gpt-4.1-mini" in result.stderr
