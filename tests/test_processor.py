"""``SftraceSpanProcessor``: which bundles it writes, when, in which order, and within which
bounds; and that nothing it does can raise into the program."""

from __future__ import annotations

import contextlib
import threading
from contextvars import copy_context
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from orjson import loads as orjson_loads

import stepfork_otel._internal as internal
from stepfork_otel import ErrorEvent, Trace, configure, llm_request, record, trace_tool
from stepfork_otel.config import CONFIG
from stepfork_otel.otel.processor import SftraceSpanProcessor, span_record
from stepfork_otel.recording.handoff import HANDOFF
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.checks import validate_structure, verify_integrity
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR


@trace_tool
def lookup(key: str, limit: int = 2) -> list[str]:
    return [f"{key}-{i}" for i in range(limit)]


@trace_tool
def nested(key: str) -> str:
    return llm_request(provider="p", model="m", input={"key": key}, call=lambda: key.upper())


def outline(trace: Trace) -> list[tuple[str, str, str | None, str | None]]:
    return [
        (e.type, e.id, e.parent_id, getattr(e, "input", None) or getattr(e, "output", None))
        for e in trace.events
    ]


def program(path: Path) -> Trace:
    with record(path, input={"q": 1}) as run:
        lookup("a")
        nested("b")
        with contextlib.suppress(ZeroDivisionError):
            llm_request(provider="p", model="m", input="boom", call=lambda: 1 / 0)
        run.set_output(lookup("c", limit=1))
    return Trace.load(path)


def test_same_program_same_events_and_ids(recording: Recording, tmp_path: Path) -> None:
    first = program(tmp_path / "1.sftrace")
    second = program(tmp_path / "2.sftrace")
    assert outline(first) == outline(second)
    assert [e.type for e in first.events] == [
        "tool_call",
        "tool_result",
        "tool_call",
        "llm_request",
        "llm_response",
        "tool_result",
        "llm_request",
        "error",
        "tool_call",
        "tool_result",
    ]
    assert [e.seq for e in first.calls] == [1, 2, 3, 4, 5]
    assert first.trace_id != second.trace_id
    assert verify_integrity(first) == []


