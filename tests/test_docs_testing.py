"""``docs/testing.md`` shows real output: its agent and test are run here through the workflow
the page walks through (missing bundle, record once, replay, a changed prompt, re-record, diff)
and every pasted output must come out again (timings aside)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.fake_llm import FakeLLM

pytest.importorskip("openai")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "testing.md"
TIMING = re.compile(r"in \d+\.\d+s")


def blocks(language: str) -> list[str]:
    """The page's fenced blocks of ``language`` ("" for plain ones), in order."""
    found, current, fence_language = [], None, ""
    for line in PAGE.read_text().split("\n"):
        if line.startswith("```"):
            if current is None:
                current, fence_language = [], line[3:].strip()
            else:
                if fence_language == language:
                    found.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return found


def pasted_outputs() -> list[str]:
    """Each ``$ pytest``/``$ stepfork`` console block: (its last command, its output)."""
    outputs = []
    for block in blocks(""):
        lines = block.rstrip("\n").split("\n")
        if lines and lines[0].startswith("$ "):
            body = [line for line in lines if not line.startswith("$ ")]
            outputs.append("\n".join(body))
    return outputs


def normalised(text: str) -> str:
    return TIMING.sub("in <t>s", text.rstrip("\n"))


def run(project: Path, url: str, *args: str) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEPFORK_", "PYTEST_")) and k not in ("CI", "BUILD_NUMBER")
    }  # pytest shortens summary lines to the terminal width, except under CI
    env["FAKE_LLM_URL"] = url
    env["COLUMNS"] = "80"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout


def test_the_testing_page_output_is_what_the_workflow_prints(tmp_path: Path) -> None:
    agent, test = blocks("python")[:2]
    (tmp_path / "agent.py").write_text(agent)
    (tmp_path / "test_refund.py").write_text(test)
    nowhere = "http://127.0.0.1:9/v1"
    bundle = tmp_path / "bundles/test_refund/test_refund_agent.sftrace"
    got = [run(tmp_path, nowhere)]
    with FakeLLM() as llm:
        got.append(run(tmp_path, llm.openai_url, "--stepfork-record-mode=once"))
    got.append(run(tmp_path, nowhere))
    old = tmp_path / "old.sftrace"
    old.write_bytes(bundle.read_bytes())
    (tmp_path / "test_refund.py").write_text(test.replace("Refund order", "Please refund order"))
    got.append(run(tmp_path, nowhere))
    with FakeLLM() as llm:
        got.append(run(tmp_path, llm.openai_url, "--stepfork-record-mode=all"))
    diff = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepfork_otel.cli",
            "diff",
            str(old),
            str(bundle.relative_to(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    got.append(diff.stdout.replace(str(old), "/tmp/old.sftrace"))  # where the page saved it
    assert [normalised(o) for o in pasted_outputs()] == [normalised(g) for g in got]
