"""Replay fidelity: a bundle can never loosen the code, and the session says how many recorded calls
are still ahead (issue: unchanged code replays cleanly, nothing live unless named)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import (
    ReplayError,
    ReplayPolicy,
    ReplayPolicyError,
    ReplaySession,
    Trace,
    record,
    trace_tool,
)

CHARGED: list[float] = []


def charge_card_declared(policy: str) -> Callable[[float], dict[str, Any]]:
    """The same tool as the code of one day or another declares it."""

    @trace_tool(name="charge_card", replay_policy=policy)
    def charge_card(amount: float) -> dict[str, Any]:
        CHARGED.append(amount)
        return {"charged": amount}

    return charge_card


def recorded_with(recording: Recording, tmp_path: Path, policy: str) -> Trace:
    charge = charge_card_declared(policy)
    with record(tmp_path / f"{policy}.sftrace"):
        charge(12.5)
    CHARGED.clear()
    return Trace.load(tmp_path / f"{policy}.sftrace")


def test_code_that_now_forbids_a_tool_is_obeyed_whatever_the_bundle_says(
    recording: Recording, tmp_path: Path
) -> None:
    trace = recorded_with(recording, tmp_path, "replayable")  # an old bundle: before the fix
    charge = charge_card_declared("forbidden")  # today's code: a payment, never replayed
    with (
        pytest.raises(ReplayPolicyError) as caught,
        ReplaySession.from_trace(trace, mode="live", allow_live_tools={"charge_card"}) as replay,
    ):
        charge(12.5)
    assert CHARGED == []  # the body did not run, although the bundle and the allowlist said so
    assert caught.value.reason.startswith(
        "the call call-1 has replay policy 'forbidden' declared by this code (recorded: "
        "'replayable'): it is never replayed automatically"
    )
    (call,) = replay.calls
    assert call.action == "rejected"
    assert call.notes == [
        "replay policy: recorded 'replayable', this code declares 'forbidden'; the restrictions "
        "of both apply"
    ]


def test_an_edited_policy_word_does_not_loosen_the_code(
    recording: Recording, tmp_path: Path
) -> None:
    """The policy word edited in a Trace built in memory (as an old bundle without a lines
    fingerprint, or one rebuilt from spans, carries no proof of its policies)."""
    trace = recorded_with(recording, tmp_path, "forbidden")
    call = trace.events[0].model_copy(update={"replay_policy": ReplayPolicy.REPLAYABLE})
    edited = trace.model_copy(update={"events": [call, *trace.events[1:]]})
    assert edited.calls[0].replay_policy.value == "replayable"
    charge = charge_card_declared("forbidden")
    with (
        pytest.raises(ReplayPolicyError, match="declared by this code"),
        ReplaySession.from_trace(edited, mode="live", allow_live_tools={"charge_card"}),
    ):
        charge(12.5)
    assert CHARGED == []


def test_a_recorded_restriction_holds_when_the_code_relaxed_it(
    recording: Recording, tmp_path: Path
) -> None:
    trace = recorded_with(recording, tmp_path, "forbidden")
    charge = charge_card_declared("replayable")
    with (
        pytest.raises(ReplayPolicyError, match="the recorded call call-1 has replay policy"),
        ReplaySession.from_trace(trace, mode="live", allow_live_tools={"charge_card"}) as replay,
    ):
        charge(12.5)
    assert CHARGED == []
    assert replay.calls[0].notes[0].startswith("replay policy: recorded 'forbidden'")


def test_frozen_and_manual_together_need_an_approval_and_never_run_live(
    recording: Recording, tmp_path: Path
) -> None:
    trace = recorded_with(recording, tmp_path, "frozen")
    charge = charge_card_declared("manual")
    with (
        pytest.raises(ReplayPolicyError, match="needs an explicit approval"),
        ReplaySession.from_trace(trace, mode="live", allow_live_tools={"charge_card"}),
    ):
        charge(12.5)
    approved: list[str] = []
    with ReplaySession.from_trace(
        trace,
        mode="live",
        allow_live_tools={"charge_card"},
        approve=lambda rc: approved.append(rc.event.id) or True,
    ) as replay:
        assert charge(12.5) == {"charged": 12.5}
        replay.verify_complete()
    assert approved == ["call-1"]
    assert replay.calls[0].action == "substituted"  # frozen: never executed, even when approved
    assert CHARGED == []


def test_agreeing_policies_add_no_note(recording: Recording, tmp_path: Path) -> None:
    trace = recorded_with(recording, tmp_path, "replayable")
    charge = charge_card_declared("replayable")
    with ReplaySession.from_trace(trace) as replay:
        charge(12.5)
    assert replay.calls[0].notes == []


def test_pending_counts_the_recorded_calls_still_ahead(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def step(n: int) -> int:
        return n

    with record(tmp_path / "steps.sftrace"):
        for n in range(3):
            step(n)
    with ReplaySession.from_trace(tmp_path / "steps.sftrace") as replay:
        seen = [replay.pending]
        for n in range(2):
            step(n)
            seen.append(replay.pending)
    assert seen == [3, 2, 1]
    assert [rc.event.id for rc in replay.pending_calls] == ["call-3"]
    assert replay.summary.pending == 1
    assert [rc.event.id for rc in replay.summary.pending_calls] == ["call-3"]


class Opaque:
    """An object with no JSON form (like an SDK stream)."""


def test_an_unreplayable_output_is_loud_when_recorded_and_at_replay(
    recording: Recording, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @trace_tool
    def stream(n: int) -> Any:
        return Opaque()

    with caplog.at_level("WARNING", logger="stepfork_otel"), record(tmp_path / "o.sftrace"):
        stream(1)
        stream(2)  # the same call site and type: warned once
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        "stepfork_otel: the output of tool stream has no JSON form (test_replay_fidelity.Opaque); "
        "it is recorded as unserialisable and this call cannot be replayed -- return "
        "JSON-encodable values, pydantic models or dataclasses"
    ]
    with (
        pytest.raises(ReplayError, match="could not be serialised when it was recorded") as caught,
        ReplaySession.from_trace(tmp_path / "o.sftrace"),
    ):
        stream(1)
    assert "test_replay_fidelity.Opaque" in caught.value.reason


def test_an_unreplayable_input_is_loud_when_recorded(
    recording: Recording, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @trace_tool
    def consume(item: Any) -> int:
        return 1

    with caplog.at_level("WARNING", logger="stepfork_otel"), record(tmp_path / "i.sftrace"):
        consume(Opaque())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [  # the parameter is named, and the way to leave it out
        "stepfork_otel: the input of tool consume has no JSON form (parameter 'item': "
        "test_replay_fidelity.Opaque); it is recorded as unserialisable and this call cannot be "
        "replayed -- if it is not the tool's input, leave it out: @trace_tool(exclude=('item',))"
    ]
