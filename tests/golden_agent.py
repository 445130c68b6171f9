"""A small deterministic dinner-planning agent: the code the golden bundles (``tests/golden/``)
were recorded from, and the code the replay tests run against them.

No network, no clock, no randomness (but for ``run_dated_agent``, which reads them the way a
recording with ``capture=`` replays): the "LLMs" are scripted and decide from the request they are
given, so a changed prompt or tool changes what the agent does -- which is what replay must catch.
It exercises what replay has to handle:

* an LLM (``scripted/planner-1``) that answers with tool calls in the OpenAI chat shape, once with
  two tool calls in one turn (two tool calls back to back: the "order" case);
* tools returning a pydantic model with a ``datetime`` (``lookup_weather``), a ``float``
  (``convert_currency``) and a dataclass with ``bytes`` (``research``);
* a tool whose body makes its own LLM call (``research`` -> ``scripted/summariser-1``): nesting;
* a tool that fails (``book_table`` in Porto), with a secret in its error message;
* a variant of ``lookup_weather`` with another default (``units="imperial"``): argument drift;
* an async twin of the whole agent (``allm_request``, async tools, two tools run concurrently).

``BODY_CALLS`` counts every dependency body that really ran, so tests can prove a body did not.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from stepfork_otel import allm_request, canonical_json, llm_request, trace_tool

PROMPT = "You plan dinners. Use the tools."
IMPERIAL_PROMPT = "You plan dinners for guests from the US. Use imperial units."
RESERVATION_TOKEN = "sk-proj-R3s3rv4t10nT0k3nF4k3xYz0123456789"  # fake, looks real
PLANNER = ("scripted", "planner-1")
SUMMARISER = ("scripted", "summariser-1")

#: How many times each dependency body really ran (reset by the tests).
BODY_CALLS: Counter[str] = Counter()

_RESTAURANTS = {"Lisbon": ("Taberna do Mar", 3), "Porto": ("Cantinho do Avillez", 0)}
_TEMPERATURE_C = {"Lisbon": 21.5, "Porto": 17.0}
_OBSERVED_AT = datetime(2025, 5, 17, 18, 30, tzinfo=timezone.utc)


class TableUnavailableError(RuntimeError):
    """The reservation system refused the booking."""


class Weather(BaseModel):
    city: str
    temperature: float
    units: str
    observed_at: datetime


class Summary(BaseModel):
    text: str
    tokens: int


@dataclass
class Notes:
    topic: str
    summary: str
    digest: bytes


def _city(text: str) -> str:
    return "Porto" if "Porto" in text else "Lisbon"


def _weather(city: str, units: str) -> Weather:
    BODY_CALLS["lookup_weather"] += 1
    celsius = _TEMPERATURE_C[city]
    temperature = celsius if units == "metric" else round(celsius * 9 / 5 + 32, 1)
    return Weather(city=city, temperature=temperature, units=units, observed_at=_OBSERVED_AT)


def _book(restaurant: str, party: int) -> dict[str, Any]:
    BODY_CALLS["book_table"] += 1
    for name, tables in _RESTAURANTS.values():
        if name == restaurant:
            if tables <= 0:
                raise TableUnavailableError(
                    f"reservation API (token {RESERVATION_TOKEN}) refused {restaurant}: "
                    f"no table for {party}"
                )
            return {"restaurant": restaurant, "party": party, "reference": "TBL-0042"}
    raise TableUnavailableError(f"unknown restaurant {restaurant}")


# --- the scripted models ---------------------------------------------------------------------------


def _tool_call(name: str, arguments: dict[str, Any], n: int = 1) -> dict[str, Any]:
    return {
        "id": f"call_{name}_{n}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, sort_keys=True)},
    }


def _reply(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": PLANNER[1],
        "choices": [{"message": {"role": "assistant", **message}}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20},
    }


def plan(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The planner: reads the conversation, answers with tool calls or a final message."""
    BODY_CALLS["planner-1"] += 1
    last = messages[-1]
    if last["role"] == "user":
        city = _city(last["content"])
        arguments: dict[str, Any] = {"city": city}
        if "imperial" in messages[0]["content"]:
            arguments["units"] = "imperial"
        return _reply({"tool_calls": [_tool_call("lookup_weather", arguments)]})
    if last["name"] == "lookup_weather":
        city = json.loads(last["content"])["city"]
        return _reply(
            {
                "tool_calls": [
                    _tool_call(
                        "convert_currency", {"amount": 40.0, "source": "EUR", "target": "USD"}
                    ),
                    _tool_call("research", {"topic": f"dinner in {city}"}, 2),
                ]
            }
        )
    if last["name"] == "research":
        city = _city(json.loads(last["content"])["topic"])
        restaurant = _RESTAURANTS[city][0]
        return _reply(
            {"tool_calls": [_tool_call("book_table", {"restaurant": restaurant, "party": 2})]}
        )
    booking = json.loads(last["content"])
    return _reply({"content": f"Booked {booking['restaurant']}, reference {booking['reference']}."})


def summarise(topic: str) -> Summary:
    BODY_CALLS["summariser-1"] += 1
    return Summary(text=f"Three well-reviewed places for {topic}.", tokens=9)


TOOLS = [
    {"type": "function", "function": {"name": n}}
    for n in ("lookup_weather", "convert_currency", "research", "book_table")
]


# --- sync tools ------------------------------------------------------------------------------------


