"""OpenInference spans read as stepfork's: the OpenAI LLM spans of
``openinference-instrumentation-openai`` (at ``exact`` fidelity) and the TOOL spans framework
instrumentations write.

What an OpenInference OpenAI span holds (``openinference-instrumentation-openai`` 0.1.x, read from
its source): ``input.value`` is the request's ``json_data`` -- the body the SDK sends, except
``extra_body``, which the SDK merges in later -- and ``output.value`` the parsed response as
``model_dump_json(exclude_unset=True)``: every field the server sent, in the model's field order.
The span's name is the response type (``ChatCompletion``, ``Response``), which gives the endpoint.
It holds no response headers (only ``content-type``, which the SDK needs, is put back), no chunks
of a streamed call (OpenInference merges them into one completion-shaped object: replay cuts it
into a stream again, ``trace/foreign_responses.py``) and no response of a failed call (only an
``exception`` event). The SDK's 128-attribute limit evicts the oldest attributes first, and
``input.value`` is among the first: a long conversation loses it. Each of these is a call with a
missing input or result, named in the notes -- never a value made up.

A TOOL span (``openinference.span.kind`` ``TOOL``, from a framework instrumentation) holds the
tool's name (``tool.name``), its arguments (``input.value``, JSON) and its result
(``output.value``): it becomes a tool call, matched on its arguments like a ``@trace_tool``'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.foreign_calls import (
    EVICTED,
    Flattened,
    ImportedLlm,
    flattened_messages,
    indexed_messages,
    json_object,
    json_value,
    llm_record,
    token_count,
    tool_record,
    where,
)
from stepfork_otel.trace.foreign_request import normal_messages, request_form, unchecked
from stepfork_otel.trace.foreign_responses import JSON_HEADERS, openai_chat_completion
from stepfork_otel.trace.genai_messages import request_attributes
from stepfork_otel.trace.redaction import Redactor

#: OpenInference's OpenAI span names (the SDK's response type) -> the request URL, relative to
#: the client's base URL, as ``instrument_openai()`` records it.
OPENINFERENCE_OPENAI_URLS: Mapping[str, str] = {
    "ChatCompletion": "chat/completions",
    "Response": "responses",
}
#: The request body field each endpoint cannot be without (recognising ``input.value``).
_BODY_FIELD = {"chat/completions": "messages", "responses": "input"}
#: The convention's name, as the bundle's ``created_by`` and the docs' table say it.
NAME = "OpenInference"


def openai_url(span: SpanRecord) -> str | None:
    """The endpoint of an OpenInference OpenAI LLM span (None: not one). The provider attribute
    (``llm.provider``/``llm.system``) is among the first the limit evicts: without it the span's
    name (the OpenAI SDK's response type) decides; with it, it must say ``openai``."""
    attrs = span.attributes
    if attrs.get(k.OPENINFERENCE_SPAN_KIND) != k.OI_KIND_LLM:
        return None
    provider = attrs.get(k.OI_LLM_PROVIDER, attrs.get(k.OI_LLM_SYSTEM))
    if provider is not None and provider != k.PROVIDER_OPENAI:
        return None
    return OPENINFERENCE_OPENAI_URLS.get(span.name)


def is_tool(span: SpanRecord) -> bool:
    attrs = span.attributes
    return attrs.get(k.OPENINFERENCE_SPAN_KIND) == k.OI_KIND_TOOL and isinstance(
        attrs.get(k.OI_TOOL_NAME), str
    )


def _model(attrs: Mapping[str, Any], body: Mapping[str, Any] | None) -> str:
    model = body.get("model") if body is not None else None
    if not isinstance(model, str):  # the input was lost: the parameters OpenInference keeps
        params = json_object(attrs.get(k.OI_INVOCATION_PARAMETERS))
        model = params.get("model") if params is not None else None
    if not isinstance(model, str):
        model = attrs.get(k.OI_MODEL_NAME)
    return model if isinstance(model, str) else ""


def llm_call(
    span: SpanRecord, n: int, url: str, redactor: Redactor, notes: list[str]
) -> SpanRecord:
    """An OpenInference OpenAI span as the span of an ``instrument_openai()`` call."""
    attrs = span.attributes
    at = where(span, n, redactor)
    raw_input = attrs.get(k.INPUT_VALUE)
    body = json_object(raw_input)
    if body is not None and _BODY_FIELD[url] not in body:
        body = None
    call = ImportedLlm(k.PROVIDER_OPENAI, _model(attrs, body))
    flat = _flattened(attrs, k.OI_INPUT_MESSAGES) if raw_input is None else Flattened([], 0)
    if body is None and flat.messages and url == "chat/completions":
        _tail(call, attrs, url, flat.messages, flat.first)
        gap = "" if flat.gap is None else f"; {flat.not_kept(_INPUT_NAME)}"
        notes.append(
            f"{at}: input.value is not on the span {EVICTED}{gap}; the last "
            f"{len(flat.messages)} messages, from its per-message attributes, are compared "
            f"(fidelity {call.fidelity})"
        )
    elif body is None:
        why = (
            f"input.value is not on the span {EVICTED}"
            if raw_input is None
            else "input.value is not a JSON request body"
        )
        notes.append(f"{at}: input missing -- {why}; replay stops at this call")
    else:
        call.request = {"body": body, "method": "POST", "url": url}
    for name, source in (
        ("input_tokens", k.OI_TOKEN_COUNT_PROMPT),
        ("output_tokens", k.OI_TOKEN_COUNT_COMPLETION),
    ):
        count = token_count(attrs.get(source))
        if count is not None:
            call.usage[name] = count
    response = json_object(attrs.get(k.OUTPUT_VALUE))
    evicted = response is None and k.OUTPUT_VALUE not in attrs
    out = _flattened(attrs, k.OI_OUTPUT_MESSAGES) if evicted else Flattened([], 0)
    outputs = out.messages if not out.first else []  # (a response of some choices: made up)
    if span.status == "error":
        notes.append(
            f"{at}: the call failed; OpenInference keeps no response of a failed call "
            "(only its exception event); replay stops at this call"
        )
    elif outputs:
        reason = attrs.get(k.OI_FINISH_REASON)
        if isinstance(reason, str):
            outputs[0]["finish_reason"] = reason
        body, inferred = openai_chat_completion(
            outputs,
            response_id=f"imported-{span.span_id}",
            model=call.model,
            created=(span.end_time_unix_nano or 0) // 1_000_000_000,
            usage=call.usage,
        )
        call.unchecked += inferred
        call.response = {"status": 200, "headers": dict(JSON_HEADERS), "body": body}
        notes.append(
            f"{at}: output.value is not on the span {EVICTED}; the response is rebuilt from "
            "its per-message attributes (no response id)"
        )
    elif response is None:
        why = (
            f"output.value is not on the span {EVICTED}"
            if evicted
            else "output.value is not a JSON response body"
        )
        if out.first:
            why += f"; of its per-message attributes, {out.not_kept(_OUTPUT_NAME, 'choice')}"
        notes.append(f"{at}: result missing -- {why}; replay stops at this call")
    else:
        model_out = response.get("model")
        call.response_model = model_out if isinstance(model_out, str) else None
        call.response = {"status": 200, "headers": dict(JSON_HEADERS), "body": response}
    return llm_record(span, call, redactor)


_FLAT = re.compile(
    rf"^({re.escape(k.OI_INPUT_MESSAGES)}|{re.escape(k.OI_OUTPUT_MESSAGES)})\.(\d+)\.message\.(.+)$"
)
_FLAT_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)$")
_FLAT_TEXT = re.compile(r"^contents\.(\d+)\.message_content\.text$")
#: How the notes name message N.
_INPUT_NAME, _OUTPUT_NAME = f"{k.OI_INPUT_MESSAGES}.{{}}", f"{k.OI_OUTPUT_MESSAGES}.{{}}"


