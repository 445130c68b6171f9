"""Frozen means the whole process (issue 26): a frozen replay of an OpenAI Agents SDK agent whose
SDK exports its own traces from a background thread sends nothing -- not the LLM calls, not
``POST /v1/traces/ingest`` -- to the fake server, which keeps running and counting; the refused
exports are the session's divergences (tests/guard_agents.py)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from examples.fake_llm import FakeLLM

ROOT = Path(__file__).resolve().parent.parent
AGENT = Path(__file__).with_name("guard_agents.py")


def run(mode: str, bundle: Path, url: str, key: str) -> dict[str, Any]:
    out = bundle.with_suffix(f".{mode}.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT), GUARD_AGENTS_KEY=key)
    env.pop("OPENAI_AGENTS_DISABLE_TRACING", None)  # the SDK's tracing on, as by default
    done = subprocess.run(
        [sys.executable, str(AGENT), mode, str(bundle), str(out), url],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_a_frozen_replay_of_an_agents_sdk_agent_sends_nothing(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    key = "sk-test-" + secrets.token_hex(16)
    bundle = tmp_path / "agent.sftrace"
    with FakeLLM() as llm:
        recorded = run("record", bundle, llm.openai_url, key)
        paths = [request["path"] for request in llm.requests]
        assert "/v1/traces/ingest" in paths  # the SDK's exporter reaches the server unguarded
        assert "/v1/responses" in paths
        llm.requests.clear()  # the same server, running and counting
        replayed = run("replay", bundle, llm.openai_url, key)
        reached = [request["path"] for request in llm.requests]
    assert reached == []  # nothing at all, /v1/traces/ingest included
    assert replayed["result"] == recorded["result"]
    assert {action for _, action in replayed["calls"]} == {"substituted"}
    assert replayed["exporter_thread_refused"] is True
    refused = replayed["refusals"]
    assert refused
    assert {(r["host"], r["method"], r["path"]) for r in refused} == {
        ("127.0.0.1", "POST", "/v1/traces/ingest")
    }
    assert str(replayed["verified"]).startswith("ReplayMismatchError")
    assert "NetworkRefusedError" in replayed["verified"]
    assert key not in json.dumps(replayed)
