"""What every adapter of another instrumentation's spans shares (``trace/foreign_*.py``): the span
record of an imported call -- the attributes and payloads a stepfork boundary span carries, so the
one conversion builds its events -- the run made of a trace's local root, and reading JSON
attributes that may be hostile (too deep, cut, not JSON).

Pure data in, data out (the format layer): no OpenTelemetry import. Payloads go through
:func:`~stepfork_otel.trace.payload.capture` with the importer's redactor, as a recorded call's do
at its boundary.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stepfork_otel import constants as k
from stepfork_otel.trace.canonical import loads, model_fingerprint
from stepfork_otel.trace.conversion import SpanRecord
from stepfork_otel.trace.errors import quote
from stepfork_otel.trace.foreign_request import TOOL_UNCHECKED
from stepfork_otel.trace.limits import text_depth_exceeds
from stepfork_otel.trace.payload import Payload, capture
from stepfork_otel.trace.redaction import Redactor

#: Said of a payload the SDK's attribute count limit evicted.
EVICTED = (
    "(the SDK's attribute count limit evicts the oldest attributes first: raise "
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT)"
)


@dataclass(frozen=True)
class Adopted:
    """The spans of a trace as stepfork's, and what they could not hold (one note per call)."""

    records: list[SpanRecord]
    notes: list[str] = field(default_factory=list)


def json_value(text: Any) -> Any:
    """``text`` parsed when it is JSON text of an object or array within the nesting limit;
    None otherwise (not a string, cut, not JSON, hostile depth)."""
    if not isinstance(text, str) or not text.lstrip().startswith(("{", "[")):
        return None
    if text_depth_exceeds(text.encode("utf-8", "surrogatepass"), k.DEFAULT_MAX_JSON_DEPTH):
        return None
    try:
        return loads(text)
    except (ValueError, RecursionError):
        return None


def json_object(text: Any) -> dict[str, Any] | None:
    """``text`` parsed, when it is JSON text of an object (None otherwise, hostile depth too)."""
    value = json_value(text)
    return value if isinstance(value, dict) else None


def token_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def where(span: SpanRecord, n: int, redactor: Redactor) -> str:
    """How a note names a call: its span, its name (redacted, as the bundle holds span names:
    they may embed credentials) and its place."""
    return f"span {span.span_id} ({quote(redactor.redact_text(span.name))}, call {n} of the trace)"


@dataclass
class ImportedLlm:
    """An LLM call read off a foreign span, before it becomes a span record."""

    provider: str
    model: str
    operation: str = k.OP_CHAT
    request: Any = None
    """The recorded input (an exchange for ``exact``, a request form otherwise); None: missing."""
    response: Any = None
    """The recorded output (``{status, headers, body}``); None: the call has no result."""
    response_model: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    fidelity: str = k.FIDELITY_EXACT
    unchecked: list[str] = field(default_factory=list)


def llm_record(span: SpanRecord, call: ImportedLlm, redactor: Redactor) -> SpanRecord:
    """``span`` with the attributes and payloads of a stepfork LLM boundary span (no other
    attribute of the foreign span is kept: the conversion reads only these)."""
    new: dict[str, Any] = {
        k.KIND: k.KIND_LLM,
        k.GEN_AI_PROVIDER_NAME: call.provider,
        k.GEN_AI_REQUEST_MODEL: call.model,
        k.GEN_AI_OPERATION_NAME: call.operation,
        k.MODEL_FINGERPRINT: model_fingerprint(call.provider, call.model, call.operation),
        k.IMPORT_FIDELITY: call.fidelity,
    }
    if call.unchecked:
        new[k.IMPORT_UNCHECKED] = list(call.unchecked)
    for key, name in (
        (k.GEN_AI_USAGE_INPUT_TOKENS, "input_tokens"),
        (k.GEN_AI_USAGE_OUTPUT_TOKENS, "output_tokens"),
    ):
        if name in call.usage:
            new[key] = call.usage[name]
    payloads: dict[str, Payload] = {}
    if call.request is not None:
        payloads[k.INPUT] = capture(call.request, redactor)
    if call.response is not None and span.end_time_unix_nano is not None:
        if call.response_model:
            new[k.GEN_AI_RESPONSE_MODEL] = call.response_model
        new[k.STATUS] = k.STATUS_OK
        payloads[k.OUTPUT] = capture(call.response, redactor, keep_order=True)
    return replace(span, attributes=new, payloads=payloads)


