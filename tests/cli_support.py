"""Helpers for the ``stepfork`` command tests: run the command as a user would (a subprocess),
and build the bundles it is run against, once per test session.

The example agent's bundles are recorded by running ``examples/booking_agent.py`` as a script --
so its exception class is recorded from ``__main__`` as plain ``SeatUnavailableError``, as a user's
would be -- and, separately, through ``examples.booking_agent.main`` imported as a module. A tiny
second agent (written below) covers what the example does not: an ``async def`` entrypoint, a run
without a recorded output, a positional input, a redacted input.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "examples.booking_agent:run_agent"
#: The hang guard of every process these tests start: a command takes a second or two, a pytest
#: run of an exported test a few; a loaded machine (2 cores, load 13) takes ten times that. Only a
#: hang should ever reach it -- no test here measures time.
HANG_GUARD_SECONDS = 600

TINY_AGENT = """
from __future__ import annotations

from stepfork_otel import allm_request, llm_request, trace_tool


@trace_tool
def lookup(city: str, units: str = "metric") -> dict:
    return {"city": city, "temp": 21, "units": units}


def _reply(prompt: dict) -> dict:
    return {"text": "sunny", "prompt_chars": len(str(prompt))}


def forecast(city: str) -> str:
    data = lookup(city)
    prompt = {"q": f"weather in {data['city']} at {data['temp']}"}
    reply = llm_request(provider="acme", model="m1", input=prompt, call=lambda: _reply(prompt))
    return FORMAT.format(city=city, text=reply["text"])


async def aforecast(city: str) -> str:
    data = lookup(city)
    prompt = {"q": f"weather in {data['city']} at {data['temp']}"}

    async def call() -> dict:
        return _reply(prompt)

    reply = await allm_request(provider="acme", model="m1", input=prompt, call=call)
    return FORMAT.format(city=city, text=reply["text"])


def forecast_with_key(city: str, api_key: str) -> str:
    return forecast(city)


@trace_tool
def summarise(city: str) -> str:
    data = lookup(city)
    reply = llm_request(
        provider="acme", model="m2", input={"summarise": data}, call=lambda: {"text": "mild"}
    )
    return f"{city} is {reply['text']}"


def nested(city: str) -> str:
    return summarise(city)


FORMAT = "{city}: {text}"
"""

RECORD_TINY = """
import asyncio, sys
from stepfork_otel import record
import tiny_agent as t

out = sys.argv[1]
with record(f"{out}/ok.sftrace", input={"city": "Oslo"}, entrypoint="tiny_agent:forecast") as run:
    run.set_output(t.forecast("Oslo"))
with record(f"{out}/async.sftrace", input={"city": "Oslo"}) as run:
    run.set_output(asyncio.run(t.aforecast("Oslo")))
with record(f"{out}/no_output.sftrace", input={"city": "Oslo"}):
    t.forecast("Oslo")
with record(f"{out}/positional.sftrace", input="Oslo") as run:
    run.set_output(t.forecast("Oslo"))
with record(f"{out}/nested.sftrace", input={"city": "Oslo"}) as run:
    run.set_output(t.nested("Oslo"))
key = "sk-proj-" + "Zq3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jK"
with record(f"{out}/secret_input.sftrace", input={"city": "Oslo", "api_key": key}) as run:
    run.set_output(t.forecast_with_key("Oslo", key))
"""


@dataclass(frozen=True)
class Bundles:
    """Bundles recorded once per test session (read-only: copy before changing one)."""

    failure: Path
    """The example's failing run, recorded from ``python examples/booking_agent.py``."""
    success: Path
    module_failure: Path
    """The same failing run recorded through ``examples.booking_agent.main`` (module names)."""
    tiny_dir: Path
    """Directory holding ``tiny_agent.py`` and its bundles (run the command with this cwd)."""

    def tiny(self, name: str) -> Path:
        return self.tiny_dir / f"{name}.sftrace"


