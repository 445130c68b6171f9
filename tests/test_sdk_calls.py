"""Instrumented SDK calls in one process, against the loopback fake API: what goes on their spans
(GenAI semantic conventions; message content only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_
CONTENT`` says so, built from redacted payloads), usage counted once beside other GenAI
instrumentation, retries and timeouts, per-client instrumentation, legacy ``httpx`` clients, and a
stepfork failure that leaves the SDK call alone."""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Recording, installed

import stepfork_otel
from examples.fake_llm import FakeLLM
from stepfork_otel import ReplaySession, Trace, record
from stepfork_otel import constants as k

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    stepfork_otel.instrument_openai()
    stepfork_otel.instrument_anthropic()
    with FakeLLM() as server:
        yield server
    stepfork_otel.uninstrument_openai()
    stepfork_otel.uninstrument_anthropic()
    # The tests here make short-lived SDK clients and leave them open: collect them now, in the
    # test that made them, not in whichever later test's gc.collect() finds their sockets (whose
    # ResourceWarning then fails that test under filterwarnings=error).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def boundary_spans(recording: Recording) -> list[Any]:
    return [
        s
        for s in recording.exporter.get_finished_spans()
        if s.attributes is not None and s.attributes.get(k.KIND) == k.KIND_LLM
    ]


def test_a_chat_completion_span_carries_the_conventions_and_no_content_by_default(
    recording: Recording, llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(k.ENV_CAPTURE_MESSAGE_CONTENT, raising=False)
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
    with record(tmp_path / "c.sftrace"):
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": "hi"}],
            temperature=0.3,
            max_tokens=50,
            seed=7,
            stop=["\n"],
        )
    (span,) = boundary_spans(recording)
    a = dict(span.attributes)
    assert span.name == "chat gpt-4o"
    assert span.kind.name == "CLIENT"
    assert a[k.GEN_AI_PROVIDER_NAME] == "openai"
    assert a[k.GEN_AI_OPERATION_NAME] == "chat"
    assert a[k.GEN_AI_REQUEST_MODEL] == "gpt-4o"
    assert a[k.GEN_AI_REQUEST_TEMPERATURE] == 0.3
    assert a[k.GEN_AI_REQUEST_MAX_TOKENS] == 50
    assert a[k.GEN_AI_REQUEST_SEED] == 7
    assert a[k.GEN_AI_REQUEST_STOP_SEQUENCES] == ("\n",)
    assert a[k.GEN_AI_RESPONSE_MODEL] == "gpt-4o"
    assert a[k.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")
    assert a[k.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert a[k.GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert a[k.GEN_AI_USAGE_OUTPUT_TOKENS] == 7
    for key in (k.GEN_AI_INPUT_MESSAGES, k.GEN_AI_OUTPUT_MESSAGES, k.GEN_AI_SYSTEM_INSTRUCTIONS):
        assert key not in a


def test_message_content_in_the_spec_shape_when_capture_is_on(
    recording: Recording, llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    client = anthropic.Anthropic(  # its own spans off: they would report the usage instead
        base_url=llm.anthropic_url,
        api_key="sk-ant-test",
        open_telemetry={"traces": {"enabled": False}},
    )
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}]
    with record(tmp_path / "m.sftrace"):
        client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=64,
            system="You are terse.",
            messages=[{"role": "user", "content": "weather?"}],
            tools=tools,
        )
        with client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": "hello"}],
        ) as stream:
            stream.get_final_message()
    tool_span, stream_span = boundary_spans(recording)
    a = dict(tool_span.attributes)
    assert json.loads(a[k.GEN_AI_SYSTEM_INSTRUCTIONS]) == [
        {"type": "text", "content": "You are terse."}
    ]
    assert json.loads(a[k.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "weather?"}]}
    ]
    (message,) = json.loads(a[k.GEN_AI_OUTPUT_MESSAGES])
    assert message["finish_reason"] == "tool_use"
    assert message["parts"][0]["type"] == "tool_call"
    assert message["parts"][0]["name"] == "get_weather"
    assert json.loads(a[k.GEN_AI_TOOL_DEFINITIONS])[0]["name"] == "get_weather"
    # Anthropic's input_tokens exclude cached tokens; the convention's include them
    assert a[k.GEN_AI_USAGE_INPUT_TOKENS] == 10 + 3 + 2
    assert a[k.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 3
    assert a[k.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS] == 2  # the current name (#440) ...
    assert a[k.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS] == 2  # ... and the old one, still read
    # a stream is described by the message it delivered
    s = dict(stream_span.attributes)
    assert s[k.STREAM] is True
    assert s[k.GEN_AI_RESPONSE_FINISH_REASONS] == ("end_turn",)
    assert s[k.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    (streamed,) = json.loads(s[k.GEN_AI_OUTPUT_MESSAGES])
    assert streamed["parts"] == [{"type": "text", "content": "You said: hello "}]


def test_content_attributes_are_built_from_the_redacted_payloads(
    recording: Recording, llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(k.ENV_CAPTURE_MESSAGE_CONTENT, "true")
    secret = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
    with record(tmp_path / "s.sftrace"):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"my key is {secret}"}]
        )
    (span,) = boundary_spans(recording)
    for value in span.attributes.values():
        assert secret not in str(value)
    assert "[REDACTED" in span.attributes[k.GEN_AI_INPUT_MESSAGES]


