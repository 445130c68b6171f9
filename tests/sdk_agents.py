"""Agents written against the real SDKs, as users write them, for the integration tests.

Each scenario takes the fake server's base URL and returns what the agent saw, as JSON: for every
step the class of the object the SDK gave back and its ``model_dump()``, the chunks of a stream,
the class and message of an exception. The test runs a scenario while recording, then again in
a fresh process replaying the bundle with the server stopped, and compares.

Run as ``python tests/sdk_agents.py SCENARIO record|replay BUNDLE OUT.json URL``.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel


def seen(value: Any) -> Any:
    """What the agent saw, as JSON: the class and its dump."""
    if isinstance(value, BaseModel):
        return [
            f"{type(value).__module__}.{type(value).__qualname__}",
            value.model_dump(mode="json"),
        ]
    if isinstance(value, BaseException):
        return [f"{type(value).__module__}.{type(value).__qualname__}", str(value)]
    if isinstance(value, (list, tuple)):
        return [seen(v) for v in value]
    return value


def messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Answer(BaseModel):
    text: str


# --- OpenAI --------------------------------------------------------------------------------------


def openai_sync(url: str) -> list[Any]:
    import openai

    client = openai.OpenAI(
        base_url=url, api_key="sk-proj-NOTAREALKEY0123456789abcdef", max_retries=2
    )
    out: list[Any] = []
    out.append(seen(client.chat.completions.create(model="gpt-4o", messages=messages("hi"))))
    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=messages("stream me please"),
        stream=True,
        stream_options={"include_usage": True},
        temperature=0.2,
        extra_body={"metadata_tag": "x"},
    )
    out.append([type(stream).__qualname__, [seen(c) for c in stream]])
    early = client.chat.completions.create(
        model="gpt-4o", messages=messages("a b c d e"), stream=True
    )
    with early:
        out.append(["early", seen(next(iter(early))), seen(next(iter(early)))])
    tool = client.chat.completions.create(
        model="gpt-4o", messages=messages("weather?"), tools=[WEATHER_TOOL]
    )
    out.append(seen(tool))
    out.append(seen(client.chat.completions.create(model="quirky", messages=messages("q"))))
    out.append(seen(client.chat.completions.create(model="flaky", messages=messages("f"))))
    for model in ("rate-limited", "server-error"):
        try:
            client.with_options(max_retries=1).chat.completions.create(
                model=model, messages=messages("r")
            )
        except openai.APIStatusError as exc:
            out.append([type(exc).__qualname__, exc.status_code, exc.body, str(exc)])
    with client.chat.completions.stream(model="gpt-4o", messages=messages("helper")) as helper:
        kinds = [event.type for event in helper]
        out.append([kinds, seen(helper.get_final_completion())])
    parsed = client.chat.completions.parse(
        model="gpt-4o", messages=messages('{"text": "parsed"}'), response_format=Answer
    )
    out.append(seen(parsed))
    out.append(
        seen(client.responses.create(model="gpt-4o", input="hello", instructions="be brief"))
    )
    with client.responses.stream(model="gpt-4o", input="stream responses") as responses:
        kinds = [event.type for event in responses]
        out.append([kinds, seen(responses.get_final_response())])
    out.append(seen(client.embeddings.create(model="text-embedding-3-small", input=["a", "bb"])))
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages("raw"))
    out.append([raw.headers.get("x-request-id"), seen(raw.parse())])
    return out


def openai_async(url: str) -> list[Any]:
    import openai

    async def run() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=2)
        out: list[Any] = []
        out.append(
            seen(await client.chat.completions.create(model="gpt-4o", messages=messages("hi")))
        )
        stream = await client.chat.completions.create(
            model="gpt-4o", messages=messages("async stream"), stream=True
        )
        out.append([type(stream).__qualname__, [seen(c) async for c in stream]])
        early = await client.chat.completions.create(
            model="gpt-4o", messages=messages("one two three"), stream=True
        )
        async with early:
            out.append(["early", seen(await early.__anext__())])
        out.append(
            seen(await client.chat.completions.create(model="flaky", messages=messages("f")))
        )
        try:
            await client.with_options(max_retries=0).chat.completions.create(
                model="rate-limited", messages=messages("r")
            )
        except openai.RateLimitError as exc:
            out.append([type(exc).__qualname__, exc.status_code, str(exc)])
        async with client.responses.stream(model="gpt-4o", input="async responses") as responses:
            kinds = [event.type async for event in responses]
            out.append([kinds, seen(await responses.get_final_response())])
        return out

    return asyncio.run(run())


def openai_timeout(url: str) -> list[Any]:
    """A connection that fails: recorded as the transport error, replayed as the same SDK class."""
    import openai

    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test", max_retries=1)
    out: list[Any] = []
    try:
        client.chat.completions.create(model="gpt-4o", messages=messages("nobody home"))
    except openai.APIConnectionError as exc:
        out.append([type(exc).__qualname__, str(exc), type(exc.__cause__).__qualname__])
    return out


# --- Anthropic -----------------------------------------------------------------------------------


def anthropic_sync(url: str) -> list[Any]:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-api03-NOTAREALKEY", max_retries=2)
    out: list[Any] = []
    out.append(
        seen(
            client.messages.create(
                model="claude-sonnet-4-5", max_tokens=100, system="be kind", messages=messages("hi")
            )
        )
    )
    stream = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages("stream it"), stream=True
    )
    out.append([type(stream).__qualname__, [seen(e) for e in stream]])
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages("helper text stream")
    ) as helper:
        out.append(["text", list(helper.text_stream), seen(helper.get_final_message())])
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages("events")
    ) as helper:
        out.append(["events", [event.type for event in helper]])
    tools = [
        {
            "name": "get_weather",
            "description": "Weather in a city",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages("weather"), tools=tools
    ) as helper:
        out.append(["tool", seen(helper.get_final_message())])
    early = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=100, messages=messages("x y z w"), stream=True
    )
    with early:
        out.append(["early", seen(next(iter(early)))])
    out.append(seen(client.messages.create(model="flaky", max_tokens=10, messages=messages("f"))))
    try:
        client.with_options(max_retries=0).messages.create(
            model="rate-limited", max_tokens=10, messages=messages("r")
        )
    except anthropic.RateLimitError as exc:
        out.append([type(exc).__qualname__, exc.status_code, exc.body])
    return out


def anthropic_async(url: str) -> list[Any]:
    import anthropic

    async def run() -> list[Any]:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=2)
        out: list[Any] = []
        out.append(
            seen(
                await client.messages.create(
                    model="claude-haiku-4-5", max_tokens=50, messages=messages("hi")
                )
            )
        )
        stream = await client.messages.create(
            model="claude-haiku-4-5", max_tokens=50, messages=messages("async"), stream=True
        )
        out.append([seen(e) async for e in stream])
        async with client.messages.stream(
            model="claude-haiku-4-5", max_tokens=50, messages=messages("helper")
        ) as helper:
            out.append(
                [[t async for t in helper.text_stream], seen(await helper.get_final_message())]
            )
        return out

    return asyncio.run(run())


# --- raw responses (with_raw_response / with_streaming_response) --------------------------------


def raw_seen(raw: Any, body: Any) -> dict[str, Any]:
    """What an agent reads off a raw response (an SDK ``APIResponse``), after reading ``body``
    (its ``parse()``, its lines): ``elapsed`` is read last, once the response is read or closed,
    as the SDK allows."""
    elapsed = raw.elapsed
    return {
        "status": raw.status_code,
        "request id": raw.headers.get("x-request-id") or raw.headers.get("request-id"),
        "content type": raw.headers.get("content-type"),
        "request": [raw.http_request.method, raw.http_request.url.path],
        "retries taken": raw.retries_taken,
        "body": seen(body),
        "closed": raw.is_closed,
        "elapsed": [type(elapsed).__name__, elapsed >= datetime.timedelta(0)],
    }


def openai_raw(url: str) -> list[Any]:
    import openai

    client = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
    chat = client.chat.completions
    out: list[Any] = []
    raw = chat.with_raw_response.create(model="gpt-4o", messages=messages("raw"))
    out.append(raw_seen(raw, raw.parse()))
    with chat.with_streaming_response.create(model="gpt-4o", messages=messages("one")) as raw:
        out.append(raw_seen(raw, raw.parse()))
    with chat.with_streaming_response.create(
        model="gpt-4o", messages=messages("lines of a stream"), stream=True
    ) as raw:
        out.append(raw_seen(raw, [line for line in raw.iter_lines() if line]))
    raw = client.responses.with_raw_response.create(model="gpt-4o", input="raw responses")
    out.append(raw_seen(raw, raw.parse()))

    async def run() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0)
        chat = client.chat.completions
        out: list[Any] = []
        raw = await chat.with_raw_response.create(model="gpt-4o", messages=messages("async"))
        out.append(raw_seen(raw, raw.parse()))  # (openai's raw response parses synchronously)
        async with chat.with_streaming_response.create(
            model="gpt-4o", messages=messages("async stream"), stream=True
        ) as raw:
            stream = await raw.parse()  # the SDK's AsyncStream over the response
            out.append(raw_seen(raw, [chunk async for chunk in stream]))
        return out

    return out + asyncio.run(run())


def anthropic_raw(url: str) -> list[Any]:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
    out: list[Any] = []
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=messages("raw")
    )
    out.append(raw_seen(raw, raw.parse()))
    with client.messages.with_streaming_response.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=messages("raw stream"), stream=True
    ) as raw:
        out.append(raw_seen(raw, [line for line in raw.iter_lines() if line]))

    async def run() -> list[Any]:
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
        out: list[Any] = []
        raw = await client.messages.with_raw_response.create(
            model="claude-haiku-4-5", max_tokens=50, messages=messages("async raw")
        )
        # anthropic 0.x hands the async client a legacy raw response whose parse() is not a
        # coroutine; later releases made it one.
        parsed = raw.parse()
        out.append(raw_seen(raw, await parsed if inspect.isawaitable(parsed) else parsed))
        async with client.messages.with_streaming_response.create(
            model="claude-haiku-4-5", max_tokens=50, messages=messages("async one")
        ) as raw:
            out.append(raw_seen(raw, await raw.parse()))
        return out

    return out + asyncio.run(run())


SCENARIOS: dict[str, Callable[[str], list[Any]]] = {
    "openai_sync": openai_sync,
    "openai_async": openai_async,
    "openai_timeout": openai_timeout,
    "anthropic_sync": anthropic_sync,
    "anthropic_async": anthropic_async,
    "openai_raw": openai_raw,
    "anthropic_raw": anthropic_raw,
}


if __name__ == "__main__":
    from agent_runner import main

    sys.exit(main(sys.argv[1:], SCENARIOS))
