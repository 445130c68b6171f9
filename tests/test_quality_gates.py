"""The repository's quality gates run with the test suite: ruff (lint + format) and mypy --strict.

Ruff lints exactly the project's own paths, not the work tree: the quickstart has the reader save
files in the checkout's root (``replay_failure.py``, the exported ``test_failure.py``), and what a
reader writes there is not the project's code to gate."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

#: Every Python file of the project lives under one of these (pinned below against git).
PROJECT_PATHS = ("stepfork_otel", "tests", "benchmarks", "examples", "docs")


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True)


def ruff_check(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return _run("ruff", "check", *PROJECT_PATHS, cwd=root)


def ruff_format_check(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return _run("ruff", "format", "--check", *PROJECT_PATHS, cwd=root)


def test_ruff_lint() -> None:
    result = ruff_check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = ruff_format_check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gates_leave_the_readers_files_alone(tmp_path: Path) -> None:
    """A file the reader saved in the checkout's root (unused import, unformatted) fails neither
    gate; the same file inside a project path fails both."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path in PROJECT_PATHS:
        (tmp_path / path).mkdir()
        (tmp_path / path / "clean.py").write_text('"""Clean."""\n\nVALUE = 1\n')
    untidy = "import os\nx=1\n"
    (tmp_path / "replay_failure.py").write_text(untidy)
    assert ruff_check(tmp_path).returncode == 0, ruff_check(tmp_path).stdout
    assert ruff_format_check(tmp_path).returncode == 0, ruff_format_check(tmp_path).stdout

    (tmp_path / "examples" / "untidy.py").write_text(untidy)
    assert ruff_check(tmp_path).returncode != 0
    assert ruff_format_check(tmp_path).returncode != 0


def test_every_python_file_of_the_project_is_gated() -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "*.pyi"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    outside = [name for name in listed if name.split("/", 1)[0] not in PROJECT_PATHS]
    assert not outside, f"add their directory to PROJECT_PATHS: {outside}"
