"""GenAI semantic-convention messages (``gen_ai.input.messages`` parts) read from OpenAI and
Anthropic request and response bodies: pure data in, data out.

Two users: the SDK integrations describe their calls on spans with them
(``recording/integrations/genai.py``), and replay compares a live request with a call imported
from another instrumentation's GenAI spans in the same terms (``trace/foreign_request.py``).
Anything unexpected in a body is skipped: describing a call must never fail it.
"""

from __future__ import annotations

from typing import Any

import orjson

from stepfork_otel import constants as k

#: Request body fields -> the ``gen_ai.request.*`` attribute that carries them.
REQUEST_PARAMS: tuple[tuple[str, str], ...] = (
    ("temperature", k.GEN_AI_REQUEST_TEMPERATURE),
    ("top_p", k.GEN_AI_REQUEST_TOP_P),
    ("top_k", k.GEN_AI_REQUEST_TOP_K),
    ("max_tokens", k.GEN_AI_REQUEST_MAX_TOKENS),
    ("max_completion_tokens", k.GEN_AI_REQUEST_MAX_TOKENS),
    ("max_output_tokens", k.GEN_AI_REQUEST_MAX_TOKENS),
    ("frequency_penalty", k.GEN_AI_REQUEST_FREQUENCY_PENALTY),
    ("presence_penalty", k.GEN_AI_REQUEST_PRESENCE_PENALTY),
    ("seed", k.GEN_AI_REQUEST_SEED),
    ("n", k.GEN_AI_REQUEST_CHOICE_COUNT),
)


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_text(value: Any) -> str:
    return orjson.dumps(value).decode("utf-8")


