"""Concurrent calls with the real ``openai`` SDK against the loopback fake server: 20 calls fanned
out with ``asyncio.gather`` (and with a thread pool), each after a random wait, then a call that
uses all their answers -- recorded, then replayed frozen in a fresh process with the server
stopped, ten times in a row, each replay starting the calls in another order (another seed). And
an agent that changes one of the concurrent inputs still fails precisely."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_runner import ROOT, run_agent

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

pytest.importorskip("openai")

AGENTS = Path(__file__).with_name("concurrent_agents.py")
N = 20
SEEDS = range(1, 11)


def _concurrent_server() -> FakeLLM:
    """The fake server, answering the N fanned-out questions only once all N have arrived: the
    recorded calls overlap by construction, whatever the machine's load."""
    llm = FakeLLM()
    llm._server.socket.listen(4 * N)  # (its default backlog of 5 would drop connections)
    barrier = threading.Barrier(N)
    answer = llm._answer

    def answer_together(handler: Any, path: str, body: dict[str, Any]) -> None:
        last = (body.get("messages") or [{}])[-1].get("content", "")
        if str(last).startswith("question"):
            barrier.wait(timeout=60)
        answer(handler, path, body)

    llm._answer = answer_together  # type: ignore[method-assign]
    return llm


def _record(scenario: str, tmp_path: Path) -> tuple[dict[str, Any], Path, str]:
    bundle = tmp_path / f"{scenario}.sftrace"
    with _concurrent_server() as llm:
        url = llm.openai_url
        recorded = run_agent(AGENTS, scenario, "record", bundle, url)
        assert len(llm.requests) == N + 1
    return recorded, bundle, url


def _replay_seeds(scenario: str, bundle: Path, url: str) -> list[dict[str, Any]]:
    """Replay ``bundle`` once per seed in one fresh process (a new session each time)."""
    out = bundle.with_suffix(".seeds.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    seeds = ",".join(str(s) for s in SEEDS)
    args = [
        sys.executable,
        str(AGENTS),
        scenario,
        "replay-seeds",
        str(bundle),
        str(out),
        url,
        seeds,
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    runs: list[dict[str, Any]] = json.loads(out.read_text())
    return runs


@pytest.mark.parametrize("scenario", ["openai_gather", "openai_threads"])
def test_20_concurrent_sdk_calls_replay_frozen_in_any_start_order(
    scenario: str, tmp_path: Path
) -> None:
    recorded, bundle, url = _record(scenario, tmp_path)
    trace = Trace.load(bundle)
    assert len(trace.calls) == N + 1
    assert recorded["result"]["answers"] == [f"You said: question {i}" for i in range(N)]
    fanned = [c for c in trace.calls if '"content":"question' in (c.input or "")]
    assert len(fanned) == N
    ends = {e.parent_id: e.time_unix_nano for e in trace.events if e.type == "llm_response"}
    assert max(c.time_unix_nano for c in fanned) < min(ends[c.id] for c in fanned)
    replays = _replay_seeds(scenario, bundle, url)  # the server is stopped: no request can pass
    assert len(replays) == len(SEEDS)
    for replayed in replays:  # each with verify_complete() passed
        assert replayed["result"] == recorded["result"]
        assert replayed["calls"] == [["llm", "substituted"]] * (N + 1)
    orders = {tuple(recorded["extra"])} | {tuple(r["started"]) for r in replays}
    assert len(orders) > 5  # the replays really started the calls in other orders


def test_a_changed_concurrent_input_fails_naming_the_call_and_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, bundle, url = _record("openai_gather", tmp_path)
    trace = Trace.load(bundle)
    recorded_7 = next(c for c in trace.calls if '"question 7"' in (c.input or ""))
    monkeypatch.setenv("STEPFORK_TEST_SEED", "4")
    monkeypatch.setenv("STEPFORK_TEST_CHANGE", "7")
    with pytest.raises(AssertionError) as failed:  # the replay process exits with the error
        run_agent(AGENTS, "openai_gather", "replay", bundle, url)
    message = str(failed.value)
    assert "ReplayMismatchError" in message
    assert "input differs from the recording" in message
    assert f"the nearest is {recorded_7.id}" in message
    assert (
        'first differing path: body.messages[0].content: recorded "question 7", '
        'this run "question 7 (changed)"'
    ) in message


def _parallel_tool_server() -> FakeLLM:
    """The fake server, asking for the five tool calls at once when no tool result is in."""
    llm = FakeLLM()
    chat = llm._chat

    def parallel(handler: Any, body: dict[str, Any]) -> None:
        if not body.get("tools") or any(m.get("role") == "tool" for m in body["messages"]):
            chat(handler, body)
            return
        calls = [
            {
                "id": f"call_{city}",
                "type": "function",
                "function": {"name": "weather", "arguments": json.dumps({"city": city})},
            }
            for city in ["Paris", "Rome", "Oslo", "Lima", "Kyoto"]
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}
        completion = {
            "id": "chatcmpl-parallel",
            "object": "chat.completion",
            "created": 1700000000,
            "model": body.get("model", ""),
            "choices": [choice],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }
        llm._send_json(handler, 200, completion)

    llm._chat = parallel  # type: ignore[method-assign]
    return llm


def test_parallel_tool_calls_inside_pydantic_ai_replay_frozen_in_any_order(
    tmp_path: Path,
) -> None:
    pytest.importorskip("pydantic_ai")
    scenario = "pydantic_ai_parallel_tools"
    bundle = tmp_path / f"{scenario}.sftrace"
    with _parallel_tool_server() as llm:
        url = llm.openai_url
        recorded = run_agent(AGENTS, scenario, "record", bundle, url)
        assert len(llm.requests) == 2
    trace = Trace.load(bundle)
    tools = [c for c in trace.calls if c.type == "tool_call"]
    ends = {e.parent_id: e.time_unix_nano for e in trace.events if e.type == "tool_result"}
    assert len(tools) == 5
    assert max(c.time_unix_nano for c in tools) < min(ends.values())  # all open together
    replays = _replay_seeds(scenario, bundle, url)
    for replayed in replays:
        assert replayed["result"] == recorded["result"]
        assert sorted(replayed["calls"]) == sorted(
            [["llm", "substituted"]] * 2 + [["tool", "substituted"]] * 5
        )
    orders = {tuple(recorded["extra"])} | {tuple(r["started"]) for r in replays}
    assert len(orders) > 3
