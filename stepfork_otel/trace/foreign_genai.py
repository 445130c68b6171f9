"""Spans that follow the OpenTelemetry GenAI semantic conventions, read as stepfork's:
``opentelemetry-instrumentation-openai-v2`` / ``-genai-openai`` with content on the span,
logfire's ``instrument_openai()`` / ``instrument_anthropic()`` (its version-2 spans), OpenLLMetry,
and framework spans (pydantic-ai's ``chat``/``execute_tool``).

What such a span holds (read from the instrumentations' sources, measured in
``docs/collectors.md``): the messages as parts (``gen_ai.input.messages``,
``gen_ai.system_instructions``, ``gen_ai.output.messages`` with a finish reason), the model, some
request parameters (``gen_ai.request.temperature`` & co.), the response id, model and token
usage, and -- logfire, the newer genai package -- the tool definitions. OpenLLMetry's older
releases flatten the messages into ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` attributes:
they are read into the same parts. Never the whole request body: so an imported call holds a
request *form* (``trace/foreign_request.py``, fidelity ``messages-only``), matched on what the
span held, the rest listed per call as unchecked; its response is rebuilt for the SDK from the
output messages (``trace/foreign_responses.py``). A span whose early flattened prompt
attributes were evicted by the attribute count limit keeps the tail of the conversation
(fidelity ``truncated``: the last messages are compared); a gap in the indexes is read the same
way, the messages after it being the tail (``foreign_calls.flattened_messages``).

Streams: logfire ends the request span when the stream opens and writes the merged message on a
second span ("streaming response from ...") under the same parent: the two are one call. Every
instrumentation merges the chunks, so replay cuts the final message into a stream again.

Tool spans: ``gen_ai.operation.name`` ``execute_tool`` with ``gen_ai.tool.name`` and, when
content is captured, ``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result`` -- a tool call.
SDK instrumentations write none: a tool the model called (a ``tool_call`` part) whose run no span
holds is named in the notes, and replay refuses it unless it may run live.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.foreign_calls import (
    Flattened,
    ImportedLlm,
    first_str,
    flattened_messages,
    indexed_messages,
    json_object,
    json_value,
    llm_record,
    string_list,
    token_count,
    tool_record,
    where,
)
from stepfork_otel.trace.foreign_request import (
    normal_messages,
    normal_tools,
    request_form,
    unchecked,
)
from stepfork_otel.trace.foreign_responses import (
    JSON_HEADERS,
    anthropic_message,
    openai_chat_completion,
)
from stepfork_otel.trace.genai_messages import REQUEST_PARAMS, as_dict, as_list
from stepfork_otel.trace.redaction import Redactor

#: The operations read as LLM calls.
_LLM_OPERATIONS = frozenset({k.OP_CHAT, k.OP_TEXT_COMPLETION, "generate_content"})
#: ``gen_ai.request.*`` attributes a form compares (the stop sequences are a list).
_PARAM_ATTRIBUTES = (
    *dict.fromkeys(a for _, a in REQUEST_PARAMS),
    k.GEN_AI_REQUEST_STOP_SEQUENCES,
)
_INDEXED = re.compile(rf"^({re.escape(k.TL_PROMPT)}|{re.escape(k.TL_COMPLETION)})\.(\d+)\.(.+)$")
_INDEXED_CALL = re.compile(r"^tool_calls\.(\d+)\.(id|name|arguments)$")
#: The provider's endpoint (relative URL) of a chat call, as ``instrument_*()`` records it.
_URLS = {k.PROVIDER_OPENAI: "chat/completions", k.PROVIDER_ANTHROPIC: "messages"}
_CUT = "(if an attribute value length limit cut it: raise OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)"
_CONTENT_OFF = (
    "the span holds no messages and no gen_ai.client.inference.operation.details log record "
    "of it was imported (capture is off, or the content went to log records: import their file "
    "with the spans, or set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY or the "
    "instrumentation's own switch)"
)
_TOOL_CONTENT_OFF = (
    "the span holds no messages (content capture is off: set "
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY, or the instrumentation's own "
    "switch)"
)


def provider_of(attrs: Mapping[str, Any]) -> str | None:
    value = first_str(attrs, k.GEN_AI_PROVIDER_NAME, k.GEN_AI_SYSTEM)
    return value.lower() if value is not None else None


def is_llm(span: SpanRecord) -> bool:
    """A GenAI chat span of a provider replay can serve (OpenAI, Anthropic)."""
    attrs = span.attributes
    operation = attrs.get(k.GEN_AI_OPERATION_NAME, attrs.get(k.TL_REQUEST_TYPE))
    return (
        isinstance(operation, str) and operation in _LLM_OPERATIONS and provider_of(attrs) in _URLS
    )


def is_tool(span: SpanRecord) -> bool:
    attrs = span.attributes
    return attrs.get(k.GEN_AI_OPERATION_NAME) == k.OP_EXECUTE_TOOL and isinstance(
        attrs.get(k.GEN_AI_TOOL_NAME), str
    )


# --- messages ---------------------------------------------------------------------------------


def _flattened(attrs: Mapping[str, Any], family: str) -> Flattened | None:
    """OpenLLMetry's flattened messages (``gen_ai.prompt.N.role``, ``.content``,
    ``.tool_call_id``, ``.finish_reason``, ``.tool_calls.M.name``/``id``/``arguments``); None
    when the span has none."""
    found = indexed_messages(attrs, family, _INDEXED, _INDEXED_CALL)
    if not found:
        return None
    return flattened_messages(found, json_content=True, finish_reason=family == k.TL_COMPLETION)


def _messages(attrs: Mapping[str, Any], key: str, family: str) -> tuple[Any, Flattened | None, str]:
    """``(messages, flattened, why)``: the messages (None: not on the span, or not readable --
    ``why`` says which), and what the flattened attributes held when the span has those (they
    may keep only the last messages)."""
    if key in attrs:
        value = json_value(attrs[key])
        if isinstance(value, list):
            return value, None, ""
        return None, None, f"{key} is cut or not JSON {_CUT}"
    flat = _flattened(attrs, family)
    if flat is None:
        return None, None, _CONTENT_OFF
    if not flat.messages:
        return None, flat, f"{family}.{flat.first - 1} is a message in part (no role)"
    return flat.messages, flat, ""


def _params(attrs: Mapping[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key in _PARAM_ATTRIBUTES:
        value = attrs.get(key)
        if value is None:  # (OpenLLMetry writes empty values for parameters not given)
            continue
        params[key] = string_list(value) if key == k.GEN_AI_REQUEST_STOP_SEQUENCES else value
    return params


def _tools(attrs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tool definitions the span held (None: it held none)."""
    definitions = json_value(attrs.get(k.GEN_AI_TOOL_DEFINITIONS))
    if isinstance(definitions, list):
        return normal_tools(definitions)
    functions = _indexed_functions(attrs)
    return normal_tools(functions) if functions else None


