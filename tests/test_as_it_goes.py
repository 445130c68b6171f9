"""A run's bundle written as the run goes (format 3; issue 13, item 2): memory bounded by what is
open, the run's end one trailer, and a file cut anywhere still a bundle that loads.

The bundle on disk holds each call's events in the order the calls *ended* (a nested call before
the call it is nested in); loading puts them in the conversion's order, so the loaded trace is
the one the whole conversion (``spans_to_trace``, which the OTLP importer uses) builds from the
same spans.
"""

from __future__ import annotations

import asyncio
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest

from stepfork_otel import ReplaySession, configure, record, trace_tool
from stepfork_otel.constants import FLUSH_BUFFER_BYTES
from stepfork_otel.otel.processor import span_record
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.bundle import dump_trace, load_trace
from stepfork_otel.trace.checks import validate_structure, verify_integrity
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.models import ToolCall, Trace
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR


@trace_tool
def leaf(n: int) -> dict[str, Any]:
    return {"leaf": n, "pad": "p" * 50}


@trace_tool
def branch(n: int) -> int:
    return leaf(n)["leaf"] + leaf(n + 1)["leaf"]


@trace_tool
async def slow_leaf(n: int, pause: float) -> int:
    await asyncio.sleep(pause)
    return n


async def _concurrently() -> list[int]:
    # started 1, 2, 3; ended 3, 2, 1: the file has them in the opposite order to the numbers
    return list(await asyncio.gather(slow_leaf(1, 0.03), slow_leaf(2, 0.02), slow_leaf(3, 0.0)))


def _agent() -> None:
    leaf(0)
    branch(10)
    asyncio.run(_concurrently())
    branch(20)


def test_nested_and_concurrent_calls_load_as_the_whole_conversion_orders_them(
    recording: Any, tmp_path: Path
) -> None:
    path = tmp_path / "run.sftrace"
    with record(path, input={"q": 1}, name="mixed") as run:
        _agent()
        run.set_output("done")
    on_disk = [line for line in path.read_bytes().splitlines() if line.startswith(b'{"type":')]
    ids = [line.split(b'"id":"')[1].split(b'"')[0].decode() for line in on_disk]
    assert ids.index("call-3") < ids.index("call-2")  # written as they ended: nested first
    assert ids.index("call-7") < ids.index("call-5")  # concurrent: the last started ended first
    loaded = load_trace(path)
    spans = [span_record(s) for s in recording.exporter.get_finished_spans()]
    whole = spans_to_trace(spans, redactor=DEFAULT_REDACTOR)
    assert loaded.events == whole.events  # the same calls, numbers, nesting and order
    assert loaded.run == whole.run
    assert loaded.context == whole.context
    assert loaded.complete
    assert whole.complete
    assert verify_integrity(loaded) == []
    assert validate_structure(loaded) == []
    with ReplaySession.from_trace(path) as replay:
        _agent()
    replay.verify_complete()


def test_a_bundle_cut_at_any_byte_loads_as_far_as_it_goes(recording: Any, tmp_path: Path) -> None:
    """What a kill leaves, at every possible point: the file loads, says it is incomplete, holds
    calls numbered 1..k without a hole, each with its outcome but perhaps the last, and replays
    up to there."""
    path = tmp_path / "run.sftrace"
    with record(path, input={"q": 1}) as run:
        for n in range(4):
            branch(n)
        run.set_output("done")
    data = path.read_bytes()
    whole = load_trace(path)
    head_end = data.index(b"\n") + 1
    cut = tmp_path / "cut.sftrace"
    seen: set[int] = set()
    for size in range(head_end, len(data)):
        cut.write_bytes(data[:size])
        trace = load_trace(cut)
        assert trace.complete is False, size
        numbers = [c.seq for c in trace.calls]
        assert numbers == list(range(1, len(numbers) + 1)), size
        without = [c for c in trace.calls if trace.outcome_of(c) is None]
        assert len(without) <= 1, size
        assert [e.id for e in trace.events] == [e.id for e in whole.events][
            : len(trace.events)
        ] or (without), size
        seen.add(len(trace.calls))
    # a branch is written after its two leaves: cut before it, its leaves go too (a hole at its
    # number), so the calls come in threes
    assert seen == {0, 3, 6, 9, 12}
    assert load_trace(path).complete


