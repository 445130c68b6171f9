"""The seven trajectory assertions: what passes, and the exact failure messages (with the
trajectory actually reached), on replays of the golden bundles."""

from __future__ import annotations

import contextlib
from pathlib import Path

import golden_agent as agent
import pytest

from stepfork_otel import RecordedDependencyError, ReplayMismatchError, ReplaySession
from stepfork_otel.assertions import (
    assert_max_steps,
    assert_tool_arguments,
    assert_tool_call_count,
    assert_tool_called,
    assert_tool_not_called,
    assert_tool_order,
    assert_tool_sequence,
)

GOLDEN = Path(__file__).parent / "golden"

LISBON_TRAJECTORY = """\
trajectory (8 calls reached):
    1. llm  scripted/planner-1 [substituted]
    2. tool lookup_weather {"city":"Lisbon","units":"metric"} [substituted]
    3. llm  scripted/planner-1 [substituted]
    4. tool convert_currency {"amount":40.0,"source":"EUR","target":"USD"} [substituted]
    5. tool research {"topic":"dinner in Lisbon"} [substituted]
    6. llm  scripted/planner-1 [substituted]
    7. tool book_table {"party":2,"restaurant":"Taberna do Mar"} [substituted]
    8. llm  scripted/planner-1 [substituted]"""


@pytest.fixture(scope="module")
def lisbon() -> ReplaySession:
    with ReplaySession.from_trace(GOLDEN / "dinner_lisbon.sftrace") as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    return replay


@pytest.fixture(scope="module")
def porto() -> ReplaySession:
    with ReplaySession.from_trace(GOLDEN / "dinner_porto_failure.sftrace") as replay:
        with contextlib.suppress(RecordedDependencyError):  # the recorded failure, reproduced
            agent.run_dinner_agent(agent.PORTO)
        replay.verify_complete()
    return replay


def _message(excinfo: pytest.ExceptionInfo[AssertionError]) -> str:
    return str(excinfo.value)


def test_all_seven_pass_on_the_recorded_trajectory(lisbon: ReplaySession) -> None:
    assert_tool_called(lisbon, "research")
    assert_tool_not_called(lisbon, "charge_card")
    assert_tool_call_count(lisbon, "lookup_weather", 1)
    assert_tool_call_count(lisbon, "charge_card", 0)
    assert_tool_arguments(lisbon, "lookup_weather", {"city": "Lisbon"}, occurrence=1)
    assert_tool_arguments(lisbon, "lookup_weather", {"units": "metric"})  # a defaulted argument
    assert_tool_arguments(lisbon, "convert_currency", {"amount": 40.0, "target": "USD"})
    assert_tool_order(lisbon, "lookup_weather", "book_table")
    assert_tool_sequence(lisbon, ["lookup_weather", "convert_currency", "research", "book_table"])
    assert_tool_sequence(lisbon, ["lookup_weather", "book_table"], strict=False)
    assert_max_steps(lisbon, 8)


def test_they_accept_the_frozen_summary(lisbon: ReplaySession) -> None:
    summary = lisbon.summary
    assert_tool_called(summary, "book_table")
    assert_max_steps(summary, 8)


def test_a_failed_tool_call_counts(porto: ReplaySession) -> None:
    assert porto.calls[-1].status == "error"
    assert_tool_called(porto, "book_table")
    assert_tool_call_count(porto, "book_table", 1)
    assert_tool_arguments(porto, "book_table", {"restaurant": "Cantinho do Avillez"})
    assert_tool_sequence(porto, ["lookup_weather", "convert_currency", "research", "book_table"])
    assert_max_steps(porto, 7)
    with pytest.raises(AssertionError) as caught:
        assert_max_steps(porto, 6)
    assert "    7. tool book_table" in _message(caught)
    assert "[substituted (raised)]" in _message(caught)


def test_assert_tool_called_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_called(lisbon, "charge_card")
    assert _message(caught) == "tool 'charge_card' was never called\n" + LISBON_TRAJECTORY


def test_assert_tool_not_called_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_not_called(lisbon, "book_table")
    assert _message(caught) == (
        "tool 'book_table' was called once (at call 7), expected never\n" + LISBON_TRAJECTORY
    )


def test_assert_tool_call_count_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_call_count(lisbon, "research", 2)
    assert _message(caught) == (
        "tool 'research' was called once, expected 2 times\n" + LISBON_TRAJECTORY
    )
    with pytest.raises(AssertionError, match="tool 'charge_card' was never called, expected once"):
        assert_tool_call_count(lisbon, "charge_card", 1)
    with pytest.raises(ValueError, match="count must be >= 0"):
        assert_tool_call_count(lisbon, "research", -1)