def _indexed_functions(attrs: Mapping[str, Any]) -> list[dict[str, Any]]:
    """OpenLLMetry's ``llm.request.functions.N.name``/``description``/``parameters``."""
    found: dict[int, dict[str, Any]] = {}
    prefix = k.TL_REQUEST_FUNCTIONS + "."
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        index, _, field = key[len(prefix) :].partition(".")
        if index.isdigit() and field in ("name", "description", "parameters"):
            parsed = json_value(value) if field == "parameters" else value
            found.setdefault(int(index), {})[field] = parsed
    return [found[i] for i in sorted(found)]


def _usage(attrs: Mapping[str, Any]) -> dict[str, int]:
    usage: dict[str, int] = {}
    for name, keys in (
        ("input_tokens", (k.GEN_AI_USAGE_INPUT_TOKENS, k.TL_USAGE_PROMPT_TOKENS)),
        ("output_tokens", (k.GEN_AI_USAGE_OUTPUT_TOKENS, k.TL_USAGE_COMPLETION_TOKENS)),
    ):
        for key in keys:
            count = token_count(attrs.get(key))
            if count is not None:
                usage[name] = count
                break
    return usage


# --- one call -----------------------------------------------------------------------------------


def llm_call(
    span: SpanRecord,
    n: int,
    redactor: Redactor,
    notes: list[str],
    output_from: SpanRecord | None = None,
) -> SpanRecord:
    """A GenAI chat span as the span of an ``instrument_openai()``/``instrument_anthropic()``
    call. ``output_from``: the span that holds its output (logfire's stream span)."""
    attrs = span.attributes
    at = where(span, n, redactor)
    provider = provider_of(attrs) or k.PROVIDER_OPENAI
    model = first_str(attrs, k.GEN_AI_REQUEST_MODEL) or ""
    call = ImportedLlm(provider, model, fidelity=k.FIDELITY_MESSAGES_ONLY)
    url = "responses" if span.name.startswith("Responses API") else _URLS[provider]
    messages, flat, why = _messages(attrs, k.GEN_AI_INPUT_MESSAGES, k.TL_PROMPT)
    system = json_value(attrs.get(k.GEN_AI_SYSTEM_INSTRUCTIONS))
    if messages is None:
        notes.append(f"{at}: input missing -- {why}; replay stops at this call")
    else:
        tail = None
        if flat is not None and flat.first:
            call.fidelity = k.FIDELITY_TRUNCATED
            tail = len(messages)
        form = request_form(
            url=url,
            model=model,
            messages=normal_messages(
                as_list(system), messages, keep_system_in_place=tail is not None
            ),
            tools=_tools(attrs),
            params=_params(attrs),
            tail=tail,
        )
        call.request = form
        call.unchecked = unchecked(form)
        if flat is not None and flat.first:
            said = flat.not_kept(f"{k.TL_PROMPT}.{{}}")
            notes.append(f"{at}: {said}; the last {len(messages)} are compared")
    source = (output_from or span).attributes
    call.usage = _usage(source) or _usage(attrs)
    call.response_model = first_str(source, k.GEN_AI_RESPONSE_MODEL)
    outputs, out_flat, why = _messages(source, k.GEN_AI_OUTPUT_MESSAGES, k.TL_COMPLETION)
    if out_flat is not None and out_flat.first:  # a response of some of the choices: made up
        outputs = None
        why = out_flat.not_kept(f"{k.TL_COMPLETION}.{{}}", "choice")
    elif not outputs and out_flat is None and k.GEN_AI_OUTPUT_MESSAGES in source:
        why = f"{k.GEN_AI_OUTPUT_MESSAGES} is cut, empty or not JSON {_CUT}"
    if span.status == "error" or (output_from is not None and output_from.status == "error"):
        error = first_str(attrs, k.ERROR_TYPE_SEMCONV) or "an error"
        notes.append(
            f"{at}: the call failed ({error}); the span keeps no response; replay stops at this "
            "call"
        )
    elif not outputs:
        notes.append(f"{at}: result missing -- {why}; replay stops at this call")
    elif url == "responses":
        notes.append(
            f"{at}: result missing -- an OpenAI Responses call is not rebuilt from GenAI "
            "messages; replay stops at this call"
        )
    else:
        ended = (output_from or span).end_time_unix_nano or span.start_time_unix_nano
        response_id = first_str(source, k.GEN_AI_RESPONSE_ID) or f"imported-{span.span_id}"
        response_model = call.response_model or model
        if provider == k.PROVIDER_ANTHROPIC:
            body, inferred = anthropic_message(
                outputs, response_id=response_id, model=response_model, usage=call.usage
            )
        else:
            body, inferred = openai_chat_completion(
                outputs,
                response_id=response_id,
                model=response_model,
                created=ended // 1_000_000_000,
                usage=call.usage,
            )
        call.unchecked += inferred
        call.response = {"status": 200, "headers": dict(JSON_HEADERS), "body": body}
    return llm_record(span, call, redactor)


