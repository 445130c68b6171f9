"""Forking with the real ``openai`` and ``anthropic`` SDKs (``instrument_openai()`` /
``instrument_anthropic()``, streams included) against the loopback fake server, each step in a
fresh process as a user would run it: record a three-LLM-call tool loop; fork it at the second LLM
call (call 3) onto another model -- the calls before it are not sent (the server counts), the
later ones are; the fork's bundle replays frozen on its own with the server stopped; a changed
prefix raises before the fork point and sends nothing; a ``forbidden`` tool after the fork point
is refused. And in process: the network guard covers the frozen prefix and is lifted only for the
live part."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from agent_runner import run_agent
from conftest import Recording
from test_replay_network import _from_a_plain_thread

from examples.fake_llm import FakeLLM
from stepfork_otel import (
    NetworkRefusedError,
    ReplaySession,
    Trace,
    instrument_openai,
    record,
    uninstrument_openai,
)

pytest.importorskip("openai")
pytest.importorskip("anthropic")

AGENTS = Path(__file__).with_name("fork_agents.py")
ANSWER_MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}


def run_fork_agent(agent: str, action: str, bundle: Path, url: str, name: str) -> dict[str, Any]:
    """``tests/fork_agents.py`` in a fresh process: what it wrote to ``<name>.json``."""
    return run_agent(AGENTS, agent, action, bundle, url, name)


def fork_served(agent: str, bundle: Path, options: str, name: str) -> tuple[dict[str, Any], int]:
    """Fork ``bundle`` (``fork:<options>``) against a fresh fake server: what the agent wrote,
    and how many requests reached the server."""
    with FakeLLM() as llm:
        result = run_fork_agent(agent, f"fork:{options}", bundle, url_of(llm, agent), name)
        return result, len(llm.requests)


def url_of(llm: FakeLLM, agent: str) -> str:
    return llm.openai_url if agent == "openai" else llm.anthropic_url


@pytest.fixture(scope="module", params=["openai", "anthropic"])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The agent's run recorded against the fake server: (agent, bundle, what it returned)."""
    agent: str = request.param
    bundle = tmp_path_factory.mktemp(agent) / "trip.sftrace"
    with FakeLLM() as llm:
        result = run_fork_agent(agent, "record", bundle, url_of(llm, agent), "record")
        assert len(llm.requests) == 3  # calls 1, 3 and 4; call 2 is the tool
    return agent, bundle, result["result"]


@pytest.fixture(scope="module")
def fork_run(recorded: Any) -> Any:
    """The recorded run forked at call 3 onto the answer model (server up): (agent, bundle,
    what the recorded run returned, the fork's bundle, what the fork wrote, the models the
    server was asked for, the stopped server's URL)."""
    agent, bundle, original = recorded
    fork_path = bundle.with_name("fork.sftrace")
    model = ANSWER_MODEL[agent]
    with FakeLLM() as llm:
        url = url_of(llm, agent)
        result = run_fork_agent(
            agent, f"fork:at=3,to={fork_path},model={model}", bundle, url, "fork"
        )
        sent = [r["body"]["model"] for r in llm.requests]
    return agent, bundle, original, fork_path, result, sent, url


def test_a_fork_sends_only_the_calls_from_the_fork_point(fork_run: Any) -> None:
    agent, bundle, original, fork_path, forked, sent, _ = fork_run
    model = ANSWER_MODEL[agent]
    assert "raised" not in forked, forked
    assert sent == [model, model]  # call 1 was served from the recording, never sent
    result = forked["result"]
    assert result["models"][0] == original["models"][0]  # what the recording answered
    assert set(result["models"][1:]) == {model}  # the new model answered from the fork point
    assert result["stream"] == original["stream"]  # the SDK's own stream types, live
    assert forked["calls"] == [
        ["llm", "substituted", "call-1"],
        ["tool", "substituted", "call-2"],
        ["llm", "executed", None],
        ["llm", "executed", None],
    ]
    assert forked["fork_bundle"] == str(fork_path)
    trace, origin = Trace.load(fork_path), Trace.load(bundle)
    assert trace.forked_from is not None
    assert (trace.forked_from.trace_id, trace.forked_from.at_call) == (origin.trace_id, 3)
    assert [getattr(c, "model", None) for c in trace.calls] == [
        origin.calls[0].model,  # type: ignore[union-attr]
        None,
        model,
        model,
    ]
    assert trace.run.output == json.dumps(result["answer"])
    assert "NOTAREALKEY" not in fork_path.read_text()