def test_a_missing_call_is_named_and_the_calls_after_it_are_kept(
    recording: Any, tmp_path: Path
) -> None:
    """A hole in the numbers is a call that had not ended (another thread's, when a call after
    it is there): the calls after it ended and returned, so they stay (issue 28: they were left
    out, and a thread's call that returned was not in the bundle)."""
    path = tmp_path / "run.sftrace"
    with record(path):
        for n in range(3):
            leaf(n)
    lines = path.read_bytes().split(b"\n")
    # drop call-2 (its event, payload, outcome and payload lines) and the trailer
    start = next(i for i, line in enumerate(lines) if b'"id":"call-2"' in line)
    kept = lines[:start] + lines[start + 4 :]
    kept = [line for line in kept if not line.startswith((b'{"run":', b'{"end":'))]
    cut = tmp_path / "cut.sftrace"
    cut.write_bytes(b"\n".join(kept))
    trace = load_trace(cut)
    assert [c.id for c in trace.calls] == ["call-1", "call-3"]
    assert all(trace.outcome_of(c) is not None for c in trace.calls)
    assert "; call-2 is not in it (not ended" in (trace.incomplete_reason or "")
    assert "left out" not in (trace.incomplete_reason or "")
    assert validate_structure(trace) == []


def test_calls_nested_in_a_missing_call_are_left_out(recording: Any, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace"
    with record(path):
        leaf(0)
        branch(1)  # call-2, its leaves call-3 and call-4 (written before it)
        leaf(5)
    lines = path.read_bytes().split(b"\n")
    start = next(i for i, line in enumerate(lines) if b'"id":"call-2"' in line)
    kept = lines[:start] + lines[start + 4 :]
    kept = [line for line in kept if not line.startswith((b'{"run":', b'{"end":'))]
    cut = tmp_path / "cut.sftrace"
    cut.write_bytes(b"\n".join(kept))
    trace = load_trace(cut)
    assert [c.id for c in trace.calls] == ["call-1", "call-5"]
    assert (trace.incomplete_reason or "").endswith(
        "call-2 is not in it (not ended, or ended within the flush interval), so the 2 call(s) "
        "nested in it are left out too"
    )


def test_saved_in_one_piece_or_as_it_goes_the_same_trace(recording: Any, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace"
    with record(path, input={"q": 1}) as run:
        _agent()
        run.set_output("done")
    trace = load_trace(path)
    one_piece = tmp_path / "one.sftrace"
    trace.save(one_piece)
    assert b'"trailer"' not in one_piece.read_bytes()
    again = load_trace(one_piece)
    assert again == trace
    assert dump_trace(again, trailer=True) != path.read_bytes()  # (nested: the order on disk)
    cut = tmp_path / "cut.sftrace"
    cut.write_bytes(one_piece.read_bytes()[:-5])  # a one-piece bundle cut short is refused
    with pytest.raises(Exception, match=r"end line|truncated"):
        load_trace(cut)


def test_recording_memory_does_not_grow_with_the_run(recording: Any, tmp_path: Path) -> None:
    """Payloads of 2 KB: a run that kept its calls would hold 4 KB more per call; this one holds
    what is open, and one byte per event for the lines fingerprint."""

    @trace_tool
    def tool(n: int, text: str) -> str:
        return text[::-1]

    from opentelemetry.sdk.trace import TracerProvider

    configure(tracer_provider=TracerProvider())  # (the fixture's in-memory exporter keeps spans)
    text = "x" * 2000
    with record(tmp_path / "long.sftrace"):
        for n in range(300):  # warm up: caches, the flush thread, the file
            tool(n, text)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for n in range(3000):
                tool(n, text)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    # at most the queue (FLUSH_BUFFER_BYTES, 1 MiB: then a call waits for the writer), the round
    # the writer thread is writing at that moment (what it took, and those bytes joined), and a
    # little; holding the calls would be 3,000 x 4 KB = 12 MB
    assert grown < 3 * FLUSH_BUFFER_BYTES + 500_000, grown
    trace = Trace.load(tmp_path / "long.sftrace")
    assert trace.complete
    assert len(trace.calls) == 3300
    assert all(isinstance(c, ToolCall) for c in trace.calls)


def test_flush_and_fsync_intervals_are_settings(recording: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_interval must be >= 0"):
        configure(flush_interval=-1)
    with pytest.raises(ValueError, match="fsync_interval must be >= 0"):
        configure(fsync_interval=-0.5)
    processor = configure(flush_interval=0.25, fsync_interval=float("inf"))
    assert processor is recording.processor
    assert (processor.flush_interval, processor.fsync_interval) == (0.25, None)
    path = tmp_path / "run.sftrace"
    with record(path, flush_interval=0):  # this run's own: each call written as it ends
        leaf(1)
        assert len(load_trace(path).calls) == 1


def test_a_compressed_bundle_cut_short_loads_too(recording: Any, tmp_path: Path) -> None:
    path = tmp_path / "run.sftrace.gz"
    with record(path, flush_interval=0):  # (a gzip flush at each write)
        for n in range(3):
            leaf(n)
        data = path.read_bytes()
        mid = load_trace(path)  # the stream so far: flushed, not ended
        assert [c.seq for c in mid.calls] == [1, 2, 3]
        assert mid.complete is False
    assert load_trace(path).complete
    cut = tmp_path / "cut.sftrace.gz"
    loaded = 0
    for size in range(20, len(data), 7):
        cut.write_bytes(data[:size])
        if b"\n" not in zlib.decompressobj(wbits=31).decompress(data[:size]):
            # cut inside the header line: no telling the layout, refused as truncated
            with pytest.raises(BundleError, match="truncated gzip data"):
                load_trace(cut)
            continue
        trace = load_trace(cut)
        loaded += 1
        assert trace.complete is False
        assert [c.seq for c in trace.calls] == list(range(1, len(trace.calls) + 1))
    assert loaded > 10
    one_piece = tmp_path / "one.sftrace.gz"
    load_trace(path).save(one_piece)
    cut.write_bytes(one_piece.read_bytes()[:-20])  # a one-piece bundle: still refused
    with pytest.raises(Exception, match="truncated gzip data"):
        load_trace(cut)


def test_a_bundle_file_writes_what_was_added_and_nothing_after_the_trailer(
    recording: Any, tmp_path: Path
) -> None:
    # what is added is written when due (forced here, as a waiting thread forces it); after the
    # trailer nothing is written, and closing twice says so
    from stepfork_otel.otel.writer import BundleAppender
    from stepfork_otel.trace.bundle import BundleEncoder

    with record(tmp_path / "recorded.sftrace"):
        branch(1)
        branch(3)
    events = load_trace(tmp_path / "recorded.sftrace").events
    path = tmp_path / "x.sftrace"
    start = Trace(trace_id="ab" * 16)
    appender = BundleAppender(path, BundleEncoder(start), flush_interval=0.5)
    for event in events[:-2]:
        appender.add([event])
    head = path.read_bytes()
    appender.write_pending(tick=False)  # not due: not a periodic round, nobody waits
    assert path.read_bytes() == head
    appender.write_pending(force=True)
    assert len(load_trace(path).events) == len(events) - 2
    final = start.model_copy(update={"complete": True})
    assert appender.finish(events[-2:], final)
    written = path.read_bytes()
    appender.add(events[:1])  # too late: dropped
    appender.write_pending(force=True)
    assert appender.finish([], start) is False  # (closed once)
    assert path.read_bytes() == written
    loaded = load_trace(path)
    assert loaded.complete
    assert loaded.events == events


def test_force_flush_keeps_to_its_timeout_when_the_writer_is_stuck(
    recording: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a slow disk holds the writer thread: force_flush gives up at the SDK's timeout, and the
    # calls queued meanwhile are written once the writer is free
    import threading

    from stepfork_otel.otel.writer import BundleAppender

    stuck, free = threading.Event(), threading.Event()
    write_pending = BundleAppender.write_pending

    def slow(self: BundleAppender, *, force: bool = False, tick: bool = False) -> None:
        if not free.is_set():
            stuck.set()
            free.wait(30)
        write_pending(self, force=force, tick=tick)

    path = tmp_path / "stuck.sftrace"
    with record(path):
        leaf(1)
        monkeypatch.setattr(BundleAppender, "write_pending", slow)
        flushing = threading.Thread(target=recording.provider.force_flush, args=(200,))
        flushing.start()
        flushing.join(timeout=20)
        assert not flushing.is_alive()  # (it would wait for the writer forever without one)
        assert stuck.is_set()
        free.set()
    assert [c.seq for c in load_trace(path).calls] == [1]