def test_an_error_status_is_a_failed_span_with_error_type(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0)
    with record(tmp_path / "e.sftrace"), pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model="rate-limited", messages=[{"role": "user", "content": "x"}]
        )
    (span,) = boundary_spans(recording)
    assert span.attributes[k.ERROR_TYPE_SEMCONV] == "429"
    assert span.status.is_ok is False


#: openai-v2 and its successor genai-openai are never installed together (their
#: opentelemetry-util-genai pins exclude each other); .ci/run runs genai-openai in a venv of its own.
OTHER_OPENAI_INSTRUMENTATIONS = {
    "openai-v2": "opentelemetry.instrumentation.openai_v2",
    "genai-openai": "opentelemetry.instrumentation.genai.openai",
    "openinference": "openinference.instrumentation.openai",
}


@pytest.mark.parametrize("instrumentation", sorted(OTHER_OPENAI_INSTRUMENTATIONS))
def test_beside_another_genai_instrumentation_usage_is_counted_once_and_replay_holds(
    instrumentation: str, recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    module = installed(OTHER_OPENAI_INSTRUMENTATIONS[instrumentation])
    other = module.OpenAIInstrumentor()
    other.instrument(tracer_provider=recording.provider)
    try:
        client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
        with record(tmp_path / "both.sftrace"):
            live = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
        spans = recording.exporter.get_finished_spans()
        (ours,) = boundary_spans(recording)
        parent = next(s for s in spans if s.context.span_id == ours.parent.span_id)
        assert k.KIND not in (parent.attributes or {})  # the other instrumentation's span
        usage_keys = (k.GEN_AI_USAGE_INPUT_TOKENS, "llm.token_count.prompt")
        counted = sum(
            int(s.attributes.get(key, 0)) for s in spans if s.attributes for key in usage_keys
        )
        assert counted == live.usage.prompt_tokens  # once, on the other instrumentation's span
        (response,) = [
            e for e in Trace.load(tmp_path / "both.sftrace").events if e.type == "llm_response"
        ]
        assert response.usage == {  # and the bundle still has it
            "input_tokens": live.usage.prompt_tokens,
            "output_tokens": live.usage.completion_tokens,
        }

        requests = len(llm.requests)
        with ReplaySession.from_trace(Trace.load(tmp_path / "both.sftrace")) as replay:
            again = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
            replay.verify_complete()
        assert again.model_dump() == live.model_dump()
        assert len(llm.requests) == requests
    finally:
        other.uninstrument()


def test_instrumenting_is_idempotent_and_undone(llm: FakeLLM) -> None:
    base = pytest.importorskip("openai._base_client")
    patched = base.SyncAPIClient.request
    stepfork_otel.instrument_openai()
    assert base.SyncAPIClient.request is patched
    stepfork_otel.uninstrument_openai()
    assert not hasattr(base.SyncAPIClient.request, "__stepfork_original__")
    stepfork_otel.instrument_openai()


def test_one_client_only(recording: Recording, llm: FakeLLM, tmp_path: Path) -> None:
    stepfork_otel.uninstrument_openai()
    mine = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
    other = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
    stepfork_otel.instrument_openai(mine)
    with record(tmp_path / "one.sftrace"):
        mine.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "a"}])
        other.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "b"}])
    assert len(boundary_spans(recording)) == 1
    stepfork_otel.uninstrument_openai(mine)
    with pytest.raises(TypeError, match="expects a openai client"):
        stepfork_otel.instrument_openai(object())


