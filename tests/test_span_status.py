"""A stepfork span whose call or run succeeded ends with the OpenTelemetry status OK (Phoenix and
other back-ends show an Unset span as neither a success nor a failure); a failed one is ERROR,
and a status already set is never overwritten."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Recording
from opentelemetry.trace import StatusCode

from stepfork_otel import ReplaySession, llm_request, record, trace_tool


@trace_tool
def lookup(city: str) -> list[str]:
    return [city]


@trace_tool
def broken(city: str) -> None:
    raise ValueError(f"no {city}")


def _status(recording: Recording) -> dict[str, StatusCode]:
    return {s.name: s.status.status_code for s in recording.exporter.get_finished_spans()}


def test_a_successful_run_and_its_calls_are_ok(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "ok.sftrace", name="agent") as run:
        lookup("Paris")
        llm_request(provider="openai", model="m", input={"q": 1}, call=lambda: {"a": 1})
        run.set_output("done")
    status = _status(recording)
    assert status == {
        "execute_tool lookup": StatusCode.OK,
        "chat m": StatusCode.OK,
        "invoke_agent agent": StatusCode.OK,
    }, status


def test_a_failed_call_and_run_are_errors(recording: Recording, tmp_path: Path) -> None:
    def agent() -> None:
        with record(tmp_path / "bad.sftrace", name="agent"):
            lookup("Paris")
            broken("Paris")

    with pytest.raises(ValueError, match="no Paris"):
        agent()
    status = _status(recording)
    assert status == {
        "execute_tool lookup": StatusCode.OK,
        "execute_tool broken": StatusCode.ERROR,
        "invoke_agent agent": StatusCode.ERROR,
    }, status


def test_a_substituted_call_is_ok(recording: Recording, tmp_path: Path) -> None:
    path = tmp_path / "ok.sftrace"
    with record(path, name="agent"):
        lookup("Paris")
    recording.exporter.clear()
    with ReplaySession.from_trace(path, mode="frozen") as replay:
        assert lookup("Paris") == ["Paris"]
        replay.verify_complete()
    assert _status(recording)["execute_tool lookup"] is StatusCode.OK
