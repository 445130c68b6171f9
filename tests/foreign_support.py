"""What the import tests of other instrumentations' spans share (``tests/test_import_*.py``):
running ``tests/foreign_agents.py`` in its own process, tracing an agent with an instrumentation
and importing its spans with the ``stepfork import`` command, and the docs' pasted outputs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli_support import stepfork
from otlp_receiver import running_receiver

from examples.fake_llm import FakeLLM

ROOT = Path(__file__).resolve().parent.parent
AGENT = Path(__file__).with_name("foreign_agents.py")
PROMPT = "What is the weather in Paris?"
#: What each agent answers against the fake server (a tool call, then the answer).
ANSWERS = {
    "weather": "Done: sunny in Paris",
    "stream": "Done: sunny in Paris  [18 tokens]",
    "pydantic-ai": "Done: sunny in Paris",
    "anthropic": "Done: sunny in Paris",
    "anthropic-stream": "Done: sunny in Paris ",  # (the fake server streams a trailing space)
}


def run_agent(argv: list[str], out: Path) -> dict[str, Any]:
    """``tests/foreign_agents.py ARGV`` in a fresh process without the caller's ``OTEL_*``
    variables; what it wrote to ``out``."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    for name in list(env):
        if name.startswith("OTEL_"):
            env.pop(name)
    done = subprocess.run(
        [sys.executable, str(AGENT), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def replay(
    agent: str,
    bundle: Path,
    url: str,
    out: Path,
    prompt: str = PROMPT,
    *options: str,
    traced_tool: bool = False,
) -> dict[str, Any]:
    """The agent replayed from ``bundle`` in a fresh process (``options``: mode, allowed tools)."""
    command = "replay-traced" if traced_tool else "replay"
    return run_agent([command, agent, str(bundle), str(out), url, prompt, *options], out)


def replay_sending_nothing(agent: str, bundle: Path, out: Path) -> dict[str, Any]:
    """The agent replayed frozen from ``bundle`` while a server is up at the URL it is given:
    the replay must send it nothing (checked here: 0 requests)."""
    with FakeLLM() as sentinel:
        replayed = replay(agent, bundle, sentinel.openai_url, out)
        assert len(sentinel.requests) == 0
    return replayed


@dataclass
class Traced:
    live: dict[str, Any]
    """What the agent did: its answer, the tools it ran, the (now stopped) server's URL."""
    bundle: Path
    imported: str
    """What ``stepfork import spans.jsonl [logs.jsonl] -o bundles`` printed (run where the spans
    are; ``logs.jsonl`` when the agent wrote its log records apart)."""
    instrumentation: str
    agent: str
    spans: Path


def traced(
    directory: Path, instrumentation: str, agent: str = "weather", *, otlp: bool = False
) -> Traced:
    """The agent traced by ``instrumentation`` (spans in a file, or over OTLP/HTTP to the
    loopback receiver), then imported by the command. The fake server is stopped when this
    returns."""
    directory.mkdir(parents=True, exist_ok=True)
    spans = directory / "spans.jsonl"
    out = directory / "live.json"
    with FakeLLM() as llm:
        argv = ["trace", instrumentation, agent]
        if otlp:
            with running_receiver(spans) as receiver:
                live = run_agent(
                    [*argv, receiver.http_endpoint, str(out), llm.openai_url, PROMPT], out
                )
        else:
            live = run_agent([*argv, str(spans), str(out), llm.openai_url, PROMPT], out)
        served = len(llm.requests)
        live["url"] = llm.openai_url
    assert served == 2  # a tool call, then the answer
    assert live["answer"] == ANSWERS[agent]
    assert live["tool_ran"] == ["Paris"]
    files = ["spans.jsonl", *(["logs.jsonl"] if (directory / "logs.jsonl").exists() else [])]
    done = stepfork("import", *files, "-o", "bundles", cwd=directory)
    assert done.returncode == 0, done.stdout + done.stderr
    (bundle,) = (directory / "bundles").glob("*.sftrace")
    return Traced(live, bundle, done.stdout, instrumentation, agent, spans)


# --- the docs' pasted outputs ---------------------------------------------------------------------

DOCS = ROOT / "docs" / "collectors.md"
_BLOCK = re.compile(r"<!-- output: (?P<name>[a-z0-9-]+) -->\n```[a-z]*\n(?P<text>.*?)```", re.S)


def normalised(text: str) -> str:
    """Without what differs between runs: ids, durations, the version."""
    text = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", text)
    text = re.sub(r"\b[0-9a-f]{32}\b", "<trace id>", text)
    text = re.sub(r"\b[0-9a-f]{16}\b", "<span id>", text)
    text = re.sub(r"\b[0-9a-f]{12}…", "<trace id>…", text)
    return re.sub(r"\d+\.\d ms", "<ms>", text)


def docs_block(name: str) -> str:
    blocks = {m["name"]: m["text"] for m in _BLOCK.finditer(DOCS.read_text(encoding="utf-8"))}
    return blocks[name]