def test_a_legacy_httpx_client_is_covered_too(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    httpx = pytest.importorskip("httpx")
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", http_client=httpx.Client())
    with record(tmp_path / "legacy.sftrace"):
        live = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "old"}], stream=True
        )
        chunks = [c.model_dump() for c in live]
    requests = len(llm.requests)
    with ReplaySession.from_trace(tmp_path / "legacy.sftrace") as replay:
        again = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "old"}], stream=True
        )
        assert [c.model_dump() for c in again] == chunks
        replay.verify_complete()
    assert len(llm.requests) == requests


def test_beside_the_anthropic_sdk_own_spans_usage_is_counted_once(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    client = anthropic.Anthropic(
        base_url=llm.anthropic_url,
        api_key="sk-ant-test",
        open_telemetry={"tracer_provider": recording.provider},
    )
    with record(tmp_path / "native.sftrace"):
        live = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    spans = recording.exporter.get_finished_spans()
    (ours,) = boundary_spans(recording)
    sdk_span = next(s for s in spans if s.context.span_id == ours.parent.span_id)
    assert sdk_span.instrumentation_scope.name == "com.anthropic.sdk.python"
    counted = sum(
        int(s.attributes.get(k.GEN_AI_USAGE_OUTPUT_TOKENS, 0)) for s in spans if s.attributes
    )
    assert counted == live.usage.output_tokens
    assert k.GEN_AI_USAGE_OUTPUT_TOKENS not in ours.attributes
    (response,) = [
        e for e in Trace.load(tmp_path / "native.sftrace").events if e.type == "llm_response"
    ]
    cached = (live.usage.cache_read_input_tokens or 0) + (
        live.usage.cache_creation_input_tokens or 0
    )
    assert response.usage == {  # the convention's input tokens: Anthropic's plus the cached ones
        "input_tokens": live.usage.input_tokens + cached,
        "output_tokens": live.usage.output_tokens,
    }


def test_a_retried_call_replays_attempt_by_attempt_without_sleeping(
    recording: Recording, llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = pytest.importorskip("openai._base_client")
    slept: list[float] = []
    monkeypatch.setattr(base.time, "sleep", slept.append)  # the SDK's retry wait
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=2)
    with record(tmp_path / "retry.sftrace"):
        live = client.chat.completions.create(
            model="flaky", messages=[{"role": "user", "content": "x"}]
        )
    assert len(slept) == 1  # recording: a 429, the SDK's wait, then the answer
    trace = Trace.load(tmp_path / "retry.sftrace")
    statuses = [
        json.loads(e.output or "")["status"] for e in trace.events if e.type == "llm_response"
    ]
    assert statuses == [429, 200]

    slept.clear()
    with ReplaySession.from_trace(trace) as replay:
        again = client.chat.completions.create(
            model="flaky", messages=[{"role": "user", "content": "x"}]
        )
        replay.verify_complete()
    assert again.model_dump() == live.model_dump()
    assert slept == []  # both attempts replayed, no waiting


def test_a_timeout_replays_as_the_sdk_timeout_error(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test", max_retries=0, timeout=0.3)
    with record(tmp_path / "slow.sftrace"), pytest.raises(openai.APITimeoutError) as live:
        client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "x"}])
    with (
        ReplaySession.from_trace(tmp_path / "slow.sftrace"),
        pytest.raises(openai.APITimeoutError) as replayed,
    ):
        client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "x"}])
    assert str(replayed.value) == str(live.value)
    assert type(replayed.value.__cause__) is type(live.value.__cause__)