def tool_record(
    span: SpanRecord,
    name: str,
    arguments: Any,
    result: Any,
    redactor: Redactor,
    *,
    failed: tuple[str, str] | None = None,
) -> SpanRecord:
    """``span`` with the attributes and payloads of a stepfork tool boundary span: the arguments
    (None: missing), the result (None: missing) or the failure ``(error type, message)``. A tool
    span holds the arguments the model sent, not the tool's defaults: fidelity
    ``messages-only``, matched on those arguments (``trace/foreign_request.live_arguments``)."""
    new: dict[str, Any] = {
        k.KIND: k.KIND_TOOL,
        k.GEN_AI_OPERATION_NAME: k.OP_EXECUTE_TOOL,
        k.GEN_AI_TOOL_NAME: name,
        k.IMPORT_FIDELITY: k.FIDELITY_MESSAGES_ONLY,
        k.IMPORT_UNCHECKED: [TOOL_UNCHECKED],
    }
    payloads: dict[str, Payload] = {}
    if arguments is not None:
        payloads[k.INPUT] = capture(arguments, redactor)
    if span.end_time_unix_nano is not None:
        if failed is not None:
            new[k.STATUS] = k.STATUS_ERROR
            new[k.ERROR_TYPE] = failed[0]
            new[k.ERROR_MESSAGE] = redactor.redact_message(failed[1])
        elif result is not None:
            new[k.STATUS] = k.STATUS_OK
            payloads[k.OUTPUT] = capture(result, redactor, keep_order=True)
    return replace(span, attributes=new, payloads=payloads)


def run_record(span: SpanRecord, redactor: Redactor, created_by: str) -> SpanRecord:
    """The local root of the trace as the run: its name (redacted: span names may embed
    credentials), status, and an input/output only when it carries ``input.value``/
    ``output.value`` (a framework's AGENT or CHAIN span)."""
    attrs = span.attributes
    new: dict[str, Any] = {
        k.KIND: k.KIND_RUN,
        k.RUN_NAME: redactor.redact_text(span.name),
        k.SDK_VERSION: created_by,
    }
    if span.status == "error":
        new[k.STATUS] = k.STATUS_ERROR
    elif span.end_time_unix_nano is not None:  # ended without an error (OTel's "unset" too)
        new[k.STATUS] = k.STATUS_OK
    payloads: dict[str, Payload] = {}
    for key, value_key, mime_key in (
        (k.INPUT, k.INPUT_VALUE, k.INPUT_MIME_TYPE),
        (k.OUTPUT, k.OUTPUT_VALUE, k.OUTPUT_MIME_TYPE),
    ):
        raw = attrs.get(value_key)
        if not isinstance(raw, str):
            continue
        value: Any = json_object(raw) if attrs.get(mime_key) == k.MIME_JSON else None
        payloads[key] = capture(
            raw if value is None else value, redactor, keep_order=key == k.OUTPUT
        )
    return replace(span, attributes=new, payloads=payloads)


def string_list(value: Any) -> list[str]:
    """An attribute that holds strings: an array, or JSON text of one (logfire)."""
    if isinstance(value, str):
        value = json_value(value)
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, str)]
    return []


