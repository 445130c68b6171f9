"""GenAI semantic-convention attributes (v1.41 as the released baseline) of SDK calls, read off the
*redacted* recorded request and response -- so nothing reaches a span that the bundle would not
hold -- for OpenAI (Chat Completions, Responses, Embeddings) and Anthropic (Messages).

Always: ``gen_ai.request.*`` parameters, ``gen_ai.response.id``/``model``/``finish_reasons``,
``gen_ai.usage.*`` (cache read and write included -- the write under its current name,
``cache_write``, and its old one, ``cache_creation``, which some back-ends still read;
Anthropic's ``input_tokens`` excludes cached tokens, the convention's includes them, so they are
added), ``error.type`` for an error status.
Message content (``gen_ai.input.messages``, ``gen_ai.output.messages``,
``gen_ai.system_instructions``, ``gen_ai.tool.definitions``) only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is ``true``, ``SPAN_ONLY`` or
``SPAN_AND_EVENT`` (the variable the OTel GenAI instrumentations read, with their values that
put content on spans) and stepfork's own payload capture is on. Streams are folded into the
message they delivered. Anything unexpected in a body is skipped: describing a call must never
fail it.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from stepfork_otel import constants as k
from stepfork_otel.config import CONFIG
from stepfork_otel.trace.genai_messages import (
    Summary,
    anthropic_response,
    as_dict,
    as_list,
    json_text,
    openai_response,
    request_attributes,
    tool_definitions,
)

__all__ = [
    "anthropic_response",
    "content_captured",
    "describe",
    "describe_request",
    "openai_response",
    "tool_definitions",
]


#: The values of ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` that put content on spans:
#: the boolean the OTel GenAI instrumentations read, and the modes of their newer releases
#: (``opentelemetry-util-genai``) that include spans -- so one value turns content on for
#: stepfork and, say, ``opentelemetry-instrumentation-openai-v2`` alike. ``EVENT_ONLY`` and
#: ``NO_CONTENT`` put none on spans, and stepfork writes no events.
_CONTENT_ON_SPANS = frozenset({"true", "1", "yes", "span_only", "span_and_event"})


def content_captured() -> bool:
    flag = os.environ.get(k.ENV_CAPTURE_MESSAGE_CONTENT, "").strip().lower()
    return flag in _CONTENT_ON_SPANS and CONFIG.settings.capture_content


_UNPARSED: Any = object()


def _loaded(text: str) -> Any:
    """The JSON value of ``text`` (``_UNPARSED`` when it is not JSON)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return _UNPARSED


def _parsed(text: str) -> dict[str, Any]:
    return as_dict(_loaded(text))


def describe(
    input_text: str,
    output_text: str,
    usage_elsewhere: bool,
    response: Any,
    output: Any = None,
) -> dict[str, Any]:
    """The attributes of one call; ``response(request body, output record) -> Summary``.
    ``output``: the recorded output already parsed from ``output_text`` (a replay substitutes
    it: its JSON value is at hand), else None: parsed here."""
    request = _parsed(input_text)
    return _described(
        as_dict(request.get("body")),
        _parsed(output_text) if output is None else as_dict(output),
        usage_elsewhere,
        response,
    )


def _described(
    body: dict[str, Any], output: dict[str, Any], usage_elsewhere: bool, response: Any
) -> dict[str, Any]:
    """:func:`describe` of a request ``body`` and an ``output`` record, both parsed."""
    attributes = request_attributes(body)
    status = output.get("status")
    if isinstance(status, int) and status >= 400:
        attributes[k.ERROR_TYPE_SEMCONV] = str(status)
        return attributes
    summary: Summary = response(body, output)
    if summary.response_id:
        attributes[k.GEN_AI_RESPONSE_ID] = summary.response_id
    if summary.model:
        attributes[k.GEN_AI_RESPONSE_MODEL] = summary.model
    if summary.finish_reasons:
        attributes[k.GEN_AI_RESPONSE_FINISH_REASONS] = summary.finish_reasons
    if not usage_elsewhere:
        for attribute, value in (
            (k.GEN_AI_USAGE_INPUT_TOKENS, summary.input_tokens),
            (k.GEN_AI_USAGE_OUTPUT_TOKENS, summary.output_tokens),
            (k.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, summary.cache_read),
            (k.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS, summary.cache_creation),
            (k.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, summary.cache_creation),  # the old name
        ):
            if value is not None:
                attributes[attribute] = value
    else:  # the parent span counts it; the bundle still wants it (stepfork's own keys)
        for attribute, value in (
            (k.USAGE_INPUT_TOKENS, summary.input_tokens),
            (k.USAGE_OUTPUT_TOKENS, summary.output_tokens),
        ):
            if value is not None:
                attributes[attribute] = value
    if content_captured():
        if summary.input_messages:
            attributes[k.GEN_AI_INPUT_MESSAGES] = json_text(summary.input_messages)
        if summary.system_instructions:
            attributes[k.GEN_AI_SYSTEM_INSTRUCTIONS] = json_text(summary.system_instructions)
        if summary.output_messages:
            attributes[k.GEN_AI_OUTPUT_MESSAGES] = json_text(summary.output_messages)
        tools = tool_definitions(as_list(body.get("tools")))
        if tools:
            attributes[k.GEN_AI_TOOL_DEFINITIONS] = json_text(tools)
    return attributes


def describe_request(
    provider: str, input_text: str, output_text: str, output: Any = None
) -> dict[str, Any]:
    """A hand-written ``llm_request``/``allm_request`` described as the SDK integrations describe
    their calls, when its request and response have an SDK's shape: Anthropic's Messages for
    provider ``anthropic``, else OpenAI's Chat Completions or Responses (the shape OpenAI-compatible
    APIs share). A request with neither ``messages`` nor ``input`` is described by nothing here
    (its usage still is: ``spans.usage_attributes``). ``output``: as in :func:`describe`."""
    request = _parsed(input_text)
    if not isinstance(request.get("messages"), list) and "input" not in request:
        return {}
    response = anthropic_response if provider == "anthropic" else openai_response
    body = _loaded(output_text) if output is None else output
    record = {} if body is _UNPARSED else {"status": 200, "body": body}
    return _described(request, record, False, response)
