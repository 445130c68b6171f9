"""Replaying a run that only ``openinference-instrumentation-openai`` traced (issue 23, first
slice): the spans a team already has become a bundle through ``stepfork import``, and the agent
replays frozen from it through ``instrument_openai()``.

Every step runs as a user runs it: the agent in its own process traced ONLY by OpenInference
(spans written by ``OtlpJsonFileExporter``, or sent over real OTLP/HTTP to the loopback
receiver), the ``stepfork import`` command in a subprocess, the replay in a fresh process with the
fake server stopped. ``tests/foreign_agents.py`` is the agent; its tool is plain Python (no
OpenInference SDK instrumentation writes tool spans), so it runs live in replay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import stepfork
from conftest import installed
from foreign_support import (
    PROMPT,
    Traced,
    docs_block,
    normalised,
    replay,
    replay_sending_nothing,
    traced,
)

import stepfork_otel
from examples.fake_llm import FakeLLM
from stepfork_otel import Trace
from stepfork_otel import constants as k
from stepfork_otel.trace import foreign
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.models import LlmRequest, LlmResponse, payload_value
from stepfork_otel.trace.otlp import ImportReport, iter_traces_from_otlp_json
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

pytest.importorskip("openai")


@pytest.fixture(autouse=True)
def _openinference() -> None:
    installed("openinference.instrumentation.openai")


@pytest.fixture(scope="module")
def by_file(tmp_path_factory: pytest.TempPathFactory) -> Traced:
    return traced(tmp_path_factory.mktemp("openinference"), "openinference")


@pytest.mark.parametrize("transport", ["file", "otlp"])
def test_an_openinference_traced_agent_replays_frozen_from_its_imported_spans(
    by_file: Traced, tmp_path: Path, transport: str
) -> None:
    run = by_file if transport == "file" else traced(tmp_path, "openinference", otlp=True)
    print(run.imported)
    assert "complete -- weather-agent, 2 calls, ok" in run.imported
    assert "1 run imported" in run.imported
    assert "ignored" not in run.imported

    trace = Trace.load(run.bundle)
    assert trace.complete
    assert trace.created_by == foreign.created_by([foreign.OPENINFERENCE])
    assert trace.run.name == "weather-agent"
    requests = [e for e in trace.events if isinstance(e, LlmRequest)]
    assert [(r.provider, r.model, r.operation) for r in requests] == [
        ("openai", "gpt-4o", "chat")
    ] * 2
    assert [r.fidelity for r in requests] == ["exact"] * 2
    first = payload_value(requests[0].input)
    assert first["method"] == "POST"
    assert first["url"] == "chat/completions"
    assert first["body"]["messages"][1] == {"role": "user", "content": PROMPT}
    assert first["body"]["tools"][0]["function"]["name"] == "get_weather"
    responses = [e for e in trace.events if isinstance(e, LlmResponse)]
    assert responses[0].usage == {"input_tokens": 11, "output_tokens": 7}
    answer = payload_value(responses[1].output)
    assert answer["status"] == 200
    assert answer["headers"] == {"content-type": "application/json"}
    assert answer["body"]["choices"][0]["message"]["content"] == "Done: sunny in Paris"
    # the api key the agent sent is nowhere (OpenInference does not record headers)
    assert "NOTAREALKEY" not in run.bundle.read_text()
    assert trace.run.untraced_tools == ["get_weather"]

    # a fresh process, the server stopped: nothing can answer but the bundle
    replayed = replay("weather", run.bundle, run.live["url"], tmp_path / "replay.json")
    assert "error" not in replayed, replayed
    assert replayed["answer"] == run.live["answer"]
    assert replayed["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    assert replayed["tool_ran"] == ["Paris"]  # not traced, so it ran (plain Python)


def test_replay_reaches_no_server(by_file: Traced, tmp_path: Path) -> None:
    """Pointed at a server that is up, the frozen replay sends it nothing (0 requests)."""
    replayed = replay_sending_nothing("weather", by_file.bundle, tmp_path / "r")
    assert replayed["answer"] == by_file.live["answer"]


def diverged(by_file: Traced, tmp_path: Path) -> dict[str, Any]:
    url = by_file.live["url"]
    return replay("weather", by_file.bundle, url, tmp_path / "d", "What is the weather in Rome?")


def test_a_different_prompt_diverges_at_the_first_call(by_file: Traced, tmp_path: Path) -> None:
    changed = diverged(by_file, tmp_path)
    print(changed["error"][1])
    name, message = changed["error"]
    assert name == "ReplayMismatchError"
    assert message.startswith("at call 1 of this run: input differs from the recording")
    assert "What is the weather in Paris?" in message
    assert "What is the weather in Rome?" in message
    assert changed["calls"][0] == ["llm", "rejected"]
    assert "answer" not in changed


def test_a_streaming_agent_replays_from_the_merged_completion(tmp_path: Path) -> None:
    """OpenInference merges a stream into one completion-shaped object: the replay cuts it into
    the SDK's stream again (text, tool-call deltas, usage) and the report says so."""
    run = traced(tmp_path / "trace", "openinference", "stream")
    replayed = replay("stream", run.bundle, run.live["url"], tmp_path / "replay.json")
    assert "error" not in replayed, replayed
    assert replayed["answer"] == run.live["answer"]
    assert replayed["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    assert all(
        any(note.startswith("stream rebuilt from the recorded final message") for note in notes)
        for notes in replayed["notes"]
    )


