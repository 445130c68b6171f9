"""Bad input, for every command: one line on stderr naming the problem, exit 2, no traceback
(unless ``--verbose``).

Every case runs through ``stepfork_otel.cli.main`` in this process (fast: the full matrix of
commands x bad bundles), and a selection -- every command, every kind of bad bundle, every
entrypoint problem -- also as a real subprocess, concurrently, as a user would run it."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_support import ENTRYPOINT, HANG_GUARD_SECONDS, ROOT, Bundles, bundles

from stepfork_otel.cli import main
from stepfork_otel.constants import FORMAT_VERSION
from stepfork_otel.trace.bundle import dump_trace
from stepfork_otel.trace.models import Trace

__all__ = ["bundles"]


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    names: str
    """Text the one error line must contain (the problem, named)."""


BAD_BUNDLES = ("missing", "directory", "empty", "text", "json", "truncated", "newer")
#: Entrypoint problems import modules: only as subprocesses (they would pollute this process).
ENTRYPOINT_CASES = {
    f"{command}-{name}"
    for command in ("replay", "export")
    for name in (
        "no-module",
        "no-function",
        "not-callable",
        "raises-on-import",
        "import-error-inside",
        "no-colon",
        "wrong-signature",
    )
}


def _cases(d: Path, good: Path) -> dict[str, Case]:
    bad_bundles = {
        "missing": (d / "missing.sftrace", "missing.sftrace: no such file"),
        "directory": (d, "is a directory, not a .sftrace bundle"),
        "empty": (d / "empty.sftrace", "empty file, not a .sftrace bundle"),
        "text": (d / "notes.txt", "notes.txt: not a .sftrace bundle (it starts with b'not a bu'"),
        "json": (d / "other.json", 'not a .sftrace bundle (no "format": "sftrace" field)'),
        "truncated": (d / "truncated.sftrace", "truncated.sftrace: truncated bundle (no end line"),
        "newer": (d / "newer.sftrace", "format version 99 is newer than this stepfork_otel"),
    }
    cases: dict[str, Case] = {}
    for name, (path, names) in bad_bundles.items():
        p = str(path)
        out = str(d / f"test_{name}.py")
        cases[f"replay-{name}"] = Case(("replay", p, "--entrypoint", ENTRYPOINT), names)
        cases[f"validate-{name}"] = Case(("validate", p), names)
        cases[f"export-{name}"] = Case(
            ("export", "pytest", p, "--entrypoint", ENTRYPOINT, "-o", out), names
        )
        cases[f"show-{name}"] = Case(("show", p), names)
        cases[f"diff-a-{name}"] = Case(("diff", p, str(good)), names)
        cases[f"diff-b-{name}"] = Case(("diff", str(good), p), names)
    entrypoints = {
        "no-module": ("no_such_module_xyz:run", "entrypoint module 'no_such_module_xyz' not found"),
        "no-function": (
            "examples.booking_agent:nope",
            "module 'examples.booking_agent' has no attribute 'nope'",
        ),
        "not-callable": ("not_callable:run_agent", "is not callable (it is a int)"),
        "raises-on-import": (
            "raises_on_import:run",
            "importing entrypoint module 'raises_on_import' raised RuntimeError: boom",
        ),
        "import-error-inside": (
            "imports_missing:run",
            "importing entrypoint module 'imports_missing' failed: ModuleNotFoundError",
        ),
        "no-colon": ("examples.booking_agent", "--entrypoint must be MODULE:FUNCTION"),
        "wrong-signature": (
            "examples.booking_agent:main",
            "does not accept the recorded run input (arguments: question=…)",
        ),
    }
    for name, (spec, names) in entrypoints.items():
        cases[f"replay-{name}"] = Case(("replay", str(good), "--entrypoint", spec), names)
        out = str(d / f"test_{name}.py")
        cases[f"export-{name}"] = Case(
            ("export", "pytest", str(good), "--entrypoint", spec, "-o", out), names
        )
    replay = ("replay", str(good), "--entrypoint", ENTRYPOINT)
    cases["replay-unknown-mode"] = Case((*replay, "--mode", "fast"), "unknown replay mode 'fast'")
    cases["replay-derived-mode"] = Case((*replay, "--mode", "derived"), "'derived' is reserved")
    cases["replay-live-tool-not-live"] = Case(
        (*replay, "--allow-live-tool", "search_flights"),
        "--allow-live-tool only applies to --mode live",
    )
    cases["replay-hybrid-without-llm"] = Case(
        (*replay, "--mode", "hybrid"), "--mode hybrid needs --live-llm"
    )
    cases["replay-no-entrypoint"] = Case(
        ("replay", str(good)), "the following arguments are required: --entrypoint"
    )
    cases["no-such-command"] = Case(("frobnicate",), "invalid choice: 'frobnicate'")
    cases["export-no-kind"] = Case(("export",), "the following arguments are required: KIND")
    cases["export-unknown-approval"] = Case(
        (
            *("export", "pytest", str(good), "--entrypoint", ENTRYPOINT),
            *("--approve", "call-99", "-o", str(d / "x.py")),
        ),
        "--approve call-99: no such recorded call",
    )
    return cases


def _write_inputs(d: Path, bundles: Bundles) -> None:
    text = bundles.failure.read_text()
    (d / "empty.sftrace").write_text("")
    (d / "notes.txt").write_text("not a bundle\n")
    (d / "other.json").write_text('{"a": 1}\n')
    # (cut in one piece: a bundle written as its run went loads as far as it goes)
    whole = dump_trace(Trace.load(bundles.failure)).decode()
    (d / "truncated.sftrace").write_text(whole[: len(whole) // 2])
    newer = text.replace(f'"format_version":{FORMAT_VERSION}', '"format_version":99')
    assert newer != text
    (d / "newer.sftrace").write_text(newer)
    (d / "not_callable.py").write_text("run_agent = 42\n")
    (d / "raises_on_import.py").write_text("raise RuntimeError('boom')\n")
    (d / "imports_missing.py").write_text("import no_such_dependency_xyz\n")


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def outcomes(
    bundles: Bundles, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Outcome]]:
    d = tmp_path_factory.mktemp("bad_input")
    _write_inputs(d, bundles)
    cases = {n: c for n, c in _cases(d, bundles.failure).items() if n in SUBPROCESS_CASES}

    def run(args: tuple[str, ...]) -> Outcome:
        result = subprocess.run(
            [sys.executable, "-m", "stepfork_otel.cli", *args],
            cwd=d,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_SECONDS,
        )
        return Outcome(result.returncode, result.stdout, result.stderr)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run, case.args) for name, case in cases.items()}
        results = {name: future.result() for name, future in futures.items()}
    return d, results


CASE_NAMES = sorted(_cases(Path("/d"), Path("/g")))
#: Run as subprocesses too: each command, each kind of bad bundle, each entrypoint problem.
SUBPROCESS_CASES = {
    "replay-missing",
    "validate-directory",
    "export-truncated",
    "show-newer",
    "diff-a-text",
    "diff-b-json",
    "show-empty",
    *(n for n in CASE_NAMES if n.startswith("replay-") and not n.endswith(tuple(BAD_BUNDLES))),
    "export-no-module",
    "export-raises-on-import",
    "export-not-callable",
    "no-such-command",
}


def _check(case: Case, outcome: Outcome) -> None:
    assert outcome.returncode == 2, outcome
    assert outcome.stdout == ""
    assert outcome.stderr.count("\n") == 1, outcome.stderr
    prog = outcome.stderr.split(": error: ")[0]
    assert prog in ("stepfork", "stepfork replay", "stepfork export"), outcome.stderr
    assert "Traceback" not in outcome.stderr
    assert case.names in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("name", sorted(SUBPROCESS_CASES))
def test_bad_input_as_a_subprocess(name: str, outcomes: tuple[Path, dict[str, Outcome]]) -> None:
    _check(_cases(Path("/d"), Path("/g"))[name], outcomes[1][name])


@pytest.fixture(scope="module")
def in_process_dir(bundles: Bundles, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad_input_in_process")
    _write_inputs(d, bundles)
    return d


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if n not in ENTRYPOINT_CASES])
def test_bad_input_in_process(
    name: str, in_process_dir: Path, bundles: Bundles, capsys: pytest.CaptureFixture[str]
) -> None:
    case = _cases(in_process_dir, bundles.failure)[name]
    code = main(list(case.args))
    captured = capsys.readouterr()
    _check(case, Outcome(code, captured.out, captured.err))


def test_no_test_file_is_written_for_bad_input(outcomes: tuple[Path, dict[str, Outcome]]) -> None:
    directory, results = outcomes
    assert set(results) == SUBPROCESS_CASES
    assert sorted(p.name for p in directory.glob("test_*.py")) == []


def test_verbose_shows_the_traceback(tmp_path: Path, bundles: Bundles) -> None:
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('boom')\n")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "stepfork_otel.cli", "replay", str(bundles.failure)),
            *("--entrypoint", "raises_on_import:run", "--verbose"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert result.returncode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "RuntimeError: boom" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == (
        "stepfork: error: importing entrypoint module 'raises_on_import' raised RuntimeError: boom"
    )


def test_help_and_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stepfork_otel.cli", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert result.returncode == 0
    for command in ("replay", "validate", "export", "show", "diff"):
        assert command in result.stdout
    version = subprocess.run(
        [str(Path(sys.executable).parent / "stepfork"), "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert version.returncode == 0
    assert version.stdout.startswith("stepfork_otel ")
