"""Many runs recorded at once -- 50 threads, 200 asyncio tasks -- each into its own bundle: no
cross-talk between runs, every run's calls in its own order with its own inputs."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from pathlib import Path
from typing import Any

from conftest import Recording

from stepfork_otel import (
    LlmRequest,
    LlmResponse,
    ToolCall,
    ToolResult,
    Trace,
    allm_request,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel.trace.checks import validate_structure, verify_integrity
from stepfork_otel.trace.models import payload_value


@trace_tool
def fetch(run: int, step: int) -> dict[str, int]:
    return {"run": run, "step": step, "value": run * 100 + step}


@trace_tool
async def afetch(run: int, step: int) -> dict[str, int]:
    await asyncio.sleep(0)  # let other tasks interleave
    return {"run": run, "step": step, "value": run * 100 + step}


def expected_calls(i: int) -> list[tuple[str, Any]]:
    return [
        ("llm", {"run": i, "prompt": "plan"}),
        ("fetch", {"run": i, "step": 1}),
        ("fetch", {"run": i, "step": 2}),
        ("llm", {"run": i, "prompt": "answer"}),
    ]


def check_bundle(path: Path, i: int, tool: str) -> None:
    trace = Trace.load(path)
    assert trace.complete
    assert validate_structure(trace) == []
    assert verify_integrity(trace) == []
    assert payload_value(trace.run.input) == {"i": i}
    assert payload_value(trace.run.output) == {"answer": i}
    calls = [
        ("llm" if isinstance(c, LlmRequest) else c.name, payload_value(c.input))
        for c in trace.calls
    ]
    want = [(tool if name == "fetch" else name, args) for name, args in expected_calls(i)]
    assert calls == want
    assert [e.type for e in trace.events] == [
        "llm_request",
        "llm_response",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "llm_request",
        "llm_response",
    ]
    for event in trace.events:
        assert event.trace_id == trace.trace_id
        if isinstance(event, (ToolResult, LlmResponse)):
            assert payload_value(event.output)["run"] == i
        if isinstance(event, ToolCall):
            assert event.parent_id is None


def test_50_threads_record_50_separate_runs(recording: Recording, tmp_path: Path) -> None:
    barrier = threading.Barrier(50)
    errors: list[BaseException] = []

    def agent(i: int) -> None:
        try:
            barrier.wait()
            with record(tmp_path / f"run{i}.sftrace", input={"i": i}) as run:
                llm_request(
                    provider="p",
                    model="m",
                    input={"run": i, "prompt": "plan"},
                    call=lambda: {"run": i, "plan": "fetch"},
                )
                fetch(i, 1)
                fetch(i, step=2)
                llm_request(
                    provider="p",
                    model="m",
                    input={"run": i, "prompt": "answer"},
                    call=lambda: {"run": i, "answer": i},
                )
                run.set_output({"answer": i})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(50):
        check_bundle(tmp_path / f"run{i}.sftrace", i, "fetch")
    assert recording.processor.stats.bundles_written == 50
    assert sorted(p.name for p in tmp_path.glob("*.sftrace")) == sorted(
        f"run{i}.sftrace" for i in range(50)
    )


async def test_200_tasks_record_200_separate_runs(recording: Recording, tmp_path: Path) -> None:
    async def agent(i: int) -> None:
        async def reply(value: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(0)
            return value

        async with record(tmp_path / f"run{i}.sftrace", input={"i": i}) as run:
            await allm_request(
                provider="p",
                model="m",
                input={"run": i, "prompt": "plan"},
                call=lambda: reply({"run": i, "plan": "fetch"}),
            )
            await afetch(i, 1)
            await afetch(i, step=2)
            await allm_request(
                provider="p",
                model="m",
                input={"run": i, "prompt": "answer"},
                call=lambda: reply({"run": i, "answer": i}),
            )
            run.set_output({"answer": i})

    await asyncio.gather(*(agent(i) for i in range(200)))
    for i in range(200):
        check_bundle(tmp_path / f"run{i}.sftrace", i, "afetch")
    assert recording.processor.stats.bundles_written == 200


def test_threads_making_a_tools_first_call_together_are_all_recorded(
    recording: Recording, tmp_path: Path, monkeypatch: Any
) -> None:
    # a tool's return type and description are resolved at its first call; threads making that
    # call together must each see both (one saw the type without the description: its call went
    # unrecorded in a bundle that said it was complete)
    import time

    from stepfork_otel.recording import boundaries

    describe = boundaries._tool_description

    def slow_description(*args: Any) -> Any:
        time.sleep(0.01)  # (widens the window between the two)
        return describe(*args)

    monkeypatch.setattr(boundaries, "_tool_description", slow_description)

    @trace_tool
    def first(n: int) -> int:
        return n

    with record(tmp_path / "first.sftrace"):
        threads = [
            threading.Thread(target=contextvars.copy_context().run, args=(first, i))
            for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    trace = Trace.load(tmp_path / "first.sftrace")
    assert trace.complete
    assert sorted(c.input for c in trace.calls) == sorted(f'{{"n":{i}}}' for i in range(8))