def test_the_fork_bundle_replays_frozen_on_its_own(fork_run: Any) -> None:
    agent, _, _, fork_path, forked, _, url = fork_run
    model = ANSWER_MODEL[agent]
    # the server is stopped: a request would fail (and the network guard refuses it first)
    replayed = run_fork_agent(agent, f"replay:model={model}", fork_path, url, "replay")
    assert "raised" not in replayed, replayed
    assert replayed["result"] == forked["result"]
    assert replayed["calls"] == [
        ["llm", "substituted", "call-1"],
        ["tool", "substituted", "call-2"],
        ["llm", "substituted", "call-3"],
        ["llm", "substituted", "call-4"],
    ]


def test_a_changed_prefix_raises_before_the_fork_point(recorded: Any) -> None:
    agent, bundle, _ = recorded
    fork_path = bundle.with_name("lyon.sftrace")
    forked, sent = fork_served(agent, bundle, f"at=3,to={fork_path},city=Lyon", "lyon")
    assert sent == 0
    name, position, reason, details = forked["raised"]
    assert (name, position) == ("ReplayMismatchError", 1)
    assert reason.startswith("input differs from the recording")
    assert "the fork point was not reached" in details[-1]
    assert forked["calls"] == [["llm", "rejected", None]]
    assert forked["fork_bundle"] is None
    assert not fork_path.exists()


def test_a_forbidden_tool_after_the_fork_point_is_refused(recorded: Any) -> None:
    agent, bundle, _ = recorded
    fork_path = bundle.with_name("notify.sftrace")
    forked, sent = fork_served(
        agent, bundle, f"at=3,to={fork_path},notify=1,allow=notify", "notify"
    )
    assert sent == 2
    name, position, reason, _ = forked["raised"]
    assert (name, position) == ("ReplayPolicyError", 5)
    assert reason.startswith("tool notify has replay policy 'forbidden': after the fork point")
    assert forked["calls"][-1] == ["tool", "rejected", None]
    trace = Trace.load(fork_path)  # the fork ran from its fork point: kept, as it failed
    assert trace.run.error_type == "stepfork_otel.replay.errors.ReplayPolicyError"


# --- the network guard ---------------------------------------------------------------------------


def test_the_network_guard_covers_the_prefix_and_lifts_only_for_the_live_part(
    recording: Recording, tmp_path: Path
) -> None:
    import openai

    instrument_openai()
    try:
        with FakeLLM() as llm:
            client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)
            models = f"{llm.openai_url}/models"

            def peek() -> None:  # traffic no boundary serves
                urllib.request.urlopen(models, timeout=5).close()

            def ask(model: str, text: str) -> str:
                reply = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": text}]
                )
                return reply.model

            path = tmp_path / "two.sftrace"
            with record(path):
                ask("gpt-4o", "first")
                ask("gpt-4o", "second")
            llm.requests.clear()
            with ReplaySession.from_trace(path, fork_at=2) as fork:
                # the frozen prefix: nothing goes out, from any thread of the process
                with pytest.raises(NetworkRefusedError):
                    peek()
                assert isinstance(_from_a_plain_thread(peek), NetworkRefusedError)
                assert ask("gpt-4o", "first") == "gpt-4o"  # substituted: the fork point next
                # the live part: the call's own request goes out...
                assert ask("gpt-4o-mini", "second") == "gpt-4o-mini"
                # ...traffic no boundary serves is still refused in the session's context, as in
                # live mode, and threads that do not carry the session are no longer guarded
                with pytest.raises(NetworkRefusedError):
                    peek()
                assert _from_a_plain_thread(peek) is None
            assert [r["path"] for r in llm.requests] == ["/v1/chat/completions", "/v1/models"]
            assert [c.action for c in fork.calls] == ["substituted", "executed"]
    finally:
        uninstrument_openai()


def test_a_framework_agent_forks_with_no_framework_code(tmp_path: Path) -> None:
    """pydantic-ai on the OpenAI SDK (``tests/framework_agents.py``): its tool loop, forked at
    its second model request, in fresh processes."""
    pytest.importorskip("pydantic_ai")
    path, fork_path = tmp_path / "pai.sftrace", tmp_path / "pai-fork.sftrace"
    with FakeLLM() as llm:
        recorded = run_fork_agent("pydantic_ai", "record", path, llm.openai_url, "record")
        assert len(llm.requests) == 2
        llm.requests.clear()
        forked = run_fork_agent(
            "pydantic_ai", f"fork:at=3,to={fork_path}", path, llm.openai_url, "fork"
        )
        assert len(llm.requests) == 1  # only the request from the fork point went out
    assert "raised" not in forked, forked
    assert forked["result"]["answer"] == recorded["result"]["answer"]
    assert recorded["result"]["tool_ran"] == ["Paris"]
    assert forked["result"]["tool_ran"] == []  # the tool, before the fork point, was served
    assert [c[1] for c in forked["calls"]] == ["substituted", "substituted", "executed"]
    assert Trace.load(fork_path).events[:4] == Trace.load(path).events[:4]
