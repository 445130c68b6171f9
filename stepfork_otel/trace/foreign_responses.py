"""Responses rebuilt for an SDK from what another instrumentation's span held, one builder per
provider: the output messages (GenAI parts) become an OpenAI chat completion or an Anthropic
message that the SDK parses into its own objects -- the content, the tool calls with their
arguments, the finish reason mapped back to the provider's word, the usage.

And streams: a trace holds no chunks (every instrumentation merges a stream into one message),
so when the agent streams, :func:`restreamed` cuts the recorded final message into the events
the provider would have sent (one text delta, one delta per tool call, the finish, the usage when
the request asked for it), and the SDK's own stream class reads them. What the events cannot
carry again (how the text was split, the timing) the agent never depended on for its answer; the
replay report says the stream was rebuilt.

Pure data in, data out (the format layer): the importer builds bodies with it, the SDK
integrations re-chunk with it in replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from stepfork_otel import constants as k
from stepfork_otel.trace.foreign_request import arguments_value
from stepfork_otel.trace.genai_messages import as_dict, as_int, as_list

#: GenAI finish reasons -> OpenAI's (``finish_reason``) and Anthropic's (``stop_reason``) words;
#: a provider's own word passes through.
_OPENAI_FINISH = {
    "tool_call": "tool_calls",
    "tool_use": "tool_calls",
    "end_turn": "stop",
    "max_tokens": "length",
}
_ANTHROPIC_FINISH = {
    "stop": "end_turn",
    "tool_call": "tool_use",
    "tool_calls": "tool_use",
    "length": "max_tokens",
}

#: The headers of a rebuilt JSON response and of a rebuilt event stream.
JSON_HEADERS: Mapping[str, str] = {"content-type": k.MIME_JSON}
SSE_HEADERS: Mapping[str, str] = {"content-type": "text/event-stream"}


def _text(parts: Sequence[Any]) -> str | None:
    """The text of the parts (None: no text part holds text; a part without any is skipped, as
    :func:`anthropic_message` skips it)."""
    texts = [p.get("content") for p in map(as_dict, parts) if p.get("type") == "text"]
    kept = [t for t in texts if isinstance(t, str)]
    return "".join(kept) if kept else None


def _calls(parts: Sequence[Any]) -> list[dict[str, Any]]:
    return [p for p in map(as_dict, parts) if p.get("type") == "tool_call"]


def _arguments_text(arguments: Any) -> str:
    value = arguments_value(arguments)
    return value if isinstance(value, str) else orjson.dumps(value).decode("utf-8")


def finish_reason(reason: Any, has_calls: bool, words: Mapping[str, str]) -> tuple[str, bool]:
    """The provider's word for a GenAI finish reason, and whether it was recorded (else the
    reason is inferred from the parts: tool calls, or a normal stop)."""
    if isinstance(reason, str) and reason and reason != "error":
        return words.get(reason, reason), True
    fallback = "tool_calls" if has_calls else "stop"
    return words.get(fallback, fallback), False


def openai_chat_completion(
    output_messages: Sequence[Any],
    *,
    response_id: str,
    model: str,
    created: int,
    usage: Mapping[str, int] | None,
) -> tuple[dict[str, Any], list[str]]:
    """A chat completion body from ``gen_ai.output.messages`` (one choice per message), and what
    it had to infer (said on the call)."""
    inferred: list[str] = []
    choices = []
    for index, item in enumerate(output_messages):
        message = as_dict(item)
        parts = as_list(message.get("parts"))
        calls = _calls(parts)
        built: dict[str, Any] = {"role": "assistant", "content": _text(parts)}
        if calls:
            built["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": call.get("name"),
                        "arguments": _arguments_text(call.get("arguments")),
                    },
                }
                for call in calls
            ]
        reason, recorded = finish_reason(message.get("finish_reason"), bool(calls), _OPENAI_FINISH)
        if not recorded:
            inferred.append(f"finish reason of choice {index} not recorded: {reason!r} assumed")
        choices.append({"index": index, "message": built, "finish_reason": reason})
    body: dict[str, Any] = {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage:
        prompt, completion = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
        body["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
    return body, inferred


def anthropic_message(
    output_messages: Sequence[Any],
    *,
    response_id: str,
    model: str,
    usage: Mapping[str, int] | None,
) -> tuple[dict[str, Any], list[str]]:
    """An Anthropic message body from the first of ``gen_ai.output.messages``, and what it had
    to infer."""
    message = as_dict(output_messages[0]) if output_messages else {}
    content: list[dict[str, Any]] = []
    for part in map(as_dict, as_list(message.get("parts"))):
        if part.get("type") == "text" and isinstance(part.get("content"), str):
            content.append({"type": "text", "text": part["content"]})
        elif part.get("type") == "tool_call":
            arguments = arguments_value(part.get("arguments"))
            content.append(
                {
                    "type": "tool_use",
                    "id": part.get("id"),
                    "name": part.get("name"),
                    "input": arguments if isinstance(arguments, dict) else {},
                }
            )
    has_calls = any(block["type"] == "tool_use" for block in content)
    reason, recorded = finish_reason(message.get("finish_reason"), has_calls, _ANTHROPIC_FINISH)
    inferred = [] if recorded else [f"stop reason not recorded: {reason!r} assumed"]
    usage = usage or {}
    body = {
        "id": response_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
        },
    }
    return body, inferred


# --- streams ------------------------------------------------------------------------------------


def _openai_chat_events(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    head = {key: body.get(key) for key in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(index: int, delta: dict[str, Any], reason: Any = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": reason}
        return {"data": dict(head, choices=[choice])}

    events = []
    for choice in map(as_dict, as_list(body.get("choices"))):
        index = as_int(choice.get("index")) or 0
        message = as_dict(choice.get("message")) or as_dict(choice.get("delta"))
        events.append(chunk(index, {"role": "assistant", "content": ""}))
        if isinstance(message.get("content"), str) and message["content"]:
            events.append(chunk(index, {"content": message["content"]}))
        for n, call in enumerate(map(as_dict, as_list(message.get("tool_calls")))):
            function = as_dict(call.get("function"))
            delta = {
                "index": n,
                "id": call.get("id"),
                "type": "function",
                "function": {"name": function.get("name"), "arguments": function.get("arguments")},
            }
            events.append(chunk(index, {"tool_calls": [delta]}))
        events.append(chunk(index, {}, choice.get("finish_reason") or "stop"))
    if include_usage and isinstance(body.get("usage"), dict):
        events.append({"data": dict(head, choices=[], usage=body["usage"])})
    events.append({"text": "[DONE]"})
    return events


def _anthropic_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    usage = as_dict(body.get("usage"))
    start = {key: value for key, value in body.items() if key not in ("content", "stop_reason")}
    start.update(content=[], stop_reason=None, usage=dict(usage, output_tokens=0))

    def event(name: str, **data: Any) -> dict[str, Any]:
        return {"event": name, "data": {"type": name, **data}}

    events = [event("message_start", message=start)]
    for index, block in enumerate(map(as_dict, as_list(body.get("content")))):
        if block.get("type") == "tool_use":
            empty = dict(block, input={})
            delta = {
                "type": "input_json_delta",
                "partial_json": orjson.dumps(block.get("input", {})).decode(),
            }
        else:
            empty = dict(block, text="")
            delta = {"type": "text_delta", "text": block.get("text", "")}
        events.append(event("content_block_start", index=index, content_block=empty))
        events.append(event("content_block_delta", index=index, delta=delta))
        events.append(event("content_block_stop", index=index))
    stop = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    events.append(
        event("message_delta", delta=stop, usage={"output_tokens": usage.get("output_tokens", 0)})
    )
    events.append(event("message_stop"))
    return events


def restreamed(provider: str, request: Any, record: Any) -> dict[str, Any] | None:
    """The recorded stream value (``{status, headers, chunks, complete}``) that a streamed
    request gets from a recorded final message ``record`` (``{status, headers, body}``), or None
    when ``record`` is not one this module can cut (an error status, another endpoint). A request
    that is not an API stream, only read as one by its SDK, gets the body (and no chunks)."""
    record, request = as_dict(record), as_dict(request)
    body = as_dict(record.get("body"))
    if record.get("status") != 200 or not body:
        return None
    if as_dict(request.get("body")).get("stream") is not True:
        # the API call is not a stream, the SDK only reads the response as one (the Anthropic
        # SDK does for every request): the body, as a recording of that call holds it
        return {**record, k.STREAM_CHUNKS: [], k.STREAM_COMPLETE: True}
    if provider == k.PROVIDER_ANTHROPIC and body.get("type") == "message":
        events = _anthropic_events(body)
    elif provider != k.PROVIDER_ANTHROPIC and "choices" in body:
        options = as_dict(as_dict(request.get("body")).get("stream_options"))
        events = _openai_chat_events(body, options.get("include_usage") is True)
    else:
        return None
    return {
        "status": 200,
        "headers": dict(SSE_HEADERS),
        k.STREAM_CHUNKS: events,
        k.STREAM_COMPLETE: True,
    }