def test_assert_tool_arguments_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_arguments(lisbon, "lookup_weather", {"city": "Porto", "units": "metric"})
    assert _message(caught) == (
        "tool 'lookup_weather' call 1 (call 2 of the run) had other arguments:\n"
        '  city: expected "Porto", got "Lisbon"\n' + LISBON_TRAJECTORY
    )


def test_assert_tool_arguments_compares_canonical_json(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError, match=r"amount: expected 40, got 40\.0"):
        assert_tool_arguments(lisbon, "convert_currency", {"amount": 40})


def test_assert_tool_arguments_unknown_name_and_occurrence(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_arguments(lisbon, "lookup_weather", {"town": "Lisbon"})
    assert "  town: not an argument of 'lookup_weather' (its arguments: city, units)" in _message(
        caught
    )
    with pytest.raises(AssertionError) as caught:
        assert_tool_arguments(lisbon, "lookup_weather", {"city": "Lisbon"}, occurrence=2)
    assert _message(caught).startswith(
        "tool 'lookup_weather' was called once, so it has no call number 2 to check arguments on"
    )
    with pytest.raises(ValueError, match="occurrence counts from 1"):
        assert_tool_arguments(lisbon, "lookup_weather", {}, occurrence=0)


def test_assert_tool_order_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_order(lisbon, "book_table", "research")
    assert _message(caught) == (
        "expected tool 'book_table' before tool 'research', but 'research' was first called at "
        "call 5 and 'book_table' only at call 7\n" + LISBON_TRAJECTORY
    )
    with pytest.raises(AssertionError) as caught:
        assert_tool_order(lisbon, "charge_card", "book_table")
    assert _message(caught).startswith(
        "expected tool 'charge_card' before tool 'book_table', but 'charge_card' was never called"
    )


def test_assert_tool_sequence_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_tool_sequence(lisbon, ["lookup_weather", "book_table"])
    assert _message(caught) == (
        "tool sequence differs (exact match):\n"
        "  expected: ['lookup_weather', 'book_table']\n"
        "  actual:   ['lookup_weather', 'convert_currency', 'research', 'book_table']\n"
        + LISBON_TRAJECTORY
    )
    with pytest.raises(AssertionError) as caught:
        assert_tool_sequence(lisbon, ["book_table", "research"], strict=False)
    assert _message(caught).startswith(
        "tool sequence not found (other tools allowed between): matched ['book_table'], then no "
        "call of 'research' after them"
    )
    with pytest.raises(TypeError, match="not a string"):
        assert_tool_sequence(lisbon, "research")


def test_assert_max_steps_failure(lisbon: ReplaySession) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_max_steps(lisbon, 4)
    assert _message(caught) == (
        "the agent took 8 steps (4 tool, 4 LLM calls), more than the maximum of 4\n"
        + LISBON_TRAJECTORY
    )


def test_a_caught_mismatch_invalidates_every_assertion() -> None:
    with (
        ReplaySession.from_trace(GOLDEN / "dinner_lisbon.sftrace") as replay,
        contextlib.suppress(ReplayMismatchError),  # the agent swallows it
    ):
        agent.run_dinner_agent(agent.LISBON, drifted_default=True)
    checks = [
        lambda: assert_tool_called(replay, "lookup_weather"),
        lambda: assert_tool_not_called(replay, "charge_card"),
        lambda: assert_tool_call_count(replay, "lookup_weather", 1),
        lambda: assert_tool_arguments(replay, "lookup_weather", {"city": "Lisbon"}),
        lambda: assert_tool_order(replay, "lookup_weather", "lookup_weather"),
        lambda: assert_tool_sequence(replay, ["lookup_weather"]),
        lambda: assert_max_steps(replay, 100),
    ]
    for check in checks:
        with pytest.raises(AssertionError) as caught:
            check()
        assert _message(caught) == (
            "the replay diverged at call 2 (ReplayMismatchError: input differs from the recording "
            "(arguments are normalised with their defaults: a changed default counts)); 1 replay "
            "error(s) were raised during the run, even if the agent caught them, so assertions "
            "about its trajectory would be about a run that left the recorded path\n"
            "trajectory (2 calls reached):\n"
            "    1. llm  scripted/planner-1 [substituted]\n"
            '    2. tool lookup_weather {"city":"Lisbon","units":"imperial"} [rejected (raised)]'
        )


def test_a_replay_that_reached_nothing() -> None:
    with ReplaySession.from_trace(GOLDEN / "dinner_lisbon.sftrace") as replay:
        pass
    with pytest.raises(AssertionError) as caught:
        assert_tool_called(replay, "research")
    assert _message(caught) == (
        "tool 'research' was never called\ntrajectory: no tool or LLM call was reached"
    )
