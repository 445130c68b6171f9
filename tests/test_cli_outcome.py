"""The outcome comparison shared by ``stepfork replay``, exported tests and the plugin, and the
small formatting helpers of ``cli/_common.py`` and ``replay/report.py`` (in-process: pure
functions)."""

from __future__ import annotations

import pytest

from examples.booking_agent import SeatUnavailableError
from stepfork_otel import RecordedDependencyError, ReplayPolicyError, RunInfo, fingerprint
from stepfork_otel.cli._common import abbreviate, abbreviate_in_data
from stepfork_otel.pytest_plugin import assert_recorded_output, expect_recorded_failure
from stepfork_otel.replay.outcome import compare_outcome, same_type_name
from stepfork_otel.replay.report import abbreviate_in_text

FAILED = RunInfo(status="error", error_type="SeatUnavailableError")
RETURNED = RunInfo(status="ok", output='"done"', output_sha256=fingerprint("done"))


@pytest.mark.parametrize(
    ("recorded", "actual", "same"),
    [
        ("SeatUnavailableError", "examples.booking_agent.SeatUnavailableError", True),
        ("examples.booking_agent.SeatUnavailableError", "SeatUnavailableError", True),
        ("ValueError", "ValueError", True),
        ("mod.Outer.Inner", "Outer.Inner", True),
        ("SeatUnavailableError", "examples.booking_agent.OtherError", False),
        ("Error", "examples.booking_agent.SeatUnavailableError", False),
        ("a.Error", "b.Error", False),
    ],
)
def test_same_type_name(recorded: str, actual: str, same: bool) -> None:
    assert same_type_name(recorded, actual) is same


def test_replayed_dependency_failure_reproduces_the_recorded_failure() -> None:
    error = RecordedDependencyError("SeatUnavailableError", "no seats", position=4)
    result = compare_outcome(FAILED, raised=error)
    assert result.verdict == "REPRODUCED FAILURE"
    assert "message and side effects are not compared" in result.detail
    assert result.ok


def test_the_agents_own_exception_from_its_module_reproduces_a_main_recording() -> None:
    result = compare_outcome(FAILED, raised=SeatUnavailableError("no seats"))
    assert result.verdict == "REPRODUCED FAILURE"
    assert "this run raised examples.booking_agent.SeatUnavailableError" in result.detail


def test_another_failure_type_diverges() -> None:
    result = compare_outcome(FAILED, raised=KeyError("x"))
    assert result.verdict == "DIVERGED"
    assert (
        result.detail
        == "the recorded run failed with SeatUnavailableError; this run raised KeyError"
    )
    other = RecordedDependencyError("TimeoutError", "slow")
    assert compare_outcome(FAILED, raised=other).verdict == "DIVERGED"


def test_returning_where_the_recording_failed_diverges() -> None:
    result = compare_outcome(FAILED, returned="booked")
    assert result.verdict == "DIVERGED"
    assert result.replayed_preview == '"booked"'


def test_a_run_stopped_by_replay_is_diverged_not_compared() -> None:
    stop = ReplayPolicyError("refused", position=6)
    result = compare_outcome(RETURNED, raised=stop)
    assert result.verdict == "DIVERGED"
    assert result.detail == "not compared: replay stopped the run (ReplayPolicyError at call 6)"


def test_output_compared_by_fingerprint_after_redaction() -> None:
    assert compare_outcome(RETURNED, returned="done").verdict == "MATCHED"
    assert compare_outcome(RETURNED, returned="done!").verdict == "DIVERGED"
    secret = RunInfo(status="ok", output_sha256=fingerprint({"api_key": "[REDACTED]"}))
    # the secret itself is never compared: the redacted value has the recorded fingerprint
    assert compare_outcome(secret, returned={"api_key": "hunter2"}).verdict == "MATCHED"


def test_no_recorded_output() -> None:
    result = compare_outcome(RunInfo(status="ok"), returned="anything")
    assert result.verdict == "NOT RECORDED"
    assert result.ok
    unfinished = compare_outcome(RunInfo(status="unset"), returned=None)
    assert unfinished.detail.startswith("the recorded run did not finish")


def test_expect_recorded_failure() -> None:
    with expect_recorded_failure("SeatUnavailableError"):
        raise RecordedDependencyError("SeatUnavailableError", "no seats")
    with expect_recorded_failure("SeatUnavailableError"):
        raise SeatUnavailableError("no seats")
    expect = expect_recorded_failure("SeatUnavailableError")
    with pytest.raises(pytest.fail.Exception, match="this run returned without raising"), expect:
        pass
    expect = expect_recorded_failure("SeatUnavailableError")
    with pytest.raises(pytest.fail.Exception, match="this run raised KeyError"), expect:
        raise KeyError("x")
    expect = expect_recorded_failure("SeatUnavailableError")
    with pytest.raises(ReplayPolicyError), expect:  # a divergence is left for the plugin
        raise ReplayPolicyError("refused")


def test_assert_recorded_output() -> None:
    assert_recorded_output("done", fingerprint("done"))
    with pytest.raises(pytest.fail.Exception, match=r'this run: "other"  sha256 [0-9a-f]{12}…'):
        assert_recorded_output("other", fingerprint("done"), '"done"')


def test_fingerprint_abbreviation() -> None:
    digest = fingerprint("x")
    assert abbreviate(digest) == digest[:12] + "…"
    assert abbreviate(digest, verbose=True) == digest
    assert abbreviate(None) == "-"
    text = f"input sha256: {digest} (stored)"
    assert abbreviate_in_text(text) == f"input sha256: {digest[:12]}… (stored)"
    assert abbreviate_in_text(text + "a", verbose=True) == text + "a"
    assert abbreviate_in_data({"a": [digest, 1]}) == {"a": [digest[:12] + "…", 1]}
