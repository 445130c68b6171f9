"""``docs/cli.md`` shows real output: every shell session on the page is run, in page order, in
one project directory as the page describes it -- the example agent's ``examples/`` with the
bundles ``python examples/booking_agent.py`` writes -- and what each command prints (stdout and
stderr, as a terminal shows them) must be what the page shows under it, then ``[exit N]``.

How the page is read:

- a shell session is an untyped fenced block whose first line is a ``$ `` command; each command is
  followed by its output, a ``...`` line standing for any number of lines. Trace ids (in ``trace
  <12 hex>…``, ``"trace_id"`` and bundle file names), durations and pytest's timing are masked on
  both sides; fingerprints are not (they are of the payloads, the same in every recording);
- ``[exit N]`` after a command's output is its exit status, and is checked;
- ``stepfork`` and ``python`` are this checkout's (``python -m stepfork_otel.cli``), and the
  project has its ``pyproject.toml`` (pytest's settings);
- a python block marked ``<!-- snippet: file=NAME -->`` is saved as ``NAME`` first (the page tells
  the reader to save it), and the python block right after ``The file it wrote:`` must be the
  test ``stepfork export pytest`` wrote (trace id masked);
- a session the page marks ``<!-- transcript: not run (why) -->`` on the line before it is not
  run (an interactive one: ``tests/test_cli_replay.py`` answers its questions on a terminal).
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import HANG_GUARD_SECONDS
from conftest import ROOT
from test_docs_quickstart import lines_match, run_shell, session
from test_docs_snippets import Block, parse_blocks

PAGE = ROOT / "docs" / "cli.md"
_NOT_RUN = re.compile(r"^\s*<!--\s*transcript:\s*not run\b.*-->\s*$")
_EXIT = re.compile(r"^\[exit (\d+)\]$")
_MASKS = (
    (re.compile(r"\btrace [0-9a-f]{12}…"), "trace <trace id>…"),
    (re.compile(r'"trace_id": "[0-9a-f]{32}"'), '"trace_id": "<trace id>"'),
    (re.compile(r"\b[0-9a-f]{32}(?=\.sftrace)"), "<trace id>"),
    (re.compile(r"\b\d+(?:\.\d+)? (?:ms|µs|s)\b"), "<duration>"),
    (re.compile(r'"duration_ns": \d+'), '"duration_ns": <duration>'),
    (re.compile(r"\bin \d+\.\d+s\b"), "in <duration>"),
)


def _mask(text: str) -> list[str]:
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return [line.rstrip() for line in text.rstrip("\n").splitlines()] if text.strip() else []


def _sessions() -> list[Block]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    return [
        block
        for block in parse_blocks(PAGE)
        if block.lang == ""
        and block.source.startswith("$ ")
        and not _NOT_RUN.match(lines[block.line - 2] if block.line > 1 else "")
    ]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The project directory the page's commands run in, and their environment."""
    base = tmp_path_factory.mktemp("cli_page")
    (base / "examples").mkdir()
    for source in (ROOT / "examples").glob("*.py"):
        (base / "examples" / source.name).write_bytes(source.read_bytes())
    (base / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())  # pytest's set-up
    bin_dir = tmp_path_factory.mktemp("bin")
    for name, command in (
        ("stepfork", f'exec "{sys.executable}" -m stepfork_otel.cli "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{command}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "STEPFORK_", "PYTEST_"))
        and k not in ("CI", "BUILD_NUMBER", "NO_COLOR", "PYTHONIOENCODING")
    }  # (pytest shortens summary lines to the terminal width, except under CI)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",  # stdout and stderr interleaved as a terminal shows them
        PYTHONDONTWRITEBYTECODE="1",
        COLUMNS="80",
    )
    for block in parse_blocks(PAGE):  # the files the page tells the reader to save
        if block.tokens.get("file"):
            (base / (block.tokens["file"] or "")).write_text(block.source, encoding="utf-8")
    ran = subprocess.run(
        ["python", "examples/booking_agent.py"],
        cwd=base,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_SECONDS,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return base, env


def _exported_test_shown() -> str:
    """The python block the page shows as the file ``stepfork export pytest`` wrote."""
    page = PAGE.read_text(encoding="utf-8")
    after = page.split("The file it wrote:", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_page_shows_what_the_commands_print(project: tuple[Path, dict[str, str]]) -> None:
    directory, env = project
    failures: list[str] = []
    ran = 0
    for block in _sessions():
        for command, shown in session(block):
            expected = shown.splitlines()
            code: int | None = None
            if expected and (exit_line := _EXIT.match(expected[-1])):
                code, expected = int(exit_line.group(1)), expected[:-1]
            result = run_shell(command, directory, env)
            ran += 1
            printed, wanted = _mask(result.stdout), _mask("\n".join(expected))
            if lines_match(wanted, printed) and code in (None, result.returncode):
                continue
            diff = "\n".join(difflib.unified_diff(wanted, printed, "page", "printed", lineterm=""))
            failures.append(
                f"{block.key}: $ {command}\n[exit {result.returncode}, page: {code}]\n{diff}"
            )
    assert ran >= 30, f"only {ran} commands found on the page"
    assert not failures, "\n\n".join(failures)
    written = (directory / "tests" / "test_replay_failure.py").read_text(encoding="utf-8")
    trace_id = re.compile(r"\(trace [0-9a-f]{12}\\u2026\)")
    assert trace_id.sub("(trace …)", written) == trace_id.sub("(trace …)", _exported_test_shown())


def test_masks_hide_trace_ids_and_timings_not_fingerprints() -> None:
    assert _mask("run x  ok  1.1 ms\n  trace 290b41fef871… · format 4") == _mask(
        "run x  ok  756 µs\n  trace 0123456789ab… · format 4"
    )
    assert _mask('"trace_id": "' + "a" * 32 + '", "duration_ns": 5') == _mask(
        '"trace_id": "' + "b" * 32 + '", "duration_ns": 7'
    )
    assert _mask("sha256 3a95c0f3af5f…") != _mask("sha256 0123456789ab…")
