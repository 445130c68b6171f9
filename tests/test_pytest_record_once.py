"""Record once against the real model, replay forever: ``@pytest.mark.stepfork`` as a new user
meets it -- a small project of tests on the real OpenAI SDK, run by pytest in subprocesses,
against the loopback fake API (stopped for every replay)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace

pytest.importorskip("openai")

AGENT = """
import os

import openai
import pytest

import stepfork_otel
from stepfork_otel import trace_tool

stepfork_otel.instrument_openai()
URL = os.environ.get("FAKE_LLM_URL", "http://127.0.0.1:9/v1")
PROMPT = "Refund order {order}"


@trace_tool
def refund(order_id: int) -> str:
    return f"order {order_id} refunded"


def run_agent(order: int) -> str:
    client = openai.OpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": PROMPT.format(order=order)}]
    )
    return str(reply.choices[0].message.content) + " / " + refund(order)
"""

TESTS = """
import anyio
import openai
import pytest

from agent import URL, run_agent


@pytest.mark.stepfork
def test_refund_agent():
    assert "refunded" in run_agent(1042)


@pytest.mark.stepfork
@pytest.mark.parametrize("order", [1, 22])
def test_each_order(order):
    assert str(order) in run_agent(order)


@pytest.mark.stepfork
async def test_async_client():
    client = openai.AsyncOpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    reply = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "async hello"}]
    )
    assert "async hello" in reply.choices[0].message.content


@pytest.mark.stepfork("custom/named.sftrace")
@pytest.mark.anyio
async def test_anyio_and_a_named_bundle():
    await anyio.sleep(0)
    assert "refunded" in run_agent(7)
"""

INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agent.py").write_text(AGENT)
    (tmp_path / "test_agent.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef anyio_backend():\n    return 'asyncio'\n"
    )
    (tmp_path / "pytest.ini").write_text(INI)
    return tmp_path


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


def pytest_run(
    project: Path, *args: str, url: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("STEPFORK_", "PYTEST_"))
    }
    environment["FAKE_LLM_URL"] = url or "http://127.0.0.1:9/v1"  # nothing listens there
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


BUNDLES = [
    "bundles/test_agent/test_refund_agent.sftrace",
    "bundles/test_agent/test_each_order[1].sftrace",
    "bundles/test_agent/test_each_order[22].sftrace",
    "bundles/test_agent/test_async_client.sftrace",
    "custom/named.sftrace",
]


def test_record_once_then_replay_offline_forever(project: Path, llm: FakeLLM) -> None:
    recorded = pytest_run(project, "--stepfork-record-mode=once", url=llm.openai_url)
    assert recorded.returncode == 0, recorded.stdout
    assert (
        "0 replayed, 0 failed replay, 5 recorded, 0 re-recorded, 0 missing, 0 failed (record mode once)"
        in (recorded.stdout)
    )
    assert len(llm.requests) == 5
    for bundle in BUNDLES:
        trace = Trace.load(project / bundle)
        assert trace.complete
    llm.stop()  # from now on nothing answers

    replayed = pytest_run(project)  # the default record mode: none
    assert replayed.returncode == 0, replayed.stdout
    assert "5 replayed, 0 failed replay, 0 recorded" in replayed.stdout
    again = pytest_run(project, "--stepfork-record-mode=once")  # existing bundles are replayed
    assert again.returncode == 0, again.stdout
    assert "5 replayed, 0 failed replay, 0 recorded" in again.stdout


def test_a_missing_bundle_fails_with_the_command_that_records_it(project: Path) -> None:
    run = pytest_run(project, "test_agent.py::test_refund_agent")
    assert run.returncode == 1
    assert (
        "stepfork: no bundle at bundles/test_agent/test_refund_agent.sftrace (record mode none): "
        "record it once with\n    pytest --stepfork-record-mode=once "
        "'test_agent.py::test_refund_agent'"
    ) in run.stdout
    assert (
        "0 replayed, 0 failed replay, 0 recorded, 0 re-recorded, 1 missing, 0 failed" in run.stdout
    )


def test_a_changed_prompt_fails_replay_and_a_re_record_shows_the_change(
    project: Path, llm: FakeLLM
) -> None:
    only = "test_agent.py::test_refund_agent"
    assert (
        pytest_run(project, only, "--stepfork-record-mode=once", url=llm.openai_url).returncode == 0
    )
    bundle = project / BUNDLES[0]
    before = project / "before.sftrace"
    shutil.copy(bundle, before)
    agent = project / "agent.py"
    agent.write_text(agent.read_text().replace("Refund order {order}", "Please refund {order}"))

    replay = pytest_run(project, only)
    assert replay.returncode == 1
    assert "diverged from the recording" in replay.stdout
    assert "Please refund 1042" in replay.stdout  # the report shows the new prompt
    assert "the input is the request the SDK sent: every parameter counts" in replay.stdout
    assert "1 failed replay" in replay.stdout

    rerecord = pytest_run(project, only, "--stepfork-record-mode=all", url=llm.openai_url)
    assert rerecord.returncode == 0, rerecord.stdout
    assert "1 re-recorded" in rerecord.stdout
    assert "stepfork diff /tmp/old.sftrace <bundle>" in rerecord.stdout
    diff = subprocess.run(
        [sys.executable, "-m", "stepfork_otel.cli", "diff", str(before), str(bundle)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert diff.returncode == 1, diff.stderr
    assert "call-1" in diff.stdout
    assert pytest_run(project, only).returncode == 0  # and the new bundle replays


def test_a_test_failing_while_recording_keeps_a_failed_recording_never_replayed(
    project: Path, llm: FakeLLM
) -> None:
    (project / "test_fails.py").write_text(
        "import pytest\nfrom agent import run_agent\n\n"
        "@pytest.mark.stepfork\ndef test_wrong():\n    assert 'nothing' in run_agent(5)\n"
    )
    run = pytest_run(project, "test_fails.py", "--stepfork-record-mode=once", url=llm.openai_url)
    assert run.returncode == 1
    failed = project / "bundles/test_fails/test_wrong.failed.sftrace"
    assert failed.is_file()
    assert not (project / "bundles/test_fails/test_wrong.sftrace").exists()
    assert "failed      bundles/test_fails/test_wrong.failed.sftrace" in run.stdout
    assert (
        "kept in bundles/test_fails/test_wrong.failed.sftrace (not used for replay)" in run.stdout
    )
    assert Trace.load(failed).run.status == "error"
    again = pytest_run(project, "test_fails.py")
    assert "1 missing" in again.stdout  # the failed recording is not a bundle


def test_parallel_workers_record_and_replay(project: Path, llm: FakeLLM) -> None:
    pytest.importorskip("xdist")
    recorded = pytest_run(project, "-n", "2", "--stepfork-record-mode=once", url=llm.openai_url)
    assert recorded.returncode == 0, recorded.stdout
    assert (
        "0 replayed, 0 failed replay, 5 recorded" in recorded.stdout
    )  # the summary sees every worker's tests
    llm.stop()
    replayed = pytest_run(project, "-n", "2")
    assert replayed.returncode == 0, replayed.stdout
    assert "5 replayed, 0 failed replay, 0 recorded" in replayed.stdout


def test_the_record_mode_from_the_environment_and_ini_and_a_bad_one(
    project: Path, llm: FakeLLM
) -> None:
    only = "test_agent.py::test_refund_agent"
    by_env = pytest_run(project, only, url=llm.openai_url, env={"STEPFORK_RECORD_MODE": "once"})
    assert "1 recorded" in by_env.stdout
    (project / "pytest.ini").write_text(INI + "stepfork_record_mode = all\n")
    by_ini = pytest_run(project, only, url=llm.openai_url)
    assert "1 re-recorded" in by_ini.stdout
    bad = pytest_run(project, only, env={"STEPFORK_RECORD_MODE": "sometimes"})
    assert bad.returncode == 4
    assert "record mode 'sometimes' is not one of none, once, all" in bad.stderr


def test_two_tests_never_share_a_bundle(project: Path) -> None:
    (project / "test_shared.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.stepfork('one.sftrace')\ndef test_a():\n    pass\n\n"
        "@pytest.mark.stepfork(bundle='one.sftrace')\ndef test_b():\n    pass\n"
    )
    run = pytest_run(project, "test_shared.py")
    assert "the bundle one.sftrace belongs to test_shared.py::test_a" in run.stdout


def test_a_secret_from_the_environment_in_a_recorded_bundle_is_warned_about(
    project: Path, llm: FakeLLM
) -> None:
    token = "qv7Rk2Lm9Xw4Tz8Bn"  # no rule knows this shape: it reaches the bundle
    (project / "test_leak.py").write_text(
        "import os, pytest\nfrom agent import run_agent\nimport agent\n\n"
        "@pytest.mark.stepfork\ndef test_leaks():\n"
        "    agent.PROMPT = 'token ' + os.environ['INTERNAL_TOKEN'] + ' {order}'\n"
        "    assert run_agent(3)\n"
    )
    run = pytest_run(
        project,
        "test_leak.py",
        "--stepfork-record-mode=once",
        url=llm.openai_url,
        env={"INTERNAL_TOKEN": token},
    )
    assert run.returncode == 0, run.stdout
    assert (
        "WARNING: bundles/test_leak/test_leaks.sftrace contains the value of $INTERNAL_TOKEN"
    ) in run.stdout


DATED_TESTS = """
import datetime
import uuid

