"""Forking a recorded run at call N (``ReplaySession.from_trace(..., fork_at=N, record_to=...)``):
the calls before N replayed frozen and matched strictly, the run live from N, and the fork kept as
a bundle of its own -- its calls before N the original's, byte for byte, its header naming where
it came from. The agents here use ``@trace_tool`` and ``llm_request``; the real SDKs against the
loopback fake server are ``tests/test_fork_sdk.py``."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import (
    BundleError,
    ReplayMismatchError,
    ReplayModeError,
    ReplayPolicyError,
    ReplaySession,
    Trace,
    llm_request,
    record,
    trace_tool,
)
from stepfork_otel import constants as k
from stepfork_otel.replay.plan import RecordedCall
from stepfork_otel.trace.bundle import bundle_fingerprint
from stepfork_otel.trace.checks import validate_structure, verify_integrity

RAN: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


@trace_tool
def get_weather(city: str) -> str:
    RAN["get_weather"] += 1
    return f"{city}: sunny, 24C"


@trace_tool(replay_policy="forbidden")
def notify(text: str) -> str:
    RAN["notify"] += 1
    return "sent"


@trace_tool
def research(topic: str) -> str:
    """A tool that asks a model itself: a call nested in a call."""
    RAN["research"] += 1
    return ask("inner-model", f"notes on {topic}")


def ask(model: str, prompt: str) -> str:
    def call() -> dict[str, Any]:
        RAN[f"llm:{model}"] += 1
        return {"model": model, "text": f"[{model}] {prompt[-40:]}"}

    reply = llm_request(provider="fake", model=model, input={"prompt": prompt}, call=call)
    return str(reply["text"])


def trip_agent(answer_model: str = "gpt-4o", *, notify_user: bool = False) -> str:
    """Three LLM calls around a tool: plan (call 1), the tool (2), answer (3), summary (4)."""
    plan = ask("gpt-4o", "Weather in Paris?")
    weather = get_weather("Paris")
    answer = ask(answer_model, f"{plan} / {weather}")
    summary = ask(answer_model, f"one line: {answer}")
    if notify_user:
        notify(summary)
    return summary


@pytest.fixture
def recorded(recording: Recording, tmp_path: Path) -> Path:
    path = tmp_path / "trip.sftrace"
    with record(path, name="trip", input={"city": "Paris"}) as run:
        run.set_output(trip_agent())
    RAN.clear()
    return path


def _call_lines(path: Path) -> dict[int, list[bytes]]:
    """Each call's event and payload lines as the file holds them, by call number."""
    lines = path.read_bytes().split(b"\n")
    out: dict[int, list[bytes]] = {}
    current: int | None = None
    for line in lines:
        if line.startswith(b'{"type":'):
            current = json.loads(line)["seq"]
            out.setdefault(current, []).append(line)
        elif line.startswith((b'{"input":', b'{"output":')) and current is not None:
            out[current].append(line)
        else:
            current = None
    return out