@trace_tool
def lookup_weather(city: str, units: str = "metric") -> Weather:
    return _weather(city, units)


@trace_tool(name="lookup_weather")
def lookup_weather_imperial_default(city: str, units: str = "imperial") -> Weather:
    """The same tool after someone changed its default: argument drift."""
    return _weather(city, units)


@trace_tool
def convert_currency(amount: float, source: str, target: str) -> float:
    BODY_CALLS["convert_currency"] += 1
    return round(amount * 1.08, 2) if (source, target) == ("EUR", "USD") else amount


@trace_tool
def research(topic: str) -> Notes:
    BODY_CALLS["research"] += 1
    summary = llm_request(
        provider=SUMMARISER[0],
        model=SUMMARISER[1],
        input={"task": "summarise", "topic": topic},
        call=functools.partial(summarise, topic),
        response_type=Summary,
    )
    digest = hashlib.sha256(summary.text.encode()).digest()[:6] + b"\xff\x00"
    return Notes(topic=topic, summary=summary.text, digest=digest)


@trace_tool
def book_table(restaurant: str, party: int) -> dict[str, Any]:
    return _book(restaurant, party)


def run_dinner_agent(
    question: str, *, system_prompt: str = PROMPT, drifted_default: bool = False
) -> str:
    """The agent loop: ask the planner, run the tools it picks, until it answers."""
    weather_tool = lookup_weather_imperial_default if drifted_default else lookup_weather
    tools: dict[str, Any] = {
        "lookup_weather": weather_tool,
        "convert_currency": convert_currency,
        "research": research,
        "book_table": book_table,
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": question},
    ]
    for _ in range(6):
        reply = llm_request(
            provider=PLANNER[0],
            model=PLANNER[1],
            input={"messages": messages, "tools": TOOLS},
            call=functools.partial(plan, list(messages)),
        )
        message = reply["choices"][0]["message"]
        if not message.get("tool_calls"):
            return str(message["content"])
        for call in message["tool_calls"]:
            name = call["function"]["name"]
            result = tools[name](**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "name": name, "content": canonical_json(result)})
    raise RuntimeError("the agent did not finish in 6 turns")


def run_dated_agent(question: str) -> str:
    """The agent with the date, a request id and a random greeting in its system prompt, as real
    agents have: the golden run recorded with ``capture=("time", "uuid", "random")``, replayed
    with the values it read then."""
    today = datetime.now(timezone.utc).date().isoformat()
    request = str(uuid.uuid4())
    greeting = random.choice(["Hello", "Hi", "Welcome"])
    prompt = f"{PROMPT} {greeting}, today is {today} (request {request})."
    return run_dinner_agent(question, system_prompt=prompt)


# --- the async twin --------------------------------------------------------------------------------


@trace_tool(name="lookup_weather")
async def alookup_weather(city: str, units: str = "metric") -> Weather:
    await asyncio.sleep(0)
    return _weather(city, units)


@trace_tool(name="convert_currency")
async def aconvert_currency(amount: float, source: str, target: str) -> float:
    await asyncio.sleep(0)  # research starts while this one is still running
    BODY_CALLS["convert_currency"] += 1
    return round(amount * 1.08, 2) if (source, target) == ("EUR", "USD") else amount


async def _asummarise(topic: str) -> Summary:
    await asyncio.sleep(0)
    return summarise(topic)


async def _aplan(messages: list[dict[str, Any]]) -> dict[str, Any]:
    await asyncio.sleep(0)
    return plan(messages)


@trace_tool(name="research")
async def aresearch(topic: str) -> Notes:
    BODY_CALLS["research"] += 1
    summary = await allm_request(
        provider=SUMMARISER[0],
        model=SUMMARISER[1],
        input={"task": "summarise", "topic": topic},
        call=functools.partial(_asummarise, topic),
        response_type=Summary,
    )
    digest = hashlib.sha256(summary.text.encode()).digest()[:6] + b"\xff\x00"
    return Notes(topic=topic, summary=summary.text, digest=digest)


@trace_tool(name="book_table")
async def abook_table(restaurant: str, party: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return _book(restaurant, party)


async def run_dinner_agent_async(question: str, *, system_prompt: str = PROMPT) -> str:
    """The async agent: the tool calls of one turn run concurrently (``asyncio.gather``)."""
    tools: dict[str, Any] = {
        "lookup_weather": alookup_weather,
        "convert_currency": aconvert_currency,
        "research": aresearch,
        "book_table": abook_table,
    }
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": question},
    ]
    for _ in range(6):
        reply = await allm_request(
            provider=PLANNER[0],
            model=PLANNER[1],
            input={"messages": messages, "tools": TOOLS},
            call=functools.partial(_aplan, list(messages)),
        )
        message = reply["choices"][0]["message"]
        if not message.get("tool_calls"):
            return str(message["content"])
        calls = message["tool_calls"]
        results = await asyncio.gather(
            *(tools[c["function"]["name"]](**json.loads(c["function"]["arguments"])) for c in calls)
        )
        for call, result in zip(calls, results, strict=True):
            messages.append(
                {
                    "role": "tool",
                    "name": call["function"]["name"],
                    "content": canonical_json(result),
                }
            )
    raise RuntimeError("the agent did not finish in 6 turns")


LISBON = "Plan dinner in Lisbon for 2 and book a table."
PORTO = "Plan dinner in Porto for 2 and book a table."
