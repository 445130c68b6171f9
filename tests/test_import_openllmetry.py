"""Replaying runs that OpenLLMetry traced (``opentelemetry-instrumentation-openai``, traceloop).

OpenLLMetry 0.62.4 installs beside the pinned OpenTelemetry (API/SDK 1.45.2, instrumentation
0.66b2) in a separate virtualenv, but it is not a dependency of the project: its spans were
recorded once, with the real instrumentation, into the fixtures here, and the main suite imports
and replays those. To record them again::

    python3 -m venv /tmp/venv-tl
    /tmp/venv-tl/bin/pip install -e . opentelemetry-instrumentation-openai openai
    # with examples/fake_llm.py serving on URL:
    PYTHONPATH=.:tests /tmp/venv-tl/bin/python tests/foreign_agents.py trace openllmetry \
        weather tests/fixtures/openllmetry/weather.jsonl /tmp/live.json URL \
        "What is the weather in Paris?"        # and "stream" -> stream.jsonl

Its 0.62 release writes the GenAI semantic conventions (``gen_ai.input.messages`` parts, the
tool definitions, ``tool_call`` as a finish reason). Older releases flattened the messages into
``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*``: those are tested from spans built with the
attribute names of its source, including a conversation whose first prompts the attribute count
limit evicted (fidelity ``truncated``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_support import stepfork
from foreign_support import ANSWERS, PROMPT, replay

from stepfork_otel import Trace
from stepfork_otel import constants as k
from stepfork_otel.trace import foreign
from stepfork_otel.trace.builder import spans_to_trace
from stepfork_otel.trace.canonical import canonical_json
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.foreign_request import live_form
from stepfork_otel.trace.models import LlmRequest, LlmResponse, payload_value
from stepfork_otel.trace.redaction import DEFAULT_REDACTOR

pytest.importorskip("openai")

FIXTURES = Path(__file__).with_name("fixtures") / "openllmetry"
URL = "http://127.0.0.1:9/v1"  # nothing listens there: a replay that sent a request would fail


def imported(tmp_path: Path, agent: str, edit: Any = None) -> tuple[Path, str]:
    spans = tmp_path / "spans.jsonl"
    shutil.copy(FIXTURES / f"{agent}.jsonl", spans)
    if edit is not None:
        spans.write_text(edit(spans.read_text()))
    done = stepfork("import", "spans.jsonl", "-o", "bundles", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (bundle,) = (tmp_path / "bundles").glob("*.sftrace")
    return bundle, done.stdout


@pytest.mark.parametrize("agent", ["weather", "stream"])
def test_the_recorded_openllmetry_spans_replay_frozen(tmp_path: Path, agent: str) -> None:
    bundle, printed = imported(tmp_path, agent)
    assert "complete -- weather-agent, 2 calls, ok" in printed
    trace = Trace.load(bundle)
    assert trace.created_by == foreign.created_by([foreign.OPENLLMETRY])
    requests = [e for e in trace.events if isinstance(e, LlmRequest)]
    assert [r.fidelity for r in requests] == ["messages-only"] * 2
    assert "tools" in payload_value(requests[0].input)  # it records the definitions
    responses = [e for e in trace.events if isinstance(e, LlmResponse)]
    first = payload_value(responses[0].output)["body"]["choices"][0]
    assert first["finish_reason"] == "tool_calls"  # its "tool_call", mapped back to OpenAI's word

    replayed = replay(agent, bundle, URL, tmp_path / "replay.json")
    assert "error" not in replayed, replayed
    assert replayed["answer"] == ANSWERS[agent]
    assert replayed["calls"] == [["llm", "substituted"], ["llm", "substituted"]]
    rebuilt = "stream rebuilt from the recorded final message"
    assert any(rebuilt in n for notes in replayed["notes"] for n in notes) == (agent == "stream")


def test_headers_it_writes_verbatim_never_reach_the_bundle(tmp_path: Path) -> None:
    """OpenLLMetry writes the request's extra headers as ``gen_ai.headers``, a secret included:
    the importer copies no attribute it does not read, and redacts what it reads."""
    secret = "sk-proj-" + "Q9w8E7r6T5y4U3i2O1p0A9s8D7f6G5h4"

    def leak(text: str) -> str:
        lines = []
        for line in text.splitlines():
            data = json.loads(line)
            for rs in data["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        span.setdefault("attributes", []).append(
                            {
                                "key": "gen_ai.headers",
                                "value": {"stringValue": f"{{'Authorization': 'Bearer {secret}'}}"},
                            }
                        )
                        for attribute in span["attributes"]:
                            if attribute["key"] == "gen_ai.input.messages":
                                value = attribute["value"]["stringValue"]
                                attribute["value"]["stringValue"] = value.replace(
                                    "Answer with the weather.",
                                    f"Answer with the weather. key={secret}",
                                )
            lines.append(json.dumps(data))
        return "\n".join(lines) + "\n"

    bundle, _ = imported(tmp_path, "weather", leak)
    text = bundle.read_text()
    assert secret not in text
    assert "Answer with the weather. key=" in text  # the message is there, its secret is not


# --- older releases: flattened messages -----------------------------------------------------------


def flattened_span(span_id: str, start: int, first: int, attrs: dict[str, Any]) -> SpanRecord:
    """An ``openai.chat`` span as OpenLLMetry's older releases wrote it (``_set_prompts`` /
    ``_set_completions``: ``gen_ai.prompt.N.role``/``content``/``tool_call_id``,
    ``gen_ai.completion.N.*`` with ``tool_calls.M.id``/``name``/``arguments``), its prompts from
    index ``first`` on (lower indexes evicted)."""
    base = {
        "gen_ai.system": "openai",
        "llm.request.type": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o",
        "gen_ai.usage.prompt_tokens": 11,
        "gen_ai.usage.completion_tokens": 7,
    }
    return SpanRecord(
        trace_id="cd" * 16,
        span_id=span_id,
        parent_span_id="1" * 16,
        name="openai.chat",
        start_time_unix_nano=start,
        end_time_unix_nano=start + 5,
        status="ok",
        attributes={**base, **{key: v for key, v in attrs.items() if _index(key) >= first}},
    )


def _index(key: str) -> int:
    parts = key.split(".")
    return int(parts[2]) if key.startswith("gen_ai.prompt.") else 10**6


CONVERSATION = {
    "gen_ai.prompt.0.role": "system",
    "gen_ai.prompt.0.content": "Answer with the weather.",
    "gen_ai.prompt.1.role": "user",
    "gen_ai.prompt.1.content": PROMPT,
    "gen_ai.prompt.2.role": "assistant",
    "gen_ai.prompt.2.tool_calls.0.id": "call_1",
    "gen_ai.prompt.2.tool_calls.0.name": "get_weather",
    "gen_ai.prompt.2.tool_calls.0.arguments": '{"city": "Paris"}',
    "gen_ai.prompt.3.role": "tool",
    "gen_ai.prompt.3.tool_call_id": "call_1",
    "gen_ai.prompt.3.content": "sunny in Paris",
    "gen_ai.completion.0.role": "assistant",
    "gen_ai.completion.0.content": "Done: sunny in Paris",
    "gen_ai.completion.0.finish_reason": "stop",
}
LIVE = {
    "method": "POST",
    "url": "chat/completions",
    "body": {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Answer with the weather."},
            {"role": "user", "content": PROMPT},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny in Paris"},
        ],
    },
}


def adopted(first: int) -> LlmRequest:
    spans = [
        SpanRecord(
            "cd" * 16, "1" * 16, None, "agent", start_time_unix_nano=0, end_time_unix_nano=99
        ),
        flattened_span("2" * 16, 1, first, CONVERSATION),
    ]
    result = foreign.adopt(spans, DEFAULT_REDACTOR)
    assert result is not None
    (call,) = spans_to_trace(result.records, redactor=DEFAULT_REDACTOR).calls
    assert isinstance(call, LlmRequest)
    return call


def matches(call: LlmRequest, live: dict[str, Any]) -> bool:
    assert call.input is not None
    form = live_form(call.provider, live, payload_value(call.input))
    return canonical_json(form) == call.input


def test_flattened_messages_import_as_a_form_the_live_request_matches() -> None:
    call = adopted(first=0)
    assert call.fidelity == "messages-only"
    assert matches(call, LIVE)
    changed = json.loads(json.dumps(LIVE))
    changed["body"]["messages"][1]["content"] = "What is the weather in Rome?"
    assert not matches(call, changed)


def test_evicted_first_prompts_leave_a_truncated_call_matched_on_its_last_messages() -> None:
    call = adopted(first=2)
    assert call.fidelity == "truncated"
    form = payload_value(call.input or "")
    assert form["tail"] == 2
    assert "the messages before the last 2" in (call.unchecked or [])
    assert matches(call, LIVE)  # the system prompt and the question are not compared
    earlier = json.loads(json.dumps(LIVE))
    earlier["body"]["messages"][1]["content"] = "What is the weather in Rome?"
    assert matches(call, earlier)
    later = json.loads(json.dumps(LIVE))
    later["body"]["messages"][3]["content"] = "rain in Paris"
    assert not matches(call, later)


def test_a_flattened_call_without_messages_says_content_capture_is_off() -> None:
    spans = [flattened_span("2" * 16, 1, 0, {})]
    result = foreign.adopt(spans, DEFAULT_REDACTOR)
    assert result is not None
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in result.notes[0]
    assert k.INPUT not in result.records[0].payloads
