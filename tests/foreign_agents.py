"""An OpenAI tool-loop agent traced by another instrumentation only, then replayed by stepfork.

``python tests/foreign_agents.py trace SPANS.jsonl OUT.json URL PROMPT``: the agent runs against
the fake server traced ONLY by ``openinference-instrumentation-openai`` (no stepfork
instrumentation, no ``record``), its spans written by ``OtlpJsonFileExporter`` -- or, with
``trace-otlp`` and an OTLP/HTTP endpoint as SPANS, sent over real OTLP.

``python tests/foreign_agents.py replay BUNDLE OUT.json URL PROMPT``: the same agent under
``instrument_openai()`` in a frozen ``ReplaySession`` of the bundle ``stepfork import`` built
from those spans; ``verify_complete()`` is called. A replay error is written to OUT.json as
``{"error": [type, message]}``.

The tool is plain Python, not ``@trace_tool``: OpenInference's SDK instrumentation writes no
tool spans, so the bundle holds no tool call and the tool runs live in replay (``tool_ran``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sdk_agents import WEATHER_TOOL

TOOLS = [WEATHER_TOOL]  # the tool the SDK agents use
TOOL_RAN: list[str] = []


def get_weather(city: str) -> str:
    TOOL_RAN.append(city)
    return f"sunny in {city}"


def weather_agent(url: str, prompt: str) -> str:
    """Chat completions with a tool until the model answers (two calls against the fake)."""
    import openai

    with openai.OpenAI(base_url=url, api_key="sk-proj-NOTAREALKEY0123456789abcdef") as client:
        return _weather_loop(client, prompt)


def _weather_loop(client: Any, prompt: str) -> str:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Answer with the weather."},
        {"role": "user", "content": prompt},
    ]
    for _ in range(5):
        reply = client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=TOOLS, temperature=0.0
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": get_weather(**arguments)}
            )
    raise RuntimeError("the agent did not finish")


def _trace(where: str, url: str, prompt: str, otlp: bool) -> dict[str, Any]:
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

    exporter: SpanExporter
    if otlp:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=where)
    else:
        from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter

        exporter = OtlpJsonFileExporter(where)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    with provider.get_tracer("weather-app").start_as_current_span("weather-agent"):
        answer = weather_agent(url, prompt)
    provider.shutdown()
    return {"answer": answer}


def _replay(bundle: str, url: str, prompt: str) -> dict[str, Any]:
    import stepfork_otel
    from stepfork_otel import ReplaySession

    stepfork_otel.instrument_openai()
    out: dict[str, Any] = {}
    try:
        with ReplaySession.from_trace(bundle, mode="frozen") as session:
            out["answer"] = weather_agent(url, prompt)
            session.verify_complete()
    except stepfork_otel.ReplayError as exc:
        out["error"] = [type(exc).__name__, str(exc)]
    out["calls"] = [[call.kind, call.action] for call in session.calls]
    return out


def main(argv: list[str]) -> int:
    mode, where, out, url, prompt = argv
    if mode == "replay":
        result = _replay(where, url, prompt)
    else:
        result = _trace(where, url, prompt, otlp=mode == "trace-otlp")
    result["tool_ran"] = TOOL_RAN
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
