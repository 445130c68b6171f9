"""Generic streamed LLM calls (``llm_request(..., stream=True)``): recorded chunk by chunk as one
outcome, replayed as a stream; a stream cut short or broken is recorded and replayed as such."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import (
    RecordedDependencyError,
    ReplayMismatchError,
    ReplaySession,
    Trace,
    allm_request,
    llm_request,
    record,
)
from stepfork_otel import constants as k

SOURCE: list[str] = []


def chunks(n: int = 3) -> Iterator[dict[str, Any]]:
    for i in range(n):
        SOURCE.append(f"chunk {i}")
        yield {"delta": f"part {i} ", "index": i}


def stream_call(n: int = 3) -> Iterator[dict[str, Any]]:
    return llm_request(
        provider="custom",
        model="m1",
        input={"prompt": "hi"},
        call=lambda: chunks(n),
        stream=True,
    )


def recorded(tmp_path: Path, consume: Any, name: str = "s.sftrace") -> Trace:
    SOURCE.clear()
    with record(tmp_path / name):
        consume()
    return Trace.load(tmp_path / name)


def output_of(trace: Trace) -> dict[str, Any]:
    (response,) = [e for e in trace.events if e.type == "llm_response"]
    assert response.output is not None
    value: dict[str, Any] = json.loads(response.output)
    return value


def test_a_stream_read_to_the_end_is_one_recorded_outcome_and_replays_as_a_stream(
    recording: Recording, tmp_path: Path
) -> None:
    trace = recorded(tmp_path, lambda: list(stream_call()))
    assert output_of(trace) == {
        "chunks": [{"delta": f"part {i} ", "index": i} for i in range(3)],
        "complete": True,
    }
    (span,) = [s for s in recording.exporter.get_finished_spans() if s.name == "chat m1"]
    assert span.attributes is not None
    assert span.attributes[k.STREAM] is True
    assert span.attributes[k.STREAM_CHUNK_COUNT] == 3

    SOURCE.clear()
    with ReplaySession.from_trace(trace) as replay:
        got = list(stream_call())
        replay.verify_complete()
    assert got == [{"delta": f"part {i} ", "index": i} for i in range(3)]
    assert SOURCE == []  # the real stream was never opened


def test_a_stream_closed_early_is_recorded_cut_short_and_reading_further_in_replay_diverges(
    recording: Recording, tmp_path: Path
) -> None:
    def read_two() -> None:
        with stream_call(5) as stream:
            next(stream)
            next(stream)

    trace = recorded(tmp_path, read_two)
    value = output_of(trace)
    assert value["complete"] is False
    assert len(value["chunks"]) == 2
    assert SOURCE == ["chunk 0", "chunk 1"]  # the source was closed, not drained

    with ReplaySession.from_trace(trace) as replay:  # unchanged code: the same two chunks
        read_two()
        replay.verify_complete()

    with ReplaySession.from_trace(trace) as replay:
        stream = stream_call(5)
        assert [next(stream), next(stream)] == value["chunks"]
        with pytest.raises(ReplayMismatchError) as caught:
            next(stream)
    assert "closed by the agent after 2 chunk(s); this run reads further" in str(caught.value)
    assert caught.value.position == 1
    assert replay.errors == [caught.value]


def test_a_stream_dropped_without_closing_still_ends_its_span(
    recording: Recording, tmp_path: Path
) -> None:
    def drop() -> None:
        stream = stream_call(4)
        next(stream)
        del stream
        gc.collect()

    trace = recorded(tmp_path, drop)
    assert output_of(trace) == {"chunks": [{"delta": "part 0 ", "index": 0}], "complete": False}


def test_a_stream_broken_midway_keeps_its_chunks_and_replays_the_break(
    recording: Recording, tmp_path: Path
) -> None:
    def broken() -> Iterator[dict[str, Any]]:
        yield {"delta": "only"}
        raise ConnectionResetError("peer went away")

    def consume() -> None:
        stream = llm_request(
            provider="custom", model="m1", input={"p": 1}, call=broken, stream=True
        )
        with pytest.raises(ConnectionResetError):
            list(stream)

    trace = recorded(tmp_path, consume)
    value = output_of(trace)
    assert value == {
        "chunks": [{"delta": "only"}],
        "complete": False,
        "error": {"error_type": "ConnectionResetError", "message": "peer went away"},
    }
    (span,) = [s for s in recording.exporter.get_finished_spans() if s.name == "chat m1"]
    assert span.attributes is not None
    assert span.attributes[k.ERROR_TYPE_SEMCONV] == "ConnectionResetError"
    assert span.status.is_ok is False

    with ReplaySession.from_trace(trace):
        stream = llm_request(
            provider="custom", model="m1", input={"p": 1}, call=broken, stream=True
        )
        assert next(stream) == {"delta": "only"}
        with pytest.raises(RecordedDependencyError) as caught:
            next(stream)
    assert caught.value.error_type == "ConnectionResetError"


def test_a_recorded_single_value_replayed_as_a_stream_is_a_divergence(
    recording: Recording, tmp_path: Path
) -> None:
    def single() -> None:
        llm_request(provider="custom", model="m1", input={"prompt": "hi"}, call=lambda: {"a": 1})

    trace = recorded(tmp_path, single)
    with ReplaySession.from_trace(trace), pytest.raises(ReplayMismatchError) as caught:
        stream_call()
    assert "the recorded call returned a single value, this run streams" in str(caught.value)


async def achunks(n: int) -> AsyncIterator[dict[str, Any]]:
    for i in range(n):
        SOURCE.append(f"chunk {i}")
        yield {"i": i}


async def test_async_streams_record_and_replay(recording: Recording, tmp_path: Path) -> None:
    async def read_all() -> list[Any]:
        stream = await allm_request(
            provider="custom", model="m2", input={"q": 1}, call=lambda: achunks(3), stream=True
        )
        return [chunk async for chunk in stream]

    async def awaitable_stream() -> AsyncIterator[dict[str, Any]]:  # like AsyncOpenAI(stream=True)
        return achunks(3)

    SOURCE.clear()
    with record(tmp_path / "a.sftrace"):
        assert await read_all() == [{"i": 0}, {"i": 1}, {"i": 2}]
        stream = await allm_request(
            provider="custom", model="m2", input={"q": 2}, call=awaitable_stream, stream=True
        )
        async with stream:
            assert await stream.__anext__() == {"i": 0}
    trace = Trace.load(tmp_path / "a.sftrace")
    outputs = [json.loads(e.output or "") for e in trace.events if e.type == "llm_response"]
    assert [o["complete"] for o in outputs] == [True, False]

    SOURCE.clear()
    with ReplaySession.from_trace(trace) as replay:
        assert await read_all() == [{"i": 0}, {"i": 1}, {"i": 2}]
        stream = await allm_request(
            provider="custom", model="m2", input={"q": 2}, call=awaitable_stream, stream=True
        )
        async with stream:
            assert await stream.__anext__() == {"i": 0}
        replay.verify_complete()
    assert SOURCE == []
