"""``docs/testing.md`` tells a reader without an API key how to follow it: its
``record_offline.py`` records the page's test against ``examples/fake_llm.py``, and without it
(no ``FAKE_LLM_URL``, no network) the record step fails as the page says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_docs_snippets import Block, parse_blocks

pytest.importorskip("openai")

PAGE = ROOT / "docs" / "testing.md"


def _python_blocks() -> list[Block]:
    return [b for b in parse_blocks(PAGE) if b.is_python]


def _project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    agent, test, *rest = _python_blocks()
    (offline,) = [b for b in rest if b.source.startswith("# record_offline.py")]
    (tmp_path / "agent.py").write_text(agent.source)
    (tmp_path / "test_refund.py").write_text(test.source)
    (tmp_path / "record_offline.py").write_text(offline.source)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STEPFORK_", "PYTEST_", "OPENAI_", "FAKE_LLM_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *sys.path[1:2]])  # the checkout, as it says
    return tmp_path, env


@pytest.mark.slow
def test_record_offline_records_the_bundle(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    done = subprocess.run(
        [sys.executable, "record_offline.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 recorded" in done.stdout
    assert (project / "bundles/test_refund/test_refund_agent.sftrace").is_file()


@pytest.mark.slow
def test_without_a_key_or_the_fake_the_record_step_fails_as_the_page_says(
    tmp_path: Path,
) -> None:
    project, env = _project(tmp_path)
    env["OPENAI_BASE_URL"] = "http://127.0.0.1:9/v1"  # the real API, unreachable (offline)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--stepfork-record-mode=once"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "openai.APIConnectionError" in done.stdout
    assert "`APIConnectionError`" in PAGE.read_text(encoding="utf-8")