def tool_call(span: SpanRecord, n: int, redactor: Redactor, notes: list[str]) -> SpanRecord:
    """An ``execute_tool`` span as a tool call: its arguments and result when content was
    captured (else the call is imported with them missing, and named)."""
    attrs = span.attributes
    name = str(attrs.get(k.GEN_AI_TOOL_NAME))
    raw = attrs.get(k.GEN_AI_TOOL_CALL_ARGUMENTS)
    arguments = json_object(raw)
    if arguments is None:
        why = (
            _TOOL_CONTENT_OFF
            if raw is None
            else f"{k.GEN_AI_TOOL_CALL_ARGUMENTS} is not a JSON object"
        )
        notes.append(f"{where(span, n, redactor)}: tool {name!r}: arguments missing -- {why}")
    output = attrs.get(k.GEN_AI_TOOL_CALL_RESULT)
    result = json_value(output)
    if result is None:
        result = output
    failed = None
    if span.status == "error":
        failed = (first_str(attrs, k.ERROR_TYPE_SEMCONV) or "Exception", "the tool raised")
    elif result is None:
        notes.append(
            f"{where(span, n, redactor)}: tool {name!r}: result missing -- {_TOOL_CONTENT_OFF}"
        )
    return tool_record(span, name, arguments, result, redactor, failed=failed)


# --- streams: logfire's second span ---------------------------------------------------------------


def stream_outputs(calls: Sequence[SpanRecord]) -> dict[str, SpanRecord]:
    """For a chat span that ended without output messages, the later logfire log span under the
    same parent with the same input messages that has them (its "streaming response" span):
    request span id -> output span. The output spans are not calls of their own. (Only logfire's
    log span: a retry of a failed call with the same messages is a call of its own.)"""
    pending: dict[tuple[str | None, Any], SpanRecord] = {}
    paired: dict[str, SpanRecord] = {}
    for span in calls:  # (in start order)
        attrs = span.attributes
        messages = attrs.get(k.GEN_AI_INPUT_MESSAGES)
        key = (span.parent_span_id, messages if isinstance(messages, str) else None)
        if k.GEN_AI_OUTPUT_MESSAGES not in attrs:
            pending[key] = span
        elif key in pending and key[1] is not None and attrs.get(k.LOGFIRE_SPAN_TYPE) == "log":
            paired[pending.pop(key).span_id] = span
    return paired


def called_tools(records: Sequence[SpanRecord]) -> list[str]:
    """The names of the tools the model called in ``records`` (their output messages)."""
    names: dict[str, None] = {}  # (in the order they were called, once each)
    for span in records:
        if not span.payloads.get(k.OUTPUT):
            continue
        body = as_dict(as_dict(json_value(span.payloads[k.OUTPUT].text)).get("body"))
        for choice in as_list(body.get("choices")):
            for call in as_list(as_dict(as_dict(choice).get("message")).get("tool_calls")):
                name = as_dict(as_dict(call).get("function")).get("name")
                if isinstance(name, str):
                    names[name] = None
        for block in as_list(body.get("content")):
            name = as_dict(block).get("name")
            if as_dict(block).get("type") == "tool_use" and isinstance(name, str):
                names[name] = None
    return list(names)
