"""Replay adds no secret material: a live body's exception is redacted in what the session keeps,
and every live input is redacted with the rules in force, whatever the bundle holds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from conftest import Recording

from stepfork_otel import ReplayMismatchError, ReplaySession, Trace, record, trace_tool
from stepfork_otel import constants as k
from stepfork_otel.config import CONFIG
from stepfork_otel.trace import payload as payload_module
from stepfork_otel.trace.redaction import Redactor

SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
fail_live = False


@trace_tool
def lookup(city: str) -> str:
    if fail_live:
        raise RuntimeError(f"upstream refused token {SECRET}")
    return city.upper()


def test_live_tool_exception_is_redacted_in_replayed_calls(recording: Recording) -> None:
    global fail_live
    path = recording.directory / "run.sftrace"
    with record(path):
        lookup("paris")
    fail_live = True
    try:
        with (
            ReplaySession.from_trace(path, mode="live", allow_live_tools={"lookup"}) as replay,
            pytest.raises(RuntimeError, match="upstream refused"),
        ):
            lookup("paris")
    finally:
        fail_live = False
    (call,) = replay.calls
    assert call.action == "executed"
    assert call.error is not None
    assert SECRET not in call.error
    assert "[REDACTED:github_token]" in call.error


# --- a live input identical to its recording is taken as recorded ---------------------------------


class CountingRedactor(Redactor):
    """The default rules, counting the payloads redaction looked at."""

    def redact_canonical(self, canonical: str, *, keep_order: bool = False) -> str:
        seen.append(canonical)
        return super().redact_canonical(canonical, keep_order=keep_order)


seen: list[str] = []


@trace_tool
def search(query: str, key: str = "") -> dict[str, str]:
    return {"query": query, "hit": query[::-1]}


def test_every_replayed_input_is_redacted_and_one_equal_to_its_recording_not_hashed_again(
    recording: Recording, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = recording.directory / "run.sftrace"
    with record(path):
        search("paris")
        search("rome", key=SECRET)
    trace = Trace.load(path)
    recorded = [call.input for call in trace.calls]
    assert SECRET not in "".join(str(text) for text in recorded)
    hashed: list[bytes] = []
    real_sha256 = payload_module.hashlib.sha256

    def counting_sha256(data: bytes) -> Any:
        hashed.append(data)
        return real_sha256(data)

    monkeypatch.setattr(payload_module, "hashlib", SimpleNamespace(sha256=counting_sha256))
    CONFIG.update(redactor=CountingRedactor())
    seen.clear()
    with ReplaySession.from_trace(path) as replay:
        assert search("paris") == {"query": "paris", "hit": "sirap"}
        # the secret makes the live text differ from the recording until it is redacted
        assert search("rome", key=SECRET) == {"query": "rome", "hit": "emor"}
        replay.verify_complete()
    # both inputs were redacted with the rules in force ...
    assert seen == ['{"key":"","query":"paris"}', '{"key":"' + SECRET + '","query":"rome"}']
    # ... and each, redacted, was its recorded text: its stored fingerprint was reused
    assert hashed == []
    assert [c.input for c in replay.calls] == recorded
    assert [c.input_sha256 for c in replay.calls] == [c.input_sha256 for c in trace.calls]
    replay_spans = [
        s for s in recording.exporter.get_finished_spans() if s.attributes.get(k.REPLAY_MODE)
    ]
    assert [s.attributes[k.INPUT_VALUE] for s in replay_spans] == recorded
    assert SECRET not in str([dict(s.attributes) for s in replay_spans])


def test_the_recorded_input_is_only_a_shortcut_never_a_match(recording: Recording) -> None:
    path = recording.directory / "run.sftrace"
    with record(path):
        search("paris")
    with (
        ReplaySession.from_trace(path) as replay,
        pytest.raises(ReplayMismatchError, match="input differs"),
    ):
        search("pariS")
    assert replay.calls[0].action == "rejected"


@trace_tool
def fetch(repo: str, note: str) -> str:
    return "ok"


def _replay_span_inputs(recording: Recording) -> list[Any]:
    return [
        s.attributes.get(k.INPUT_VALUE)  # an input travels once, as OpenInference's value
        for s in recording.exporter.get_finished_spans()
        if s.attributes and s.attributes.get(k.REPLAY_MODE)
    ]


def test_a_hand_built_input_holding_a_secret_is_never_taken_as_redacted(
    recording: Recording,
) -> None:
    # a legacy or hand-built bundle: the input in clear, no fingerprint -- nothing says it was
    # redacted, so a live input equal to it is redacted as usual (and then differs from it)
    path = recording.directory / "run.sftrace"
    with record(path):
        fetch("x", SECRET)
    trace = Trace.load(path)
    events = [
        e.model_copy(
            update={
                "input": e.input.replace("[REDACTED:github_token]", SECRET),
                "input_sha256": None,
            }
        )
        if getattr(e, "input", None)
        else e
        for e in trace.events
    ]
    hand_built = trace.model_copy(update={"events": events})
    recording.exporter.clear()
    with pytest.raises(ReplayMismatchError, match="input differs"), ReplaySession(hand_built):
        fetch("x", SECRET)
    assert _replay_span_inputs(recording) == ['{"note":"[REDACTED:github_token]","repo":"x"}']


def test_an_input_recorded_under_other_rules_is_redacted_under_the_current_ones(
    recording: Recording,
) -> None:
    # recorded with the default rules; a rule added since covers a value in the input: the
    # live input is redacted with it, so it no longer matches (and the value reaches no span)
    internal = "ACME-INTERNAL-7f3a9c"
    path = recording.directory / "run.sftrace"
    with record(path):
        search(internal)
    CONFIG.update(redactor=Redactor().with_rules(patterns=[("acme", r"ACME-INTERNAL-[0-9a-f]+")]))
    recording.exporter.clear()
    with pytest.raises(ReplayMismatchError, match="input differs"), ReplaySession.from_trace(path):
        search(internal)
    assert _replay_span_inputs(recording) == ['{"key":"","query":"[REDACTED:acme]"}']
