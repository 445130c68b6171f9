"""Every replay mode against the golden Lisbon run: frozen, hybrid, live, forbidden, manual, the
reserved ``derived`` and unknown modes, and options that do not fit a mode."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import golden_agent as agent
import pytest

from stepfork_otel import (
    ReplayMismatchError,
    ReplayMode,
    ReplayPolicyError,
    ReplaySession,
)
from stepfork_otel.replay.errors import ReplayModeError
from stepfork_otel.replay.session import RecordedCall

LISBON = Path(__file__).parent / "golden" / "dinner_lisbon.sftrace"
ALL_TOOLS = {"lookup_weather", "convert_currency", "research", "book_table"}


@pytest.fixture(autouse=True)
def _count_bodies() -> Iterator[None]:
    agent.BODY_CALLS.clear()
    yield
    agent.BODY_CALLS.clear()


# --- frozen ----------------------------------------------------------------------------------------


def test_frozen_is_the_default_and_never_runs_a_body() -> None:
    with ReplaySession.from_trace(LISBON) as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    assert replay.mode is ReplayMode.FROZEN
    assert {c.action for c in replay.calls} == {"substituted"}
    assert agent.BODY_CALLS == {}


def test_frozen_nested_tool_to_llm_skips_the_inner_call() -> None:
    with ReplaySession.from_trace(LISBON) as replay:
        agent.run_dinner_agent(agent.LISBON)
    research = next(c for c in replay.calls if c.name == "research")
    assert research.action == "substituted"
    assert "summariser-1" not in [c.name for c in replay.calls]
    assert [(rc.event.id, rc.name, rc.state) for rc in replay.summary.skipped] == [
        ("call-6", "summariser-1", "skipped")
    ]
    assert replay.pending == 0


# --- hybrid ----------------------------------------------------------------------------------------


def test_hybrid_runs_selected_llms_and_keeps_tools_frozen() -> None:
    with ReplaySession.from_trace(
        LISBON, mode="hybrid", live_llms={"scripted/planner-1"}
    ) as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    actions = {(c.kind, c.name): c.action for c in replay.calls}
    assert actions == {
        ("llm", "planner-1"): "executed",
        ("tool", "lookup_weather"): "substituted",
        ("tool", "convert_currency"): "substituted",
        ("tool", "research"): "substituted",
        ("tool", "book_table"): "substituted",
    }
    assert agent.BODY_CALLS == {"planner-1": 4}
    assert all(not c.notes for c in replay.calls)  # same prompt, same scripted answers


@pytest.mark.parametrize("selector", ["scripted/planner-1", "scripted/*", "planner-1"])
def test_hybrid_llm_selectors(selector: str) -> None:
    with ReplaySession.from_trace(LISBON, mode="hybrid", live_llms={selector}) as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    assert agent.BODY_CALLS["planner-1"] == 4


@pytest.mark.parametrize(
    ("selector", "why"),
    [
        ("scripted/other", "matches no recorded LLM call"),  # a typo of the model
        ("openai/planner-1", "matches no recorded LLM call"),  # the wrong provider
        ("other/*", "matches no recorded LLM call"),
        ("*", "matches no recorded LLM call"),  # a model named "*": there is none
        ("bad/selector/x", "is not 'provider/model', 'provider/*' or 'model'"),
        ("scripted/", "is not 'provider/model', 'provider/*' or 'model'"),
    ],
)
def test_a_hybrid_selector_that_selects_no_recorded_llm_is_an_error(
    selector: str, why: str
) -> None:
    """It used to give a frozen replay that reported MATCHED: the typo went unnoticed."""
    with pytest.raises(ReplayModeError, match=re.escape(why)) as caught:
        ReplaySession.from_trace(LISBON, mode="hybrid", live_llms={selector})
    assert "recorded LLMs: scripted/planner-1, scripted/summariser-1" in str(caught.value)
    assert agent.BODY_CALLS == {}


def test_a_provider_wildcard_selects_every_model_of_the_provider() -> None:
    with ReplaySession.from_trace(LISBON, mode="hybrid", live_llms={"scripted/*"}) as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    assert {c.action for c in replay.calls if c.kind == "llm"} == {"executed"}


def test_hybrid_reports_prompt_drift_and_names_the_live_call_that_led_to_a_mismatch() -> None:
    with (
        pytest.raises(ReplayMismatchError) as caught,
        ReplaySession.from_trace(LISBON, mode="hybrid", live_llms={"scripted/planner-1"}) as replay,
    ):
        agent.run_dinner_agent(agent.LISBON, system_prompt=agent.IMPERIAL_PROMPT)
    first = replay.calls[0]
    # the changed prompt is reported on the live call, not raised
    assert first.action == "executed"
    assert first.notes[0].startswith(
        "input drift (hybrid): this run's input differs from the recording"
    )
    assert first.notes[1].startswith("live output differs from the recording")
    error = caught.value
    assert error.position == 2
    assert error.reason.startswith("input differs from the recording")
    assert error.after_live_call is not None
    assert error.after_live_call.event_id == "call-1"
    message = str(error)
    assert (
        "this followed the live llm scripted/planner-1 call (call-1), which ran again instead "
        "of being substituted: its answer led the agent here"
    ) in message
    assert "(call 1 of this run: its live answer differs from the recorded one (sha256 " in message
    assert agent.BODY_CALLS == {"planner-1": 1}  # the tool body did not run


def test_hybrid_does_not_excuse_input_drift_on_a_tool_or_an_unselected_llm() -> None:
    with (
        pytest.raises(ReplayMismatchError, match="input differs"),
        ReplaySession.from_trace(LISBON, mode="hybrid", live_llms={"scripted/summariser-1"}),
    ):
        agent.run_dinner_agent(agent.LISBON, system_prompt=agent.IMPERIAL_PROMPT)
    assert agent.BODY_CALLS == {}


def test_hybrid_requires_live_llms() -> None:
    with pytest.raises(ReplayModeError, match="mode 'hybrid' needs live_llms"):
        ReplaySession.from_trace(LISBON, mode="hybrid")


# --- live ------------------------------------------------------------------------------------------


def test_live_executes_llms_and_allowed_tools_and_matches_nested_calls() -> None:
    with ReplaySession.from_trace(LISBON, mode="live", allow_live_tools=ALL_TOOLS) as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    assert [(c.name, c.action) for c in replay.calls] == [
        ("planner-1", "executed"),
        ("lookup_weather", "executed"),
        ("planner-1", "executed"),
        ("convert_currency", "executed"),
        ("research", "executed"),
        ("summariser-1", "executed"),  # inside research: its body ran, so it was matched
        ("planner-1", "executed"),
        ("book_table", "executed"),
        ("planner-1", "executed"),
    ]
    assert replay.calls[5].recorded_id == "call-6"
    assert replay.summary.skipped == ()
    assert agent.BODY_CALLS["summariser-1"] == 1


def test_live_refuses_an_unlisted_tool_before_its_body_and_without_consuming_it() -> None:
    with ReplaySession.from_trace(LISBON, mode="live", allow_live_tools={"research"}) as replay:
        with pytest.raises(ReplayPolicyError) as caught:
            agent.run_dinner_agent(agent.LISBON)
        pending_ids = [rc.event.id for rc in replay.pending_calls]
    error = caught.value
    assert error.position == 2
    assert error.reason == (
        "tool 'lookup_weather' may not run live: live mode executes a tool only when it is named "
        "in allow_live_tools (--allow-live-tool lookup_weather); its body did not run and its "
        "recorded response was not consumed"
    )
    assert agent.BODY_CALLS == {"planner-1": 1}
    # the cursor did not move: the refused recorded call is still the next one
    assert pending_ids[0] == "call-2"
    assert replay.calls[1].action == "rejected"


def test_live_refusal_leaves_the_same_recorded_call_next() -> None:
    with ReplaySession.from_trace(LISBON, mode="live"):
        agent.llm_request(
            provider="scripted",
            model="planner-1",
            input={
                "messages": [
                    {"role": "system", "content": agent.PROMPT},
                    {"role": "user", "content": agent.LISBON},
                ],
                "tools": agent.TOOLS,
            },
            call=lambda: agent.plan(
                [
                    {"role": "system", "content": agent.PROMPT},
                    {"role": "user", "content": agent.LISBON},
                ]
            ),
        )
        with pytest.raises(ReplayPolicyError):
            agent.lookup_weather("Lisbon")
        # caught and retried: refused again at the same recorded call, still not run
        with pytest.raises(ReplayPolicyError) as again:
            agent.lookup_weather("Lisbon")
    assert again.value.expected is not None
    assert again.value.expected.event_id == "call-2"
    assert agent.BODY_CALLS["lookup_weather"] == 0


def test_live_still_raises_on_llm_input_drift() -> None:
    with (
        pytest.raises(ReplayMismatchError, match="prompt payload passed to llm_request"),
        ReplaySession.from_trace(LISBON, mode="live", allow_live_tools=ALL_TOOLS),
    ):
        agent.run_dinner_agent(agent.LISBON, system_prompt=agent.IMPERIAL_PROMPT)
    assert agent.BODY_CALLS == {}


def test_live_tools_allowlist_only_in_live_mode() -> None:
    with pytest.raises(ReplayModeError, match="allow_live_tools only applies to mode 'live'"):
        ReplaySession.from_trace(LISBON, mode="frozen", allow_live_tools={"research"})
    with pytest.raises(ReplayModeError, match="live_llms only applies to mode 'hybrid'"):
        ReplaySession.from_trace(LISBON, mode="live", live_llms={"planner-1"})
    with pytest.raises(TypeError, match="not a string"):
        ReplaySession.from_trace(LISBON, mode="live", allow_live_tools="research")


# --- forbidden and manual --------------------------------------------------------------------------


def test_forbidden_rejects_every_call_before_matching() -> None:
    with (
        ReplaySession.from_trace(LISBON, mode="forbidden") as replay,
        pytest.raises(ReplayPolicyError) as caught,
    ):
        agent.run_dinner_agent(agent.LISBON)
    assert str(caught.value).startswith(
        "at call 1 of this run: replay mode 'forbidden' rejects every dependency call"
    )
    assert caught.value.expected is None  # refused before matching
    assert agent.BODY_CALLS == {}
    assert replay.pending == 9
    assert len(replay.pending_calls) == 9


def test_manual_without_an_approver_rejects_before_matching() -> None:
    with (
        pytest.raises(ReplayPolicyError, match="no approval callback was given"),
        ReplaySession.from_trace(LISBON, mode="manual"),
    ):
        agent.run_dinner_agent(agent.LISBON)
    assert agent.BODY_CALLS == {}


def test_manual_substitutes_approved_calls_and_rejects_the_rest() -> None:
    seen: list[str] = []

    def approve(call: RecordedCall) -> bool:
        seen.append(call.event.id)
        return call.name != "book_table"

    with (
        ReplaySession.from_trace(LISBON, mode="manual", approve=approve) as replay,
        pytest.raises(ReplayPolicyError) as caught,
    ):
        agent.run_dinner_agent(agent.LISBON)
    assert seen == ["call-1", "call-2", "call-3", "call-4", "call-5", "call-7", "call-8"]
    assert caught.value.reason == (
        "tool book_table needs an explicit approval (manual mode) and was not approved"
    )
    assert [c.action for c in replay.calls] == ["substituted"] * 6 + ["rejected"]
    assert agent.BODY_CALLS == {}


def test_manual_with_every_call_approved_completes() -> None:
    with ReplaySession.from_trace(LISBON, mode="manual", approve=lambda call: True) as replay:
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    assert agent.BODY_CALLS == {}


# --- bad modes -------------------------------------------------------------------------------------


def test_derived_is_reserved() -> None:
    with pytest.raises(ReplayModeError, match="replay mode 'derived' is reserved"):
        ReplaySession.from_trace(LISBON, mode="derived")


def test_unknown_mode_is_rejected_before_the_bundle_is_read(tmp_path: Path) -> None:
    with pytest.raises(ReplayModeError) as caught:
        ReplaySession.from_trace(tmp_path / "missing.sftrace", mode="frozzen")
    assert str(caught.value) == (
        "unknown replay mode 'frozzen'; expected one of: frozen, hybrid, live, forbidden, manual"
    )
    assert isinstance(caught.value, ValueError)
