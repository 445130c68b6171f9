"""The session itself: its life (enter once, no nesting, nothing after exit), the context variable
(threads and tasks started with a copied context see it), completeness, replayed value types, a
replay run traced like any run, and bad input (malformed bundles, unserialisable inputs, secrets,
nothing from a bundle ever imported)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import sys
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import golden_agent as agent
import pytest
from conftest import Recording
from pydantic import BaseModel

from stepfork_otel import (
    BundleError,
    RecordedDependencyError,
    ReplayError,
    ReplayExhaustedError,
    ReplayMismatchError,
    ReplaySession,
    Trace,
    allm_request,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel.replay.errors import ReplaySessionError
from stepfork_otel.trace.canonical import canonical_json, sha256_hex
from stepfork_otel.trace.models import ErrorEvent

LISBON = Path(__file__).parent / "golden" / "dinner_lisbon.sftrace"
FAILURE = Path(__file__).parent / "golden" / "dinner_porto_failure.sftrace"
RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    RAN.clear()
    agent.BODY_CALLS.clear()


def _record(path: Path, body: Callable[[], Any]) -> Trace:
    with record(path):
        body()
    RAN.clear()
    return Trace.load(path)


# --- life of a session -----------------------------------------------------------------------------


def test_a_session_is_entered_once() -> None:
    session = ReplaySession.from_trace(LISBON)
    with session:
        pass
    with pytest.raises(ReplaySessionError, match="can be entered only once"), session:
        pass


def test_sessions_do_not_nest() -> None:
    with (
        ReplaySession.from_trace(LISBON),
        pytest.raises(ReplaySessionError, match="already active"),
        ReplaySession.from_trace(LISBON),
    ):
        pass


def test_leaving_the_block_does_not_check_completeness() -> None:
    with ReplaySession.from_trace(LISBON) as replay:
        pass  # the agent never ran
    assert replay.pending == 9
    assert len(replay.pending_calls) == 9
    with pytest.raises(ReplayMismatchError, match="9 recorded call"):
        replay.verify_complete()


def test_a_thread_that_outlives_the_session_is_refused() -> None:
    go, done = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def late_call() -> None:
        go.wait()
        try:
            agent.lookup_weather("Lisbon")
        except BaseException as exc:
            outcome.append(exc)
        done.set()

    with ReplaySession.from_trace(LISBON) as replay:
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(late_call,))
        thread.start()
    go.set()
    assert done.wait(10)
    thread.join()
    assert len(outcome) == 1
    error = outcome[0]
    assert isinstance(error, ReplaySessionError)
    assert str(error).startswith(
        "tool lookup_weather reached a ReplaySession that is not active (it already exited)"
    )
    assert agent.BODY_CALLS == {}
    assert replay.errors == [error]


def test_a_thread_without_the_context_is_refused_not_run_live() -> None:
    with ReplaySession.from_trace(LISBON) as replay, ThreadPoolExecutor(1) as pool:
        future = pool.submit(agent.lookup_weather, "Lisbon")  # submit does not copy the context
        with pytest.raises(ReplaySessionError) as caught:
            future.result()
    assert caught.value.reason.startswith(
        "tool lookup_weather was called from a thread that does not carry the replay session"
    )
    assert agent.BODY_CALLS == {}  # no silent live call
    assert replay.errors == [caught.value]
    assert replay.calls == []  # not part of the replayed sequence, but it fails verification
    with pytest.raises(ReplayMismatchError, match="ReplaySessionError"):
        replay.verify_complete()
    # once the session has exited, the same call records as usual again
    assert agent.lookup_weather("Lisbon").city == "Lisbon"


def test_two_sessions_in_two_threads_replay_independently() -> None:
    def replay_once() -> list[str]:
        with ReplaySession.from_trace(LISBON) as replay:
            agent.run_dinner_agent(agent.LISBON)
            replay.verify_complete()
        return [c.recorded_id or "" for c in replay.calls]

    start = threading.Barrier(2)

    def in_thread() -> list[str]:
        start.wait(10)
        return replay_once()

    with ThreadPoolExecutor(2) as pool:
        results = [f.result() for f in [pool.submit(in_thread), pool.submit(in_thread)]]
    expected = ["call-1", "call-2", "call-3", "call-4", "call-5", "call-7", "call-8", "call-9"]
    assert results == [expected, expected]
    assert agent.BODY_CALLS == {}


def test_threads_and_tasks_with_a_copied_context_see_the_session() -> None:
    request = {
        "messages": [
            {"role": "system", "content": agent.PROMPT},
            {"role": "user", "content": agent.LISBON},
        ],
        "tools": agent.TOOLS,
    }
    with ReplaySession.from_trace(LISBON) as replay:
        with ThreadPoolExecutor(1) as pool:
            context = contextvars.copy_context()
            reply = pool.submit(
                context.run,
                lambda: llm_request(
                    provider="scripted", model="planner-1", input=request, call=lambda: {}
                ),
            ).result()

        async def in_tasks() -> Any:
            return await asyncio.create_task(asyncio.to_thread(agent.lookup_weather, "Lisbon"))

        weather = asyncio.run(in_tasks())
    assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "lookup_weather"
    assert weather == agent.Weather(
        city="Lisbon",
        temperature=21.5,
        units="metric",
        observed_at=datetime(2025, 5, 17, 18, 30, tzinfo=timezone.utc),
    )
    assert [c.action for c in replay.calls] == ["substituted", "substituted"]
    assert agent.BODY_CALLS == {}


def test_a_caught_mismatch_is_listed_by_verify_complete() -> None:
    with ReplaySession.from_trace(LISBON) as replay:
        with contextlib.suppress(ReplayMismatchError):  # an agent that swallows errors
            agent.run_dinner_agent(agent.LISBON, drifted_default=True)
        with pytest.raises(ReplayMismatchError) as caught:
            replay.verify_complete()
    message = str(caught.value)
    assert caught.value.reason.startswith("8 recorded call(s) were never made")
    assert "not reached: call-2 (tool lookup_weather), call-3 (llm scripted/planner-1)" in message
    assert "raised during the run: ReplayMismatchError at call 2: input differs" in message


def test_an_extra_call_the_agent_caught_still_fails_verify_complete() -> None:
    with ReplaySession.from_trace(LISBON) as replay:
        agent.run_dinner_agent(agent.LISBON)
        with pytest.raises(ReplayError):
            agent.lookup_weather("Lisbon")  # the agent catches this one
        assert replay.pending == 0
        with pytest.raises(ReplayMismatchError) as caught:
            replay.verify_complete()
    assert caught.value.reason == (
        "the run diverged from the recording (the agent caught the error)"
    )
    assert "raised during the run: ReplayExhaustedError at call 9" in str(caught.value)
    assert "its recorded answer (call-2) was already consumed" in str(replay.errors[0])


def test_a_repeated_call_is_a_recorded_call_consumed_twice(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def fetch(url: str) -> str:
        RAN["fetch"] += 1
        return "page"

    @trace_tool
    def parse(page: str) -> int:
        return 1

    trace = _record(tmp_path / "retry.sftrace", lambda: parse(fetch("https://a.example")))
    with ReplaySession.from_trace(trace):
        fetch("https://a.example")
        with pytest.raises(ReplayExhaustedError) as caught:
            fetch("https://a.example")  # a retry the recorded run did not make
    assert caught.value.reason == (
        "recorded call consumed twice: this call's recorded answer (call-1) was already consumed, "
        "and the recording has it once; the next recorded call is tool parse (call-2) [tool name "
        "differs: recorded 'parse', this run called 'fetch']"
    )
    assert RAN == {}


def test_summary_is_frozen_and_counts_per_call() -> None:
    with ReplaySession.from_trace(LISBON) as replay:
        agent.run_dinner_agent(agent.LISBON)
        summary = replay.summary
    assert summary.ok
    assert summary.first_divergence is None
    assert len(summary.calls) == 8
    assert [c.recorded_id for c in replay.matched] == [c.recorded_id for c in summary.calls]
    text = str(summary)
    assert text.splitlines()[0] == (
        "replay (frozen): 8 call(s) reached - 8 substituted, 0 executed, 0 rejected; 0 recorded "
        "call(s) not reached, 1 skipped inside substituted calls"
    )
    assert "    5. substituted tool research <- call-5" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.errors = ()  # type: ignore[misc]


# --- the replayed values -------------------------------------------------------------------------


class Booking(BaseModel):
    reference: str
    when: datetime


@dataclasses.dataclass
class Receipt:
    total: float
    issued: date
    signature: bytes


@trace_tool
def get_booking(ref: str) -> Booking:
    RAN["get_booking"] += 1
    return Booking(reference=ref, when=datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc))


@trace_tool
def get_receipt() -> Receipt:
    RAN["get_receipt"] += 1
    return Receipt(total=9.5, issued=date(2025, 1, 2), signature=b"\xff\x00\x10sig")


@trace_tool
def get_time() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)


@trace_tool
def get_blob() -> bytes:
    return b"\x00\x01\xfe\xff"


@trace_tool
def get_tags() -> set[str]:
    return {"b", "a"}


class Price(BaseModel):
    amount: float


@trace_tool
def get_price() -> Price:
    return {"amount": 1}  # type: ignore[return-value]  # a dict, although annotated Price


@trace_tool
def untyped():  # type: ignore[no-untyped-def]
    return {"k": [1, 2]}


def test_replayed_values_are_rebuilt_into_the_return_annotation(
    recording: Recording, tmp_path: Path
) -> None:
    def body() -> None:
        get_booking("B-1")
        get_receipt()
        get_time()
        get_blob()
        get_tags()
        untyped()
        llm_request(
            provider="p",
            model="m",
            input={"q": 1},
            call=lambda: agent.Summary(text="t", tokens=1),
            response_type=agent.Summary,
        )

    trace = _record(tmp_path / "values.sftrace", body)
    with ReplaySession.from_trace(trace) as replay:
        booking = get_booking("B-1")
        receipt = get_receipt()
        when = get_time()
        blob = get_blob()
        tags = get_tags()
        plain = untyped()
        summary = llm_request(
            provider="p", model="m", input={"q": 1}, call=lambda: None, response_type=agent.Summary
        )
        replay.verify_complete()
    assert RAN == {}
    assert booking == Booking(
        reference="B-1", when=datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    )
    assert receipt == Receipt(total=9.5, issued=date(2025, 1, 2), signature=b"\xff\x00\x10sig")
    assert type(receipt.signature) is bytes
    assert when == datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc)
    assert blob == b"\x00\x01\xfe\xff"
    assert tags == {"a", "b"}
    assert plain == {"k": [1, 2]}
    assert summary == agent.Summary(text="t", tokens=1)
    assert all(not c.notes for c in replay.calls)


def test_a_value_that_does_not_round_trip_is_returned_as_recorded_json(
    recording: Recording, tmp_path: Path
) -> None:
    trace = _record(tmp_path / "price.sftrace", get_price)
    with ReplaySession.from_trace(trace) as replay:
        value = get_price()
    # Price(amount=1.0) would not be what the tool returned while recording: {"amount": 1}
    assert value == {"amount": 1}
    assert type(value["amount"]) is int
    assert replay.calls[0].notes == [
        "the recorded value does not round-trip through Price; returned as JSON"
    ]


# --- a replay run is traced ------------------------------------------------------------------------


def test_a_replay_wrapped_in_record_writes_a_bundle_with_replay_actions(
    recording: Recording, tmp_path: Path
) -> None:
    with record(tmp_path / "replay.sftrace"), ReplaySession.from_trace(LISBON) as replay:
        agent.run_dinner_agent(agent.LISBON)
        with pytest.raises(ReplayError):
            agent.lookup_weather("Lisbon")  # one call too many: rejected, and traced as such
    traced = Trace.load(tmp_path / "replay.sftrace")
    assert traced.run.replay_mode == "frozen"
    calls = traced.calls
    assert [c.replay_action for c in calls] == ["substituted"] * 8 + ["rejected"]
    assert [c.seq for c in calls] == list(range(1, 10))
    # the substituted outputs are traced with the recorded fingerprints
    recorded = Trace.load(LISBON)
    outputs = [e.output_sha256 for e in traced.events if e.type in ("tool_result", "llm_response")]
    recorded_outputs = [
        e.output_sha256
        for e in recorded.events
        if e.type in ("tool_result", "llm_response") and e.parent_id != "call-6"
    ]
    assert outputs == recorded_outputs
    rejected = traced.outcome_of(calls[-1])
    assert isinstance(rejected, ErrorEvent)
    assert rejected.status == "skipped"
    assert rejected.error_type == "stepfork_otel.replay.errors.ReplayExhaustedError"
    assert len(replay.errors) == 1
    spans = [
        s for s in recording.exporter.get_finished_spans() if s.name.startswith("execute_tool")
    ]
    assert {(s.attributes or {}).get("stepfork.replay.mode") for s in spans} == {"frozen"}


def test_a_call_rejected_in_a_recorded_replay_run_has_no_result(
    recording: Recording, tmp_path: Path
) -> None:
    with (
        record(tmp_path / "replay-run.sftrace"),
        ReplaySession.from_trace(LISBON, mode="forbidden"),
        pytest.raises(ReplayError),
    ):
        agent.lookup_weather("Lisbon")
    replay_run = Trace.load(tmp_path / "replay-run.sftrace")
    with pytest.raises(ReplayMismatchError) as caught, ReplaySession.from_trace(replay_run):
        agent.lookup_weather("Lisbon")
    assert caught.value.reason == (
        "missing result: the recorded call call-1 was rejected before its body ran in the "
        "recorded run (itself a replay: stepfork_otel.replay.errors.ReplayPolicyError), so it "
        "has no result to substitute"
    )
    assert agent.BODY_CALLS == {}


# --- concurrency ---------------------------------------------------------------------------------


@trace_tool
async def slow_research(topic: str) -> str:
    await asyncio.sleep(0)  # the sibling task starts before the inner call below
    inner = await allm_request(
        provider="p", model="inner", input={"topic": topic}, call=_inner_answer
    )
    return f"{topic}: {inner}"


async def _inner_answer() -> str:
    RAN["inner"] += 1
    return "notes"


@trace_tool
async def quick_lookup(key: str) -> str:
    RAN["quick_lookup"] += 1
    return key.upper()


async def _concurrent_agent() -> list[str]:
    return list(await asyncio.gather(slow_research("lisbon"), quick_lookup("eur")))


async def test_concurrent_calls_with_interleaved_nesting(
    recording: Recording, tmp_path: Path
) -> None:
    async with record(tmp_path / "concurrent.sftrace"):
        await _concurrent_agent()
    RAN.clear()
    trace = Trace.load(tmp_path / "concurrent.sftrace")
    # recorded in start order: research, lookup, then research's inner call (not contiguous)
    assert [(c.id, c.parent_id) for c in trace.calls] == [
        ("call-1", None),
        ("call-2", None),
        ("call-3", "call-1"),
    ]
    async with ReplaySession.from_trace(trace) as frozen:
        assert await _concurrent_agent() == ["lisbon: notes", "EUR"]
        frozen.verify_complete()
    assert [rc.event.id for rc in frozen.summary.skipped] == ["call-3"]
    assert RAN == {}
    async with ReplaySession.from_trace(
        trace, mode="live", allow_live_tools={"slow_research", "quick_lookup"}
    ) as live:
        assert await _concurrent_agent() == ["lisbon: notes", "EUR"]
        live.verify_complete()
    assert [(c.name, c.recorded_id) for c in live.calls] == [
        ("slow_research", "call-1"),
        ("quick_lookup", "call-2"),
        ("inner", "call-3"),
    ]
    assert RAN == {"inner": 1, "quick_lookup": 1}


def test_a_call_inside_an_executed_body_that_was_recorded_at_run_level_is_a_mismatch(
    recording: Recording, tmp_path: Path
) -> None:
    @trace_tool
    def outer() -> int:
        return inner_tool() if RAN["nest"] else 0

    @trace_tool
    def inner_tool() -> int:
        return 1

    def body() -> None:
        outer()
        inner_tool()

    trace = _record(tmp_path / "nesting.sftrace", body)
    RAN["nest"] = 1  # today's outer() calls inner_tool() inside itself
    with (
        pytest.raises(ReplayMismatchError) as caught,
        ReplaySession.from_trace(trace, mode="live", allow_live_tools={"outer", "inner_tool"}),
    ):
        outer()
    assert caught.value.reason == (
        "call made inside call-1, but the next recorded call was made at run level"
    )


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "empty file, not a .sftrace bundle"),
        (b'{"format":"sftrace","format_version":1,"trace_id":"ab', "not valid JSON"),
        (b'{"hello": "world"}', 'not a .sftrace bundle (no "format": "sftrace" field)'),
        (b'{"format":"sftrace","format_version":99,"trace_id":"x"}', "format version 99 is newer"),
    ],
)
def test_unreadable_bundles_are_bundle_errors(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "bad.sftrace"
    path.write_bytes(content)
    with pytest.raises(BundleError) as caught:
        ReplaySession.from_trace(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert reason in str(caught.value)


def test_a_missing_bundle_and_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no such file"):
        ReplaySession.from_trace(tmp_path / "nope.sftrace")
    with pytest.raises(BundleError, match="is a directory"):
        ReplaySession.from_trace(tmp_path)
    with pytest.raises(TypeError, match="expected a path or a Trace"):
        ReplaySession.from_trace(42)  # type: ignore[arg-type]


def test_an_inconsistent_in_memory_trace_is_rejected() -> None:
    trace = Trace.load(LISBON)
    events = list(trace.events)
    events[2] = events[2].model_copy(update={"parent_id": "call-77"})
    with pytest.raises(BundleError, match=r"inconsistent bundle: call-2: parent 'call-77'"):
        ReplaySession.from_trace(trace.model_copy(update={"events": events}))


def test_an_unserialisable_input_cannot_be_matched(recording: Recording, tmp_path: Path) -> None:
    class Handle:
        pass

    @trace_tool
    def use_handle(handle: object) -> int:
        RAN["use_handle"] += 1
        return 1

    trace = _record(tmp_path / "handle.sftrace", lambda: use_handle(Handle()))
    with pytest.raises(ReplayMismatchError) as caught, ReplaySession.from_trace(trace):
        use_handle(Handle())
    assert caught.value.reason.startswith(
        "the input of this call has no canonical JSON form, so it cannot be matched"
    )
    assert RAN == {}


def test_diagnostics_add_no_secret(recording: Recording, tmp_path: Path) -> None:
    secret = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"

    @trace_tool
    def search(query: str, api_key: str) -> list[str]:
        return []

    trace = _record(tmp_path / "secret.sftrace", lambda: search("a", secret))
    assert secret not in (tmp_path / "secret.sftrace").read_text()
    with pytest.raises(ReplayMismatchError) as caught, ReplaySession.from_trace(trace):
        search("b", secret)
    error = caught.value
    assert secret not in str(error)
    assert secret not in repr(error.to_dict())
    assert '"api_key":"[REDACTED]"' in str(error)


def test_a_recorded_failure_message_is_sanitised_again() -> None:
    # a hand-edited bundle with a raw secret in a recorded error message
    secret = "sk-proj-ZzYyXxWwVvUuTtSsRrQqPpOo9876543210"
    trace = Trace.load(FAILURE)
    events = list(trace.events)
    index = next(i for i, e in enumerate(events) if isinstance(e, ErrorEvent))
    error_event = events[index]
    assert isinstance(error_event, ErrorEvent)
    message = f"refused (key {secret})"
    text = canonical_json({"error_type": error_event.error_type, "message": message})
    events[index] = error_event.model_copy(
        update={"message": message, "output": text, "output_sha256": sha256_hex(text)}
    )
    with (
        pytest.raises(RecordedDependencyError) as caught,
        ReplaySession.from_trace(trace.model_copy(update={"events": events})),
    ):
        agent.run_dinner_agent(agent.PORTO)
    assert caught.value.message == "refused (key [REDACTED:openai_api_key])"
    assert secret not in str(caught.value)


def test_nothing_named_in_a_bundle_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the module the bundle names exists and is importable: importing it would leave a mark
    (tmp_path / "stepfork_evil_module_zz.py").write_text(
        f"open({str(tmp_path / 'pwned')!r}, 'w').close()\nclass Boom(Exception): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    trace = Trace.load(FAILURE)
    events = list(trace.events)
    index = next(i for i, e in enumerate(events) if isinstance(e, ErrorEvent))
    error_event = events[index]
    assert isinstance(error_event, ErrorEvent)
    error_type = "stepfork_evil_module_zz.Boom"
    text = canonical_json({"error_type": error_type, "message": error_event.message})
    events[index] = error_event.model_copy(
        update={"error_type": error_type, "output": text, "output_sha256": sha256_hex(text)}
    )
    run = trace.run.model_copy(update={"entrypoint": "stepfork_evil_module_zz:main"})
    edited = trace.model_copy(update={"events": events, "run": run})
    with pytest.raises(RecordedDependencyError) as caught, ReplaySession.from_trace(edited):
        agent.run_dinner_agent(agent.PORTO)
    assert caught.value.error_type == error_type
    assert type(caught.value) is RecordedDependencyError
    assert "stepfork_evil_module_zz" not in sys.modules
    assert not (tmp_path / "pwned").exists()


def test_recorded_big_integers_are_substituted_exactly(recording: Recording) -> None:
    from stepfork_otel import ReplaySession, record, trace_tool

    @trace_tool
    def balance(account: str):  # type: ignore[no-untyped-def]  # no annotation: the JSON value
        return {"account": account, "micros": 10**20 + 1}

    path = recording.directory / "big.sftrace"
    with record(path):
        balance("acc-1")
    with ReplaySession.from_trace(path) as replay:
        value = balance("acc-1")
        replay.verify_complete()
    assert value == {"account": "acc-1", "micros": 10**20 + 1}
    assert isinstance(value["micros"], int)


def test_a_recorded_output_that_is_not_json_is_a_typed_missing_result(
    recording: Recording,
) -> None:
    import hashlib

    from stepfork_otel import ReplayMismatchError, ReplaySession, Trace, record, trace_tool
    from stepfork_otel.trace.models import ToolResult

    @trace_tool
    def lookup(city: str) -> str:
        return city.upper()

    path = recording.directory / "bad.sftrace"
    with record(path):
        lookup("paris")
    trace = Trace.load(path)
    broken = "{not json"
    events = [
        e.model_copy(
            update={
                "output": broken,
                "output_sha256": hashlib.sha256(broken.encode()).hexdigest(),
                "output_size": len(broken),
            }
        )
        if isinstance(e, ToolResult)
        else e
        for e in trace.events
    ]
    bad = trace.model_copy(update={"events": events})
    with (
        ReplaySession.from_trace(bad) as replay,
        pytest.raises(ReplayMismatchError, match="is not valid JSON"),
    ):
        lookup("paris")
    assert len(replay.errors) == 1


def test_a_replay_no_span_encloses_is_one_trace_under_its_own_root(
    recording: Recording, tmp_path: Path
) -> None:
    from opentelemetry import trace as trace_api
    from opentelemetry.trace import StatusCode

    from stepfork_otel import constants as k

    @trace_tool
    def lookup(n: int) -> int:
        return n * 2

    with record(tmp_path / "r.sftrace", name="refunds", input={"order": 1042}):
        lookup(1)
        lookup(2)
    recording.exporter.clear()
    with ReplaySession.from_trace(tmp_path / "r.sftrace") as replay:
        lookup(1)
        lookup(2)
        replay.verify_complete()
    spans = recording.exporter.get_finished_spans()
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "replay refunds"
    assert root.attributes[k.REPLAY_OF] == Trace.load(tmp_path / "r.sftrace").trace_id
    assert root.attributes[k.INPUT_VALUE] == '{"order":1042}'  # shown beside the original's
    assert root.attributes[k.INPUT_MIME_TYPE] == k.MIME_JSON  # (Phoenix shows it as JSON)
    assert root.status.status_code is StatusCode.OK  # as a recorded run's span, not Unset
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert len(spans) == 3

    recording.exporter.clear()  # a replay that diverged ends ERROR, even if the agent caught it
    with ReplaySession.from_trace(tmp_path / "r.sftrace"), contextlib.suppress(ReplayMismatchError):
        lookup(3)
    (root,) = [s for s in recording.exporter.get_finished_spans() if s.parent is None]
    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == "ReplayMismatchError"

    recording.exporter.clear()
    tracer = trace_api.get_tracer("user", tracer_provider=recording.provider)
    with (
        tracer.start_as_current_span("my request"),
        ReplaySession.from_trace(tmp_path / "r.sftrace"),
    ):
        lookup(1)
        lookup(2)
    names = sorted(s.name for s in recording.exporter.get_finished_spans())
    assert names == ["execute_tool lookup", "execute_tool lookup", "my request"]  # no extra root