def test_a_trace_whose_root_is_the_llm_span_still_makes_a_run(
    by_file: Traced, tmp_path: Path
) -> None:
    """An LLM span with no parent (the agent opened no span of its own): the bundle still says
    where it came from and which tools ran untraced -- the run is made around the call."""
    batches = [json.loads(line) for line in by_file.spans.read_text().splitlines() if line]
    found = [
        (resource, scope, otlp_span)
        for batch in batches
        for resource in batch["resourceSpans"]
        for scope in resource["scopeSpans"]
        for otlp_span in scope["spans"]
        if otlp_span["name"] == "ChatCompletion"
    ]
    resource, scope, lone = min(found, key=lambda f: int(f[2]["startTimeUnixNano"]))
    lone = {key: value for key, value in lone.items() if key != "parentSpanId"}
    alone = {"resourceSpans": [dict(resource, scopeSpans=[dict(scope, spans=[lone])])]}
    path = tmp_path / "lone.jsonl"
    path.write_text(json.dumps(alone) + "\n")

    (trace,) = iter_traces_from_otlp_json(path)
    assert trace.created_by == foreign.created_by([foreign.OPENINFERENCE])
    assert trace.run.name == "ChatCompletion"
    assert trace.run.untraced_tools == ["get_weather"]
    (call,) = trace.calls
    assert (call.span_id, call.fidelity) == (lone["spanId"], "exact")
    assert trace.outcome_of(call) is not None


# --- the docs' pasted outputs are this test's -----------------------------------------------------


def test_the_outputs_pasted_in_the_docs_are_what_the_commands_print(
    by_file: Traced, tmp_path: Path
) -> None:
    imported = "$ stepfork import spans.jsonl -o bundles\n" + by_file.imported
    assert normalised(docs_block("openinference-import")) == normalised(imported)
    shown = stepfork(
        "show",
        by_file.bundle.relative_to(by_file.bundle.parent.parent),
        cwd=by_file.bundle.parent.parent,
    )
    assert shown.returncode == 0, shown.stderr
    assert normalised(docs_block("openinference-show")) == normalised(
        "$ stepfork show bundles/*.sftrace\n" + shown.stdout
    )
    name, message = diverged(by_file, tmp_path)["error"]
    assert normalised(docs_block("openinference-diverged")) == normalised(f"{name}: {message}\n")


# --- what the spans could not hold ----------------------------------------------------------------


def oi_span(span_id: str, parent: str | None, name: str, start: int, **attrs: Any) -> SpanRecord:
    return SpanRecord(
        trace_id="ab" * 16,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=start + 10,
        status="ok" if name != "root" else "unset",
        attributes=attrs,
    )


CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
REPLY = {"id": "c1", "object": "chat.completion", "model": "gpt-4o", "choices": []}


def llm_attrs(**extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        k.OPENINFERENCE_SPAN_KIND: "LLM",
        "llm.system": "openai",
        "input.value": json.dumps(CHAT),
        "input.mime_type": "application/json",
        "output.value": json.dumps(REPLY),
        "output.mime_type": "application/json",
    }
    attrs.update(extra)
    return {key: value for key, value in attrs.items() if value is not None}


def test_a_call_without_input_value_is_imported_with_its_input_missing_and_named(
    tmp_path: Path,
) -> None:
    """The SDK's attribute count limit evicted ``input.value`` (and ``llm.system``): the call is
    still recognised by its name, recorded without an input, and the import says so."""
    spans = [
        oi_span("1" * 16, None, "root", 0),
        oi_span("2" * 16, "1" * 16, "ChatCompletion", 1, **llm_attrs()),
        oi_span(
            "3" * 16,
            "1" * 16,
            "ChatCompletion",
            2,
            **llm_attrs(**{"input.value": None, "llm.system": None}),
            **{k.OI_INVOCATION_PARAMETERS: '{"model": "gpt-4o-mini"}'},
        ),
    ]
    path = tmp_path / "spans.jsonl"
    path.write_text(
        json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [otlp(s) for s in spans]}]}]})
    )
    report = ImportReport()
    (trace,) = iter_traces_from_otlp_json(path, report=report)
    first, second = trace.calls
    assert first.input is not None
    assert second.input is None
    assert isinstance(second, LlmRequest)
    assert second.model == "gpt-4o-mini"
    (problem,) = report.problems
    assert "call 2 of the trace" in problem.message
    assert "input missing" in problem.message
    assert "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT" in problem.message


