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

from collections.abc import Mapping
from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.foreign_calls import (
    EVICTED,
    ImportedLlm,
    json_object,
    json_value,
    llm_record,
    token_count,
    tool_record,
    where,
)
from stepfork_otel.trace.foreign_responses import JSON_HEADERS
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
    at = where(span, n)
    raw_input = attrs.get(k.INPUT_VALUE)
    body = json_object(raw_input)
    if body is not None and _BODY_FIELD[url] not in body:
        body = None
    call = ImportedLlm(k.PROVIDER_OPENAI, _model(attrs, body))
    if body is None:
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
    if span.status == "error":
        notes.append(
            f"{at}: the call failed; OpenInference keeps no response of a failed call "
            "(only its exception event); replay stops at this call"
        )
    elif response is None:
        why = (
            f"output.value is not on the span {EVICTED}"
            if k.OUTPUT_VALUE not in attrs
            else "output.value is not a JSON response body"
        )
        notes.append(f"{at}: result missing -- {why}; replay stops at this call")
    else:
        model_out = response.get("model")
        call.response_model = model_out if isinstance(model_out, str) else None
        call.response = {"status": 200, "headers": dict(JSON_HEADERS), "body": response}
    return llm_record(span, call, redactor)


def tool_call(span: SpanRecord, n: int, redactor: Redactor, notes: list[str]) -> SpanRecord:
    """An OpenInference TOOL span as a tool call: arguments from ``input.value``, the result
    from ``output.value`` (JSON when it is JSON text, else the text)."""
    attrs = span.attributes
    name = str(attrs.get(k.OI_TOOL_NAME))
    raw = attrs.get(k.INPUT_VALUE)
    arguments = json_object(raw)
    if arguments is None:
        notes.append(
            f"{where(span, n)}: tool {name!r}: arguments missing -- input.value is "
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
