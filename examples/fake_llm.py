"""A loopback fake of the OpenAI and Anthropic HTTP APIs, for offline examples and tests.

It speaks enough of the wire formats for the real SDKs (and frameworks built on them) to work
unmodified: Chat Completions, Responses and Embeddings (``/v1/chat/completions``,
``/v1/responses``, ``/v1/embeddings``), Anthropic Messages (``/v1/messages``), JSON or
server-sent events when the request says ``"stream": true``, tool calls, and error statuses.

Its answers are deterministic: given tools and no tool result yet, it calls the first tool with
arguments made from the tool's JSON schema (``"Paris"`` for a string, ``2`` for a number); given a
tool result, it answers with it; otherwise it echoes the last user text. Some model names
script failures: ``rate-limited`` (always 429), ``flaky`` (the first request 429, then fine),
``server-error`` (500), ``slow`` (answers after 1 s), ``quirky`` (an OpenAI-compatible server's looser body: a null
``finish_reason``, no ``object``, a float ``created``).

Bound to 127.0.0.1 on a free port; ``requests`` counts what it served.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeLLM"]


def _schema_arguments(schema: Any) -> dict[str, Any]:
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    required = schema.get("required", list(properties)) if isinstance(schema, dict) else []
    out: dict[str, Any] = {}
    for name in required:
        kind = properties.get(name, {}).get("type", "string")
        out[name] = {"string": "Paris", "integer": 2, "number": 2, "boolean": True}.get(kind, "x")
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                value = part.get("text", part.get("content", ""))
                parts.append(value if isinstance(value, str) else _text_of(value))
        return " ".join(p for p in parts if p)
    return ""


class _Plan:
    """What to answer: ``("tool", name, arguments)`` or ``("text", text)``."""

    def __init__(self, kind: str, text: str = "", name: str = "", arguments: Any = None) -> None:
        self.kind, self.text, self.name, self.arguments = kind, text, name, arguments


def _plan(tools: list[dict[str, Any]], tool_result: str | None, last_user: str) -> _Plan:
    if tool_result is not None:
        return _Plan("text", f"Done: {tool_result}")
    if tools:
        name, schema = tools[0]["name"], tools[0]["schema"]
        return _Plan("tool", name=name, arguments=_schema_arguments(schema))
    return _Plan("text", f"You said: {last_user}")


class FakeLLM:
    """``with FakeLLM() as llm: OpenAI(base_url=llm.openai_url, api_key="sk-test")``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._counter = 0
        self._flaky_seen: set[str] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as written, no 40 ms wait

            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else {}
                except ValueError:
                    body = {}
                with fake._lock:
                    fake.requests.append(
                        {"path": self.path, "body": body, "headers": dict(self.headers)}
                    )
                fake._answer(self, self.path.split("?")[0], body)

            def do_GET(self) -> None:
                with fake._lock:
                    fake.requests.append({"path": self.path, "body": None, "headers": {}})
                fake._send_json(self, 200, {"object": "list", "data": [{"id": "gpt-fake"}]})

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                return  # a client that gave up (a timeout test) is not the server's problem

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # --- life ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeLLM:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeLLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._counter += 1
            return f"{prefix}{self._counter:04d}"

    # --- wire ------------------------------------------------------------------------------------

    @staticmethod
    def _send_json(
        handler: BaseHTTPRequestHandler,
        status: int,
        value: Any,
        headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(value).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        handler.send_header("x-request-id", "req_fake")
        for name, val in (headers or {}).items():
            handler.send_header(name, val)
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _send_events(
        handler: BaseHTTPRequestHandler, events: Iterator[tuple[str | None, Any]]
    ) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("transfer-encoding", "chunked")
        handler.end_headers()
        for name, data in events:
            text = data if isinstance(data, str) else json.dumps(data)
            frame = (f"event: {name}\n" if name else "") + f"data: {text}\n\n"
            chunk = frame.encode()
            handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")

    def _failure(self, handler: BaseHTTPRequestHandler, model: str, anthropic: bool) -> bool:
        status = None
        if model == "rate-limited":
            status = 429
        elif model == "server-error":
            status = 500
        elif model == "flaky":
            with self._lock:
                first = model not in self._flaky_seen
                self._flaky_seen.add(model)
            status = 429 if first else None
        if status is None:
            return False
        message = "Rate limit reached" if status == 429 else "The server had an error"
        if anthropic:
            kind = "rate_limit_error" if status == 429 else "api_error"
            body: Any = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            body = {"error": {"message": message, "type": "requests", "code": None}}
        self._send_json(handler, status, body, {"retry-after-ms": "1", "x-should-retry": "true"})
        return True

    def _answer(self, handler: BaseHTTPRequestHandler, path: str, body: dict[str, Any]) -> None:
        model = str(body.get("model", ""))
        anthropic = path.endswith("/messages")
        if model == "slow":  # longer than any client timeout a test sets
            time.sleep(1)
        if self._failure(handler, model, anthropic):
            return
        if path.endswith("/chat/completions"):
            self._chat(handler, body)
        elif path.endswith("/responses"):
            self._responses(handler, body)
        elif path.endswith("/embeddings"):
            self._embeddings(handler, body)
        elif anthropic:
            self._messages(handler, body)
        else:
            self._send_json(handler, 404, {"error": {"message": f"no route {path}"}})

    # --- OpenAI Chat Completions -----------------------------------------------------------------

    def _chat(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        messages = body.get("messages", [])
        tools = [
            {"name": t["function"]["name"], "schema": t["function"].get("parameters", {})}
            for t in body.get("tools", [])
            if t.get("type") == "function"
        ]
        results = [m for m in messages if m.get("role") == "tool"]
        users = [m for m in messages if m.get("role") == "user"]
        plan = _plan(
            tools,
            _text_of(results[-1].get("content")) if results else None,
            _text_of(users[-1].get("content")) if users else "",
        )
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_schema" and plan.kind == "text":
            schema = response_format.get("json_schema", {}).get("schema", {})
            plan = _Plan("text", json.dumps(_schema_arguments(schema)))
        model, rid = body.get("model", ""), self._next_id("chatcmpl-")
        usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        call_id = self._next_id("call_")
        if plan.kind == "tool":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": plan.name, "arguments": json.dumps(plan.arguments)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": plan.text}, "stop"
        quirky = model == "quirky"
        if not body.get("stream"):
            completion: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion",
                "created": 1700000000,
                "model": model,
                "choices": [
                    {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
                ],
                "usage": usage,
            }
            if quirky:
                del completion["object"]
                completion["created"] = 1700000000.5
                completion["choices"][0]["finish_reason"] = None
            self._send_json(handler, 200, completion)
            return

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }

        def events() -> Iterator[tuple[str | None, Any]]:
            yield None, chunk({"role": "assistant", "content": ""})
            if plan.kind == "tool":
                call = message["tool_calls"][0]
                yield (
                    None,
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": plan.name, "arguments": ""},
                                }
                            ]
                        }
                    ),
                )
                arguments = call["function"]["arguments"]
                for piece in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
                    yield (
                        None,
                        chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    )
            else:
                for word in plan.text.split(" "):
                    yield None, chunk({"content": word + " "})
            yield None, chunk({}, finish)
            if body.get("stream_options", {}).get("include_usage"):
                final = chunk({})
                final["choices"], final["usage"] = [], usage
                yield None, final
            yield None, "[DONE]"

        self._send_events(handler, events())

    # --- OpenAI Responses ------------------------------------------------------------------------

    def _responses(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        items = body.get("input", [])
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        tools = [
            {"name": t["name"], "schema": t.get("parameters", {})}
            for t in body.get("tools", [])
            if t.get("type") == "function"
        ]
        results = [i for i in items if i.get("type") == "function_call_output"]
        users = [i for i in items if i.get("role") == "user"]
        plan = _plan(
            tools,
            str(results[-1].get("output")) if results else None,
            _text_of(users[-1].get("content")) if users else "",
        )
        rid, model = self._next_id("resp_"), body.get("model", "")
        if plan.kind == "tool":
            item: dict[str, Any] = {
                "type": "function_call",
                "id": self._next_id("fc_"),
                "call_id": self._next_id("call_"),
                "name": plan.name,
                "arguments": json.dumps(plan.arguments),
                "status": "completed",
            }
        else:
            item = {
                "type": "message",
                "id": self._next_id("msg_"),
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": plan.text, "annotations": []}],
            }
        response = {
            "id": rid,
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": model,
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools", []),
            "usage": {
                "input_tokens": 12,
                "output_tokens": 6,
                "total_tokens": 18,
                "input_tokens_details": {"cached_tokens": 4},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        if not body.get("stream"):
            self._send_json(handler, 200, response)
            return

        def events() -> Iterator[tuple[str | None, Any]]:
            seq = iter(range(1000))
            started = dict(response, status="in_progress", output=[], usage=None)
            yield (
                "response.created",
                {
                    "type": "response.created",
                    "response": started,
                    "sequence_number": next(seq),
                },
            )
            added = dict(item, status="in_progress")
            if item["type"] == "message":
                added["content"] = []
            elif item["type"] == "function_call":
                added["arguments"] = ""
            yield (
                "response.output_item.added",
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": added,
                    "sequence_number": next(seq),
                },
            )
            if item["type"] == "message":
                text = item["content"][0]["text"]
                part = {"type": "output_text", "text": "", "annotations": []}
                yield (
                    "response.content_part.added",
                    {
                        "type": "response.content_part.added",
                        "item_id": item["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "part": part,
                        "sequence_number": next(seq),
                    },
                )
                for word in text.split(" "):
                    yield (
                        "response.output_text.delta",
                        {
                            "type": "response.output_text.delta",
                            "item_id": item["id"],
                            "output_index": 0,
                            "content_index": 0,
                            "delta": word + " " if word != text.split(" ")[-1] else word,
                            "logprobs": [],
                            "sequence_number": next(seq),
                        },
                    )
                yield (
                    "response.output_text.done",
                    {
                        "type": "response.output_text.done",
                        "item_id": item["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "text": text,
                        "logprobs": [],
                        "sequence_number": next(seq),
                    },
                )
                yield (
                    "response.content_part.done",
                    {
                        "type": "response.content_part.done",
                        "item_id": item["id"],
                        "output_index": 0,
                        "content_index": 0,
                        "part": item["content"][0],
                        "sequence_number": next(seq),
                    },
                )
            else:
                yield (
                    "response.function_call_arguments.delta",
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": 0,
                        "delta": item["arguments"],
                        "sequence_number": next(seq),
                    },
                )
                yield (
                    "response.function_call_arguments.done",
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item["id"],
                        "output_index": 0,
                        "arguments": item["arguments"],
                        "name": item["name"],
                        "sequence_number": next(seq),
                    },
                )
            yield (
                "response.output_item.done",
                {
                    "type": "response.output_item.done",
                    "output_index": 0,
                    "item": item,
                    "sequence_number": next(seq),
                },
            )
            yield (
                "response.completed",
                {
                    "type": "response.completed",
                    "response": response,
                    "sequence_number": next(seq),
                },
            )

        self._send_events(handler, events())

    # --- OpenAI Embeddings -----------------------------------------------------------------------

    def _embeddings(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        inputs = body.get("input", [])
        inputs = [inputs] if isinstance(inputs, str) else inputs
        data = []
        for index, text in enumerate(inputs):
            vector = [round((len(str(text)) + i) / 10, 3) for i in range(4)]
            embedding: Any = vector
            if body.get("encoding_format") == "base64":
                embedding = base64.b64encode(struct.pack("<4f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        self._send_json(
            handler,
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", ""),
                "usage": {"prompt_tokens": 3 * len(inputs), "total_tokens": 3 * len(inputs)},
            },
        )

    # --- Anthropic Messages ----------------------------------------------------------------------

    def _messages(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        messages = body.get("messages", [])
        tools = [
            {"name": t["name"], "schema": t.get("input_schema", {})} for t in body.get("tools", [])
        ]
        tool_result = None
        last_user = ""
        for message in messages:
            content = message.get("content")
            if message.get("role") != "user":
                continue
            blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
            results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
            if results:
                tool_result = _text_of(results[-1].get("content"))
            else:
                tool_result, last_user = None, _text_of(content)
        plan = _plan(tools, tool_result, last_user)
        rid, model = self._next_id("msg_"), body.get("model", "")
        if plan.kind == "tool":
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": self._next_id("toolu_"),
                "name": plan.name,
                "input": plan.arguments,
            }
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": plan.text}, "end_turn"
        usage = {
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_read_input_tokens": 3,
            "cache_creation_input_tokens": 2,
        }
        message_out = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            self._send_json(handler, 200, message_out)
            return

        def events() -> Iterator[tuple[str | None, Any]]:
            start = dict(
                message_out, content=[], stop_reason=None, usage=dict(usage, output_tokens=1)
            )
            yield "message_start", {"type": "message_start", "message": start}
            empty = (
                {"type": "text", "text": ""} if block["type"] == "text" else dict(block, input={})
            )
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": empty},
            )
            yield "ping", {"type": "ping"}
            if block["type"] == "text":
                for word in plan.text.split(" "):
                    yield (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": word + " "},
                        },
                    )
            else:
                arguments = json.dumps(block["input"])
                for piece in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
                    yield (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
            yield "content_block_stop", {"type": "content_block_stop", "index": 0}
            yield (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                },
            )
            yield "message_stop", {"type": "message_stop"}

        self._send_events(handler, events())