def test_streamed_calls_keep_the_merged_completion_and_failed_calls_have_no_result() -> None:
    """A streamed call's merged completion is its result (replay cuts it into a stream again);
    a failed call keeps no response, and is named."""
    stream = dict(CHAT, stream=True)
    spans = [
        oi_span("1" * 16, None, "root", 0),
        oi_span(
            "2" * 16,
            "1" * 16,
            "ChatCompletion",
            1,
            **llm_attrs(**{"input.value": json.dumps(stream)}),
        ),
        SpanRecord(
            trace_id="ab" * 16,
            span_id="3" * 16,
            parent_span_id="1" * 16,
            name="ChatCompletion",
            start_time_unix_nano=2,
            end_time_unix_nano=3,
            status="error",
            attributes=llm_attrs(**{"output.value": None}),
        ),
    ]
    adopted = foreign.adopt(spans, DEFAULT_REDACTOR)
    assert adopted is not None
    assert [n.split(": ", 1)[1].split(";")[0] for n in adopted.notes] == ["the call failed"]
    streamed, failed = adopted.records[1:]
    assert streamed.attributes[k.STATUS] == k.STATUS_OK
    assert payload_value(streamed.payloads[k.OUTPUT].text)["body"] == REPLY
    assert k.STATUS not in failed.attributes
    assert k.OUTPUT not in failed.payloads


def test_spans_of_other_instrumentations_and_stepfork_spans_are_left_alone() -> None:
    anthropic = oi_span("2" * 16, None, "Message", 1, **llm_attrs(**{"llm.system": "anthropic"}))
    assert foreign.adopt([anthropic], DEFAULT_REDACTOR) is None
    plain = oi_span("3" * 16, None, "GET /", 1)
    assert foreign.adopt([plain], DEFAULT_REDACTOR) is None


def test_secrets_in_the_imported_request_are_redacted() -> None:
    secret = "sk-proj-" + "Q9w8E7r6T5y4U3i2O1p0A9s8D7f6G5h4"
    body = dict(CHAT, messages=[{"role": "user", "content": f"my key is {secret}"}])
    spans = [
        oi_span("1" * 16, None, f"root {secret}", 0),
        oi_span(
            "2" * 16,
            "1" * 16,
            "ChatCompletion",
            1,
            **llm_attrs(**{"input.value": json.dumps(body)}),
        ),
    ]
    adopted = foreign.adopt(spans, DEFAULT_REDACTOR)
    assert adopted is not None
    for record in adopted.records:
        assert secret not in str(record.attributes)
        assert all(secret not in p.text for p in record.payloads.values())


# --- helpers: SpanRecords as OTLP JSON --------------------------------------------------------------


def otlp(span: SpanRecord) -> dict[str, Any]:
    return {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        **({"parentSpanId": span.parent_span_id} if span.parent_span_id else {}),
        "name": span.name,
        "startTimeUnixNano": str(span.start_time_unix_nano),
        "endTimeUnixNano": str(span.end_time_unix_nano),
        "status": {"code": {"unset": 0, "ok": 1, "error": 2}[span.status]},
        "attributes": [
            {"key": key, "value": {"stringValue": value}} for key, value in span.attributes.items()
        ],
    }


def conversation() -> list[dict[str, str]]:
    """70 exchanges, then a question: 141 messages."""
    messages: list[dict[str, str]] = []
    for n in range(70):
        messages += [
            {"role": "user", "content": f"question {n}"},
            {"role": "assistant", "content": f"answer {n}"},
        ]
    messages.append({"role": "user", "content": "and now?"})
    return messages


def long_conversation(
    url: str, spans: Path, attribute_limit: int | None = None, hide_messages: bool = False
) -> None:
    """A Responses call, then a chat completion of 70 exchanges, traced by OpenInference in
    this process (the SDK's own attribute count limit, or ``attribute_limit``; OpenInference's
    per-message attributes, or not with ``hide_messages``)."""
    import openai
    from openinference.instrumentation import TraceConfig
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter

    instrumentation = installed("openinference.instrumentation.openai").OpenAIInstrumentor()
    limits = SpanLimits(max_span_attributes=attribute_limit) if attribute_limit else None
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonFileExporter(spans)))
    config = TraceConfig(hide_input_messages=hide_messages, hide_output_messages=hide_messages)
    instrumentation.instrument(tracer_provider=provider, config=config)
    try:
        with (
            openai.OpenAI(base_url=url, api_key="sk-test") as client,
            provider.get_tracer("chat-app").start_as_current_span("long-chat"),
        ):
            client.responses.create(model="gpt-4o", input="hello", instructions="be brief")
            client.chat.completions.create(model="gpt-4o", messages=conversation())
    finally:
        instrumentation.uninstrument()
        provider.shutdown()