def _flattened(attrs: Mapping[str, Any], family: str) -> Flattened:
    """OpenInference's per-message attributes (``llm.input_messages.N.message.role``,
    ``.content``, ``.contents.M.message_content.text``, ``.tool_call_id``,
    ``.tool_calls.M.tool_call.id``/``.function.name``/``.function.arguments``) as GenAI messages:
    the last ones, from the first whole one on (the attribute limit evicts the oldest: the
    messages before it, and part of it, are lost)."""
    return flattened_messages(indexed_messages(attrs, family, _FLAT, _FLAT_CALL, _FLAT_TEXT))


def _tail(
    call: ImportedLlm, attrs: Mapping[str, Any], url: str, kept: list[Any], lost: int
) -> None:
    """The request form of a call whose ``input.value`` was evicted: the messages its
    per-message attributes still hold (the last ones), and the parameters
    ``llm.invocation_parameters`` holds when it was kept."""
    invocation = json_object(attrs.get(k.OI_INVOCATION_PARAMETERS))
    tail = len(kept) if lost else None
    call.fidelity = k.FIDELITY_TRUNCATED if lost else k.FIDELITY_MESSAGES_ONLY
    form = request_form(
        url=url,
        model=call.model,
        messages=normal_messages([], kept, keep_system_in_place=tail is not None),
        params=None if invocation is None else request_attributes(invocation),
        tail=tail,
    )
    call.request = form
    call.unchecked = unchecked(form)


def tool_call(span: SpanRecord, n: int, redactor: Redactor, notes: list[str]) -> SpanRecord:
    """An OpenInference TOOL span as a tool call: arguments from ``input.value``, the result
    from ``output.value`` (JSON when it is JSON text, else the text)."""
    attrs = span.attributes
    name = str(attrs.get(k.OI_TOOL_NAME))
    raw = attrs.get(k.INPUT_VALUE)
    arguments = json_object(raw)
    if arguments is None:
        notes.append(
            f"{where(span, n, redactor)}: tool {name!r}: arguments missing -- input.value is "
            + ("not on the span" if raw is None else "not a JSON object")
            + "; replay stops at this call"
        )
    output = attrs.get(k.OUTPUT_VALUE)
    result = json_value(output) if attrs.get(k.OUTPUT_MIME_TYPE) == k.MIME_JSON else None
    if result is None and isinstance(output, str):
        result = output
    failed = None
    if span.status == "error":
        failed = ("Exception", "the tool raised (OpenInference keeps its exception event only)")
    return tool_record(span, name, arguments, result, redactor, failed=failed)
