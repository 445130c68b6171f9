"""Per-call replay policies, recorded with each call and enforced whatever the session mode:
``replayable`` (the mode decides), ``frozen`` (only ever substituted), ``manual`` (needs an
approval in every mode) and ``forbidden`` (never replayed automatically)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import ReplayPolicyError, ReplaySession, Trace, record, trace_tool

RAN: Counter[str] = Counter()


@trace_tool
def read_inventory(sku: str) -> int:
    RAN["read_inventory"] += 1
    return 7


@trace_tool(replay_policy="frozen")
def read_production_db(query: str) -> list[str]:
    RAN["read_production_db"] += 1
    return ["row-1", "row-2"]


@trace_tool(replay_policy="manual")
def send_email(to: str) -> str:
    RAN["send_email"] += 1
    return f"sent to {to}"


@trace_tool(replay_policy="forbidden")
def charge_card(amount: float) -> dict[str, Any]:
    RAN["charge_card"] += 1
    return {"charge_id": "ch_1", "amount": amount}


def _record(path: Path, body: Callable[[], Any]) -> Trace:
    with record(path):
        body()
    RAN.clear()
    return Trace.load(path)


@pytest.fixture
def trace(recording: Recording, tmp_path: Path) -> Trace:
    def body() -> None:
        read_inventory("sku-1")
        read_production_db("select 1")
        send_email("ada@example.com")
        charge_card(12.5)

    recorded = _record(tmp_path / "policies.sftrace", body)
    assert [e.replay_policy.value for e in recorded.calls] == [
        "replayable",
        "frozen",
        "manual",
        "forbidden",
    ]
    return recorded


def test_forbidden_policy_is_refused_in_frozen_mode(trace: Trace) -> None:
    with ReplaySession.from_trace(trace, approve=lambda call: True) as replay:
        assert read_inventory("sku-1") == 7
        read_production_db("select 1")
        send_email("ada@example.com")
        with pytest.raises(ReplayPolicyError) as caught:
            charge_card(12.5)
    assert caught.value.reason.startswith(
        "the recorded call call-4 has replay policy 'forbidden': it is never replayed "
        "automatically, whatever the mode or allowlist"
    )
    assert RAN == {}
    assert [rc.event.id for rc in replay.pending_calls] == ["call-4"]


def test_forbidden_policy_is_refused_in_live_mode_even_when_allow_listed(trace: Trace) -> None:
    allowed = {"read_inventory", "read_production_db", "send_email", "charge_card"}
    with ReplaySession.from_trace(
        trace, mode="live", allow_live_tools=allowed, approve=lambda call: True
    ):
        read_inventory("sku-1")
        read_production_db("select 1")
        send_email("ada@example.com")
        with pytest.raises(ReplayPolicyError, match="replay policy 'forbidden'"):
            charge_card(12.5)
    assert RAN["charge_card"] == 0


def test_forbidden_policy_can_be_substituted_with_a_manual_approval(trace: Trace) -> None:
    approved: list[str] = []

    def approve(call: Any) -> bool:
        approved.append(call.name)
        return True

    with ReplaySession.from_trace(trace, mode="manual", approve=approve) as replay:
        read_inventory("sku-1")
        read_production_db("select 1")
        send_email("ada@example.com")
        assert charge_card(12.5) == {"charge_id": "ch_1", "amount": 12.5}
        replay.verify_complete()
    assert approved == ["read_inventory", "read_production_db", "send_email", "charge_card"]
    assert RAN == {}
    assert replay.calls[-1].action == "substituted"


def test_frozen_policy_is_substituted_in_live_mode_even_when_allow_listed(trace: Trace) -> None:
    allowed = {"read_inventory", "read_production_db", "send_email"}
    with ReplaySession.from_trace(
        trace, mode="live", allow_live_tools=allowed, approve=lambda call: True
    ) as replay:
        read_inventory("sku-1")
        assert read_production_db("select 1") == ["row-1", "row-2"]
        send_email("ada@example.com")
    assert [c.action for c in replay.calls] == ["executed", "substituted", "executed"]
    assert RAN == {"read_inventory": 1, "send_email": 1}


def test_frozen_policy_tool_in_live_mode_needs_no_allowlist(trace: Trace) -> None:
    with ReplaySession.from_trace(
        trace, mode="live", allow_live_tools={"read_inventory"}
    ) as replay:
        read_inventory("sku-1")
        read_production_db("select 1")
    assert [c.action for c in replay.calls] == ["executed", "substituted"]


def test_manual_policy_needs_an_approval_even_in_frozen_mode(trace: Trace) -> None:
    with ReplaySession.from_trace(trace) as replay:
        read_inventory("sku-1")
        read_production_db("select 1")
        with pytest.raises(ReplayPolicyError) as caught:
            send_email("ada@example.com")
    assert caught.value.reason == (
        "tool send_email needs an explicit approval (recorded policy 'manual') and no approval "
        "callback was given (ReplaySession(..., approve=...))"
    )
    assert [rc.event.id for rc in replay.pending_calls] == ["call-3", "call-4"]


def test_manual_policy_denied_by_the_approver(trace: Trace) -> None:
    with ReplaySession.from_trace(trace, approve=lambda call: call.name != "send_email"):
        read_inventory("sku-1")
        read_production_db("select 1")
        with pytest.raises(ReplayPolicyError, match="was not approved"):
            send_email("ada@example.com")
    assert RAN == {}


def test_manual_policy_once_approved_follows_the_mode(trace: Trace) -> None:
    with ReplaySession.from_trace(
        trace,
        mode="live",
        allow_live_tools={"read_inventory", "send_email"},
        approve=lambda call: True,
    ) as replay:
        read_inventory("sku-1")
        read_production_db("select 1")
        assert send_email("ada@example.com") == "sent to ada@example.com"
    assert replay.calls[-1].action == "executed"
    assert RAN["send_email"] == 1


def test_policy_is_enforced_after_matching(trace: Trace) -> None:
    # a mismatched call is reported as a mismatch, not as a policy refusal
    from stepfork_otel import ReplayMismatchError

    with ReplaySession.from_trace(trace):
        read_inventory("sku-1")
        read_production_db("select 1")
        with pytest.raises(ReplayMismatchError, match="input differs"):
            send_email("grace@example.com")