def _run(args: list[str], cwd: Path) -> None:
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=HANG_GUARD_SECONDS
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="session")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    base = tmp_path_factory.mktemp("bundles")
    script_dir, module_dir, tiny_dir = base / "script", base / "module", base / "tiny"
    _run([sys.executable, "examples/booking_agent.py", str(script_dir)], ROOT)
    code = "import sys; from examples.booking_agent import main; main(sys.argv[1])"
    _run([sys.executable, "-c", code, str(module_dir)], ROOT)
    tiny_dir.mkdir()
    (tiny_dir / "tiny_agent.py").write_text(TINY_AGENT)
    record_tiny(tiny_dir)
    return Bundles(
        failure=script_dir / "failure.sftrace",
        success=script_dir / "success.sftrace",
        module_failure=module_dir / "failure.sftrace",
        tiny_dir=tiny_dir,
    )


def run_for_json(
    command: list[str], *, env: dict[str, str] | None = None, timeout: float = HANG_GUARD_SECONDS
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run a script as a user would (a fresh process, from the project's root), insist that it
    succeeded, and read the JSON object its last line printed."""
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr
    values: dict[str, Any] = json.loads(lines[-1])
    return values, result


def stepfork(
    *args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m stepfork_otel.cli ARGS`` with stdin/stdout/stderr not terminals."""
    return subprocess.run(
        [sys.executable, "-m", "stepfork_otel.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=HANG_GUARD_SECONDS,
        env={**os.environ, **(env or {})},
    )


@dataclass
class TerminalRun:
    returncode: int
    stdout: str
    terminal: str
    """Everything written to the terminal (stderr, echoed input; stdout too if on the terminal)."""


def stepfork_on_terminal(
    *args: str | Path, cwd: Path = ROOT, typed: str = "", stdout_on_terminal: bool = False
) -> TerminalRun:
    """Run the command with stdin and stderr on a pseudo-terminal (``typed`` is what the user
    types); stdout is piped unless ``stdout_on_terminal``."""
    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def reader() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the terminal closed
                return
            if not data:
                return
            chunks.append(data)

    process = subprocess.Popen(
        [sys.executable, "-m", "stepfork_otel.cli", *map(str, args)],
        cwd=cwd,
        stdin=slave,
        stdout=slave if stdout_on_terminal else subprocess.PIPE,
        stderr=slave,
        env={k: v for k, v in os.environ.items() if k != "NO_COLOR"},
    )
    os.close(slave)
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    if typed:
        os.write(master, typed.encode())
    stdout = ""
    if process.stdout is not None:
        with process.stdout:
            stdout = process.stdout.read().decode()
    returncode = process.wait(timeout=HANG_GUARD_SECONDS)
    thread.join(timeout=HANG_GUARD_SECONDS)
    os.close(master)
    return TerminalRun(returncode, stdout, b"".join(chunks).decode(errors="replace"))


def agent_copy(tmp_path: Path, old: str, new: str) -> Path:
    """A project directory holding a changed copy of the example agent (``examples`` package);
    run the command with it as cwd and the changed agent shadows the original."""
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    (project / "examples" / "__init__.py").write_text("")
    source = (ROOT / "examples" / "booking_agent.py").read_text()
    assert old in source, old
    (project / "examples" / "booking_agent.py").write_text(source.replace(old, new))
    return project


def record_tiny(directory: Path) -> None:
    """Record the tiny agent's bundles with the ``tiny_agent.py`` found in ``directory``."""
    _run([sys.executable, "-c", RECORD_TINY, str(directory)], directory)


def tiny_copy(
    bundles: Bundles, tmp_path: Path, old: str = "", new: str = "", name: str = "tiny_changed"
) -> Path:
    """A directory with (a changed copy of) the tiny agent."""
    directory = tmp_path / name
    directory.mkdir()
    source = (bundles.tiny_dir / "tiny_agent.py").read_text()
    assert old in source, old
    (directory / "tiny_agent.py").write_text(source.replace(old, new) if old else source)
    return directory


def copy_bundle(source: Path, destination: Path) -> Path:
    shutil.copyfile(source, destination)
    return destination