def test_a_changed_request_is_a_replay_mismatch_not_an_sdk_error(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    from stepfork_otel import ReplayMismatchError

    client = anthropic.Anthropic(base_url=llm.anthropic_url, api_key="sk-ant-test", max_retries=3)
    with record(tmp_path / "a.sftrace"):
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    requests = len(llm.requests)
    with (
        ReplaySession.from_trace(tmp_path / "a.sftrace") as replay,
        pytest.raises(ReplayMismatchError) as caught,
    ):
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
        )
    assert "at call 1 of this run" in str(caught.value)
    assert "max_tokens" in str(caught.value)
    assert len(replay.calls) == 1  # no SDK retry of the refused call
    assert len(llm.requests) == requests


async def test_a_legacy_httpx_async_client_is_covered_too(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    httpx = pytest.importorskip("httpx")
    client = openai.AsyncOpenAI(
        base_url=llm.openai_url, api_key="sk-test", http_client=httpx.AsyncClient()
    )
    with record(tmp_path / "legacy-async.sftrace"):
        stream = await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "old async"}], stream=True
        )
        chunks = [c.model_dump() async for c in stream]
    requests = len(llm.requests)
    with ReplaySession.from_trace(tmp_path / "legacy-async.sftrace") as replay:
        again = await client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "old async"}], stream=True
        )
        assert [c.model_dump() async for c in again] == chunks
        replay.verify_complete()
    await client.close()
    assert len(llm.requests) == requests


def test_a_failure_inside_stepfork_never_breaks_the_sdk_call(
    recording: Recording,
    llm: FakeLLM,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import stepfork_otel._internal as internal
    from stepfork_otel.recording.integrations import exchange

    monkeypatch.setattr(internal, "RAISE_INTERNAL_ERRORS", False)

    def broken(*args: Any) -> Any:
        raise RuntimeError("stepfork bug")

    monkeypatch.setattr(exchange, "request_input", broken)
    client = openai.OpenAI(base_url=llm.openai_url, api_key="sk-test")
    with record(tmp_path / "bug.sftrace"):
        reply = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "still works"}]
        )
    assert reply.choices[0].message.content == "You said: still works"
    assert "preparing an SDK call" in caplog.text
    assert boundary_spans(recording) == []  # not recorded, and said so


def test_an_azure_deployment_url_is_a_chat_call(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    client = openai.AzureOpenAI(
        azure_endpoint=f"http://127.0.0.1:{llm.port}",
        api_key="azure-test-key",
        api_version="2024-10-21",
    )
    with record(tmp_path / "azure.sftrace"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    (span,) = boundary_spans(recording)
    assert span.name == "chat gpt-4o"
    trace = Trace.load(tmp_path / "azure.sftrace")
    (request,) = [json.loads(e.input or "") for e in trace.events if e.type == "llm_request"]
    assert request["url"] == "deployments/gpt-4o/chat/completions"
    assert request["query"] == {"api-version": ["2024-10-21"]}
    assert "azure-test-key" not in (tmp_path / "azure.sftrace").read_text()


def test_the_run_span_is_an_internal_agent_span_that_names_no_provider(
    recording: Recording, llm: FakeLLM, tmp_path: Path
) -> None:
    """The run's ``invoke_agent`` span is an internal (in-process) agent span: the GenAI
    conventions set no ``gen_ai.provider.name``, ``server.*`` or ``gen_ai.agent.id`` on one
    (semantic-conventions-genai#289; stepfork used to name its first LLM call's provider
    there). The LLM call's own span names it."""
    client = anthropic.Anthropic(
        base_url=llm.anthropic_url,
        api_key="sk-ant-test",
        open_telemetry={"traces": {"enabled": False}},
    )
    with record(tmp_path / "p.sftrace", name="support"):
        client.messages.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
    (run,) = [
        s for s in recording.exporter.get_finished_spans() if s.name == "invoke_agent support"
    ]
    attributes = dict(run.attributes or {})
    assert run.kind.name == "INTERNAL"
    assert attributes[k.GEN_AI_OPERATION_NAME] == k.OP_INVOKE_AGENT
    assert attributes[k.GEN_AI_AGENT_NAME] == "support"
    unwanted = [key for key in attributes if key.startswith("server.")]
    unwanted += [key for key in (k.GEN_AI_PROVIDER_NAME, "gen_ai.agent.id") if key in attributes]
    assert unwanted == []
    (call,) = boundary_spans(recording)
    assert dict(call.attributes or {})[k.GEN_AI_PROVIDER_NAME] == "anthropic"