import openai
import pytest

from agent import URL, refund


def dated_agent() -> str:
    today = datetime.datetime.now().isoformat()
    client = openai.OpenAI(base_url=URL, api_key="sk-test", max_retries=0)
    reply = client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {"role": "system", "content": f"Today is {today}; request {uuid.uuid4()}"},
            {"role": "user", "content": "Refund order 5"},
        ],
    )
    return str(reply.choices[0].message.content) + " / " + refund(5)


@pytest.mark.stepfork(capture=("time", "uuid"))
def test_dated_with_capture():
    assert "refunded" in dated_agent()


@pytest.mark.stepfork
def test_dated_without_capture():
    assert "refunded" in dated_agent()
"""


def test_the_marker_captures_the_clock_and_uuids_the_test_reads(
    project: Path, llm: FakeLLM
) -> None:
    (project / "test_dated.py").write_text(DATED_TESTS)
    recorded = pytest_run(
        project, "test_dated.py", "--stepfork-record-mode=once", url=llm.openai_url
    )
    assert recorded.returncode == 0, recorded.stdout
    trace = Trace.load(project / "bundles/test_dated/test_dated_with_capture.sftrace")
    assert [r.source for r in trace.captured] == ["datetime.now", "uuid.uuid4"]
    assert trace.run.capture == ["time", "uuid"]
    llm.stop()

    replayed = pytest_run(project, "test_dated.py")  # a later clock, the server gone
    assert replayed.returncode == 1
    assert "1 failed, 1 passed" in replayed.stdout  # only the test recorded without capture
    assert "FAILED test_dated.py::test_dated_without_capture" in replayed.stdout
    assert "the run read values the recording did not capture: uuid.uuid4 at test_dated:" in (
        replayed.stdout
    )
    assert "1 replayed, 1 failed replay" in replayed.stdout
