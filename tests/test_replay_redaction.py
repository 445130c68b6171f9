"""Replay adds no secret material: a live body's exception is redacted in what the session keeps."""

from __future__ import annotations

import pytest
from conftest import Recording

from stepfork_otel import ReplaySession, record, trace_tool

SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
fail_live = False


@trace_tool
def lookup(city: str) -> str:
    if fail_live:
        raise RuntimeError(f"upstream refused token {SECRET}")
    return city.upper()


def test_live_tool_exception_is_redacted_in_replayed_calls(recording: Recording) -> None:
    global fail_live
    path = recording.directory / "run.sftrace"
    with record(path):
        lookup("paris")
    fail_live = True
    try:
        with (
            ReplaySession.from_trace(path, mode="live", allow_live_tools={"lookup"}) as replay,
            pytest.raises(RuntimeError, match="upstream refused"),
        ):
            lookup("paris")
    finally:
        fail_live = False
    (call,) = replay.calls
    assert call.action == "executed"
    assert call.error is not None
    assert SECRET not in call.error
    assert "[REDACTED:github_token]" in call.error
