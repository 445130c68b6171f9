"""OpenAI agents traced by another instrumentation only, then replayed by stepfork (issue 23).

``python tests/foreign_agents.py trace INSTRUMENTATION AGENT WHERE OUT.json URL PROMPT``: the
agent runs against the fake server traced ONLY by INSTRUMENTATION (no stepfork instrumentation,
no ``record``): ``openinference`` (``openinference-instrumentation-openai``), ``openai-v2``
(``opentelemetry-instrumentation-openai-v2`` with content on the span), ``openai-v2-events``
(the same with ``EVENT_ONLY``: the content in ``gen_ai.client.inference.operation.details`` log
records, written to WHERE among the spans' lines (each call's record before its span's line), as
the collector's file exporter writes them) or
``openai-v2-events-apart`` (those log records in ``logs.jsonl`` beside WHERE), ``logfire``
(``logfire.instrument_openai()``, ``send_to_logfire=False``) or ``openllmetry``
(``opentelemetry-instrumentation-openai``, when installed), ``pydantic-ai`` (the framework's
own instrumentation) or ``openinference-pydantic-ai`` (the same, rewritten by
``openinference-instrumentation-pydantic-ai``, when installed). Its spans go to WHERE: a file written
by ``OtlpJsonFileExporter``, or -- an ``http://`` URL -- over real OTLP/HTTP.

AGENT: ``weather`` (chat completions with a tool until the model answers), ``stream`` (the same
loop streamed with ``client.chat.completions.stream(...)``: the SDK accumulates the deltas),
``anthropic`` / ``anthropic-stream`` (the tool loop with the Anthropic SDK, streamed or not), ``pydantic-ai`` (a pydantic-ai agent with
the same tool; traced by ``pydantic-ai``, the
framework's own instrumentation, which writes ``execute_tool`` spans with arguments and result).

``python tests/foreign_agents.py replay AGENT BUNDLE OUT.json URL PROMPT [MODE [ALLOWED_TOOL]]``:
the same agent under ``instrument_openai()`` in a ``ReplaySession`` of the bundle ``stepfork
import`` built from those spans (``frozen`` unless MODE); ``verify_complete()`` is called. With
``replay-traced`` instead of ``replay`` the tool is made a boundary (``@trace_tool``) first.
A replay error is written to OUT.json as ``{"error": [type, message]}``, with the report.

The tool is plain Python while tracing: these SDK instrumentations write no tool spans, so the
bundle holds no tool call and a plain tool runs live in replay (``tool_ran``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sdk_agents import WEATHER_TOOL

TOOLS = [WEATHER_TOOL]  # the tool the SDK agents use
TOOL_RAN: list[str] = []
API_KEY = "sk-proj-NOTAREALKEY0123456789abcdef"


def get_weather(city: str) -> str:
    TOOL_RAN.append(city)
    return f"sunny in {city}"


TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {"get_weather": get_weather}


def _messages(prompt: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Answer with the weather."},
        {"role": "user", "content": prompt},
    ]


def _run_tools(message: Any, messages: list[dict[str, Any]]) -> None:
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls:
        arguments = json.loads(call.function.arguments)
        result = TOOL_FUNCTIONS[call.function.name](**arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


def _weather_loop(client: Any, prompt: str) -> str:
    """Chat completions with a tool until the model answers (two calls against the fake)."""
    messages = _messages(prompt)
    for _ in range(5):
        reply = client.chat.completions.create(
            model="gpt-4o", messages=messages, tools=TOOLS, temperature=0.0
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        _run_tools(message, messages)
    raise RuntimeError("the agent did not finish")


def _stream_loop(client: Any, prompt: str) -> str:
    """The same loop, streamed: the SDK's stream helper accumulates the deltas (text and tool
    calls) into the final completion."""
    messages = _messages(prompt)
    for _ in range(5):
        with client.chat.completions.stream(
            model="gpt-4o",
            messages=messages,
            tools=TOOLS,
            stream_options={"include_usage": True},
        ) as stream:
            text = "".join(event.delta for event in stream if event.type == "content.delta")
            reply = stream.get_final_completion()
        message = reply.choices[0].message
        if not message.tool_calls:
            usage = reply.usage
            return f"{text} [{usage.total_tokens if usage else 'no'} tokens]"
        _run_tools(message, messages)
    raise RuntimeError("the agent did not finish")


AGENTS: dict[str, Callable[[Any, str], str]] = {"weather": _weather_loop, "stream": _stream_loop}


def _pydantic_ai_agent(url: str, prompt: str) -> str:
    """A pydantic-ai agent with the same tool (its framework runs the tool loop)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=url, api_key=API_KEY))
    agent = Agent(
        model, instructions="Answer with the weather.", tools=[TOOL_FUNCTIONS["get_weather"]]
    )
    return str(agent.run_sync(prompt).output)