def test_a_fork_runs_the_prefix_frozen_and_the_rest_live(recorded: Path, tmp_path: Path) -> None:
    fork_path = tmp_path / "fork.sftrace"
    with ReplaySession.from_trace(recorded, fork_at=3, record_to=fork_path) as fork:
        answer = trip_agent("gpt-4o-mini")
        fork.set_output(answer)
    fork.verify_complete()
    # calls 1 and 2 were served from the recording; 3 and 4 ran, on the other model
    assert RAN == {"llm:gpt-4o-mini": 2}
    assert answer.startswith("[gpt-4o-mini]")
    assert [(c.action, c.recorded_id) for c in fork.calls] == [
        ("substituted", "call-1"),
        ("substituted", "call-2"),
        ("executed", None),
        ("executed", None),
    ]
    summary = fork.summary
    assert summary.ok
    assert summary.fork_at == 3
    assert summary.forked_after == 2
    assert [rc.event.id for rc in summary.after_fork] == ["call-3", "call-4"]
    assert fork.mode.value == "live"
    assert str(summary).splitlines()[0] == (
        "replay (forked at call 3): 4 call(s) reached - 2 substituted, 2 executed, 0 rejected; "
        "0 recorded call(s) not reached, 0 skipped inside substituted calls, "
        "2 after the fork point"
    )
    assert fork.fork_bundle == fork_path
    assert not fork_path.with_name("fork.sftrace.partial").exists()

    original, forked = Trace.load(recorded), Trace.load(fork_path)
    assert forked.forked_from is not None
    assert forked.forked_from.model_dump() == {
        "trace_id": original.trace_id,
        "lines_sha256": bundle_fingerprint(original),
        "at_call": 3,
        "span_id": original.run.span_id,
        "bundle": "trip.sftrace",
    }
    assert forked.trace_id != original.trace_id
    # its first two calls are the original's, line for line; the rest its own, numbered on
    before, after = _call_lines(recorded), _call_lines(fork_path)
    assert after[1] == before[1]
    assert after[2] == before[2]
    assert after[3] != before[3]
    assert [c.id for c in forked.calls] == ["call-1", "call-2", "call-3", "call-4"]
    assert [c.trace_id for c in forked.calls] == [original.trace_id] * 2 + [forked.trace_id] * 2
    assert [getattr(c, "model", None) for c in forked.calls[2:]] == ["gpt-4o-mini"] * 2
    assert forked.run.name == "trip"
    assert forked.run.input == original.run.input
    assert forked.run.output == json.dumps(answer)
    assert forked.run.replay_mode == "live"  # its own calls ran live (its prefix is the original's)
    assert forked.complete
    assert not verify_integrity(forked)
    assert not validate_structure(forked)


def test_the_fork_bundle_replays_frozen_on_its_own(recorded: Path, tmp_path: Path) -> None:
    fork_path = tmp_path / "fork.sftrace"
    with ReplaySession.from_trace(recorded, fork_at=3, record_to=fork_path) as fork:
        fork.set_output(trip_agent("gpt-4o-mini"))
    RAN.clear()
    with ReplaySession.from_trace(fork_path) as replay:
        again = trip_agent("gpt-4o-mini")
    replay.verify_complete()
    assert RAN == {}
    assert again == Trace.load(fork_path).run.output.strip('"')  # type: ignore[union-attr]
    assert [c.recorded_id for c in replay.calls] == ["call-1", "call-2", "call-3", "call-4"]


def test_the_fork_run_links_to_the_original(
    recorded: Path, tmp_path: Path, recording: Recording
) -> None:
    recording.exporter.clear()
    with ReplaySession.from_trace(
        recorded, fork_at=2, record_to=tmp_path / "f.sftrace", allow_live_tools=["get_weather"]
    ) as fork:
        fork.set_output(trip_agent())
    original = Trace.load(recorded)
    spans = recording.exporter.get_finished_spans()
    (run,) = [s for s in spans if s.parent is None]
    assert run.name == "invoke_agent trip"
    assert run.attributes[k.FORK_OF] == original.trace_id
    assert run.attributes[k.FORK_AT_CALL] == 2
    (link,) = run.links
    assert format(link.context.trace_id, "032x") == original.trace_id
    assert format(link.context.span_id, "016x") == original.run.span_id
    # every call of the fork is in its trace: the prefix substituted, the rest live
    calls = [s for s in spans if s.attributes and s.attributes.get(k.REPLAY_ACTION)]
    assert {s.context.trace_id for s in calls} == {run.context.trace_id}
    assert [s.attributes[k.REPLAY_MODE] for s in calls] == ["frozen"] + ["live"] * 3


def test_a_replay_root_span_links_to_the_recorded_run(recorded: Path, recording: Recording) -> None:
    recording.exporter.clear()
    with ReplaySession.from_trace(recorded) as replay:
        trip_agent()
    replay.verify_complete()
    (root,) = [s for s in recording.exporter.get_finished_spans() if s.parent is None]
    (link,) = root.links
    assert format(link.context.span_id, "016x") == Trace.load(recorded).run.span_id


