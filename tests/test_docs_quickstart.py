"""``docs/quickstart.md`` shows real output: the replay and export blocks are produced again here
(fingerprints and trace ids masked) and must appear in the page as pasted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

DOC = ROOT / "docs" / "quickstart.md"
ENTRYPOINT = "examples.booking_agent:run_agent"


def _mask(text: str) -> str:
    return re.sub(r"\b[0-9a-f]{12}…", "<hex>…", text)


def _stepfork(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "stepfork_otel.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout


def test_quickstart_outputs_are_real(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    for name in ("__init__.py", "booking_agent.py"):
        (project / "examples" / name).write_text((ROOT / "examples" / name).read_text())
    subprocess.run(
        [sys.executable, "examples/booking_agent.py"], cwd=project, check=True, capture_output=True
    )
    page = _mask(DOC.read_text(encoding="utf-8"))

    replayed = _stepfork(
        "replay", "examples/out/failure.sftrace", "--entrypoint", ENTRYPOINT, cwd=project
    )
    assert "result: reproduced the recorded failure (exit 0)" in replayed
    assert _mask(replayed).strip() in page

    exported = _stepfork(
        "export",
        "pytest",
        "examples/out/failure.sftrace",
        "--entrypoint",
        ENTRYPOINT,
        "-o",
        "test_failure.py",
        cwd=project,
    )
    assert exported.strip() in page
    generated = (project / "test_failure.py").read_text()
    test_function = generated[generated.index("@pytest.mark.stepfork_replay") :].strip()
    assert test_function in page

    agent = project / "examples" / "booking_agent.py"
    agent.write_text(
        agent.read_text().replace(
            "result: Any = search_flights(**args)",
            'result: Any = [f for f in search_flights(**args) if f["seats_left"] > 0]',
        )
    )
    diverged = _mask(
        _stepfork("replay", "examples/out/failure.sftrace", "--entrypoint", ENTRYPOINT, cwd=project)
    )
    matching = diverged[diverged.index("2. Dependency-call matching") :].strip()
    assert matching in page
