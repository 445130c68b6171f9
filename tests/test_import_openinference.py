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
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import stepfork
from conftest import installed
from otlp_receiver import running_receiver

from examples.fake_llm import FakeLLM
from stepfork_otel import Trace
from stepfork_otel import constants as k
from stepfork_otel.trace import foreign
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.models import LlmRequest, LlmResponse, payload_value
from stepfork_otel.trace.otlp import ImportReport, iter_traces_from_otlp_json
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

ROOT = Path(__file__).resolve().parent.parent
AGENT = Path(__file__).with_name("foreign_agents.py")
PROMPT = "What is the weather in Paris?"

pytest.importorskip("openai")


@pytest.fixture(autouse=True)
def _openinference() -> None:
    installed("openinference.instrumentation.openai")


def run_agent(mode: str, where: Path | str, url: str, prompt: str, out: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    for name in list(env):
        if name.startswith("OTEL_"):
            env.pop(name)
    done = subprocess.run(
        [sys.executable, str(AGENT), mode, str(where), str(out), url, prompt],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def import_spans(spans: Path, directory: Path) -> tuple[Path, str]:
    done = stepfork("import", spans, "-o", directory)
    assert done.returncode == 0, done.stdout + done.stderr
    (bundle,) = directory.glob("*.sftrace")
    return bundle, done.stdout


def traced(tmp_path: Path, *, otlp: bool = False) -> tuple[dict[str, Any], Path, str]:
    """The agent traced by OpenInference, then imported: (what it did, the bundle, the import's
    output). The fake server is stopped when this returns."""
    with FakeLLM() as llm:
        if otlp:
            spans = tmp_path / "received.jsonl"
            with running_receiver(spans) as receiver:
                live = run_agent(
                    "trace-otlp", receiver.http_endpoint, llm.openai_url, PROMPT, tmp_path / "l"
                )
        else:
            spans = tmp_path / "spans.jsonl"
            live = run_agent("trace", spans, llm.openai_url, PROMPT, tmp_path / "live.json")
        served = len(llm.requests)
        url = llm.openai_url
    assert served == 2  # a tool call, then the answer
    assert live["answer"] == "Done: sunny in Paris"
    assert live["tool_ran"] == ["Paris"]
    live["url"] = url
    bundle, output = import_spans(spans, tmp_path / "bundles")
    return live, bundle, output


@pytest.mark.parametrize("transport", ["file", "otlp"])
def test_an_openinference_traced_agent_replays_frozen_from_its_imported_spans(
    tmp_path: Path, transport: str
) -> None:
    live, bundle, output = traced(tmp_path, otlp=transport == "otlp")
    print(output)
    assert "complete -- weather-agent, 2 calls, ok" in output
    assert "1 run imported" in output
    assert "ignored" not in output

    trace = Trace.load(bundle)
    assert trace.complete
    assert trace.created_by == foreign.CREATED_BY_OPENINFERENCE
    assert trace.run.name == "weather-agent"
    requests = [e for e in trace.events if isinstance(e, LlmRequest)]
    assert [(r.provider, r.model, r.operation) for r in requests] == [
        ("openai", "gpt-4o", "chat")
    ] * 2
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
    assert "NOTAREALKEY" not in bundle.read_text()

    # a fresh process, the server stopped: nothing can answer but the bundle
    replay = run_agent("replay", bundle, live["url"], PROMPT, tmp_path / "replay.json")
    assert "error" not in replay, replay
    assert replay["answer"] == live["answer"]
    assert replay["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    assert replay["tool_ran"] == ["Paris"]  # not traced, so it ran (plain Python)


def test_replay_reaches_no_server(tmp_path: Path) -> None:
    """Pointed at a server that is up, the frozen replay sends it nothing (0 requests)."""
    live, bundle, _ = traced(tmp_path)
    with FakeLLM() as sentinel:
        replay = run_agent("replay", bundle, sentinel.openai_url, PROMPT, tmp_path / "r.json")
        assert len(sentinel.requests) == 0
    assert replay["answer"] == live["answer"]


def test_a_different_prompt_diverges_at_the_first_call(tmp_path: Path) -> None:
    live, bundle, _ = traced(tmp_path)
    changed = run_agent(
        "replay", bundle, live["url"], "What is the weather in Rome?", tmp_path / "d.json"
    )
    print(changed["error"][1])
    name, message = changed["error"]
    assert name == "ReplayMismatchError"
    assert "call 1" in message or "call-1" in message
    assert "Rome" in message
    assert "Paris" in message
    assert changed["calls"][0] == ["llm", "rejected"]
    assert "answer" not in changed


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


def test_streamed_and_failed_calls_have_no_result_and_are_named() -> None:
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
    assert [n.split(": ", 1)[1].split(";")[0] for n in adopted.notes] == [
        "a streamed call",
        "the call failed",
    ]
    for record in adopted.records[1:]:
        assert k.STATUS not in record.attributes
        assert k.OUTPUT not in record.payloads


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
