"""Replay against the golden bundles in ``tests/golden/`` (see ``make_golden.py`` for how each
was made): one test per way a run can leave the recorded path, each asserting the exact error type
and the key parts of its message, plus the recorded failure, the async agent and legacy bundles."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import golden_agent as agent
import pytest

from stepfork_otel import (
    RecordedDependencyError,
    ReplayExhaustedError,
    ReplayMismatchError,
    ReplaySession,
    Trace,
)
from stepfork_otel.replay.errors import BundleIntegrityError, ReplayError
from stepfork_otel.trace.errors import BundleError

GOLDEN = Path(__file__).parent / "golden"
SHA = re.compile(r"\b[0-9a-f]{64}\b")


def golden(name: str) -> Path:
    return GOLDEN / f"{name}.sftrace"


@pytest.fixture(autouse=True)
def _count_bodies() -> Iterator[None]:
    agent.BODY_CALLS.clear()
    yield
    agent.BODY_CALLS.clear()


def replay_lisbon(bundle: str, **options: object) -> ReplaySession:
    """Run the sync agent on the Lisbon question against ``bundle`` and verify completeness."""
    with ReplaySession.from_trace(golden(bundle), **options) as replay:  # type: ignore[arg-type]
        agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    return replay


# --- the recorded runs replay ----------------------------------------------------------------------


def test_frozen_replay_of_the_recorded_run_runs_no_dependency_body() -> None:
    with ReplaySession.from_trace(golden("dinner_lisbon")) as replay:
        answer = agent.run_dinner_agent(agent.LISBON)
        replay.verify_complete()
    assert answer == "Booked Taberna do Mar, reference TBL-0042."
    assert agent.BODY_CALLS == {}
    summary = replay.summary
    assert summary.ok
    assert summary.counts() == {"substituted": 8, "executed": 0, "rejected": 0}
    # research was substituted: the LLM call recorded inside it was skipped, not pending
    assert [rc.event.id for rc in summary.skipped] == ["call-6"]
    assert [c.recorded_id for c in replay.calls] == [f"call-{n}" for n in (1, 2, 3, 4, 5, 7, 8, 9)]


def test_recorded_failure_is_replayed_as_recorded_dependency_error() -> None:
    with (
        pytest.raises(RecordedDependencyError) as caught,
        ReplaySession.from_trace(golden("dinner_porto_failure")) as replay,
    ):
        agent.run_dinner_agent(agent.PORTO)
    error = caught.value
    assert error.error_type == "golden_agent.TableUnavailableError"
    assert error.message == (
        "reservation API (token [REDACTED:openai_api_key]) refused Cantinho do Avillez: "
        "no table for 2"
    )
    assert agent.RESERVATION_TOKEN not in str(error)
    assert str(error).startswith(
        "at call 7 of this run: recorded failure replayed: golden_agent.TableUnavailableError"
    )
    assert error.expected is not None
    assert error.expected.event_id == "call-8"
    assert agent.BODY_CALLS["book_table"] == 0
    # the reproduced failure is the recorded behaviour, not a divergence
    assert replay.errors == []
    replay.verify_complete()
    failed = replay.calls[-1]
    assert (failed.name, failed.action, failed.status) == ("book_table", "substituted", "error")


def test_a_run_cut_short_before_its_end_replays_every_call_it_has() -> None:
    trace = Trace.load(golden("dinner_lisbon_cut"))  # written as it went, no trailer
    assert not trace.complete
    assert len(trace.calls) == 9
    with ReplaySession.from_trace(golden("dinner_lisbon_cut")) as replay:
        answer = agent.run_dinner_agent(agent.LISBON)
    replay.verify_complete()
    assert answer == "Booked Taberna do Mar, reference TBL-0042."
    assert agent.BODY_CALLS == {}


def test_the_dated_agent_replays_the_date_uuid_and_greeting_it_read() -> None:
    trace = Trace.load(golden("dinner_dated"))
    assert [r.source for r in trace.captured] == ["datetime.now", "uuid.uuid4", "random.choice"]
    with ReplaySession.from_trace(golden("dinner_dated")) as replay:
        answer = agent.run_dated_agent(agent.LISBON)
    replay.verify_complete()
    assert answer == "Booked Taberna do Mar, reference TBL-0042."
    assert agent.BODY_CALLS == {}
    assert replay.summary.reads.served == 3


async def test_async_agent_replays_frozen() -> None:
    async with ReplaySession.from_trace(golden("dinner_lisbon_async")) as replay:
        answer = await agent.run_dinner_agent_async(agent.LISBON)
        replay.verify_complete()
    assert answer == "Booked Taberna do Mar, reference TBL-0042."
    assert agent.BODY_CALLS == {}
    assert replay.summary.counts()["substituted"] == 8
    assert [rc.event.id for rc in replay.summary.skipped] == ["call-6"]


async def test_async_agent_replays_live_with_nested_calls_matched() -> None:
    tools = {"lookup_weather", "convert_currency", "research", "book_table"}
    async with ReplaySession.from_trace(
        golden("dinner_lisbon_async"), mode="live", allow_live_tools=tools
    ) as replay:
        await agent.run_dinner_agent_async(agent.LISBON)
        replay.verify_complete()
    assert [c.action for c in replay.calls] == ["executed"] * 9
    assert agent.BODY_CALLS["summariser-1"] == 1  # the inner call of research ran and matched
    assert replay.calls[5].recorded_id == "call-6"
    assert all(not c.notes for c in replay.calls)  # deterministic agent: same live answers


def test_sync_agent_against_the_async_recording_matches_too() -> None:
    # same calls, same inputs: what replay checks does not depend on how the agent awaits
    replay = replay_lisbon("dinner_lisbon_async")
    assert replay.summary.ok


# --- one golden bundle per way of leaving the recorded path ----------------------------------------


def test_order_mismatch() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_order")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.position == 4
    assert error.reason.startswith(
        "call order differs: this call was recorded later, as call-6, but the next recorded call "
        "is tool research (call-4)"
    )
    assert "tool name differs: recorded 'research', this run called 'convert_currency'" in str(
        error
    )
    assert agent.BODY_CALLS == {}


def test_kind_mismatch() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_kind")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.reason == "kind differs: recorded an llm call, this run made a tool call"
    assert "expected (recorded): llm scripted/planner-1 (call-4)" in str(error)
    assert "actual (this run):   tool convert_currency" in str(error)


def test_tool_name_mismatch() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_tool_name")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.position == 4
    assert error.reason == (
        "tool name differs: recorded 'exchange_currency', this run called 'convert_currency'"
    )
    assert agent.BODY_CALLS["convert_currency"] == 0


def test_provider_mismatch_shows_model_fingerprints() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_provider")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.position == 1
    assert error.reason == "LLM provider differs: recorded 'openai', this run used 'scripted'"
    fingerprints = error.fingerprints
    expected_fp, actual_fp = (
        fingerprints["expected_model_fingerprint"],
        fingerprints["actual_model_fingerprint"],
    )
    assert expected_fp is not None
    assert actual_fp is not None
    assert SHA.fullmatch(expected_fp)
    assert SHA.fullmatch(actual_fp)
    assert expected_fp != actual_fp
    assert f"model fingerprint: {expected_fp} (operation chat)" in str(error)
    assert f"model fingerprint: {actual_fp} (operation chat)" in str(error)
    assert agent.BODY_CALLS["planner-1"] == 0


def test_model_mismatch() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_model")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.reason == "LLM model differs: recorded 'planner-2', this run used 'planner-1'"
    assert "expected (recorded): llm scripted/planner-2 (call-1)" in str(error)
    assert "model fingerprint:" in str(error)


def test_input_mismatch_shows_previews_fingerprints_and_first_difference() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_input")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.position == 4
    assert error.reason.startswith("input differs from the recording")
    message = str(error)
    assert 'input: {"amount":45.0,"source":"EUR","target":"USD"}' in message
    assert 'input: {"amount":40.0,"source":"EUR","target":"USD"}' in message
    assert "first difference at character 11:" in message
    assert error.expected is not None
    assert error.actual is not None
    assert error.expected.input_sha256 is not None
    assert error.actual.input_sha256 is not None
    assert f"input sha256: {error.expected.input_sha256}" in message
    assert f"input sha256: {error.actual.input_sha256}" in message
    assert SHA.fullmatch(error.actual.input_sha256)
    assert agent.BODY_CALLS["convert_currency"] == 0


def test_argument_default_drift_is_an_input_mismatch() -> None:
    with (
        pytest.raises(ReplayMismatchError) as caught,
        ReplaySession.from_trace(golden("dinner_lisbon")),
    ):
        agent.run_dinner_agent(agent.LISBON, drifted_default=True)
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.position == 2
    assert error.reason == (
        "input differs from the recording (arguments are normalised with their defaults: a "
        "changed default counts)"
    )
    assert 'recorded: …{"city":"Lisbon","units":"metric"}…' in str(error)
    assert 'this run: …{"city":"Lisbon","units":"imperial"}…' in str(error)
    assert agent.BODY_CALLS["lookup_weather"] == 0


def test_tampered_fingerprint_rejects_the_bundle() -> None:
    with pytest.raises(BundleIntegrityError) as caught:
        ReplaySession.from_trace(golden("tampered_fingerprint"))
    error = caught.value
    assert isinstance(error, BundleError)
    assert isinstance(error, ReplayError)
    message = str(error)
    assert message.startswith(f"{golden('tampered_fingerprint')}: bundle rejected")
    assert "call-4.result: output fingerprint mismatch" in message
    assert "stepfork validate --verify-integrity" in message
    assert error.problems == [str(p) for p in error.problems]
    assert len(error.problems) == 1


def test_tampered_model_fingerprint_rejects_the_bundle() -> None:
    trace = Trace.load(golden("dinner_lisbon"))
    events = list(trace.events)
    events[0] = events[0].model_copy(update={"model_fingerprint": "0" * 64})
    with pytest.raises(BundleIntegrityError, match=r"call-1: model fingerprint mismatch"):
        ReplaySession.from_trace(trace.model_copy(update={"events": events}))


def test_missing_result() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("missing_result")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.position == 4
    assert error.reason.startswith(
        "missing result: the recorded call call-4 has no recorded result"
    )
    assert "cannot be substituted" in error.reason
    assert agent.BODY_CALLS["convert_currency"] == 0  # never falls back to running the tool


def test_extra_call_exhausts_the_recording() -> None:
    with pytest.raises(ReplayExhaustedError) as caught:
        replay_lisbon("extra_call")
    error = caught.value
    assert error.position == 8
    assert error.reason == (
        "llm scripted/planner-1 was made after the recording was used up (8 recorded calls, all "
        "consumed or skipped)"
    )
    assert error.expected is None
    assert agent.BODY_CALLS["planner-1"] == 0  # no live fallback when the recording runs out


def test_skipped_call_fails_verify_complete() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("skipped_call")
    error = caught.value
    assert type(error) is ReplayMismatchError
    assert error.reason == ("1 recorded call(s) were never made: the agent skipped recorded steps")
    assert "not reached: call-10 (tool book_table)" in str(error)


def test_legacy_bundle_without_fingerprints_replays() -> None:
    trace = Trace.load(golden("legacy_no_fingerprints"))
    assert all(getattr(e, "input_sha256", None) is None for e in trace.events)
    replay = replay_lisbon("legacy_no_fingerprints")
    assert replay.summary.ok


def test_legacy_bundle_diagnostics_say_fingerprints_were_computed() -> None:
    with (
        pytest.raises(ReplayMismatchError) as caught,
        ReplaySession.from_trace(golden("legacy_no_fingerprints")),
    ):
        agent.run_dinner_agent(agent.LISBON, drifted_default=True)
    message = str(caught.value)
    assert re.search(r"input sha256: [0-9a-f]{64} \(computed from the loaded trace\)", message)
    assert caught.value.expected is not None
    assert caught.value.expected.fingerprint_source == "computed from the loaded trace"


def test_errors_serialise_to_json() -> None:
    with pytest.raises(ReplayMismatchError) as caught:
        replay_lisbon("mismatch_input")
    data = json.loads(json.dumps(caught.value.to_dict()))
    assert data["type"] == "ReplayMismatchError"
    assert data["position"] == 4
    assert data["expected"]["event_id"] == "call-4"
    assert data["actual"]["input_preview"] == '{"amount":40.0,"source":"EUR","target":"USD"}'
    assert data["message"] == str(caught.value)


def test_golden_bundles_are_all_used() -> None:
    # every bundle the script writes is exercised above; a new one needs a test
    names = {p.stem for p in GOLDEN.glob("*.sftrace")}
    assert names == {
        "dinner_dated",
        "dinner_lisbon",
        "dinner_lisbon_async",
        "dinner_lisbon_cut",
        "dinner_porto_failure",
        "extra_call",
        "legacy_no_fingerprints",
        "mismatch_input",
        "mismatch_kind",
        "mismatch_model",
        "mismatch_order",
        "mismatch_provider",
        "mismatch_tool_name",
        "missing_result",
        "skipped_call",
        "tampered_fingerprint",
    }
