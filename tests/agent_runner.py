"""Run an agent scenario in a fresh process, recording it or replaying its bundle: the shared
``main`` of ``tests/sdk_agents.py`` and ``tests/framework_agents.py``, and the tests' side.

``python tests/<agents>.py SCENARIO record|replay BUNDLE OUT.json URL`` writes ``OUT.json``:
``{"result": what the scenario returned, "calls": [[kind, action], ...] (replay only),
"extra": what the scenario module adds}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main(
    argv: list[str],
    scenarios: dict[str, Callable[[str], Any]],
    extra: Callable[[], Any] = lambda: None,
) -> int:
    scenario, mode, bundle, out, url = argv
    import stepfork_otel
    from stepfork_otel import ReplaySession, record

    stepfork_otel.instrument_openai()
    stepfork_otel.instrument_anthropic()
    run = scenarios[scenario]
    result: dict[str, Any] = {}
    if mode == "record":
        with record(bundle):
            result["result"] = run(url)
    else:
        with ReplaySession.from_trace(bundle) as session:
            result["result"] = run(url)
            session.verify_complete()
        result["calls"] = [[call.kind, call.action] for call in session.calls]
    result["extra"] = extra()
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


def run_agent(
    script: Path, scenario: str, mode: str, bundle: Path, url: str, name: str | None = None
) -> dict[str, Any]:
    """Run ``script`` in a fresh process; its ``OUT.json`` sits beside the bundle (``name``: its
    name, when ``mode`` does not make a file name)."""
    out = bundle.with_suffix(f".{mode}.json") if name is None else bundle.with_name(f"{name}.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENAI_AGENTS_DISABLE_TRACING="1")
    env.pop("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", None)
    done = subprocess.run(
        [sys.executable, str(script), scenario, mode, str(bundle), str(out), url],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result
