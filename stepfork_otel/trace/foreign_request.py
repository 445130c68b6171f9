"""What replay compares of an LLM call imported from spans that hold a projection of the request
(GenAI semantic conventions, logfire, OpenLLMetry): the request *form*.

Such a span holds the messages as parts (``gen_ai.input.messages``), maybe the tool definitions
and some request parameters -- never the whole body the SDK sent. So the recorded input of the
call is not the HTTP exchange an ``instrument_openai()`` call records but this form, and replay
projects the live request onto the same terms before comparing (:func:`live_form`): what the trace
held is matched strictly, what it did not hold is not matched at all -- and said, per call
(:func:`unchecked`), in ``stepfork show`` and in the replay report.

A form is a JSON object::

    {"url": "chat/completions", "model": "gpt-4o",
     "messages": [{"role": "system", "parts": [...]}, {"role": "user", "parts": [...]}, ...],
     "tools": [{"name", "description"?, "parameters"?}, ...]?,     # only when the span held them
     "params": {"gen_ai.request.temperature": 0.0, ...}?,         # the parameters the span held
     "tail": 3?}                                                    # only the last 3 messages held

Messages are normalised the same way on both sides, because instrumentations disagree on
details that do not change the request: all system instructions (system and developer messages,
``gen_ai.system_instructions``, Anthropic's ``system``, Responses' ``instructions``) form one
leading ``system`` message; a text part is ``{"type": "text", "content"}`` and an empty one is
dropped; tool-call arguments are compared as JSON values (instrumentations re-dump them); tool
results are one ``tool`` message each (pydantic-ai and Anthropic put them in a ``user`` message);
parts other than text and tool calls (images, audio) are left out, as most instrumentations leave
them out; a message whose parts the span did not hold (``"parts": null``) matches any content.

Pure data in, data out (the format layer): replay imports it to match, the importer to record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from stepfork_otel.trace.genai_messages import (
    as_dict,
    as_list,
    request_attributes,
    request_messages,
    tool_definitions,
)

_SYSTEM_ROLES = frozenset({"system", "developer"})


def arguments_value(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value: instrumentations keep the model's text, parse it, or
    re-dump it; ``{}`` for none."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


def _response_value(response: Any) -> Any:
    """A tool result as text when it is text or text parts, else the value."""
    if isinstance(response, list):
        texts = [as_dict(item).get("text") for item in response]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(t for t in texts if isinstance(t, str))
    return response


def normal_parts(parts: Any) -> list[dict[str, Any]] | None:
    """One message's parts in the form (None: none that the form compares)."""
    out: list[dict[str, Any]] = []
    for item in as_list(parts):
        part = as_dict(item)
        kind = part.get("type")
        if kind == "text":
            content = part.get("content")
            if isinstance(content, str) and content:
                out.append({"type": "text", "content": content})
        elif kind == "tool_call":
            out.append(
                {
                    "type": "tool_call",
                    "id": part.get("id"),
                    "name": part.get("name"),
                    "arguments": arguments_value(part.get("arguments")),
                }
            )
        elif kind == "tool_call_response":
            out.append(
                {
                    "type": "tool_call_response",
                    "id": part.get("id"),
                    "response": _response_value(part.get("response", part.get("result"))),
                }
            )
    return out or None


def normal_messages(
    system: Sequence[Any], messages: Sequence[Any], *, keep_system_in_place: bool = False
) -> list[dict[str, Any]]:
    """``gen_ai.system_instructions`` parts and ``gen_ai.input.messages`` in the form: one
    leading system message (unless ``keep_system_in_place``: a tail of a conversation), then the
    other messages in order."""
    system_parts: list[Any] = list(system)
    out: list[dict[str, Any]] = []
    for item in messages:
        message = as_dict(item)
        role = message.get("role")
        if role in _SYSTEM_ROLES and not keep_system_in_place:
            system_parts.extend(as_list(message.get("parts")))
            continue
        role = "system" if role in _SYSTEM_ROLES else role
        parts = normal_parts(message.get("parts"))
        if parts and all(part["type"] == "tool_call_response" for part in parts):
            # one tool message per result, whatever the role the instrumentation (or the API:
            # Anthropic's tool_result blocks are in user messages) puts them in
            out.extend({"role": "tool", "parts": [part]} for part in parts)
            continue
        out.append({"role": role, "parts": parts})
    lead = normal_parts(system_parts)
    return ([{"role": "system", "parts": lead}] if lead else []) + out