def _anthropic_agent(url: str, prompt: str, stream: bool = False) -> str:
    """The tool loop with the Anthropic SDK (``url``: the fake's OpenAI URL; its Anthropic API
    is at the root), streamed with ``client.messages.stream(...)`` when ``stream``."""
    import anthropic

    function = WEATHER_TOOL["function"]
    tool = {
        "name": function["name"],
        "description": function["description"],
        "input_schema": function["parameters"],
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    with anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key=API_KEY) as client:
        for _ in range(5):
            request: dict[str, Any] = {
                "model": "claude-sonnet-4-5",
                "max_tokens": 256,
                "system": "Answer with the weather.",
                "messages": messages,
                "tools": [tool],
            }
            if stream:
                with client.messages.stream(**request) as events:
                    reply = events.get_final_message()
            else:
                reply = client.messages.create(**request)
            calls = [block for block in reply.content if block.type == "tool_use"]
            if not calls:
                return "".join(block.text for block in reply.content if block.type == "text")
            messages.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in reply.content],
                }
            )
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": TOOL_FUNCTIONS[call.name](**call.input),
                }
                for call in calls
            ]
            messages.append({"role": "user", "content": results})
    raise RuntimeError("the agent did not finish")


def weather_agent(url: str, prompt: str, agent: str = "weather") -> str:
    import openai

    if agent == "pydantic-ai":
        return _pydantic_ai_agent(url, prompt)
    if agent.startswith("anthropic"):
        return _anthropic_agent(url, prompt, stream=agent == "anthropic-stream")
    with openai.OpenAI(base_url=url, api_key=API_KEY) as client:
        return AGENTS[agent](client, prompt)


# --- tracing with another instrumentation ------------------------------------------------------


def _log_exporter(path: Path) -> Any:
    """Log records as the collector's file exporter writes them (``format: json``): one
    ``LogsData`` line per batch, encoded by the OTLP exporter's own encoder and mapped to JSON as
    ``OtlpJsonFileExporter`` maps spans (protobuf's mapping, enums as numbers, ids as hex)."""
    import base64

    import orjson
    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult

    class OtlpJsonLogFileExporter(LogRecordExporter):
        def __init__(self) -> None:
            self.handle = path.open("ab")

        def export(self, batch: Any) -> LogRecordExportResult:
            data = json_format.MessageToDict(encode_logs(batch), use_integers_for_enums=True)
            for resource in data.get("resourceLogs", []):
                for scope in resource.get("scopeLogs", []):
                    for record in scope.get("logRecords", []):
                        for key in ("traceId", "spanId"):
                            if key in record:
                                record[key] = base64.b64decode(record[key]).hex()
            self.handle.write(orjson.dumps(data) + b"\n")
            self.handle.flush()
            return LogRecordExportResult.SUCCESS

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

        def shutdown(self) -> None:
            self.handle.close()

    return OtlpJsonLogFileExporter()


def _exporter(where: str) -> Any:
    if where.startswith("http://"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=where)
    from stepfork_otel.otel.otlp_file import OtlpJsonFileExporter

    return OtlpJsonFileExporter(where)


