"""One test per entry point: a failure inside stepfork itself is logged, never raised, and the
user's call still returns its real result. The one deliberate exception: inside a replay session
a call that cannot be recorded raises, because running it live would be a silent fallback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

import stepfork_otel._internal as internal
import stepfork_otel.otel.processor as processor_module
from stepfork_otel import (
    RecordedDependencyError,
    ReplayMismatchError,
    ReplayPolicyError,
    ReplaySession,
    Trace,
    allm_request,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel.otel import run as run_module
from stepfork_otel.recording import boundaries
from stepfork_otel.recording.handoff import HANDOFF, PayloadHandoff
from stepfork_otel.trace import builder as builder_module


class Forced(Exception):
    """The deliberate internal failure."""


def explode(*args: Any, **kwargs: Any) -> Any:
    raise Forced("stepfork bug")


@pytest.fixture
def logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[pytest.LogCaptureFixture]:
    """Internal errors logged (as in production), captured from the "stepfork_otel" logger."""
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)
    with caplog.at_level("ERROR", logger="stepfork_otel"):
        yield caplog


def internal_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    found = []
    for rec in caplog.records:
        if rec.name == "stepfork_otel" and rec.levelname == "ERROR":
            assert rec.exc_info is not None
            assert isinstance(rec.exc_info[1], Forced)
            found.append(rec.getMessage())
    return found


calls: list[str] = []


@trace_tool
def tool(x: int) -> int:
    calls.append("tool")
    return x * 2


@trace_tool
async def atool(x: int) -> int:
    calls.append("atool")
    return x * 3


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


# --- boundaries ----------------------------------------------------------------------------------


def test_trace_tool_sync(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = internal.internal_error_count
    monkeypatch.setattr(boundaries, "capture", explode)
    assert tool(21) == 42
    assert calls == ["tool"]
    assert internal_errors(logged) == [
        "stepfork_otel internal error while preparing a boundary call; the program continues"
    ]
    assert internal.internal_error_count == before + 1


def test_trace_tool_sync_span_start(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boundaries, "next_call_number", explode)
    assert tool(2) == 4
    assert calls == ["tool"]
    assert internal_errors(logged) == [
        "stepfork_otel internal error while opening a boundary span; the program continues"
    ]
    assert recording.exporter.get_finished_spans() == ()


async def test_trace_tool_async(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boundaries, "capture", explode)
    assert await atool(5) == 15
    assert calls == ["atool"]
    assert len(internal_errors(logged)) == 1


def test_llm_request(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boundaries, "model_fingerprint", explode)
    assert llm_request(provider="p", model="m", input="hi", call=lambda: "reply") == "reply"
    assert internal_errors(logged) == [
        "stepfork_otel internal error while preparing a boundary call; the program continues"
    ]


async def test_allm_request(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boundaries, "model_fingerprint", explode)

    async def call() -> str:
        return "async reply"

    assert await allm_request(provider="p", model="m", input="hi", call=call) == "async reply"
    assert len(internal_errors(logged)) == 1


def test_recording_the_output_fails(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = boundaries.capture
    monkeypatch.setattr(
        boundaries,
        "capture",
        lambda value, *args, **kwargs: explode() if value == 42 else real(value, *args, **kwargs),
    )
    assert tool(21) == 42
    assert internal_errors(logged) == [
        "stepfork_otel internal error while recording a call output; the program continues"
    ]


def test_user_exceptions_pass_through_a_failing_recorder(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    @trace_tool
    def fails() -> None:
        raise LookupError("the user's own error")

    monkeypatch.setattr(boundaries, "record_failure", explode)
    with pytest.raises(LookupError, match="the user's own error"):
        fails()
    assert internal_errors(logged) == [
        "stepfork_otel internal error while recording a call failure; the program continues"
    ]


def test_set_payload_attributes(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(boundaries, "span_payload_attributes", explode)
    assert tool(4) == 8
    assert internal_errors(logged) == [
        "stepfork_otel internal error while writing the call input on its span; the program "
        "continues",
        "stepfork_otel internal error while recording a call output; the program continues",
    ]
    (span,) = recording.exporter.get_finished_spans()  # the span itself was still ended
    assert span.name == "execute_tool tool"


def test_side_channel_hand_over(
    recording: Recording, logged: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PayloadHandoff, "kept_id", lambda *args: explode())
    assert tool(4) == 8
    # logged once: without the span's hand-off entry the output is not handed over either
    assert internal_errors(logged) == [
        "stepfork_otel internal error while handing the call input to the bundle processor; "
        "the program continues",
    ]
    assert HANDOFF.pending == 0
    (span,) = recording.exporter.get_finished_spans()
    assert span.name == "execute_tool tool"


# --- record(...) ---------------------------------------------------------------------------------


def test_record_enter(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(run_module, "call_start_time", explode)
    with record(tmp_path / "r.sftrace") as run:
        assert tool(1) == 2
        run.set_output("done")
    assert run.path is None
    assert internal_errors(logged) == [
        "stepfork_otel internal error while starting a run; the program continues"
    ]


def test_record_enter_without_a_processor(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(run_module, "ensure_bundle_processor", explode)
    with record(tmp_path / "r.sftrace") as run:
        assert tool(1) == 2
    assert run.path is None
    assert internal_errors(logged) == [
        "stepfork_otel internal error while attaching the bundle processor; the program continues"
    ]


def test_record_exit(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(run_module, "record_failure", explode)
    with pytest.raises(KeyError), record(tmp_path / "r.sftrace") as run:
        raise KeyError("the agent's own failure")
    assert internal_errors(logged) == [
        "stepfork_otel internal error while recording the run outcome; the program continues"
    ]
    assert run.path == tmp_path / "r.sftrace"  # the span still ended and the bundle was written
    assert Trace.load(run.path).run.status == "unset"


# --- processor -----------------------------------------------------------------------------------


def test_processor_on_start(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(processor_module, "attributes_of", explode)
    with record(tmp_path / "s.sftrace"):
        assert tool(3) == 6
    assert "queueing a started span" in internal_errors(logged)[0]


def test_processor_on_end(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    real, seen = builder_module.span_events, []

    def first_explodes(*args: Any) -> Any:
        seen.append(args)
        return explode() if len(seen) == 1 else real(*args)

    monkeypatch.setattr(builder_module, "span_events", first_explodes)  # (the writer converts)
    with record(tmp_path / "e.sftrace") as run:
        assert tool(3) == 6
        assert tool(4) == 8
        run.set_output(6)
    assert internal_errors(logged) == [
        f"stepfork_otel internal error while converting call 1 for the bundle "
        f"{tmp_path / 'e.sftrace'}; the program continues"
    ]
    assert recording.processor.stats.write_errors == 1
    trace = Trace.load(tmp_path / "e.sftrace")  # the bundle says what it lacks
    assert trace.complete is False
    assert trace.incomplete_reason == "1 call(s) could not be written (internal error, logged)"
    assert [c.input for c in trace.calls] == ['{"x":4}']  # the next call is still written


def test_processor_on_end_queueing(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(recording.processor.bundles, "put", explode)
    with record(tmp_path / "b.sftrace"):
        assert tool(3) == 6
    assert (  # (queueing the started spans failed first)
        "stepfork_otel internal error while queueing a finished span; the program continues"
        in internal_errors(logged)
    )


def test_processor_force_flush(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    flushed: list[bool] = []

    @trace_tool
    def flushing() -> str:
        with monkeypatch.context() as m:
            m.setattr(recording.processor.bundles, "wait", explode)
            flushed.append(recording.processor.force_flush())
        return "flushed"

    with record(tmp_path / "f.sftrace", flush_interval=0):
        assert flushing() == "flushed"
    assert flushed == [False]  # (the flush failed: said, as the SDK's processors say it)
    assert internal_errors(logged) == [
        "stepfork_otel internal error while flushing the bundles; the program continues"
    ]
    assert Trace.load(tmp_path / "f.sftrace").complete  # the final bundle was still written


def test_processor_writer_round(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """The writer thread meets a failure routing a span: logged, and the next spans are still
    taken (the thread goes on)."""
    real, seen = recording.processor.bundles._take, []

    def first_explodes(item: Any) -> None:
        seen.append(item)
        return explode() if len(seen) == 3 else real(item)  # (the run, its bundle, a call)

    monkeypatch.setattr(recording.processor.bundles, "_take", first_explodes)
    with record(tmp_path / "w.sftrace"):
        assert tool(3) == 6
        assert tool(4) == 8
    assert internal_errors(logged) == [
        "stepfork_otel internal error while writing a span to its bundle; the program continues"
    ]
    trace = Trace.load(tmp_path / "w.sftrace")
    assert [c.input for c in trace.calls] == ['{"x":4}']
    assert trace.incomplete_reason == "1 call(s) could not be written (internal error, logged)"
    assert recording.processor.stats.write_errors == 1


def test_a_substituted_failure_is_raised_even_when_its_span_cannot_record_it(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    @trace_tool
    def failing() -> None:
        raise LookupError("recorded failure")

    with record(tmp_path / "rec.sftrace"), pytest.raises(LookupError):
        failing()
    monkeypatch.setattr(boundaries, "record_failure", explode)
    with ReplaySession.from_trace(tmp_path / "rec.sftrace"), pytest.raises(RecordedDependencyError):
        failing()
    assert internal_errors(logged) == [
        "stepfork_otel internal error while recording a substituted outcome; the program continues"
    ]


# --- the deliberate exception: inside replay, an unrecordable call raises ------------------------


def test_inside_a_replay_session_an_unrecordable_call_raises(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with record(tmp_path / "rec.sftrace"):
        tool(1)
        llm_request(provider="p", model="m", input="q", call=lambda: "a")
    calls.clear()
    monkeypatch.setattr(boundaries, "capture", explode)
    with ReplaySession.from_trace(tmp_path / "rec.sftrace"):
        with pytest.raises(Forced):
            tool(1)
        with pytest.raises(Forced):
            llm_request(provider="p", model="m", input="q", call=explode)
    assert calls == []  # the body never ran live
    assert internal_errors(logged) == []  # raised, not logged


def test_inside_a_replay_session_a_span_that_cannot_open_raises(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with record(tmp_path / "rec.sftrace"):
        tool(1)
    calls.clear()
    session = ReplaySession.from_trace(tmp_path / "rec.sftrace")
    monkeypatch.setattr(boundaries, "next_call_number", explode)
    with session, pytest.raises(Forced):
        tool(1)
    assert calls == []
    assert internal_errors(logged) == []
    # the session had already substituted the call: it says the result was never delivered
    (call,) = session.calls
    assert (call.action, call.status, call.error) == (
        "substituted",
        "error",
        "Forced: stepfork bug",
    )
    with pytest.raises(ReplayMismatchError, match="diverged") as raised:
        session.verify_complete()
    assert "ReplaySessionError at call 1: tool tool was substituted by the session, but " in str(
        raised.value
    )
    assert "stepfork failed before the call could go on (Forced)" in str(raised.value)


def test_a_refused_call_whose_span_cannot_open_is_logged_and_still_refused(
    recording: Recording,
    logged: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with record(tmp_path / "rec.sftrace"):
        tool(1)
    session = ReplaySession.from_trace(tmp_path / "rec.sftrace", mode="forbidden")
    monkeypatch.setattr(boundaries, "next_call_number", explode)
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)
    with session, pytest.raises(ReplayPolicyError, match="rejects every dependency call"):
        tool(1)
    assert internal_errors(logged) == [
        "stepfork_otel internal error while recording a refused call; the program continues"
    ]


def test_a_span_started_before_stepfork_failed_is_still_ended(
    recording: Recording, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with record(tmp_path / "rec.sftrace"):
        tool(1)
    monkeypatch.setattr(boundaries.trace_api, "set_span_in_context", explode)
    session = ReplaySession.from_trace(
        tmp_path / "rec.sftrace", mode="live", allow_live_tools={"tool"}
    )
    recording.exporter.clear()
    with session, pytest.raises(Forced):
        tool(1)  # executed (live mode): the span starts, then making it current fails
    spans = recording.exporter.get_finished_spans()  # the tool's span ended, not left open
    assert [s.name for s in spans] == ["execute_tool tool", "replay agent"]
    assert HANDOFF.pending == 0
    (call,) = session.calls
    assert (call.action, call.status) == ("executed", "error")


# --- the one internal-error path, in each of its spellings ---------------------------------------


def test_the_decorator_raises_in_tests_and_logs_in_production(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    @internal.handle_internal_errors("doing stepfork's own work")
    def work(fail: bool) -> int:
        return explode() if fail else 5

    @internal.handle_internal_errors("doing async work")
    async def async_work() -> int:
        return explode()

    assert work(False) == 5
    with pytest.raises(Forced):  # tests re-raise: a bug cannot hide in a log
        work(True)
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)
    with caplog.at_level("ERROR", logger="stepfork_otel"):
        assert work(True) is None
        assert asyncio.run(async_work()) is None
    assert internal_errors(caplog) == [
        "stepfork_otel internal error while doing stepfork's own work; the program continues",
        "stepfork_otel internal error while doing async work; the program continues",
    ]


def test_strict_raises_even_in_production(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)

    def look_up() -> None:
        try:
            explode()
        except Forced:
            internal.internal_error("looking something up", strict=True)

    with pytest.raises(Forced):  # inside a replay session a failure to record is raised
        look_up()
