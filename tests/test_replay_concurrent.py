"""Concurrent calls replay by their inputs, in whatever order the replayed code starts them; the
order between calls that did not overlap stays strict (``docs/replay.md``, "Concurrent calls").

In-process, with ``allm_request``/``@trace_tool`` and hand-built bundles; the real SDKs against
the fake server are ``tests/test_replay_concurrent_sdk.py``."""

from __future__ import annotations

import asyncio
import contextvars
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import (
    ReplayExhaustedError,
    ReplayMismatchError,
    ReplaySession,
    Trace,
    allm_request,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel.trace.canonical import canonical_json, sha256_hex
from stepfork_otel.trace.models import Event, LlmRequest, LlmResponse

N = 20


async def _answer(value: Any) -> Any:
    return value


async def gather_agent(seed: int, change: int | None = None) -> Any:
    """N concurrent LLM calls, each after a random wait (its start order depends on ``seed``),
    then one call that uses all their answers. While recording, each answer waits until all N
    calls have started, as a slow service would: the N calls overlap by construction."""
    rng = random.Random(seed)
    waits = [rng.random() / 200 for _ in range(N)]
    started: list[int] = []
    all_started = asyncio.Event()

    async def slow_answer(i: int) -> Any:
        started.append(i)
        if len(started) == N:
            all_started.set()
        await all_started.wait()
        return {"answer": f"answer {i}"}

    async def one(i: int) -> Any:
        await asyncio.sleep(waits[i])
        question = f"question {i}" + (" (changed)" if i == change else "")
        return await allm_request(
            provider="p",
            model="m",
            input={"messages": [{"role": "user", "content": question}]},
            call=lambda: slow_answer(i),
        )

    answers = await asyncio.gather(*(one(i) for i in range(N)))
    return await allm_request(
        provider="p",
        model="m",
        input={"summarise": [a["answer"] for a in answers]},
        call=lambda: _answer({"summary": len(answers)}),
    )


@trace_tool
def lookup(i: int) -> dict[str, int]:
    BARRIER.wait(timeout=30)  # (only ever runs while recording: frozen replay runs no body)
    return {"i": i, "square": i * i}


BARRIER = threading.Barrier(N)


def threads_agent(seed: int) -> Any:
    """N tool calls from a thread pool (each task with the context copied), started in an order
    that depends on ``seed``, then one LLM call over all their results. While recording, each
    tool body waits until all N have started: the N calls overlap by construction."""
    rng = random.Random(seed)
    waits = [rng.random() / 200 for _ in range(N)]

    def one(i: int) -> Any:
        time.sleep(waits[i])
        return lookup(i)

    with ThreadPoolExecutor(max_workers=N) as pool:
        futures = [pool.submit(contextvars.copy_context().run, one, i) for i in range(N)]
        results = [f.result() for f in futures]
    return llm_request(
        provider="p",
        model="m",
        input={"total": [r["square"] for r in results]},
        call=lambda: {"sum": sum(r["square"] for r in results)},
    )


def _start_order(trace: Trace) -> list[str]:
    return [c.input or "" for c in trace.calls]


def test_a_gather_of_20_calls_replays_frozen_whatever_order_they_start_in(
    recording: Recording, tmp_path: Path
) -> None:
    bundle = tmp_path / "gather.sftrace"
    with record(bundle) as run:
        recorded = asyncio.run(gather_agent(seed=0))
        run.set_output(recorded)
    trace = Trace.load(bundle)
    assert len(trace.calls) == N + 1
    orders = set()
    for seed in range(1, 11):
        with ReplaySession.from_trace(bundle) as replay:
            assert asyncio.run(gather_agent(seed)) == recorded
            replay.verify_complete()
        orders.add(tuple(c.input for c in replay.calls))
        assert [c.action for c in replay.calls] == ["substituted"] * (N + 1)
        for call in replay.calls:  # each call got the recorded answer to its own input
            recorded_call = next(c for c in trace.calls if c.id == call.recorded_id)
            assert recorded_call.input == call.input
    assert len(orders) > 1  # the seeds really did start the calls in other orders


def test_a_thread_pool_of_20_tool_calls_replays_frozen(
    recording: Recording, tmp_path: Path
) -> None:
    bundle = tmp_path / "threads.sftrace"
    with record(bundle):
        recorded = threads_agent(seed=0)
    for seed in range(1, 11):
        with ReplaySession.from_trace(bundle) as replay:
            assert threads_agent(seed) == recorded
            replay.verify_complete()
        assert replay.pending == 0


def test_a_changed_concurrent_input_fails_naming_the_call_and_the_path(
    recording: Recording, tmp_path: Path
) -> None:
    bundle = tmp_path / "gather.sftrace"
    with record(bundle):
        asyncio.run(gather_agent(seed=0))
    trace = Trace.load(bundle)
    changed = next(c for c in trace.calls if c.input and "question 7" in c.input)
    with ReplaySession.from_trace(bundle) as replay, pytest.raises(ReplayMismatchError) as err:
        asyncio.run(gather_agent(seed=3, change=7))
    error = err.value
    assert type(error) is ReplayMismatchError
    assert error.expected is not None
    assert error.expected.event_id == changed.id
    assert "matches none of the" in error.reason
    message = str(error)
    assert f"nearest is {changed.id}" in message
    assert "first differing path: messages[0].content" in message
    assert '"question 7"' in message
    assert '"question 7 (changed)"' in message
    assert replay.errors == [error]


# --- the rule, on hand-built bundles ----------------------------------------------------------------

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def _llm(n: int, prompt: str, start: int, end: int, parent: int | None = None) -> list[Event]:
    text = canonical_json({"prompt": prompt})
    out = canonical_json({"answer": prompt.upper()})
    ids = {"trace_id": TRACE_ID, "span_id": f"{n:016x}", "seq": n}
    return [
        LlmRequest(
            id=f"call-{n}",
            parent_id=None if parent is None else f"call-{parent}",
            **ids,
            time_unix_nano=start,
            provider="p",
            model="m",
            input=text,
            input_sha256=sha256_hex(text),
        ),
        LlmResponse(
            id=f"call-{n}.result",
            parent_id=f"call-{n}",
            **ids,
            time_unix_nano=end,
            provider="p",
            model="m",
            output=out,
            output_sha256=sha256_hex(out),
        ),
    ]


def _trace(*calls: list[Event]) -> Trace:
    events = sorted((e for c in calls for e in c), key=lambda e: (e.seq, e.type != "llm_request"))
    return Trace(trace_id=TRACE_ID, events=events)


def _ask(prompt: str) -> Any:
    return llm_request(provider="p", model="m", input={"prompt": prompt}, call=lambda: None)


def test_calls_that_did_not_overlap_stay_in_order() -> None:
    # a [1,2] and b [3,4] did not overlap: b before a is an order divergence, as ever
    trace = _trace(_llm(1, "a", 1, 2), _llm(2, "b", 3, 4))
    with ReplaySession(trace) as replay, pytest.raises(ReplayMismatchError) as err:
        _ask("b")
    assert err.value.reason.startswith("call order differs: this call was recorded later")
    assert replay.pending == 2


def test_overlap_is_pairwise_a_call_after_one_that_ended_waits_for_it() -> None:
    # a [1,10], b [5,15], c [12,20]: a|b and b|c overlapped, but a ended before c started
    trace = _trace(_llm(1, "a", 1, 10), _llm(2, "b", 5, 15), _llm(3, "c", 12, 20))
    with ReplaySession(trace) as replay:
        assert _ask("b") == {"answer": "B"}
        with pytest.raises(ReplayMismatchError) as err:
            _ask("c")  # a is still ahead of it
        assert "call order differs" in err.value.reason
        assert _ask("a") == {"answer": "A"}
        assert _ask("c") == {"answer": "C"}
    assert replay.pending == 0


def test_identical_inputs_in_a_group_are_served_in_recorded_order() -> None:
    first, second = _llm(1, "same", 1, 10), _llm(2, "same", 2, 10)
    second[1] = second[1].model_copy(update={"output": '{"answer":"second"}'})
    second[1] = second[1].model_copy(update={"output_sha256": sha256_hex('{"answer":"second"}')})
    with ReplaySession(_trace(first, second)) as replay:
        assert _ask("same") == {"answer": "SAME"}
        assert _ask("same") == {"answer": "second"}
        with pytest.raises(ReplayExhaustedError):
            _ask("same")
    assert [c.recorded_id for c in replay.matched] == ["call-1", "call-2"]


def test_calls_started_after_a_group_are_matched_after_the_whole_group() -> None:
    trace = _trace(_llm(1, "a", 1, 10), _llm(2, "b", 2, 10), _llm(3, "after", 11, 12))
    with ReplaySession(trace):
        _ask("b")
        with pytest.raises(ReplayMismatchError) as err:
            _ask("after")
        assert "call order differs" in err.value.reason
        _ask("a")
        _ask("after")


def test_nested_calls_belong_to_their_parents_match() -> None:
    # two concurrent tools, each with an LLM call inside: frozen, the tools are served in the
    # other order and the inner calls are skipped with their parent
    from stepfork_otel.trace.models import ToolCall, ToolResult

    def tool(n: int, city: str, start: int, end: int) -> list[Event]:
        text, out = canonical_json({"city": city}), canonical_json({"weather": city})
        ids = {"trace_id": TRACE_ID, "span_id": f"{n:016x}", "seq": n}
        return [
            ToolCall(
                id=f"call-{n}",
                **ids,
                time_unix_nano=start,
                name="weather",
                input=text,
                input_sha256=sha256_hex(text),
            ),
            ToolResult(
                id=f"call-{n}.result",
                parent_id=f"call-{n}",
                **ids,
                time_unix_nano=end,
                name="weather",
                output=out,
                output_sha256=sha256_hex(out),
            ),
        ]

    trace = _trace(
        tool(1, "Paris", 1, 10),
        tool(2, "Rome", 2, 11),
        _llm(3, "paris inner", 3, 4, parent=1),
        _llm(4, "rome inner", 5, 6, parent=2),
        _llm(5, "summary", 12, 13),
    )

    @trace_tool(name="weather")
    def weather(city: str) -> dict[str, str]:
        raise AssertionError("a frozen body never runs")

    with ReplaySession(trace) as replay:
        assert weather("Rome") == {"weather": "Rome"}
        assert weather("Paris") == {"weather": "Paris"}
        _ask("summary")
        replay.verify_complete()
    assert sorted(c.event.id for c in replay.summary.skipped) == ["call-3", "call-4"]


def test_threads_in_a_live_replay_match_their_inner_calls_inside_their_own_parent() -> None:
    # live: two concurrent tools run their bodies, each making its own inner LLM call, in an
    # order other than the recorded one
    from stepfork_otel.trace.models import ToolCall, ToolResult

    def tool(n: int, city: str, start: int, end: int) -> list[Event]:
        text, out = canonical_json({"city": city}), canonical_json({"weather": city})
        ids = {"trace_id": TRACE_ID, "span_id": f"{n:016x}", "seq": n}
        return [
            ToolCall(
                id=f"call-{n}",
                **ids,
                time_unix_nano=start,
                name="weather_live",
                input=text,
                input_sha256=sha256_hex(text),
            ),
            ToolResult(
                id=f"call-{n}.result",
                parent_id=f"call-{n}",
                **ids,
                time_unix_nano=end,
                name="weather_live",
                output=out,
                output_sha256=sha256_hex(out),
            ),
        ]

    trace = _trace(
        tool(1, "Paris", 1, 10),
        tool(2, "Rome", 2, 11),
        _llm(3, "Paris", 3, 4, parent=1),
        _llm(4, "Rome", 5, 6, parent=2),
    )
    second_started = threading.Event()

    @trace_tool(name="weather_live")
    def weather(city: str) -> dict[str, str]:
        if city == "Paris":
            assert second_started.wait(5)  # Rome's tool is open while Paris asks its LLM
        else:
            second_started.set()
        answer = llm_request(
            provider="p", model="m", input={"prompt": city}, call=lambda: {"answer": city.upper()}
        )
        return {"weather": answer["answer"].title()}

    with ReplaySession(trace, mode="live", allow_live_tools={"weather_live"}) as replay:
        with ThreadPoolExecutor(2) as pool:
            rome = pool.submit(contextvars.copy_context().run, weather, "Rome")
            paris = pool.submit(contextvars.copy_context().run, weather, "Paris")
            assert rome.result() == {"weather": "Rome"}
            assert paris.result() == {"weather": "Paris"}
        replay.verify_complete()
    by_input = {c.input: c.recorded_id for c in replay.calls}
    assert by_input['{"prompt":"Paris"}'] == "call-3"
    assert by_input['{"prompt":"Rome"}'] == "call-4"