def test_a_changed_prefix_raises_before_the_fork_point(recorded: Path, tmp_path: Path) -> None:
    fork_path = tmp_path / "fork.sftrace"

    def changed() -> str:
        ask("gpt-4o", "Weather in Lyon?")  # call 1 differs
        return "unreachable"

    with (
        pytest.raises(ReplayMismatchError) as caught,
        ReplaySession.from_trace(recorded, fork_at=3, record_to=fork_path) as fork,
    ):
        changed()
    assert caught.value.position == 1
    assert caught.value.details[-1] == (
        "this is before the fork point (call 3): the calls before it are replayed frozen and "
        "must match the recording, so the fork point was not reached"
    )
    assert RAN == {}
    assert fork.summary.forked_after is None
    assert fork.fork_bundle is None
    assert fork.fork_bundle_missing == "the run ended before call 3, the fork point"
    assert not fork_path.exists()
    assert not fork_path.with_name("fork.sftrace.partial").exists()
    with pytest.raises(ReplayMismatchError, match="fork point was not reached"):
        fork.verify_complete()


def test_a_forbidden_tool_after_the_fork_point_is_refused(recorded: Path, tmp_path: Path) -> None:
    fork_path = tmp_path / "fork.sftrace"
    with (
        pytest.raises(ReplayPolicyError) as caught,
        ReplaySession.from_trace(
            recorded, fork_at=3, record_to=fork_path, allow_live_tools=["notify"]
        ),
    ):
        trip_agent("gpt-4o-mini", notify_user=True)
    assert RAN["notify"] == 0
    assert caught.value.position == 5
    assert caught.value.reason == (
        "tool notify has replay policy 'forbidden': after the fork point (call 3) the run is "
        "live, and a forbidden call never runs during a replay, allow-listed or not; its body "
        "did not run"
    )
    forked = Trace.load(fork_path)  # the fork reached its fork point: its run is kept, failed
    assert forked.run.status == "error"
    assert forked.run.error_type == "stepfork_otel.replay.errors.ReplayPolicyError"
    assert [c.replay_action for c in forked.calls][2:] == ["executed", "executed", "rejected"]


def test_tools_after_the_fork_point_run_only_when_allowed(recorded: Path, tmp_path: Path) -> None:
    def weather_twice() -> str:
        ask("gpt-4o", "Weather in Paris?")
        get_weather("Paris")
        return get_weather("Rome")  # call 3 is the fork point: a tool, live

    with (
        pytest.raises(ReplayPolicyError, match=r"may not run live: after the fork point \(call 3"),
        ReplaySession.from_trace(recorded, fork_at=3),
    ):
        weather_twice()
    assert RAN == {}
    with ReplaySession.from_trace(recorded, fork_at=3, allow_live_tools=["get_weather"]) as fork:
        assert weather_twice() == "Rome: sunny, 24C"
    assert RAN == {"get_weather": 1}
    fork.verify_complete()


def test_manual_after_the_fork_point_asks_about_the_call_about_to_run(
    recorded: Path, tmp_path: Path
) -> None:
    @trace_tool(name="get_weather", replay_policy="manual")
    def careful_weather(city: str) -> str:
        RAN["careful"] += 1
        return "cloudy"

    asked: list[RecordedCall] = []

    def approve(rc: RecordedCall) -> bool:
        asked.append(rc)
        return True

    def agent() -> str:
        ask("gpt-4o", "Weather in Paris?")
        get_weather("Paris")
        return careful_weather("Oslo")

    with ReplaySession.from_trace(
        recorded, fork_at=3, allow_live_tools=["get_weather"], approve=approve
    ):
        assert agent() == "cloudy"
    (rc,) = asked
    assert (rc.event.id, rc.outcome, rc.event.input) == ("live-3", None, '{"city":"Oslo"}')


def test_fork_at_one_runs_everything_live(recorded: Path, tmp_path: Path) -> None:
    with ReplaySession.from_trace(
        recorded, fork_at=1, record_to=tmp_path / "f.sftrace", allow_live_tools=["get_weather"]
    ) as fork:
        trip_agent("gpt-4o-mini")
    assert RAN == {"llm:gpt-4o": 1, "get_weather": 1, "llm:gpt-4o-mini": 2}
    forked = Trace.load(tmp_path / "f.sftrace")
    assert forked.forked_from is not None
    assert forked.forked_from.at_call == 1
    assert {c.trace_id for c in forked.calls} == {forked.trace_id}
    assert fork.summary.forked_after == 0