def replay_long(bundle: Path, messages: list[dict[str, str]]) -> str:
    """The long conversation replayed frozen in this process (nothing listens at the URL)."""
    import openai

    import stepfork_otel
    from stepfork_otel import ReplaySession

    stepfork_otel.instrument_openai()
    try:
        with (
            ReplaySession.from_trace(bundle) as session,
            openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test") as client,
        ):
            client.responses.create(model="gpt-4o", input="hello", instructions="be brief")
            reply = client.chat.completions.create(model="gpt-4o", messages=messages)
            session.verify_complete()
        return reply.choices[0].message.content or ""
    finally:
        stepfork_otel.uninstrument_openai()


def test_a_long_conversation_loses_input_value_to_the_attribute_limit_and_the_import_says_so(
    tmp_path: Path,
) -> None:
    """The attribute count limit evicts ``input.value``, ``output.value`` and the first messages'
    attributes: the call keeps the last messages (fidelity ``truncated``, compared on those) and
    a response rebuilt from the output message attributes -- and replays."""
    with FakeLLM() as llm:
        long_conversation(llm.openai_url, tmp_path / "default.jsonl")
        long_conversation(llm.openai_url, tmp_path / "raised.jsonl", attribute_limit=1000)
        long_conversation(llm.openai_url, tmp_path / "hidden.jsonl", hide_messages=True)

    done = stepfork("import", "default.jsonl", "-o", "bundles", cwd=tmp_path)
    print(done.stdout)
    assert done.returncode == 1
    assert "complete -- long-chat, 2 calls, ok" in done.stdout
    assert "missing" not in done.stdout.split("problems in the input")[0]
    assert (
        "(ChatCompletion, call 2 of the trace): input.value is not on the span "
        "(the SDK's attribute count limit evicts the oldest attributes first: raise "
        "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT); the last 60 messages, from its per-message "
        "attributes, are compared (fidelity truncated)" in done.stdout
    )
    assert "the response is rebuilt from its per-message attributes" in done.stdout
    (bundle,) = (tmp_path / "bundles").glob("*.sftrace")
    first, second = Trace.load(bundle).calls
    assert payload_value(first.input)["url"] == "responses"
    assert (first.fidelity, second.fidelity) == ("exact", "truncated")
    assert payload_value(second.input)["tail"] == 60
    assert normalised(docs_block("openinference-limit")) == normalised(
        "$ stepfork import spans.jsonl -o bundles\n" + done.stdout
    )

    assert replay_long(bundle, conversation()) == "You said: and now?"
    earlier = conversation()
    earlier[0]["content"] = "a question the span lost"
    assert replay_long(bundle, earlier) == "You said: and now?"  # not compared, and said
    later = conversation()
    later[-2]["content"] = "another answer"
    with pytest.raises(stepfork_otel.ReplayMismatchError, match=r"messages\[58\]\.parts"):
        replay_long(bundle, later)

    for name in ("raised", "hidden"):  # what the docs advise
        kept = stepfork("import", f"{name}.jsonl", "-o", name, cwd=tmp_path)
        assert kept.returncode == 0, kept.stdout
        (bundle,) = (tmp_path / name).glob("*.sftrace")
        second = Trace.load(bundle).calls[1]
        assert len(payload_value(second.input)["body"]["messages"]) == 141


def test_hostile_bodies_are_named_per_call_and_the_rest_of_the_trace_imports() -> None:
    deep = '{"model": "gpt-4o", "messages": ' + "[" * 5000 + "]" * 5000 + "}"
    spans = [
        oi_span("1" * 16, None, "root", 0),
        oi_span("2" * 16, "1" * 16, "ChatCompletion", 1, **llm_attrs(**{"input.value": deep})),
        oi_span("3" * 16, "1" * 16, "ChatCompletion", 2, **llm_attrs(**{"output.value": "[1"})),
        oi_span("4" * 16, "1" * 16, "ChatCompletion", 3, **llm_attrs()),
    ]
    adopted = foreign.adopt(spans, DEFAULT_REDACTOR)
    assert adopted is not None
    assert [note.split(" -- ")[0].split(": ", 1)[1] for note in adopted.notes] == [
        "input missing",
        "result missing",
    ]
    trace = spans_to_trace(adopted.records, redactor=DEFAULT_REDACTOR, until_root_ends=False)
    assert [call.input is not None for call in trace.calls] == [False, True, True]
    assert [trace.outcome_of(call) is not None for call in trace.calls] == [True, False, True]
