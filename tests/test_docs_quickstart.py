"""``docs/quickstart.md`` followed literally, top to bottom, in a fresh checkout: every shell
command on the page is run, in order, in ``bash`` from the checkout's root, and what it prints
(stdout and stderr, as a terminal shows them) must be what the page shows under it.

How the page is read:

- a shell session is a fenced block (``console``, ``sh``, ``bash`` or untyped) of ``$ `` lines
  (commands, ``\\`` continues one) each followed by its output; a ``...`` line in the output
  stands for any number of lines. No output shown means the command prints nothing. Trace ids
  (12 hex digits and ``…``) and timings are masked on both sides;
- ``. .venv/bin/activate`` is sourced before every later command, as in the reader's shell (the
  venv's ``bin`` is taken off ``PATH`` first, so a page that forgets it fails);
- the first command is the README's set-up command. Creating a venv and ``pip install`` need the
  network, so the checkout's ``.venv`` is a link to the virtual environment running the tests
  and only the part after the last `` && `` is run;
- a ``diff`` block is an edit of the file the last ``cp`` on the page created;
- a python block marked ``<!-- snippet: file=NAME -->`` is saved as ``NAME`` (the page tells the
  reader to save it); other python blocks are run by ``test_docs_snippets.py``.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_docs_snippets import Block, parse_blocks

DOC = ROOT / "docs" / "quickstart.md"
README = ROOT / "README.md"
SHELLS = {"console", "sh", "bash", "shell", ""}
TIMEOUT_SECONDS = 600  # a hang guard: a command takes seconds, ten times that under load
SETUP_COMMANDS = [
    'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" && '
    ".venv/bin/python examples/booking_agent.py",
    ".venv/bin/python -m pytest -n 2",
]
ACTIVATE = ". .venv/bin/activate"


def _mask(text: str) -> str:
    text = re.sub(r"\b[0-9a-f]{12}…", "<hex>…", text)
    text = re.sub(r"\b\d+(?:\.\d+)? (?:ms|µs|s)\b", "<duration>", text)
    return re.sub(r"\bin \d+\.\d+s\b", "in <duration>", text)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip("\n").splitlines()] if text.strip() else []


def output_matches(expected: str, actual: str) -> bool:
    """`actual` is `expected` (masked), as :func:`lines_match` compares them."""
    return lines_match(_lines(_mask(expected)), _lines(_mask(actual)))


def lines_match(shown: list[str], printed: list[str]) -> bool:
    """`printed` is `shown`, line for line, where a `...` line of `shown` stands for any number
    of lines."""
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line == "..." else re.escape(line) + r"\n" for line in shown
    )
    return re.fullmatch(pattern, "".join(line + "\n" for line in printed)) is not None


def run_shell(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``script`` in ``bash``, its stdout and stderr together as a terminal shows them."""
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )


def session(block: Block) -> list[tuple[str, str]]:
    """The (command, output shown) pairs of a shell block."""
    pairs: list[tuple[list[str], list[str]]] = []
    continued = False
    for line in block.source.rstrip("\n").splitlines():
        if continued:
            pairs[-1][0].append(line)
        elif line.startswith("$ "):
            pairs.append(([line[2:]], []))
        else:
            assert pairs, f"{block.key}: output before any `$ ` command"
            pairs[-1][1].append(line)
        continued = line.endswith("\\") and not pairs[-1][1]
    return [("\n".join(command), "\n".join(output)) for command, output in pairs]


def _shell_env() -> dict[str, str]:
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "STEPFORK_", "PYTEST_")) and k != "VIRTUAL_ENV"
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1", COLUMNS="80")
    return env


def _checkout(tmp_path: Path) -> Path:
    """A fresh checkout as far as the page can tell: the example, the project's pytest settings
    and a `.venv` (the one running these tests). No `examples/out/` yet."""
    if not (Path(sys.prefix) / "bin" / "activate").is_file():
        pytest.skip("the quickstart is followed in a virtual environment (see README.md)")
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    for source in (ROOT / "examples").glob("*.py"):
        shutil.copy(source, checkout / "examples" / source.name)
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    (checkout / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return checkout


def test_readme_starts_with_the_setup_commands() -> None:
    """`.ci/run` and CI rely on the README's two commands; the activation line follows them."""
    blocks = parse_blocks(README)
    assert blocks[0].source.splitlines() == SETUP_COMMANDS
    after = README.read_text(encoding="utf-8").split("```", 2)[2].split("```")[0]
    assert ACTIVATE in after, "README.md: say to activate the venv right after the set-up commands"


def test_quickstart_followed_literally(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    env = _shell_env()
    page = DOC.read_text(encoding="utf-8")
    activated = False
    copied: Path | None = None
    ran: list[str] = []
    for block in parse_blocks(DOC):
        if block.lang == "diff":
            assert copied is not None, f"{block.key}: an edit before any `cp`"
            lines = block.source.splitlines()
            old = "\n".join(line[1:] for line in lines if line.startswith("-"))
            new = "\n".join(line[1:] for line in lines if line.startswith("+"))
            text = copied.read_text(encoding="utf-8")
            assert text.count(old) == 1, f"{block.key}: {old!r} is not once in {copied.name}"
            copied.write_text(text.replace(old, new), encoding="utf-8")
            continue
        if block.is_python:
            if block.tokens.get("file"):
                (checkout / (block.tokens["file"] or "")).write_text(block.source)
            continue
        if block.lang not in SHELLS:
            continue
        assert block.source.startswith("$ "), (
            f"{block.key}: a shell block without `$ ` prompts (commands cannot be told from "
            "output) or an output block without its command"
        )
        for command, shown in session(block):
            script = command
            if not ran:
                assert command == SETUP_COMMANDS[0], "the quickstart starts as README.md does"
                script = command.rsplit(" && ", 1)[1]  # no venv creation, no pip (offline)
            if activated:
                script = f"{ACTIVATE}\n{script}"
            if command == ACTIVATE:
                activated = True
            if command.startswith("cp "):
                copied = checkout / shlex.split(command)[-1]
            result = run_shell(script, checkout, env)
            ran.append(command)
            if not output_matches(shown, result.stdout):
                diff = "\n".join(
                    difflib.unified_diff(
                        _lines(_mask(shown)),
                        _lines(_mask(result.stdout)),
                        "the page",
                        "this run",
                        lineterm="",
                    )
                )
                pytest.fail(f"{block.key}: $ {command}\nexit {result.returncode}\n{diff}")

    assert activated, "the page never activates the venv, yet runs `stepfork`"
    assert any(c.startswith("stepfork export pytest") for c in ran)
    generated = (checkout / "test_failure.py").read_text(encoding="utf-8")
    test_function = generated[generated.index("@pytest.mark.stepfork_replay") :].strip()
    assert test_function in page, "the generated test shown in §5 is not the one written"


def test_output_matching_elides_only_whole_lines() -> None:
    assert output_matches("a\n...\nd", "a\nb\nc\nd\n")
    assert output_matches("a\n...\nd", "a\nd")
    assert output_matches("...\nc\n...", "a\nb\nc\nd")
    assert not output_matches("a\nd", "a\nb\nd")
    assert not output_matches("a\n...", "b\na")
    assert not output_matches("", "printed something")
    assert output_matches("run 1.3 ms  trace 85ff48f8758f…", "run 0.9 ms  trace 0123456789ab…")