def test_forking_one_bundle_twice_in_one_process(recorded: Path, tmp_path: Path) -> None:
    outcomes = {}
    for model in ("gpt-4o-mini", "claude-haiku"):
        with ReplaySession.from_trace(
            recorded, fork_at=3, record_to=tmp_path / f"{model}.sftrace"
        ) as fork:
            outcomes[model] = trip_agent(model)
        fork.verify_complete()
    assert RAN == {"llm:gpt-4o-mini": 2, "llm:claude-haiku": 2}
    for model, answer in outcomes.items():
        forked = Trace.load(tmp_path / f"{model}.sftrace")
        assert answer.startswith(f"[{model}]")
        assert [getattr(c, "model", None) for c in forked.calls][2:] == [model, model]


# --- the fork point ----------------------------------------------------------------------------------


def test_the_fork_point_is_checked(recording: Recording, tmp_path: Path) -> None:
    path = tmp_path / "nested.sftrace"
    with record(path, name="nested"):
        research("Paris")  # call 1, with call 2 inside it
        ask("gpt-4o", "done?")  # call 3
    with pytest.raises(ReplayModeError) as caught:
        ReplaySession.from_trace(path, fork_at=2)
    assert str(caught.value) == (
        "fork_at=2: call 2 (llm fake/inner-model) was made inside call-1 (tool research), which "
        "is before the fork point and so replayed frozen -- its body does not run, so nothing "
        "would make call 2; fork at call-1 (fork_at=1) to run its body live"
    )
    with pytest.raises(ReplayModeError, match=r"the bundle has 3 call\(s\), numbered 1 to 3"):
        ReplaySession.from_trace(path, fork_at=4)
    with pytest.raises(ReplayModeError, match="numbered 1 to 3"):
        ReplaySession.from_trace(path, fork_at=0)
    with pytest.raises(ReplayModeError, match="leave the mode out, or say 'live'"):
        ReplaySession.from_trace(path, mode="frozen", fork_at=3)
    with pytest.raises(ReplayModeError, match="record_to records a fork"):
        ReplaySession.from_trace(path, record_to=tmp_path / "x.sftrace")
    with pytest.raises(ReplayModeError, match="not True"):
        ReplaySession.from_trace(path, fork_at=True)  # type: ignore[arg-type]

    RAN.clear()
    with ReplaySession.from_trace(path, fork_at=3, record_to=tmp_path / "f.sftrace") as fork:
        research("Paris")  # substituted: its inner call is skipped
        ask("gpt-4o-mini", "done?")
    fork.verify_complete()
    assert RAN == {"llm:gpt-4o-mini": 1}
    forked = Trace.load(tmp_path / "f.sftrace")
    assert [(c.id, c.parent_id) for c in forked.calls] == [
        ("call-1", None),
        ("call-2", "call-1"),  # the original's, though this run never made it
        ("call-3", None),  # the fork's first call is numbered after the prefix
    ]
    assert not validate_structure(forked)


# --- captured reads ------------------------------------------------------------------------------


def dated_agent(answer_model: str) -> str:
    request_id = str(uuid.uuid4())  # before call 1: served
    ask("gpt-4o", f"plan {request_id}")
    pick = random.choice(["Paris", "Rome", "Oslo"])  # before call 2: served
    get_weather(pick)
    seed = random.random()  # before call 3, the fork point: live
    return ask(answer_model, f"answer {seed:.6f} {request_id}")