def request_attributes(body: dict[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name, attribute in REQUEST_PARAMS:
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[attribute] = value
    stop = body.get("stop", body.get("stop_sequences"))
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        attributes[k.GEN_AI_REQUEST_STOP_SEQUENCES] = stop
    if isinstance(body.get("stream"), bool):
        attributes[k.GEN_AI_REQUEST_STREAM] = body["stream"]
    return attributes


def stream_events(output: dict[str, Any]) -> list[dict[str, Any]]:
    return [as_dict(as_dict(chunk).get("data")) for chunk in as_list(output.get(k.STREAM_CHUNKS))]


def _output_message(role: Any, parts: list[dict[str, Any]], reason: Any) -> dict[str, Any]:
    """One ``gen_ai.output.messages`` entry. A reason the response did not give (a stream cut
    short, a gateway's reply without one) is left out, never ``null``: Phoenix drops every
    output message of a span when one has ``"finish_reason": null``."""
    message: dict[str, Any] = {"role": role, "parts": parts}
    if isinstance(reason, str):
        message["finish_reason"] = reason
    return message


def _text_part(text: Any) -> dict[str, Any]:
    return {"type": "text", "content": text}


def tool_definitions(tools: list[Any]) -> list[dict[str, Any]]:
    """The request's tools in the convention's shape, ``{"type", "name", "description",
    "parameters"}``, from OpenAI Chat Completions (``{"type": "function", "function": {...}}``),
    Responses (already flat) and Anthropic (``input_schema``, no ``type``) tools. Phoenix validates
    the whole list and drops it for one item without a ``name``, so a built-in tool that has none
    (``{"type": "web_search"}``) is named by its type."""
    definitions: list[dict[str, Any]] = []
    for item in tools:
        tool = as_dict(item)
        if not tool:
            continue
        nested = as_dict(tool.get("function")) if tool.get("type") == "function" else {}
        source = nested or tool
        kind = tool.get("type") if isinstance(tool.get("type"), str) else "function"
        name = source.get("name") if isinstance(source.get("name"), str) else kind
        definition: dict[str, Any] = {"type": kind, "name": name}
        if isinstance(source.get("description"), str):
            definition["description"] = source["description"]
        parameters = source.get("parameters", source.get("input_schema"))
        if isinstance(parameters, dict):
            definition["parameters"] = parameters
        definitions.append(definition)
    return definitions


class Summary:
    """What one response says, whatever the API."""

    __slots__ = (
        "cache_creation",
        "cache_read",
        "finish_reasons",
        "input_messages",
        "input_tokens",
        "model",
        "output_messages",
        "output_tokens",
        "response_id",
        "system_instructions",
    )

    def __init__(self) -> None:
        self.response_id: str | None = None
        self.model: str | None = None
        self.finish_reasons: list[str] = []
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.cache_read: int | None = None
        self.cache_creation: int | None = None
        self.input_messages: list[dict[str, Any]] = []
        self.output_messages: list[dict[str, Any]] = []
        self.system_instructions: list[dict[str, Any]] = []

    def identify(self, source: dict[str, Any]) -> None:
        if isinstance(source.get("id"), str) and self.response_id is None:
            self.response_id = source["id"]
        if isinstance(source.get("model"), str):
            self.model = source["model"]


# --- OpenAI --------------------------------------------------------------------------------------


def _openai_message_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(_text_part(content))
    for item in as_list(content):
        item = as_dict(item)
        if item.get("type") in ("text", "input_text", "output_text"):
            parts.append(_text_part(item.get("text")))
        elif item:
            parts.append({"type": str(item.get("type", "unknown"))})
    for call in as_list(message.get("tool_calls")):
        function = as_dict(as_dict(call).get("function"))
        parts.append(
            {
                "type": "tool_call",
                "id": as_dict(call).get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    return parts


def _openai_inputs(body: dict[str, Any], summary: Summary) -> None:
    for message in as_list(body.get("messages")):
        message = as_dict(message)
        role = message.get("role")
        if role in ("system", "developer"):
            summary.system_instructions.extend(_openai_message_parts(message))
        elif role == "tool":
            summary.input_messages.append(
                {
                    "role": "tool",
                    "parts": [
                        {
                            "type": "tool_call_response",
                            "id": message.get("tool_call_id"),
                            "response": message.get("content"),
                        }
                    ],
                }
            )
        else:
            summary.input_messages.append({"role": role, "parts": _openai_message_parts(message)})
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        summary.system_instructions.append(_text_part(instructions))
    responses_input = body.get("input")
    if isinstance(responses_input, str):
        summary.input_messages.append({"role": "user", "parts": [_text_part(responses_input)]})
    for item in as_list(responses_input):
        item = as_dict(item)
        if item.get("type") == "function_call_output":
            part = {"type": "tool_call_response", "id": item.get("call_id")}
            summary.input_messages.append(
                {"role": "tool", "parts": [dict(part, response=item.get("output"))]}
            )
        elif item.get("type") == "function_call":
            summary.input_messages.append({"role": "assistant", "parts": [_responses_call(item)]})
        elif "role" in item:
            summary.input_messages.append(
                {"role": item["role"], "parts": _openai_message_parts(item)}
            )


def _responses_call(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool_call",
        "id": item.get("call_id"),
        "name": item.get("name"),
        "arguments": item.get("arguments"),
    }


def _openai_usage(usage: dict[str, Any], summary: Summary) -> None:
    if not usage:
        return
    summary.input_tokens = as_int(usage.get("prompt_tokens", usage.get("input_tokens")))
    summary.output_tokens = as_int(usage.get("completion_tokens", usage.get("output_tokens")))
    details = as_dict(usage.get("prompt_tokens_details", usage.get("input_tokens_details")))
    summary.cache_read = as_int(details.get("cached_tokens"))


def _chat_from_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completion a stream of chunks delivered."""
    choices: dict[int, dict[str, Any]] = {}
    folded: dict[str, Any] = {}
    for event in events:
        for key in ("id", "model"):
            if key in event and key not in folded:
                folded[key] = event[key]
        if event.get("usage"):
            folded["usage"] = event["usage"]
        for choice in as_list(event.get("choices")):
            choice = as_dict(choice)
            index = as_int(choice.get("index")) or 0
            into = choices.setdefault(
                index, {"message": {"role": "assistant", "content": ""}, "calls": {}}
            )
            delta = as_dict(choice.get("delta"))
            if isinstance(delta.get("content"), str):
                into["message"]["content"] += delta["content"]
            for call in as_list(delta.get("tool_calls")):
                call = as_dict(call)
                slot = into["calls"].setdefault(
                    as_int(call.get("index")) or 0,
                    {"id": None, "function": {"name": "", "arguments": ""}},
                )
                slot["id"] = call.get("id") or slot["id"]
                function = as_dict(call.get("function"))
                slot["function"]["name"] += function.get("name") or ""
                slot["function"]["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                into["finish_reason"] = choice["finish_reason"]
    folded["choices"] = []
    for index in sorted(choices):
        into = choices[index]
        if into["calls"]:
            into["message"]["tool_calls"] = [into["calls"][i] for i in sorted(into["calls"])]
        folded["choices"].append(
            {"message": into["message"], "finish_reason": into.get("finish_reason")}
        )
    return folded


def openai_response(body: dict[str, Any], output: dict[str, Any]) -> Summary:
    summary = Summary()
    _openai_inputs(body, summary)
    result = as_dict(output.get("body"))
    if k.STREAM_CHUNKS in output and "body" not in output:  # (a body: no event stream)
        events = stream_events(output)
        final = [as_dict(e.get("response")) for e in events if "response" in e]
        result = final[-1] if final else _chat_from_stream(events)
    summary.identify(result)
    _openai_usage(as_dict(result.get("usage")), summary)
    for choice in as_list(result.get("choices")):  # Chat Completions
        choice = as_dict(choice)
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            summary.finish_reasons.append(reason)
        message = as_dict(choice.get("message"))
        summary.output_messages.append(
            _output_message(
                message.get("role", "assistant"), _openai_message_parts(message), reason
            )
        )
    parts: list[dict[str, Any]] = []
    for item in as_list(result.get("output")):  # Responses
        item = as_dict(item)
        if item.get("type") == "message":
            parts.extend(_openai_message_parts(item))
        elif item.get("type") == "function_call":
            parts.append(_responses_call(item))
    if parts or "output" in result:
        reason = result.get("status")
        if isinstance(reason, str):
            summary.finish_reasons.append(reason)
        summary.output_messages.append(_output_message("assistant", parts, reason))
    return summary


# --- Anthropic -----------------------------------------------------------------------------------


def _anthropic_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [_text_part(content)]
    parts: list[dict[str, Any]] = []
    for block in as_list(content):
        block = as_dict(block)
        kind = block.get("type")
        if kind == "text":
            parts.append(_text_part(block.get("text")))
        elif kind == "tool_use":
            parts.append(
                {
                    "type": "tool_call",
                    "id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": block.get("input"),
                }
            )
        elif kind == "tool_result":
            parts.append(
                {
                    "type": "tool_call_response",
                    "id": block.get("tool_use_id"),
                    "response": block.get("content"),
                }
            )
        elif kind == "thinking":
            parts.append({"type": "reasoning", "content": block.get("thinking")})
        elif block:
            parts.append({"type": str(kind)})
    return parts


def _message_from_stream(events: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {}
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    usage: dict[str, Any] = {}
    for event in events:
        kind = event.get("type")
        if kind == "message_start":
            message = dict(as_dict(event.get("message")))
            usage.update(as_dict(message.get("usage")))
        elif kind == "content_block_start":
            blocks[as_int(event.get("index")) or 0] = dict(as_dict(event.get("content_block")))
        elif kind == "content_block_delta":
            index = as_int(event.get("index")) or 0
            block = blocks.setdefault(index, {"type": "text", "text": ""})
            delta = as_dict(event.get("delta"))
            if delta.get("type") == "text_delta":
                block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                partial[index] = partial.get(index, "") + str(delta.get("partial_json") or "")
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = str(block.get("thinking") or "") + str(
                    delta.get("thinking") or ""
                )
        elif kind == "message_delta":
            delta = as_dict(event.get("delta"))
            if delta.get("stop_reason"):
                message["stop_reason"] = delta["stop_reason"]
            usage.update(
                {key: v for key, v in as_dict(event.get("usage")).items() if v is not None}
            )
    for index, text in partial.items():
        try:
            blocks[index]["input"] = orjson.loads(text) if text else {}
        except (orjson.JSONDecodeError, KeyError):
            continue
    message["content"] = [blocks[i] for i in sorted(blocks)]
    message["usage"] = usage
    return message


def _anthropic_inputs(body: dict[str, Any], summary: Summary) -> None:
    system = body.get("system")
    summary.system_instructions = _anthropic_parts(system) if system else []
    for message in as_list(body.get("messages")):
        message = as_dict(message)
        summary.input_messages.append(
            {"role": message.get("role"), "parts": _anthropic_parts(message.get("content"))}
        )


def request_messages(
    provider: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The system instructions (parts) and input messages of a request body: Anthropic's
    Messages for provider ``anthropic``, else OpenAI's Chat Completions or Responses."""
    summary = Summary()
    (_anthropic_inputs if provider == k.PROVIDER_ANTHROPIC else _openai_inputs)(body, summary)
    return summary.system_instructions, summary.input_messages


def anthropic_response(body: dict[str, Any], output: dict[str, Any]) -> Summary:
    summary = Summary()
    _anthropic_inputs(body, summary)
    result = as_dict(output.get("body"))
    if k.STREAM_CHUNKS in output and "body" not in output:  # (a body: no event stream)
        result = _message_from_stream(stream_events(output))
    summary.identify(result)
    usage = as_dict(result.get("usage"))
    uncached = as_int(usage.get("input_tokens"))
    summary.cache_read = as_int(usage.get("cache_read_input_tokens"))
    summary.cache_creation = as_int(usage.get("cache_creation_input_tokens"))
    if uncached is not None:  # the convention counts cached input tokens as input tokens
        summary.input_tokens = uncached + (summary.cache_read or 0) + (summary.cache_creation or 0)
    summary.output_tokens = as_int(usage.get("output_tokens"))
    reason = result.get("stop_reason")
    if isinstance(reason, str):
        summary.finish_reasons.append(reason)
    if "content" in result:
        summary.output_messages.append(
            _output_message(
                result.get("role", "assistant"), _anthropic_parts(result.get("content")), reason
            )
        )
    return summary