def _trace(instrumentation: str, agent: str, where: str, url: str, prompt: str) -> dict[str, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    if instrumentation == "logfire":
        import logfire

        logfire.configure(
            send_to_logfire=False,
            console=False,
            additional_span_processors=[SimpleSpanProcessor(_exporter(where))],
        )
        logfire.instrument_openai()
        logfire.instrument_anthropic()
        with logfire.span("weather-agent"):
            answer = weather_agent(url, prompt, agent)
        logfire.force_flush()
        return {"answer": answer}
    provider = TracerProvider()
    if instrumentation == "openinference-pydantic-ai":  # rewrites the spans before they export
        from openinference.instrumentation.pydantic_ai import OpenInferenceSpanProcessor

        provider.add_span_processor(OpenInferenceSpanProcessor())
    provider.add_span_processor(SimpleSpanProcessor(_exporter(where)))
    if instrumentation == "openinference":
        from openinference.instrumentation.openai import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
    elif instrumentation == "openai-v2":
        # content on the span, in the latest conventions (its default sends content as logs)
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as V2

        V2().instrument(tracer_provider=provider)
    elif instrumentation in ("openai-v2-events", "openai-v2-events-apart"):
        # content in log records only, the setting that keeps it off spans
        os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
        os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "EVENT_ONLY"
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as V2
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

        logs = Path(where)
        if instrumentation.endswith("-apart"):
            logs = logs.with_name("logs.jsonl")
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(_log_exporter(logs)))
        V2().instrument(tracer_provider=provider, logger_provider=logger_provider)
        with provider.get_tracer("weather-app").start_as_current_span("weather-agent"):
            answer = weather_agent(url, prompt, agent)
        provider.shutdown()
        logger_provider.shutdown()
        return {"answer": answer}
    elif instrumentation in ("pydantic-ai", "openinference-pydantic-ai"):
        # the framework's own GenAI spans, tools included (OpenInference's processor adds its
        # attributes to them)
        from pydantic_ai import Agent
        from pydantic_ai.models.instrumented import InstrumentationSettings

        Agent.instrument_all(
            InstrumentationSettings(tracer_provider=provider, include_content=True)
        )
    elif instrumentation == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as Traceloop

        Traceloop().instrument(tracer_provider=provider)
    else:
        raise SystemExit(f"unknown instrumentation {instrumentation!r}")
    with provider.get_tracer("weather-app").start_as_current_span("weather-agent"):
        answer = weather_agent(url, prompt, agent)
    provider.shutdown()
    return {"answer": answer}


# --- replaying with stepfork -------------------------------------------------------------------


def _replay(
    agent: str, bundle: str, url: str, prompt: str, mode: str, allowed: list[str], traced: bool
) -> dict[str, Any]:
    import stepfork_otel
    from stepfork_otel import ReplaySession, Trace
    from stepfork_otel.replay.report import format_report

    if traced:
        TOOL_FUNCTIONS["get_weather"] = stepfork_otel.trace_tool(get_weather)
    stepfork_otel.instrument_openai()
    stepfork_otel.instrument_anthropic()
    out: dict[str, Any] = {}
    session = ReplaySession.from_trace(bundle, mode=mode, allow_live_tools=allowed)
    try:
        with session:
            out["answer"] = weather_agent(url, prompt, agent)
            session.verify_complete()
    except stepfork_otel.ReplayError as exc:
        out["error"] = [type(exc).__name__, str(exc)]
    out["calls"] = [[call.kind, call.action] for call in session.calls]
    out["notes"] = [call.notes for call in session.calls]
    out["report"] = format_report(session.summary, len(Trace.load(bundle).calls))
    return out


def main(argv: list[str]) -> int:
    if argv[0] == "trace":
        instrumentation, agent, where, out, url, prompt = argv[1:7]
        result = _trace(instrumentation, agent, where, url, prompt)
    else:
        agent, bundle, out, url, prompt = argv[1:6]
        mode = argv[6] if len(argv) > 6 else "frozen"
        allowed = argv[7:]
        result = _replay(agent, bundle, url, prompt, mode, allowed, argv[0] == "replay-traced")
    result["tool_ran"] = TOOL_RAN
    Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