def test_captured_reads_are_served_up_to_the_fork_point_and_recorded_after(
    recording: Recording, tmp_path: Path
) -> None:
    path = tmp_path / "dated.sftrace"
    with record(path, name="dated", capture=("uuid", "random")):
        dated_agent("gpt-4o")
    original = Trace.load(path)
    fork_path = tmp_path / "fork.sftrace"
    with ReplaySession.from_trace(path, fork_at=3, record_to=fork_path) as fork:
        answer = dated_agent("gpt-4o-mini")
    fork.verify_complete()
    assert fork.summary.reads.served == 2
    forked = Trace.load(fork_path)
    before = [r for r in original.captured if r.before_call is not None and r.before_call < 3]
    assert forked.captured[:2] == before  # the original's, as served
    (live,) = forked.captured[2:]
    assert (live.index, live.source, live.before_call) == (3, "random.random", 3)
    assert f"answer {live.value[0]:.6f}" in (forked.calls[2].input or "")
    assert live.value != original.captured[2].value  # read again, live
    # the fork replays frozen on its own, its live read served back
    with ReplaySession.from_trace(fork_path) as replay:
        assert dated_agent("gpt-4o-mini") == answer
    replay.verify_complete()


def test_a_fork_bundle_whose_prefix_is_not_the_original_is_inconsistent(
    recorded: Path, tmp_path: Path
) -> None:
    with ReplaySession.from_trace(recorded, fork_at=3, record_to=tmp_path / "f.sftrace"):
        trip_agent("gpt-4o-mini")
    forked = Trace.load(tmp_path / "f.sftrace")
    origin = forked.forked_from
    assert origin is not None
    mine = forked.trace_id
    relabelled = [
        e.model_copy(update={"trace_id": mine}) if e.id == "call-2" else e for e in forked.events
    ]
    bad = forked.model_copy(update={"events": relabelled})
    assert [str(p) for p in validate_structure(bad)] == [
        f"call-2: before the fork point (call 3) but not of the original run (trace {mine}, "
        f"forked from {origin.trace_id})"
    ]
    bad.save(tmp_path / "bad.sftrace")
    with pytest.raises(BundleError, match="inconsistent bundle: call-2: before the fork point"):
        Trace.load(tmp_path / "bad.sftrace")
    missing = forked.model_copy(update={"events": [e for e in forked.events if e.seq != 2]})
    assert [str(p) for p in validate_structure(missing)] == [
        "forked at call 3, so the 2 calls before it are the original's; the bundle holds 1"
    ]
    moved = forked.model_copy(update={"forked_from": origin.model_copy(update={"at_call": 2})})
    assert [str(p) for p in validate_structure(moved)] == [
        f"call-2: from the fork point (call 2) on, calls are the fork's own (trace {mine}), not "
        f"{origin.trace_id}"
    ]


def test_a_failure_to_write_the_fork_bundle_is_logged_and_keeps_the_partial_run(
    recorded: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """stepfork's own failure at the end of a fork is an internal error: logged, never raised
    into the agent's code; the fork's run stays at ``<record_to>.partial``."""
    import stepfork_otel._internal as internal
    from stepfork_otel.replay import fork as forking

    def broken(*args: Any, **kwargs: Any) -> Trace:
        raise RuntimeError("deliberate")

    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)
    monkeypatch.setattr(forking, "fork_trace", broken)
    fork_path = tmp_path / "fork.sftrace"
    with (
        caplog.at_level("ERROR", logger="stepfork_otel"),
        ReplaySession.from_trace(recorded, fork_at=3, record_to=fork_path) as fork,
    ):
        answer = trip_agent("gpt-4o-mini")
    assert answer.startswith("[gpt-4o-mini]")
    assert fork.fork_bundle is None
    assert fork.fork_bundle_missing == (
        f"writing it failed: deliberate (the run is in {fork_path}.partial)"
    )
    assert not fork_path.exists()
    partial = Trace.load(fork_path.with_name("fork.sftrace.partial"))
    assert [c.replay_action for c in partial.calls] == ["substituted"] * 2 + ["executed"] * 2
    assert any(
        f"writing the fork's bundle {fork_path}" in r.getMessage() for r in caplog.records
    ), caplog.text


def test_a_fork_is_never_written_over_the_bundle_it_forks(recorded: Path) -> None:
    before = recorded.read_bytes()
    with pytest.raises(ReplayModeError, match="record_to is the bundle being replayed"):
        ReplaySession.from_trace(
            recorded,
            fork_at=3,
            record_to=recorded.parent / ".." / recorded.parent.name / recorded.name,
        )
    assert recorded.read_bytes() == before