def normal_tools(tools: Any) -> list[dict[str, Any]]:
    """Tool definitions in the form: name, description, parameters (``strict`` and the type left
    out: not every instrumentation keeps them)."""
    keep = ("name", "description", "parameters")
    return [
        {key: value for key, value in definition.items() if key in keep and value != ""}
        for definition in tool_definitions(as_list(tools))
    ]


def request_form(
    *,
    url: str,
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    params: Mapping[str, Any] | None = None,
    tail: int | None = None,
) -> dict[str, Any]:
    """The recorded input of an imported call (see the module docstring)."""
    form: dict[str, Any] = {"url": url, "model": model, "messages": messages}
    if tools is not None:
        form["tools"] = tools
    if params is not None:
        form["params"] = dict(params)
    if tail is not None:
        form["tail"] = tail
    return form


def live_form(provider: str, exchange: Any, recorded: Any) -> dict[str, Any]:
    """The live request (the HTTP exchange an SDK integration records) in the terms of the
    recorded form ``recorded``: only what the recording holds is taken from it."""
    exchange = as_dict(exchange)
    recorded = as_dict(recorded)
    body = as_dict(exchange.get("body"))
    model = body.get("model")
    system, messages = request_messages(provider, body)
    tail = recorded.get("tail")
    if isinstance(tail, int) and not isinstance(tail, bool):
        normal = normal_messages(system, messages, keep_system_in_place=True)
        normal = normal[-tail:] if tail else []
    else:
        normal = normal_messages(system, messages)
    held = as_list(recorded.get("messages"))
    for message, recorded_message in zip(normal, held, strict=False):
        if as_dict(recorded_message).get("parts") is None:
            message["parts"] = None  # the trace did not hold this message's content
    url = exchange.get("url")
    form = request_form(
        # the endpoint, whatever the client's base URL (Anthropic's default has no /v1)
        url=url.removeprefix("v1/") if isinstance(url, str) else "",
        model=model if isinstance(model, str) else "",
        messages=normal,
        tools=normal_tools(body.get("tools")) if "tools" in recorded else None,
        tail=tail if isinstance(tail, int) else None,
    )
    params = recorded.get("params")
    if isinstance(params, dict):
        live = request_attributes(body)
        form["params"] = {key: live.get(key) for key in params}
    return form


#: What replay does not compare of a tool call imported from a tool span.
TOOL_UNCHECKED = "arguments the model did not send (the tool's defaults)"


def live_arguments(live: Any, recorded: Any) -> Any:
    """A tool call's live arguments (normalised with the tool's defaults) in the terms of the
    arguments a tool span held (what the model sent): the recorded names only, so a default
    the model left out is not a difference; a missing one is (None)."""
    if not isinstance(live, dict) or not isinstance(recorded, dict):
        return live
    return {name: live.get(name) for name in recorded}


def unchecked(form: Any) -> list[str]:
    """What of the live request replay does not compare with a recorded form, in words."""
    form = as_dict(form)
    out = []
    if "tools" not in form:
        out.append("tool definitions")
    params = form.get("params")
    held = sorted(key.rsplit(".", 1)[-1] for key in params) if isinstance(params, dict) else []
    out.append(
        "request parameters other than " + ", ".join(held)
        if held
        else "request parameters (temperature, tool_choice, response_format, ...)"
    )
    tail = form.get("tail")
    if isinstance(tail, int):
        out.append(f"the messages before the last {tail}")
    content_lost = sum(1 for m in as_list(form.get("messages")) if as_dict(m).get("parts") is None)
    if content_lost:
        out.append(f"the content of {content_lost} message(s) the span did not hold")
    return out
