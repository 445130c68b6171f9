"""``instrument_openai()`` beside another instrumentation of the same SDK, instrumented before or
after it: openinference (which wraps ``OpenAI.request`` with wrapt) and the OpenTelemetry GenAI
instrumentation (``opentelemetry-instrumentation-openai-v2``, which wraps the resource methods).

Both orders must give the same spans from both instrumentations, the bundle must replay, undoing
one must leave the other working, and an instrumentation that fails beside stepfork must be
said on stepfork's logger rather than vanish (openinference, instrumented first, lost every LLM
span: stepfork called its wrapt wrapper unbound, and openinference read the client as the
method's first argument -- ``AttributeError: 'OpenAI' object has no attribute '__name__'`` --
and logged it on a logger with only a ``NullHandler``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Recording, installed

import stepfork_otel
from examples.fake_llm import FakeLLM
from stepfork_otel import ReplaySession, Trace, record
from stepfork_otel import constants as k

openai = pytest.importorskip("openai")

DOC = ROOT / "docs" / "integrations.md"
"""Shows the two warnings as they are printed: each test that makes one finds it there."""

INSTRUMENTATIONS = {
    "openinference": "openinference.instrumentation.openai",
    "openai-v2": "opentelemetry.instrumentation.openai_v2",
    # openai-v2's successor under its new name (opentelemetry-instrumentation-genai-openai): it
    # needs opentelemetry-util-genai >= 1.3, which openai-v2 cannot import, so the two are never
    # installed together -- .ci/run covers it in a venv of its own (docs/integrations.md).
    "genai-openai": "opentelemetry.instrumentation.genai.openai",
}


@pytest.fixture(autouse=True)
def _nothing_instrumented() -> Iterator[None]:
    """Each test instruments in its own order; whatever a foreign instrumentation leaves on the
    client classes when undone (openinference sets ``OpenAI.request`` back as an attribute of
    the subclass) is taken off again, so later tests see the SDK as installed."""
    stepfork_otel.uninstrument_openai()
    yield
    stepfork_otel.uninstrument_openai()
    base = openai._base_client
    for cls, root in (
        (openai.OpenAI, base.SyncAPIClient),
        (openai.AsyncOpenAI, base.AsyncAPIClient),
    ):
        if vars(cls).get("request") is vars(root)["request"]:
            delattr(cls, "request")


def other_instrumentor(name: str) -> Any:
    return installed(INSTRUMENTATIONS[name]).OpenAIInstrumentor()


def instrumented(
    name: str, stepfork_first: bool, recording: Recording
) -> tuple[Any, Callable[[], None]]:
    """The other instrumentor, instrumented before or after stepfork; and how to undo both."""
    other = other_instrumentor(name)
    if stepfork_first:
        stepfork_otel.instrument_openai()
    other.instrument(tracer_provider=recording.provider)
    if not stepfork_first:
        stepfork_otel.instrument_openai()

    def undo() -> None:  # the reverse order
        if stepfork_first:
            other.uninstrument()
            stepfork_otel.uninstrument_openai()
        else:
            stepfork_otel.uninstrument_openai()
            other.uninstrument()

    return other, undo


def agent(url: str) -> list[Any]:
    """A chat call, a stream read to its end, and an async call."""
    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    out: list[Any] = []
    ask = [{"role": "user", "content": "hi"}]
    out.append(client.chat.completions.create(model="gpt-4o", messages=ask).model_dump())
    stream = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "a stream"}], stream=True
    )
    out.append([chunk.model_dump() for chunk in stream])

    async def run() -> Any:
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        answer = await client.chat.completions.create(model="gpt-4o", messages=ask)
        await client.close()
        return answer.model_dump()

    out.append(asyncio.run(run()))
    client.close()
    return out


SERVER_PORT = "<the fake server's port>"
DURATION = "<a duration>"
DURATIONS = ("gen_ai.response.time_to_first_chunk",)
"""Attributes that time the call (genai-openai's streams): a duration differs in every run."""


def spans_seen(recording: Recording, port: int) -> list[tuple[Any, ...]]:
    """Every span as ``(scope, name, kind, parent's scope and name, attributes)``, in end order;
    ``server.port`` (genai-openai sets it), when it is the fake server's ``port``, as
    :data:`SERVER_PORT` -- each order is recorded against a server of its own --, and a
    non-negative duration of :data:`DURATIONS` as :data:`DURATION`."""
    spans = recording.exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    seen = []
    for span in spans:
        parent = by_id.get(span.parent.span_id) if span.parent else None
        attributes = dict(span.attributes or {})
        if attributes.get("server.port") == port:
            attributes["server.port"] = SERVER_PORT
        for key in DURATIONS:
            if isinstance(attributes.get(key), float) and attributes[key] >= 0:
                attributes[key] = DURATION
        seen.append(
            (
                span.instrumentation_scope.name,
                span.name,
                span.kind.name,
                None if parent is None else (parent.instrumentation_scope.name, parent.name),
                attributes,
            )
        )
    return seen


def recorded_in_order(
    name: str, stepfork_first: bool, recording: Recording, tmp_path: Path
) -> tuple[list[tuple[Any, ...]], Path, list[Any], int]:
    _, undo = instrumented(name, stepfork_first, recording)
    bundle = tmp_path / f"{name}-{'after' if stepfork_first else 'before'}.sftrace"
    try:
        with FakeLLM() as llm:  # a fresh server: the same response ids in both orders
            with record(bundle):
                answers = agent(llm.openai_url)
            served = len(llm.requests)
        spans = spans_seen(recording, llm.port)
        recording.exporter.clear()
        with ReplaySession.from_trace(bundle) as replay:  # the server is gone
            assert agent(llm.openai_url) == answers
            replay.verify_complete()
        assert {call.action for call in replay.calls} == {"substituted"}
    finally:
        undo()
    return spans, bundle, answers, served


@pytest.mark.parametrize("name", sorted(INSTRUMENTATIONS))
def test_either_order_gives_the_same_spans_from_both_and_replays(
    name: str, recording: Recording, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    after, bundle_after, answers, served = recorded_in_order(name, True, recording, tmp_path)
    recording.exporter.clear()
    before, bundle_before, answers_before, _ = recorded_in_order(name, False, recording, tmp_path)
    assert answers_before == answers
    assert served == 3

    def summary(spans: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return [span[:4] for span in spans]

    ours = [s for s in after if s[0] == "stepfork_otel" and s[4].get(k.KIND) == k.KIND_LLM]
    theirs = [s for s in after if s[0] != "stepfork_otel"]
    assert len(ours) == len(theirs) == 3  # one span each per call
    assert all(span[3] is not None and span[3][0] != "stepfork_otel" for span in ours)
    assert summary(before) == summary(after)
    assert [span[4] for span in before] == [span[4] for span in after]  # attributes too
    payloads = []
    for bundle in (bundle_after, bundle_before):
        trace = Trace.load(bundle)
        assert trace.complete
        payloads.append([(e.type, getattr(e, "input", None) or e.output) for e in trace.events])
    assert payloads[0] == payloads[1]
    assert len(payloads[0]) == 6  # three calls, three responses
    assert [r.getMessage() for r in caplog.records if r.name == "stepfork_otel"] == []


@pytest.mark.parametrize("stepfork_first", [True, False], ids=["after", "before"])
def test_an_instrumentation_failing_beside_stepfork_is_said_on_its_logger(
    stepfork_first: bool,
    recording: Recording,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """openinference catches its own failures and logs them where nobody looks; stepfork,
    which wraps the same method, says them (once) on its own logger."""
    request = installed("openinference.instrumentation.openai._request")

    def parse_nothing(args: Any) -> Any:
        raise ValueError("no request arguments today")

    monkeypatch.setattr(request, "_parse_request_args", parse_nothing)
    caplog.set_level(logging.WARNING)
    _, undo = instrumented("openinference", stepfork_first, recording)
    bundle = tmp_path / "failing.sftrace"
    try:
        with FakeLLM() as llm, record(bundle):
            client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
            for text in ("one", "two"):
                client.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": text}]
                )
            client.close()
    finally:
        undo()
    said = [r.getMessage() for r in caplog.records if r.name == "stepfork_otel"]
    assert len(said) == 1, said  # once, not per call
    assert "openinference.instrumentation.openai" in said[0]
    assert "Failed to parse request args" in said[0]
    assert "ValueError: no request arguments today" in said[0]
    assert said[0] in DOC.read_text(encoding="utf-8")
    scopes = {s.instrumentation_scope.name for s in recording.exporter.get_finished_spans()}
    assert scopes == {"stepfork_otel"}  # openinference's spans are indeed missing
    trace = Trace.load(bundle)  # and stepfork's own recording is whole
    assert trace.complete
    assert len(trace.calls) == 2


def one_call(url: str) -> None:
    client = openai.OpenAI(base_url=url, api_key="sk-test")
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    client.close()


def scopes_of_calls(recording: Recording) -> list[str]:
    names = [s.instrumentation_scope.name for s in recording.exporter.get_finished_spans()]
    recording.exporter.clear()
    return names


def test_undoing_stepfork_leaves_an_instrumentation_made_after_it_working(
    recording: Recording,
) -> None:
    """openinference wrapped stepfork's wrapper; undoing stepfork took openinference's wrapper
    off too (stepfork read its own mark through openinference's proxy)."""
    other = other_instrumentor("openinference")
    stepfork_otel.instrument_openai()
    other.instrument(tracer_provider=recording.provider)
    try:
        with FakeLLM() as llm:
            one_call(llm.openai_url)
            assert sorted(scopes_of_calls(recording)) == [
                "openinference.instrumentation.openai",
                "stepfork_otel",
            ]
            stepfork_otel.uninstrument_openai()
            one_call(llm.openai_url)
            assert scopes_of_calls(recording) == ["openinference.instrumentation.openai"]
    finally:
        other.uninstrument()


def test_an_instrumentation_made_before_and_undone_after_stepfork_is_said_and_mended(
    recording: Recording, caplog: pytest.LogCaptureFixture
) -> None:
    """openinference, undone, puts back the method it saved before stepfork patched anything:
    the SDK's calls would silently stop being recorded. stepfork says so, and instrumenting
    again mends it."""
    caplog.set_level(logging.WARNING)
    other = other_instrumentor("openinference")
    other.instrument(tracer_provider=recording.provider)
    stepfork_otel.instrument_openai()
    other.uninstrument()
    with FakeLLM() as llm:
        one_call(llm.openai_url)
        assert scopes_of_calls(recording) == []
        said = [r.getMessage() for r in caplog.records if r.name == "stepfork_otel"]
        assert len(said) == 1
        assert "not recorded" in said[0]
        assert "call instrument_openai() again" in said[0]
        assert said[0] in DOC.read_text(encoding="utf-8")
        stepfork_otel.instrument_openai()
        one_call(llm.openai_url)
        assert scopes_of_calls(recording) == ["stepfork_otel"]