def test_the_bundle_is_written_as_the_run_goes_and_closed_when_it_ends(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "out" / "run.sftrace"
    with record(path):
        lookup("x")
        recording.provider.force_flush()
        mid = Trace.load(path)  # a bundle from the start, incomplete until the run ends
        assert mid.complete is False
        assert [c.input for c in mid.calls] == ['{"key":"x","limit":2}']
    assert Trace.load(path).complete
    assert [p.name for p in path.parent.iterdir()] == ["run.sftrace"]  # no temporary left over
    assert recording.processor.stats.bundles_written == 1
    assert HANDOFF.pending == 0  # every handed-over payload was collected


def test_configure_directory_writes_traces_without_a_run(
    recording: Recording, tmp_path: Path
) -> None:
    tracer = recording.provider.get_tracer("app")
    with (
        tracer.start_as_current_span("handle request") as root,
        tracer.start_as_current_span("plan"),
    ):
        lookup("k")
    with tracer.start_as_current_span("no boundary here"):
        pass
    trace_id = format(root.get_span_context().trace_id, "032x")
    assert [p.name for p in recording.directory.iterdir()] == [f"{trace_id}.sftrace"]
    trace = Trace.load(recording.directory / f"{trace_id}.sftrace")
    assert [c.name for c in trace.context] == ["handle request", "plan"]
    assert trace.calls[0].parent_span_id == trace.context[1].span_id
    assert trace.run.span_id is None
    assert trace.complete


def test_a_remote_parent_makes_a_local_root(recording: Recording) -> None:
    remote = SpanContext(
        trace_id=0x1234, span_id=0x99, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )
    ctx = trace_api.set_span_in_context(NonRecordingSpan(remote))
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("server", context=ctx):
        lookup("r")
    trace = Trace.load(recording.directory / f"{0x1234:032x}.sftrace")
    assert trace.context[0].parent_span_id == f"{0x99:016x}"
    assert len(trace.calls) == 1


def test_runs_inside_an_application_span_get_their_own_bundles(
    recording: Recording, tmp_path: Path
) -> None:
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("batch") as batch:
        with record(tmp_path / "one.sftrace") as one:
            lookup("1")
        assert (tmp_path / "one.sftrace").exists()  # written when the run ended
        lookup("between")
        with record() as two:
            lookup("2")
        with record() as three:
            lookup("3")
    trace_id = format(batch.get_span_context().trace_id, "032x")
    assert one.trace_id == two.trace_id == three.trace_id == trace_id
    assert [c.input for c in Trace.load(tmp_path / "one.sftrace").calls] == [
        '{"key":"1","limit":2}'
    ]
    # the first bundle of the trace to start takes <trace_id>.sftrace: here the calls outside
    # runs, written as they go from the first of them ("between"), before run two started
    assert two.path is not None
    assert three.path is not None
    assert two.path.name.startswith(f"{trace_id}-")  # a later bundle of the trace
    assert three.path.name.startswith(f"{trace_id}-")
    assert [c.input for c in two.trace.calls] == ['{"key":"2","limit":2}']
    assert [c.input for c in three.trace.calls] == ['{"key":"3","limit":2}']
    outside = recording.directory / f"{trace_id}.sftrace"
    rest = Trace.load(outside)
    assert [c.input for c in rest.calls] == ['{"key":"between","limit":2}']
    assert [c.name for c in rest.context] == ["batch"]


def test_a_nested_run_is_also_part_of_the_outer_run(recording: Recording, tmp_path: Path) -> None:
    with record(tmp_path / "outer.sftrace"):
        lookup("o1")
        with record(tmp_path / "inner.sftrace"):
            lookup("i")
        lookup("o2")
    inner = Trace.load(tmp_path / "inner.sftrace")
    outer = Trace.load(tmp_path / "outer.sftrace")
    assert [c.input for c in inner.calls] == ['{"key":"i","limit":2}']
    assert [c.input for c in outer.calls] == [
        '{"key":"o1","limit":2}',
        '{"key":"i","limit":2}',
        '{"key":"o2","limit":2}',
    ]


# --- flush and shutdown --------------------------------------------------------------------------


def test_force_flush_writes_an_incomplete_snapshot_then_the_whole_run(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "flush.sftrace"
    snapshots: list[Trace] = []

    @trace_tool
    def slow(step: int, note: str) -> str:
        assert recording.provider.force_flush()
        snapshots.append(Trace.load(path))
        return "done"

    configure(max_span_payload_bytes=64)  # the open call's input is left off its span
    with record(path, input={"q": "flush"}):
        lookup("before")
        slow(1, "n" * 200)
    snapshot = snapshots[0]  # the bundle as written so far: a call is written when it ends
    assert snapshot.complete is False
    assert (snapshot.incomplete_reason or "").startswith("the recording stopped before the run")
    assert [e.type for e in snapshot.events] == ["tool_call", "tool_result"]
    assert snapshot.run.input == '{"q":"flush"}'
    assert validate_structure(snapshot) == []
    final = Trace.load(path)
    assert final.complete is True
    assert [e.type for e in final.events] == ["tool_call", "tool_result"] * 2
    assert final.calls[1].input == '{"note":"' + "n" * 200 + '","step":1}'  # whole: the hand-off


def test_force_flush_snapshots_calls_outside_runs_with_their_open_calls(
    recording: Recording, tmp_path: Path
) -> None:
    processor = configure(directory=tmp_path / "dir", tracer_provider=recording.provider)
    tracer = recording.provider.get_tracer("app")
    snapshots: list[Trace] = []

    @trace_tool
    def slow(step: int) -> str:
        assert recording.provider.force_flush()
        (written,) = (tmp_path / "dir").iterdir()
        snapshots.append(Trace.load(written))
        return "done"

    with tracer.start_as_current_span("request"):
        lookup("before")
        slow(1)
    (snapshot,) = snapshots  # written as the calls go: the file is its own snapshot
    assert (snapshot.incomplete_reason or "").startswith("the recording stopped before the run")
    assert [e.type for e in snapshot.events] == ["tool_call", "tool_result"]  # ended calls
    assert validate_structure(snapshot) == []
    (final,) = (tmp_path / "dir").iterdir()
    whole = Trace.load(final)
    assert whole.complete is True
    assert [e.type for e in whole.events] == ["tool_call", "tool_result"] * 2
    assert [c.name for c in whole.context] == ["request"]
    assert processor.stats.bundles_written == 1


def test_shutdown_with_an_open_run_leaves_an_incomplete_bundle(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "cut.sftrace"

    @trace_tool
    def last(step: int) -> str:
        recording.provider.shutdown()  # e.g. the process is exiting
        return "never recorded"

    with record(path) as run:
        lookup("a")
        assert last(2) == "never recorded"
    assert run.path == path
    trace = Trace.load(path)
    assert trace.complete is False
    assert [e.type for e in trace.events] == ["tool_call", "tool_result", "tool_call"]
    assert trace.outcome_of(trace.calls[1]) is None
    assert trace.run.end_time_unix_nano == 0  # the run had not ended either
    # and after shutdown the processor writes nothing more: the one bundle is the flushed one
    assert recording.processor.stats.bundles_written == 1
    assert not recording.directory.exists() or list(recording.directory.iterdir()) == []


# --- bounds --------------------------------------------------------------------------------------


def test_per_trace_cap_drops_with_a_warning_and_says_so(
    tmp_path: Path, recording: Recording, caplog: pytest.LogCaptureFixture
) -> None:
    processor = configure(
        directory=tmp_path / "capped", tracer_provider=recording.provider, max_spans_per_trace=3
    )
    with record(tmp_path / "long.sftrace"):  # a run holds what is open: the cap is not met
        for i in range(5):
            lookup(str(i))
    assert Trace.load(tmp_path / "long.sftrace").complete

    @trace_tool
    def nest(depth: int) -> int:
        return depth if depth == 0 else nest(depth - 1)

    with caplog.at_level("WARNING", logger="stepfork_otel"), record(tmp_path / "c.sftrace"):
        nest(4)  # the run and 5 nested calls open at once: 3 more than the cap
    trace = Trace.load(tmp_path / "c.sftrace")
    assert trace.complete is False
    assert trace.dropped_spans == 3
    assert "3 span(s) of this trace were dropped" in (trace.incomplete_reason or "")
    assert [c.input for c in trace.calls] == ['{"depth":4}', '{"depth":3}']
    assert processor.stats.dropped_spans == 3
    assert caplog.text.count("exceeded 3 spans held") == 1


def test_open_trace_cap_refuses_whole_traces_and_says_so(
    tmp_path: Path, recording: Recording, caplog: pytest.LogCaptureFixture
) -> None:
    processor = configure(
        directory=tmp_path / "capped", tracer_provider=recording.provider, max_open_traces=2
    )
    tracer = recording.provider.get_tracer("app")
    held = [tracer.start_span("open 1"), tracer.start_span("open 2")]
    with caplog.at_level("WARNING", logger="stepfork_otel"):
        with record(tmp_path / "refused.sftrace", input={"q": "r"}):
            lookup("lost")
            nested("lost")
        for span in held:
            span.end()
        with record(tmp_path / "after.sftrace"):  # room again
            lookup("kept")
    refused = Trace.load(tmp_path / "refused.sftrace")
    assert refused.complete is False
    assert "max_open_traces" in (refused.incomplete_reason or "")
    assert refused.events == []
    assert refused.run.input == '{"q":"r"}'
    assert refused.dropped_spans == 4  # two tools, one LLM call, the run
    assert processor.stats.dropped_traces == 1
    assert processor.stats.dropped_spans == 4
    assert "2 open traces already followed" in caplog.text
    assert Trace.load(tmp_path / "after.sftrace").complete is True


def test_a_trace_whose_spans_all_ended_holds_no_room(tmp_path: Path, recording: Recording) -> None:
    """A trace is followed while something of it is open here: one whose child ended after its
    root is let go at once, and never keeps a later trace out at the open-trace cap."""
    processor = configure(
        directory=tmp_path / "capped", tracer_provider=recording.provider, max_open_traces=1
    )
    tracer = recording.provider.get_tracer("app")
    root = tracer.start_span("root")
    late = tracer.start_span("late child", context=trace_api.set_span_in_context(root))
    root.end()
    late.end()  # ends after its root
    with record(tmp_path / "ok.sftrace"):
        lookup("x")
    assert processor.stats.dropped_traces == 0
    assert Trace.load(tmp_path / "ok.sftrace").complete is True
    assert processor.bundles.open_traces == 0


# --- threads, errors -----------------------------------------------------------------------------


def test_threads_inside_one_run(recording: Recording, tmp_path: Path) -> None:
    def worker(i: int) -> None:
        for j in range(3):
            lookup(f"{i}-{j}")

    with record(tmp_path / "t.sftrace"):
        threads = [threading.Thread(target=copy_context().run, args=(worker, i)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    trace = Trace.load(tmp_path / "t.sftrace")
    assert validate_structure(trace) == []
    assert len(trace.calls) == 60
    assert [c.seq for c in trace.calls] == list(range(1, 61))
    for i in range(20):  # each thread's calls in its own order
        mine = [c.input for c in trace.calls if f'"{i}-' in (c.input or "")]
        assert mine == [f'{{"key":"{i}-{j}","limit":2}}' for j in range(3)]
    assert trace.complete


def test_a_failed_write_is_logged_counted_and_never_raised(
    recording: Recording,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with caplog.at_level("ERROR", logger="stepfork_otel"), record(blocker / "x.sftrace") as run:
        assert lookup("w") == ["w-0", "w-1"]
    assert run.path is None
    assert recording.processor.stats.write_errors == 1
    assert "internal error while writing the bundle" in caplog.text


def test_error_events_keep_their_order_among_calls(recording: Recording, tmp_path: Path) -> None:
    @trace_tool
    def fails(n: int) -> Any:
        raise RuntimeError(f"no {n}")

    with record(tmp_path / "e.sftrace"):
        for n in range(3):
            with pytest.raises(RuntimeError):
                fails(n)
            lookup(str(n))
    trace = Trace.load(tmp_path / "e.sftrace")
    errors = [e for e in trace.events if isinstance(e, ErrorEvent)]
    assert [e.message for e in errors] == ["no 0", "no 1", "no 2"]
    assert [e.type for e in trace.events] == ["tool_call", "error", "tool_call", "tool_result"] * 3


def test_boundary_calls_outside_any_span_with_nowhere_to_go_are_not_queued(
    tmp_path: Path,
) -> None:
    """No directory, no run: a lone boundary call (a test replaying an agent outside any span)
    cannot end up in a bundle, so the processor queues nothing of it -- not even for a moment --
    while a run made inside such a call still gets its bundle, nested calls and all."""
    provider = TracerProvider()
    processor = configure(tracer_provider=provider)
    try:
        assert processor.directory is None
        queued: list[Any] = []
        real = processor.bundles.put

        def spy(item: Any) -> None:
            queued.append(item)
            real(item)

        processor.bundles.put = spy  # type: ignore[method-assign]
        assert lookup("x") == ["x-0", "x-1"]
        assert nested("y") == "Y"
        assert queued == []  # never queued
        assert HANDOFF.pending == 0

        @trace_tool
        def outer() -> str:
            with record(tmp_path / "inner.sftrace"):
                return nested("z")

        assert outer() == "Z"
        trace = Trace.load(tmp_path / "inner.sftrace")
        assert [(e.type, e.parent_id) for e in trace.events] == [
            ("tool_call", None),
            ("llm_request", "call-1"),
            ("llm_response", "call-2"),
            ("tool_result", "call-1"),
        ]
        assert len(queued) == 7  # the run, its bundle, the calls inside it: started and ended
        assert processor.bundles.open_traces == 0
    finally:
        processor.shutdown()
        provider.shutdown()


def test_with_a_directory_a_lone_call_keeps_its_payloads_whole(recording: Recording) -> None:
    """A boundary call outside any span is a trace of its own: with a directory it is written,
    and a payload left off the span (over the size cap) is still whole in its bundle."""
    configure(max_span_payload_bytes=64)
    big = lookup("k" * 100, limit=3)
    (path,) = recording.directory.iterdir()
    trace = Trace.load(path)
    assert trace.calls[0].input == '{"key":"' + "k" * 100 + '","limit":3}'
    outcome = trace.outcome_of(trace.calls[0])
    assert outcome is not None
    assert outcome.output is not None
    assert orjson_loads(outcome.output) == big
    assert HANDOFF.pending == 0


def test_two_bundle_processors_on_one_provider_both_get_whole_payloads(tmp_path: Path) -> None:
    """The hand-off is read by every processor; the boundary drops it once the span ended."""
    provider = TracerProvider()
    first = SftraceSpanProcessor(tmp_path / "a")
    second = SftraceSpanProcessor(tmp_path / "b")
    provider.add_span_processor(first)
    provider.add_span_processor(second)
    CONFIG.use_tracer_provider(provider)
    CONFIG.update(max_span_payload_bytes=64)  # the payloads are left off the spans
    try:
        tracer = provider.get_tracer("app")
        with tracer.start_as_current_span("request") as root:
            lookup("k" * 100, limit=3)
        name = f"{root.get_span_context().trace_id:032x}.sftrace"
        bundles = [Trace.load(tmp_path / d / name) for d in ("a", "b")]
        for trace in bundles:
            outcome = trace.outcome_of(trace.calls[0])
            assert outcome is not None
            assert outcome.output is not None
            assert orjson_loads(outcome.output) == [f"{'k' * 100}-{i}" for i in range(3)]
        assert HANDOFF.pending == 0
    finally:
        first.shutdown()
        second.shutdown()
        CONFIG.use_tracer_provider(None)
        provider.shutdown()


# --- calls outside runs, written as they go -----------------------------------------------------


def _request(tracer: Any) -> str:
    """An application's request: its own spans around calls, a call that calls another, a
    failure, and a call from a worker thread that carries the request's context."""
    with tracer.start_as_current_span("request") as root:
        lookup("a")
        with tracer.start_as_current_span("plan"):
            nested("b")
            with contextlib.suppress(ZeroDivisionError):
                llm_request(provider="p", model="m", input="boom", call=lambda: 1 / 0)
        worker = threading.Thread(target=copy_context().run, args=(lookup, "w"))
        worker.start()
        worker.join()
        lookup("c", limit=1)
    return format(root.get_span_context().trace_id, "032x")


def test_calls_outside_runs_are_written_as_they_go_and_equal_the_imported_bundle(
    recording: Recording,
) -> None:
    """The trace's own bundle (calls outside any run) is written as the calls end, like a run's,
    and loads equal to the bundle the importer builds from the same spans (the one builder)."""
    tracer = recording.provider.get_tracer("app")
    seen: list[Trace] = []

    @trace_tool
    def peek() -> int:
        recording.provider.force_flush()
        (written,) = recording.directory.iterdir()
        seen.append(Trace.load(written))
        return len(seen)

    with tracer.start_as_current_span("request") as root:
        lookup("a")
        peek()
    live_id = format(root.get_span_context().trace_id, "032x")
    (during,) = seen  # the file while the request ran: the call that had ended, no trailer
    assert during.complete is False
    assert [e.type for e in during.events] == ["tool_call", "tool_result"]
    assert Trace.load(recording.directory / f"{live_id}.sftrace").complete

    recording.exporter.clear()
    trace_id = _request(tracer)
    live = Trace.load(recording.directory / f"{trace_id}.sftrace")
    records = [span_record(s) for s in recording.exporter.get_finished_spans()]
    imported = spans_to_trace(records, redactor=DEFAULT_REDACTOR)
    assert live.complete is True
    assert validate_structure(live) == []
    assert verify_integrity(live) == []
    assert [c.name for c in live.context] == ["request", "plan"]
    assert live.run.span_id is None  # calls outside runs: no run
    for event in imported.events:  # (the span carries the payloads: none is over the size cap)
        assert event in live.events
    assert live.model_dump() == imported.model_dump()


def test_a_run_inside_a_request_keeps_its_calls_out_of_the_requests_bundle(
    recording: Recording, tmp_path: Path
) -> None:
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("request") as root:
        lookup("before")
        with record(tmp_path / "run.sftrace"):
            lookup("inside")
            with tracer.start_as_current_span("step in the run"):
                lookup("deeper")
        lookup("after")
    trace_id = format(root.get_span_context().trace_id, "032x")
    rest = Trace.load(recording.directory / f"{trace_id}.sftrace")
    assert [c.input for c in rest.calls] == [
        '{"key":"before","limit":2}',
        '{"key":"after","limit":2}',
    ]
    assert [c.name for c in rest.context] == ["request"]
    run = Trace.load(tmp_path / "run.sftrace")
    assert [c.input for c in run.calls] == [
        '{"key":"inside","limit":2}',
        '{"key":"deeper","limit":2}',
    ]
    assert [c.name for c in run.context] == ["step in the run"]


def _remote_parent(trace_id: int) -> Any:
    """A context whose current span is a remote one of ``trace_id``: spans started in it are
    local roots of that trace."""
    remote = SpanContext(trace_id, 0x99, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace_api.set_span_in_context(NonRecordingSpan(remote))


def _two_requests(recording: Recording, trace_id: int) -> tuple[trace_api.Span, trace_api.Span]:
    """Two requests of one distributed trace handled here at once (both children of the same
    remote span), each having made one call: ``1a`` and ``2a``."""
    parent = _remote_parent(trace_id)
    tracer = recording.provider.get_tracer("app")
    first = tracer.start_span("first request", context=parent)
    second = tracer.start_span("second request", context=parent)
    with trace_api.use_span(first):
        lookup("1a")
    with trace_api.use_span(second):
        lookup("2a")
    return first, second


def test_two_local_roots_of_one_trace_get_a_bundle_each(recording: Recording) -> None:
    """Two requests of one distributed trace handled here at once: each is written to its own
    file, with its own calls and context."""
    first, second = _two_requests(recording, 0xABC)
    with trace_api.use_span(first):
        lookup("1b")
    second.end()
    first.end()
    trace_id = f"{0xABC:032x}"
    files = sorted(p.name for p in recording.directory.iterdir())
    assert files == [f"{trace_id}-outside-runs.sftrace", f"{trace_id}.sftrace"]
    one = Trace.load(recording.directory / f"{trace_id}.sftrace")
    two = Trace.load(recording.directory / f"{trace_id}-outside-runs.sftrace")
    assert [c.input for c in one.calls] == ['{"key":"1a","limit":2}', '{"key":"1b","limit":2}']
    assert [c.input for c in two.calls] == ['{"key":"2a","limit":2}']
    assert [c.name for c in one.context] == ["first request"]
    assert [c.name for c in two.context] == ["second request"]
    assert one.complete
    assert two.complete


def test_a_call_outside_any_span_keeps_the_calls_it_makes(recording: Recording) -> None:
    nested("b")  # a tool, outside any span, that makes an LLM call: one bundle of both
    (bundle,) = recording.directory.iterdir()
    trace = Trace.load(bundle)
    assert [(e.type, e.id, e.parent_id) for e in trace.events][:2] == [
        ("tool_call", "call-1", None),
        ("llm_request", "call-2", "call-1"),
    ]
    assert trace.context == []


def test_a_call_made_in_a_span_that_already_ended_is_recorded(recording: Recording) -> None:
    """A task started in a step of the request makes its call after the step ended."""
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("request") as root:
        lookup("a")
        step = tracer.start_span("step")
        step.end()
        with trace_api.use_span(step):
            lookup("late")
    trace = Trace.load(recording.directory / f"{root.get_span_context().trace_id:032x}.sftrace")
    assert [c.input for c in trace.calls] == ['{"key":"a","limit":2}', '{"key":"late","limit":2}']
    assert trace.complete


def test_a_span_refused_at_the_cap_is_counted_once_room_was_freed(recording: Recording) -> None:
    """Refused at its start, a span that ends after calls written as they go freed room is
    still dropped and counted: the bundle says it is incomplete."""
    recording.processor.max_spans_per_trace = 3
    tracer = recording.provider.get_tracer("app")
    tool = {"stepfork.kind": "tool"}
    with tracer.start_as_current_span("request") as root, tracer.start_as_current_span("step"):
        first = tracer.start_span("c1", attributes=tool)  # request, step, c1: 3 open
        refused = tracer.start_span("c2", attributes=tool)
        first.end()
        refused.end()
    trace = Trace.load(recording.directory / f"{root.get_span_context().trace_id:032x}.sftrace")
    assert trace.complete is False
    assert trace.dropped_spans == 1


def test_a_call_starting_as_its_root_ends_leaves_nothing_open(recording: Recording) -> None:
    """A call starts in the request's context just after the request ended (its bundle closed):
    it makes a bundle of its own, closed when it ends, and nothing is left open."""
    tracer = recording.provider.get_tracer("app")
    tool = {"stepfork.kind": "tool"}
    root = tracer.start_span("request")
    with trace_api.use_span(root):
        tracer.start_span("c1", attributes=tool).end()
    root.end()
    late = tracer.start_span("late", attributes=tool, context=trace_api.set_span_in_context(root))
    late.end()
    assert recording.provider.force_flush()
    assert recording.processor.bundles.open_traces == 0
    for path in recording.directory.iterdir():
        assert Trace.load(path).complete


def test_each_later_local_root_of_a_trace_gets_a_file_of_its_own(recording: Recording) -> None:
    parent = _remote_parent(0xABD)
    tracer = recording.provider.get_tracer("app")
    a = tracer.start_span("A", context=parent)
    b = tracer.start_span("B", context=parent)
    with trace_api.use_span(a):
        lookup("a")  # written as it goes: <trace_id>.sftrace
    with trace_api.use_span(b):
        lookup("b")  # buffered, a second root of the trace
    a.end()
    c = tracer.start_span("C", context=parent)
    with trace_api.use_span(c):
        lookup("c")  # written as it goes again, under a third root
    b.end()
    c.end()
    held = {p.name: [x.input for x in Trace.load(p).calls] for p in recording.directory.iterdir()}
    assert sorted(held) == [
        f"{0xABD:032x}-outside-runs-2.sftrace",
        f"{0xABD:032x}-outside-runs.sftrace",
        f"{0xABD:032x}.sftrace",
    ]
    assert sorted(x for calls in held.values() for x in calls) == [
        '{"key":"a","limit":2}',
        '{"key":"b","limit":2}',
        '{"key":"c","limit":2}',
    ]


def test_a_call_made_after_the_call_it_was_made_in_ended_is_said(
    recording: Recording, caplog: pytest.LogCaptureFixture
) -> None:
    """A fire-and-forget task of a tool makes its call after the tool returned: that call is in
    no bundle (its call was written and left the processor), and it is counted and said."""
    tracer = recording.provider.get_tracer("app")
    tool = {"stepfork.kind": "tool"}
    caplog.set_level("WARNING", logger="stepfork_otel")
    with tracer.start_as_current_span("request") as root:
        lookup("a")
        outer = tracer.start_span("execute_tool outer", attributes=tool)
        outer.end()
        late = tracer.start_span(
            "late", attributes=tool, context=trace_api.set_span_in_context(outer)
        )
        late.end()
    trace_id = f"{root.get_span_context().trace_id:032x}"
    assert f"1 call(s) of trace {trace_id} started after the call they were made in" in caplog.text
    assert recording.processor.stats.dropped_spans == 1
    trace = Trace.load(recording.directory / f"{trace_id}.sftrace")
    assert [c.span_id for c in trace.calls][-1] == f"{outer.get_span_context().span_id:016x}"


def test_a_second_local_root_of_a_trace_is_written_as_it_goes_too(recording: Recording) -> None:
    """Two requests of one distributed trace open at once here: each bundle holds its calls as
    they end, the second's as much as the first's (it used to be buffered until its root ended)."""
    first, second = _two_requests(recording, 0xABE)
    assert recording.provider.force_flush()
    trace_id = f"{0xABE:032x}"
    during = {p.name: [c.input for c in Trace.load(p).calls] for p in recording.directory.iterdir()}
    assert during == {
        f"{trace_id}.sftrace": ['{"key":"1a","limit":2}'],
        f"{trace_id}-outside-runs.sftrace": ['{"key":"2a","limit":2}'],
    }
    second.end()
    first.end()
    assert all(Trace.load(p).complete for p in recording.directory.iterdir())
