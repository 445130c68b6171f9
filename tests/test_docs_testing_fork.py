"""``docs/testing.md``'s fork section shows real output: its agent and parametrised fork test are
saved as the page says and run through its commands against the loopback fake server, and the
pasted console block must come out again (timings and trace ids aside)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_docs_snippets import parse_blocks

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

pytest.importorskip("openai")

PAGE = ROOT / "docs" / "testing.md"
SECTION = "## Forking a recorded run onto other models"


def _section_blocks() -> tuple[str, str, str]:
    """The section's agent, test, and console block."""
    start = PAGE.read_text(encoding="utf-8").splitlines().index(SECTION) + 1
    blocks = [b for b in parse_blocks(PAGE) if b.line > start]
    support, test, console = blocks[:3]
    assert support.source.startswith("# support.py\n")
    assert test.source.startswith("# test_support.py\n")
    assert console.lang == "console"
    return support.source, test.source, console.source


def _normalised(text: str) -> str:
    text = re.sub(r"in \d+\.\d+s", "in <t>s", text)
    return re.sub(r"\b[0-9a-f]{12}…", "<id>…", text).rstrip("\n")


def test_the_fork_section_output_is_what_its_commands_print(tmp_path: Path) -> None:
    support, test, console = _section_blocks()
    (tmp_path / "support.py").write_text(support)
    (tmp_path / "test_support.py").write_text(test)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEPFORK_", "PYTEST_")) and k not in ("CI", "BUILD_NUMBER")
    }
    env.update(COLUMNS="80", PYTHONPATH=str(ROOT))
    commands = [line[2:] for line in console.splitlines() if line.startswith("$ ")]
    assert commands == [
        "pytest -q --stepfork-record-mode=once test_support.py::test_support_agent",
        "pytest -q test_support.py",
        "stepfork diff forks/gpt-4o-mini.sftrace forks/gpt-4.1.sftrace",
    ]
    printed: list[str] = []
    with FakeLLM() as llm:
        env["FAKE_LLM_URL"] = llm.openai_url
        for command in commands:
            program, *args = command.split()
            argv = (
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
                if program == "pytest"
                else [sys.executable, "-m", "stepfork_otel.cli", *args]
            )
            done = subprocess.run(
                argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
            )
            printed += [f"$ {command}", done.stdout.rstrip("\n")]
        answered = [r["body"]["model"] for r in llm.requests]
    assert _normalised("\n".join(printed)) == _normalised(console)
    # recorded: calls 1 and 3 on gpt-4o; each fork sent only its answer, to its model
    assert answered == ["gpt-4o", "gpt-4o", "gpt-4o-mini", "gpt-4.1"]
    recorded = Trace.load(tmp_path / "bundles/test_support/test_support_agent.sftrace")
    for model in ("gpt-4o-mini", "gpt-4.1"):
        fork = Trace.load(tmp_path / f"forks/{model}.sftrace")
        assert fork.forked_from is not None
        assert fork.forked_from.trace_id == recorded.trace_id
        assert fork.events[:4] == recorded.events[:4]  # calls 1 and 2, with their outcomes
