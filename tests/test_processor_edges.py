"""The bundle processor at its edges: the writer wakes for work nobody waits on, traces are let
go, an end cut off before it was queued still closes its bundle, exit handling never waits on a
lock the program holds, default names never replace another file, a forked child starts free,
and a bundle built locally loads equal to the one imported from the same spans in the cases
where spans outlive what they were made in."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Recording
from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import stepfork_otel._internal as internal
from stepfork_otel import Trace, configure, record, trace_tool
from stepfork_otel.otel.processor import span_record
from stepfork_otel.recording.handoff import PayloadHandoff
from stepfork_otel.trace import builder as builder_module
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

TOOL = {"stepfork.kind": "tool"}


@trace_tool
def lookup(key: str) -> str:
    return key.upper()


def _eventually(check: Any, what: str, seconds: float = 60.0) -> None:
    """``check()`` becomes true (a hang guard, not a timing: the writer's round is due in a
    fraction of a second; a loaded machine may take longer)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _remote(trace_id: int) -> Any:
    remote = SpanContext(trace_id, 0x99, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace_api.set_span_in_context(NonRecordingSpan(remote))


# --- the writer wakes for what nobody waits on ---------------------------------------------------


def test_calls_outside_runs_reach_the_disk_while_their_request_is_open(
    recording: Recording,
) -> None:
    """With a directory, nothing waits for the writer until the request ends; its rounds still
    come, so a kill mid-request leaves the calls that ended."""
    assert configure(flush_interval=0.05) is recording.processor
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("request"):
        lookup("a")
        lookup("b")

        def written() -> bool:
            files = (
                list(recording.directory.glob("*.sftrace")) if recording.directory.exists() else []
            )
            return bool(files) and len(Trace.load(files[0]).calls) == 2

        _eventually(written, "the calls never reached the disk")


def test_the_exit_handler_closes_a_request_s_bundle_nobody_waited_on(
    recording: Recording,
) -> None:
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("request"):
        lookup("a")
        recording.processor.finalise()  # (what SIGTERM runs, mid-request)
        (path,) = recording.directory.iterdir()
        trace = Trace.load(path)
        assert trace.incomplete_reason == "the process exited before the run ended"
        assert [c.input for c in trace.calls] == ['{"key":"a"}']


# --- traces are let go ---------------------------------------------------------------------------


def test_a_span_that_outlives_its_run_holds_no_trace_open(tmp_path: Path) -> None:
    """Without a directory, nothing of a trace outlives its last run: a span started in the run
    and ended after it (a background task's) does not keep the trace, which would keep later
    traces out at the open-trace cap."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    processor = configure(tracer_provider=provider, max_open_traces=3)
    try:
        tracer = provider.get_tracer("app")
        outliving = []
        for n in range(4):
            with record(tmp_path / f"{n}.sftrace"):
                lookup(str(n))
                outliving.append(tracer.start_span("background task"))
        assert processor.force_flush()
        assert processor.bundles.open_traces == 0
        assert all(Trace.load(tmp_path / f"{n}.sftrace").complete for n in range(4))
        assert processor.stats.dropped_traces == 0
        for span in outliving:
            span.end()
    finally:
        processor.shutdown()
        provider.shutdown()


# --- an end cut off before it was queued ---------------------------------------------------------


def test_a_run_whose_end_was_cut_off_before_it_was_queued_still_gets_its_trailer(
    recording: Recording, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt lands in the processor's ``on_end`` of the run span, before the end is
    queued (here: in the hand-off read); the program catches it and goes on. The end is queued
    on the way out, so the bundle is closed with its trailer, and the trace is let go."""
    real = PayloadHandoff.read

    def cut(self: PayloadHandoff, span_id: int) -> Any:
        if cut.armed:  # type: ignore[attr-defined]
            cut.armed = False  # type: ignore[attr-defined]
            raise KeyboardInterrupt
        return real(self, span_id)

    cut.armed = False  # type: ignore[attr-defined]
    monkeypatch.setattr(PayloadHandoff, "read", cut)
    path = tmp_path / "cut.sftrace"

    def run() -> None:
        with record(path, input={"q": 1}):
            lookup("a")
            cut.armed = True  # type: ignore[attr-defined]  # (for the next span to end: the run)

    with pytest.raises(KeyboardInterrupt):
        run()
    assert recording.provider.force_flush()
    trace = Trace.load(path)
    assert trace.complete
    assert [c.input for c in trace.calls] == ['{"key":"a"}']
    assert recording.processor.bundles.open_traces == 0
    assert recording.processor._followed == {}


# --- exit handling never waits on the program's locks --------------------------------------------


def test_the_exit_handler_finishes_while_the_program_holds_the_processor_s_lock(
    recording: Recording,
) -> None:
    """A SIGTERM handler lands while the main thread holds the processor's lock (a run's start,
    say); the writer it waits for opens and closes bundles without that lock."""
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("request"):
        lookup("a")
        with recording.processor._lock:
            recording.processor.finalise(timeout=30)
            (path,) = recording.directory.iterdir()
            assert Trace.load(path).incomplete_reason == "the process exited before the run ended"


# --- default names --------------------------------------------------------------------------------


def test_a_default_name_is_never_put_over_another_file(recording: Recording) -> None:
    """Another process (or an older run) left a bundle under the name a new one would take:
    the new one takes the next name; the file there is left as it was."""
    trace_id = 0xFEED
    recording.directory.mkdir(parents=True, exist_ok=True)
    taken = recording.directory / f"{trace_id:032x}.sftrace"
    taken.write_text("not ours\n")
    tracer = recording.provider.get_tracer("app")
    with tracer.start_as_current_span("request", context=_remote(trace_id)):
        lookup("a")
        with record(recording.directory / "") as run:  # a directory: a default name
            lookup("b")
    assert taken.read_text() == "not ours\n"
    assert run.path is not None
    assert run.path != taken
    names = sorted(p.name for p in recording.directory.iterdir())
    assert len(names) == 3
    bundles = [Trace.load(recording.directory / n) for n in names if n != taken.name]
    assert sorted(c.input for b in bundles for c in b.calls) == ['{"key":"a"}', '{"key":"b"}']


# --- waits ---------------------------------------------------------------------------------------


def test_a_marker_is_set_even_when_closing_a_bundle_fails(
    recording: Recording,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("stepfork bug")

    monkeypatch.setattr(builder_module.BundleBuilder, "finish", broken)
    path = tmp_path / "r.sftrace"
    with caplog.at_level("WARNING", logger="stepfork_otel"), record(path):
        lookup("a")
    # the run's end was answered (a marker never set would end the wait at its bound, said so)
    assert "the bundle writer did not" not in caplog.text
    trace = Trace.load(path)  # what the file holds, without a trailer
    assert trace.complete is False
    assert [c.input for c in trace.calls] == ['{"key":"a"}']
    assert recording.processor.stats.write_errors == 1


def test_a_call_waiting_for_a_stalled_writer_gives_up_and_returns(
    recording: Recording,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call that waits for the writer (``flush_interval=0``) while the writer hangs on the
    disk returns after the bound, logged: the program goes on, the call is written later."""
    import threading

    from stepfork_otel.otel import processor as processor_module
    from stepfork_otel.otel.writer import BundleAppender

    release = threading.Event()
    write = BundleAppender.write_pending

    def hung(self: BundleAppender, *args: Any, **kwargs: Any) -> Any:
        release.wait(60)  # (a disk that does not answer)
        return write(self, *args, **kwargs)

    monkeypatch.setattr(processor_module, "_WRITER_WAIT", 0.2)
    path = tmp_path / "r.sftrace"
    with record(path, flush_interval=0), caplog.at_level("WARNING", logger="stepfork_otel"):
        monkeypatch.setattr(BundleAppender, "write_pending", hung)
        assert lookup("a") == "A"  # returned, the writer still hung
        assert "the bundle writer did not write the calls queued within 0.2 s" in caplog.text
        release.set()
        monkeypatch.setattr(processor_module, "_WRITER_WAIT", 30.0)  # (the run's end waits)
    assert [c.input for c in Trace.load(path).calls] == ['{"key":"a"}']


def test_a_nested_run_writing_each_call_at_once_stops_doing_so_when_it_ends(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "outer.sftrace") as outer:
        with record(tmp_path / "inner.sftrace", flush_interval=0):
            lookup("inner")
        followed = recording.processor._followed[int(outer.trace_id or "0", 16)]
        assert (followed.runs, followed.at_once) == (1, 0)


def test_a_call_under_a_remote_parent_is_whole_on_disk_when_it_returns(
    recording: Recording,
) -> None:
    token = context_api.attach(_remote(0xCAFE))
    try:
        lookup("a")  # a call outside any local span: a bundle of its own
    finally:
        context_api.detach(token)
    (path,) = recording.directory.iterdir()
    trace = Trace.load(path)  # no flush: the call's end waited for its bundle
    assert trace.complete
    assert [c.input for c in trace.calls] == ['{"key":"a"}']


# --- local and imported: the same bundle ----------------------------------------------------------


def _local_and_imported(recording: Recording, path: Path) -> tuple[Trace, Trace]:
    local = Trace.load(path)
    records = [span_record(s) for s in recording.exporter.get_finished_spans()]
    run = local.run.span_id
    imported = spans_to_trace(records, redactor=DEFAULT_REDACTOR, root_span_id=run)
    return local, imported


def test_a_call_made_after_the_call_it_was_made_in_ended_is_left_out_of_both(
    recording: Recording, tmp_path: Path
) -> None:
    tracer = recording.provider.get_tracer("app")
    path = tmp_path / "late.sftrace"
    with record(path):
        outer = tracer.start_span("execute_tool outer", attributes=TOOL)
        outer.end()
        tracer.start_span(
            "late", attributes=TOOL, context=trace_api.set_span_in_context(outer)
        ).end()
    local, imported = _local_and_imported(recording, path)
    assert [c.name for c in local.calls] == ["execute_tool outer"]
    assert local.incomplete_reason == (
        "1 call(s) started after the call they were made in had ended and are not in it"
    )
    assert local.model_dump() == imported.model_dump()


def test_a_call_still_running_when_its_run_ended_is_open_in_both(
    recording: Recording, tmp_path: Path
) -> None:
    tracer = recording.provider.get_tracer("app")
    path = tmp_path / "open.sftrace"
    with record(path):
        lookup("a")
        straggler = tracer.start_span("execute_tool straggler", attributes=TOOL)
    straggler.end()
    local, imported = _local_and_imported(recording, path)
    assert local.incomplete_reason == "1 call(s) had not ended when the bundle was written"
    assert local.model_dump() == imported.model_dump()


def test_two_local_roots_of_one_trace_import_as_the_two_bundles_written(
    recording: Recording, tmp_path: Path
) -> None:
    from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter
    from stepfork_otel.trace.otlp import iter_traces_from_otlp_json

    tracer = recording.provider.get_tracer("app")
    first = tracer.start_span("first request", context=_remote(0xAB1))
    second = tracer.start_span("second request", context=_remote(0xAB1))
    with trace_api.use_span(first):
        lookup("1")
    with trace_api.use_span(second):
        lookup("2")
    second.end()
    first.end()
    local = {
        tuple(c.input for c in Trace.load(p).calls): Trace.load(p)
        for p in recording.directory.iterdir()
    }
    source = tmp_path / "spans.jsonl"
    exporter = OtlpJsonFileExporter(source)
    exporter.export(recording.exporter.get_finished_spans())
    exporter.shutdown()
    imported = {tuple(c.input for c in t.calls): t for t in iter_traces_from_otlp_json(source)}
    assert sorted(imported) == sorted(local) == [('{"key":"1"}',), ('{"key":"2"}',)]
    for calls, trace in imported.items():
        assert trace.model_dump() == local[calls].model_dump()


# --- a forked child -------------------------------------------------------------------------------

CHILD_AFTER_A_HELD_LOCK = textwrap.dedent(
    """
    import os, sys, threading
    from stepfork_otel import trace_tool
    from stepfork_otel.recording.spans import CALL_START_LOCK

    @trace_tool
    def step(i: int) -> int:
        return i

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with CALL_START_LOCK:  # (a call starting in another thread at the fork)
            held.set()
            release.wait()

    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        step(1)  # the child's first call: its lock starts free
        os._exit(0)
    release.set()
    _, status = os.waitpid(pid, 0)
    print(status)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_forked_while_another_thread_starts_a_call_can_make_calls(tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "child.py"
    script.write_text(CHILD_AFTER_A_HELD_LOCK)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,  # (a hang guard: the child deadlocked on the lock it inherited held)
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


CHILD_FORKED_WHILE_THE_WRITER_IS_DUE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from opentelemetry import trace
    import stepfork_otel
    from stepfork_otel import Trace, trace_tool

    stepfork_otel.configure(directory=sys.argv[1])

    @trace_tool
    def step(i: int) -> int:
        return i

    request = trace.get_tracer("app").start_span("request")  # (open at the fork)
    with trace.use_span(request):
        step(1)  # queued: the writer's next round is due, and the fork comes before it
    pid = os.fork()
    if pid == 0:
        with trace.use_span(trace.get_tracer("app").start_span("child's request")):
            step(2)  # the child's own call, its request open: its writer must start for it
        time.sleep(2.5)  # (more than the 1 s background flush; nothing waits, nothing flushes)
        calls = [c.input for f in Path(sys.argv[1]).iterdir() for c in Trace.load(f).calls]
        os._exit(0 if '{"i":2}' in calls else 3)
    _, status = os.waitpid(pid, 0)
    request.end()
    print(status)
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_child_forked_while_the_writer_is_due_writes_its_calls_in_the_background(
    tmp_path: Path,
) -> None:
    """The parent's queue had work (its writer armed) at the fork: the child's writer thread is
    not running, and its first call must start it, or nothing is written until something
    waits."""
    import subprocess

    script = tmp_path / "child.py"
    script.write_text(CHILD_FORKED_WHILE_THE_WRITER_IS_DUE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "bundles")],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
