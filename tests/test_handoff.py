"""The payload hand-off between the boundaries and the bundle processors: one owned object, no
module globals. Nothing is kept unless a processor listens and the span is recorded; nothing
stays pending after a run, after an ``on_end`` that raised, or after shutdown. (That two
processors on one provider both get whole payloads is
``tests/test_processor.py::test_two_bundle_processors_on_one_provider_both_get_whole_payloads``.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import stepfork_otel._internal as internal
from stepfork_otel import Trace, configure, record, trace_tool
from stepfork_otel.recording.handoff import HANDOFF, PayloadHandoff
from stepfork_otel.trace.payload import Payload

BIG = "x" * 5000  # over the span payload cap set below: only the hand-off carries it whole


@trace_tool
def echo(text: str) -> str:
    return text


def test_nothing_is_kept_without_a_listener_or_for_an_unsampled_span() -> None:
    handoff = PayloadHandoff()
    payload = Payload.from_text('"a"')
    recorded = TracerProvider().get_tracer("t").start_span("recorded")
    unsampled = TracerProvider(sampler=ALWAYS_OFF).get_tracer("t").start_span("unsampled")
    assert handoff.kept_id(recorded) is None  # nobody listens
    handoff.keep_for(recorded, "stepfork.input", payload)
    assert handoff.pending == 0
    handoff.attach()
    assert handoff.kept_id(unsampled) is None  # no processor will ever see this span
    handoff.keep_for(unsampled, "stepfork.input", payload)
    assert handoff.pending == 0
    span_id = handoff.kept_id(recorded)
    assert span_id == recorded.get_span_context().span_id
    handoff.keep(span_id, "stepfork.input", payload)
    assert handoff.pending == 1
    copy = handoff.read(span_id)
    assert copy == {"stepfork.input": payload}
    copy["stepfork.output"] = payload  # type: ignore[index]  # a copy: the kept entry is untouched
    assert handoff.read(span_id) == {"stepfork.input": payload}
    handoff.release(span_id)
    assert handoff.pending == 0
    handoff.keep(span_id, "stepfork.input", payload)
    handoff.detach()  # the last listener leaves: what was kept is dropped
    assert handoff.pending == 0
    assert handoff.read(span_id) == {}
    handoff.keep(span_id, "stepfork.input", payload)  # kept by nobody once nobody listens
    assert handoff.pending == 0


def test_nothing_pending_after_a_run_and_after_shutdown(recording: object, tmp_path: Path) -> None:
    configure(max_span_payload_bytes=64)
    with record(tmp_path / "run.sftrace", input={"q": BIG}):
        assert echo(BIG) == BIG
        assert HANDOFF.pending == 1  # the run's input: kept until the run span ends
    assert HANDOFF.pending == 0
    assert Trace.load(tmp_path / "run.sftrace").calls[0].input == f'{{"text":"{BIG}"}}'

    processor = configure(directory=tmp_path / "d")  # replaces (shuts down) the last one
    processor.shutdown()
    with record(tmp_path / "after.sftrace"):
        echo("no processor listens any more")
        assert HANDOFF.pending == 0


class _Failing(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("a processor of the application fails")


def test_nothing_pending_after_an_on_end_that_raised(
    recording: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)  # as in production
    provider = TracerProvider()
    configure(directory=tmp_path / "traces", tracer_provider=provider)
    provider.add_span_processor(_Failing())  # after ours: the SDK lets its exception through
    with caplog.at_level(logging.ERROR, logger="stepfork_otel"):
        assert echo("hi") == "hi"  # the user's call is not broken by it
    assert HANDOFF.pending == 0
    assert "internal error while ending a boundary span" in caplog.text
    (bundle,) = (tmp_path / "traces").glob("*.sftrace")  # ours ran before it: the bundle is there
    assert Trace.load(bundle).calls[0].input == '{"text":"hi"}'


def test_a_read_from_a_signal_handler_in_a_thread_holding_the_lock_does_not_hang() -> None:
    # SIGTERM's handler (SftraceSpanProcessor.finalise) reads open spans' payloads; the signal
    # may land while the main thread is inside keep() or release(), holding the hand-off lock
    import threading

    from stepfork_otel.recording.handoff import PayloadHandoff
    from stepfork_otel.trace.payload import Payload

    handoff = PayloadHandoff()
    handoff.attach()
    handoff.keep(7, "stepfork.input", Payload.from_text('{"a":1}'))
    read: list[object] = []

    def interrupted_inside_keep() -> None:
        with handoff._lock:  # what keep() holds when the signal lands
            read.append(dict(handoff.read(7)))  # what the handler does, in the same thread

    worker = threading.Thread(target=interrupted_inside_keep, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "the hand-off lock deadlocked its own thread"
    assert list(read[0]) == ["stepfork.input"]  # type: ignore[call-overload]
