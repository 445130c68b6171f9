"""The pytest plugin, exercised as users meet it: test files in a tmp project run by pytest in a
subprocess (the plugin is loaded from its ``pytest11`` entry point, as installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import ENTRYPOINT, Bundles, agent_copy, bundles, stepfork

__all__ = ["bundles"]

HAND_WRITTEN = """
import asyncio
import threading

import pytest

from examples.booking_agent import run_agent
from stepfork_otel import ReplayError, ReplaySession, llm_request
from stepfork_otel.recording.contract import current_session

QUESTION = "Book me the cheapest flight to Paris."


@pytest.mark.stepfork_replay("failure.sftrace")
def test_hand_written(stepfork_replay: ReplaySession) -> None:
    with pytest.raises(Exception, match="SeatUnavailableError"):
        run_agent(QUESTION)
    stepfork_replay.verify_complete()


@pytest.mark.stepfork_replay("failure.sftrace", verify_complete=False)
async def test_async_test_sees_the_session(stepfork_replay: ReplaySession) -> None:
    await asyncio.sleep(0)
    assert current_session.get() is stepfork_replay


@pytest.mark.stepfork_replay("failure.sftrace")
def test_skipped_calls_fail_after_the_body() -> None:
    pass


@pytest.mark.stepfork_replay("failure.sftrace")
def test_caught_divergence_still_fails() -> None:
    try:
        run_agent("Book me the cheapest flight to Rome.")
    except ReplayError:
        pass


@pytest.mark.stepfork_replay("missing.sftrace")
def test_missing_bundle() -> None:
    pass


def test_fixture_without_marker(stepfork_replay: ReplaySession) -> None:
    pass


def _live_llm() -> object:
    return llm_request(provider="acme", model="m1", input={"q": 1}, call=lambda: {"ok": True})


def test_live_llm_outside_replay() -> None:
    assert _live_llm() == {"ok": True}


@pytest.mark.stepfork_allow_live_llm
def test_live_llm_allowed() -> None:
    assert _live_llm() == {"ok": True}


@pytest.fixture
def warm_up_model() -> None:
    try:  # swallowing pytest's Failed does not save the test
        _live_llm()
    except BaseException:
        pass


@pytest.mark.stepfork_replay("failure.sftrace", verify_complete=False)
def test_live_llm_in_a_fixture_of_a_replay_test_is_blocked(warm_up_model: None) -> None:
    pass


@pytest.mark.stepfork_replay("failure.sftrace", verify_complete=False)
def test_a_divergence_caught_in_a_thread_fails_the_test() -> None:
    def worker() -> None:
        try:
            run_agent(QUESTION)
        except BaseException:
            pass

    thread = threading.Thread(target=worker)  # started without the session's context
    thread.start()
    thread.join()
