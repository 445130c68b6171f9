"""``examples/openai_agent.py`` runs offline as a new user runs it, and ``docs/integrations.md``
shows exactly what it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stepfork_otel import Trace

pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parent.parent


def documented_output() -> str:
    page = (ROOT / "docs" / "integrations.md").read_text()
    match = re.search(r"<!-- output: examples/openai_agent.py -->\n```\n(.*?)```", page, re.S)
    assert match is not None, "docs/integrations.md lost the example's output block"
    return match.group(1)


def test_the_example_records_and_replays_and_prints_what_the_docs_show(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_agent.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == documented_output()
    trace = Trace.load(tmp_path / "openai_agent.sftrace")
    assert [e.type for e in trace.events].count("llm_request") == 2
    assert "sk-example-not-a-key" not in (tmp_path / "openai_agent.sftrace").read_text()