def first_str(attrs: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def indexed_messages(
    attrs: Mapping[str, Any],
    family: str,
    key: re.Pattern[str],
    call: re.Pattern[str],
    text: re.Pattern[str] | None = None,
) -> dict[int, dict[str, Any]]:
    """Messages flattened into one attribute per field (OpenLLMetry's ``gen_ai.prompt.N.*``,
    OpenInference's ``llm.input_messages.N.message.*``), by index. ``key`` matches an attribute
    as ``(family, index, field)``; a field that ``call`` matches as ``(tool call index, name)``
    goes to the message's ``calls`` (by the name's last part: ``function.name`` is ``name``),
    one ``text`` matches as ``(part index,)`` to its ``texts``."""
    found: dict[int, dict[str, Any]] = {}
    for name, value in attrs.items():
        match = key.match(name)
        if match is None or match[1] != family:
            continue
        message = found.setdefault(int(match[2]), {})
        tool = call.match(match[3])
        part = text.match(match[3]) if text is not None else None
        if tool is not None:
            field_name = tool[2].rpartition(".")[2]
            message.setdefault("calls", {}).setdefault(int(tool[1]), {})[field_name] = value
        elif part is not None:
            message.setdefault("texts", {})[int(part[1])] = value
        else:
            message[match[3]] = value
    return found


@dataclass(frozen=True)
class Flattened:
    """Flattened messages read back (:func:`flattened_messages`)."""

    messages: list[dict[str, Any]]
    """GenAI messages: those of the run of consecutive indexes that ends with the last index,
    from its first whole message (one with a role) on -- the tail of the conversation, which
    can be compared. Empty: no whole message there."""
    first: int
    """The index of the first of them: how many messages before them are not kept."""
    gap: int | None = None
    """The index missing just before them when lower indexes are on the span: a hole, which no
    attribute limit makes (the count limit evicts the lowest indexes first, leaving none).
    None: the messages before them are simply not on the span (evicted)."""

    def not_kept(self, attribute: str, noun: str = "message") -> str:
        """What a note says of the messages before the kept ones (``attribute``: how the
        convention names message N, with ``{}`` for N; ``noun``: what a message is)."""
        if self.gap is None:
            return f"the first {self.first} {noun}(s) are not on the span {EVICTED}"
        return (
            f"{attribute.format(self.gap)} is not on the span (a gap in the message indexes, "
            f"which no attribute limit makes): the first {self.first} {noun}(s) are left out"
        )


def flattened_messages(
    found: Mapping[int, Mapping[str, Any]],
    *,
    json_content: bool = False,
    finish_reason: bool = False,
) -> Flattened:
    """The messages :func:`indexed_messages` found, as GenAI messages: only the indexes on the
    span are visited (a hostile index such as ``2000000`` costs one message, not millions).
    ``json_content``: a ``content`` that is JSON text of content parts holds those parts
    (OpenLLMetry's releases that write list content so); ``finish_reason``: output messages,
    which keep theirs."""
    indexes = sorted(found)
    if not indexes:
        return Flattened([], 0)
    start = len(indexes) - 1
    while start > 0 and indexes[start - 1] == indexes[start] - 1:
        start -= 1
    block = indexes[start:]
    gap = block[0] - 1 if start > 0 else None
    whole = next((n for n, i in enumerate(block) if isinstance(found[i].get("role"), str)), None)
    if whole is None:
        return Flattened([], block[-1] + 1, gap)
    messages = []
    for index in block[whole:]:
        message = found[index]
        built: dict[str, Any] = {
            "role": message.get("role"),
            "parts": _flattened_parts(message, json_content),
        }
        if finish_reason and isinstance(message.get("finish_reason"), str):
            built["finish_reason"] = message["finish_reason"]
        messages.append(built)
    return Flattened(messages, block[whole], gap)


def _flattened_parts(message: Mapping[str, Any], json_content: bool) -> list[dict[str, Any]]:
    if message.get("role") == "tool":
        return [
            {
                "type": "tool_call_response",
                "id": message.get("tool_call_id"),
                "response": message.get("content"),
            }
        ]
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    structured = json_value(content) if json_content else None
    if isinstance(structured, list):
        for part in structured:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append({"type": "text", "content": part.get("text")})
    elif isinstance(content, str):
        parts.append({"type": "text", "content": content})
    texts = message.get("texts")
    if isinstance(texts, dict):
        parts += [
            {"type": "text", "content": t} for _, t in sorted(texts.items()) if isinstance(t, str)
        ]
    calls = message.get("calls")
    for _, call in sorted(calls.items()) if isinstance(calls, dict) else ():
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": call.get("name"),
                "arguments": call.get("arguments"),
            }
        )
    return parts