"""

PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _outcomes(stdout: str) -> dict[str, str]:
    """Test name -> PASSED / FAILED / ERROR, from the -rA summary."""
    found = re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\w+)", stdout, re.MULTILINE)
    return {name: outcome for outcome, name in found}


def _section(stdout: str, test: str) -> str:
    """The failure/error section pytest printed for one test."""
    match = re.search(
        rf"^_+ (?:ERROR at setup of )?{test} _+$(.*?)(?=^_{{3,}} |^=+ )", stdout, re.M | re.S
    )
    assert match, f"no section for {test}"
    return match.group(1)


@pytest.fixture(scope="module")
def project(bundles: Bundles, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("plugin")
    project = agent_copy(directory, "max_results: int = 5", "max_results: int = 5")
    (project / "pytest.ini").write_text(PYTEST_INI)
    shutil.copyfile(bundles.failure, project / "failure.sftrace")
    (project / "test_hand.py").write_text(HAND_WRITTEN)
    return project


@pytest.fixture(scope="module")
def plain_run(project: Path) -> subprocess.CompletedProcess[str]:
    return _pytest(project, "test_hand.py")


def test_replay_marker_and_fixture(plain_run: subprocess.CompletedProcess[str]) -> None:
    outcomes = _outcomes(plain_run.stdout)
    assert outcomes["test_hand_written"] == "PASSED", plain_run.stdout
    assert outcomes["test_async_test_sees_the_session"] == "PASSED", plain_run.stdout


def test_left_over_calls_fail_the_test(plain_run: subprocess.CompletedProcess[str]) -> None:
    assert _outcomes(plain_run.stdout)["test_skipped_calls_fail_after_the_body"] == "FAILED"
    section = _section(plain_run.stdout, "test_skipped_calls_fail_after_the_body")
    assert "Dependency-call matching: DIVERGED (4 of 4 recorded calls never made)" in section
    assert "not reached: call-1 llm openai/gpt-4.1-mini, call-2 tool search_flights" in section


def test_a_caught_divergence_fails_the_test(plain_run: subprocess.CompletedProcess[str]) -> None:
    assert _outcomes(plain_run.stdout)["test_caught_divergence_still_fails"] == "FAILED"
    section = _section(plain_run.stdout, "test_caught_divergence_still_fails")
    assert "DIVERGED at call 1 (0 of 4 recorded calls matched)" in section
    assert "first divergence (ReplayMismatchError):" in section
    assert "cheapest flight to Rome." in section


def test_bad_marker_and_fixture_use(plain_run: subprocess.CompletedProcess[str]) -> None:
    outcomes = _outcomes(plain_run.stdout)
    assert outcomes["test_missing_bundle"] == "FAILED"
    assert "stepfork_replay: " in _section(plain_run.stdout, "test_missing_bundle")
    assert "missing.sftrace: no such file" in _section(plain_run.stdout, "test_missing_bundle")
    assert outcomes["test_fixture_without_marker"] == "ERROR"
    assert "the stepfork_replay fixture needs the marker" in _section(
        plain_run.stdout, "test_fixture_without_marker"
    )


def test_a_divergence_in_a_thread_fails_even_without_verify_complete(
    plain_run: subprocess.CompletedProcess[str],
) -> None:
    name = "test_a_divergence_caught_in_a_thread_fails_the_test"
    assert _outcomes(plain_run.stdout)[name] == "FAILED"
    assert "diverged from the recording" in _section(plain_run.stdout, name)


def test_plugin_is_opt_in(plain_run: subprocess.CompletedProcess[str]) -> None:
    # without --stepfork, a test without the replay marker may call a model
    assert _outcomes(plain_run.stdout)["test_live_llm_outside_replay"] == "PASSED"


def test_live_llm_call_fails_the_test_when_active(
    plain_run: subprocess.CompletedProcess[str], project: Path
) -> None:
    # a replay test is active, also while its fixtures run (outside the replay session)
    name = "test_live_llm_in_a_fixture_of_a_replay_test_is_blocked"
    assert _outcomes(plain_run.stdout)[name] == "FAILED"
    assert "live LLM call to acme/m1 blocked" in _section(plain_run.stdout, name)

    for args in (("--stepfork",), ("-o", "stepfork=true")):
        active = _pytest(
            project, "test_hand.py", "-k", "live_llm_outside or live_llm_allowed", *args
        )
        outcomes = _outcomes(active.stdout)
        assert outcomes == {
            "test_live_llm_outside_replay": "FAILED",
            "test_live_llm_allowed": "PASSED",
        }, active.stdout
        section = _section(active.stdout, "test_live_llm_outside_replay")
        assert "live LLM call to acme/m1 blocked: the stepfork pytest plugin is active" in section
        assert "@pytest.mark.stepfork_allow_live_llm" in section


def test_exported_and_hand_written_failures_read_the_same(bundles: Bundles, tmp_path: Path) -> None:
    project = agent_copy(tmp_path, "max_results: int = 5", "max_results: int = 3")
    (project / "pytest.ini").write_text(PYTEST_INI)
    shutil.copyfile(bundles.failure, project / "failure.sftrace")
    (project / "test_hand.py").write_text(
        "import pytest\n"
        "from examples.booking_agent import run_agent\n\n\n"
        '@pytest.mark.stepfork_replay("failure.sftrace")\n'
        "def test_hand() -> None:\n"
        '    run_agent("Book me the cheapest flight to Paris.")\n'
    )
    exported = stepfork(
        "export", "pytest", "failure.sftrace", "--entrypoint", ENTRYPOINT,
        "-o", "test_exported.py", cwd=project,
    )  # fmt: skip
    assert exported.returncode == 0
    result = _pytest(project, "test_hand.py", "test_exported.py")
    assert _outcomes(result.stdout) == {"test_hand": "FAILED", "test_failure_replays": "FAILED"}

    def report(test: str) -> list[str]:
        lines = _section(result.stdout, test).strip().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("stepfork replay of"))
        return lines[start:]

    hand, exported_report = report("test_hand"), report("test_failure_replays")
    assert hand == exported_report
    assert hand[1] == "Dependency-call matching: DIVERGED at call 2 (1 of 4 recorded calls matched)"
