"""An offline, deterministic flight-booking agent that fails the way real agents do.

No keys, no network: the "LLM" is a scripted model that answers in the OpenAI chat-completions
shape and decides from the conversation it is given, so a change to the agent's prompt or tools
changes what it does -- which is what replay is for.

The bug: ``search_flights`` returns every flight, full ones included (``seats_left: 0``). The model
picks the cheapest one, ``book_flight`` refuses it with ``SeatUnavailableError`` (whose message
echoes the booking API key, as real client libraries sometimes do), and the run fails before the
card is charged. Run it::

    python examples/booking_agent.py            # records examples/out/failure.sftrace (and a success)
    stepfork replay examples/out/failure.sftrace --entrypoint examples.booking_agent:run_agent
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

from stepfork_otel import llm_request, record, trace_tool

BOOKING_API_KEY = "sk-proj-Xf3kT9qLmN2pR8sV4wY6zA1bC5dE7gH0jK"  # a fake key that looks real
CARD_TOKEN = "tok_4242_visa_exp1228"


class SeatUnavailableError(RuntimeError):
    """The booking system refused a flight."""


_FLIGHTS: dict[str, list[dict[str, Any]]] = {
    "Paris": [
        {"flight_id": "AF1381", "airline": "Air France", "price_eur": 89, "seats_left": 0},
        {"flight_id": "BA0304", "airline": "British Airways", "price_eur": 112, "seats_left": 7},
        {"flight_id": "U28431", "airline": "easyJet", "price_eur": 134, "seats_left": 3},
    ],
    "London": [
        {"flight_id": "BA0309", "airline": "British Airways", "price_eur": 95, "seats_left": 12},
        {"flight_id": "AF1680", "airline": "Air France", "price_eur": 101, "seats_left": 4},
    ],
}


@trace_tool
def search_flights(city: str, max_results: int = 5) -> list[dict[str, Any]]:
    """Flights to ``city``, cheapest first (full flights included: that is the bug)."""
    flights = sorted(_FLIGHTS.get(city, []), key=lambda f: f["price_eur"])
    return flights[:max_results]


@trace_tool
def book_flight(flight_id: str, passenger: str) -> dict[str, Any]:
    for flights in _FLIGHTS.values():
        for flight in flights:
            if flight["flight_id"] == flight_id:
                if flight["seats_left"] <= 0:
                    raise SeatUnavailableError(
                        f"booking API (key {BOOKING_API_KEY}) refused {flight_id}: no seats left"
                    )
                return {
                    "booking_ref": f"PNR-{flight_id}-01",
                    "flight_id": flight_id,
                    "passenger": passenger,
                    "price_eur": flight["price_eur"],
                }
    raise SeatUnavailableError(f"unknown flight {flight_id}")


@trace_tool(replay_policy="forbidden")  # side-effecting: never replayed automatically
def charge_card(amount: float, card_token: str) -> dict[str, Any]:
    return {"charge_id": "ch_000123", "amount": amount, "status": "captured"}


class ScriptedLLM:
    """A deterministic stand-in for a chat model: reads the conversation, answers with a tool call
    or a final message in the OpenAI chat-completions response shape."""

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        last = messages[-1]
        if last["role"] == "user":
            city = "Paris" if "Paris" in last["content"] else "London"
            return self._tool_call("search_flights", {"city": city})
        result = json.loads(last["content"])
        if last["name"] == "search_flights":
            cheapest = min(result, key=lambda f: f["price_eur"])  # ignores seats_left
            return self._tool_call(
                "book_flight", {"flight_id": cheapest["flight_id"], "passenger": "Ada Lovelace"}
            )
        if last["name"] == "book_flight":
            return self._tool_call("charge_card", {"amount": float(result["price_eur"])})
        return self._answer(f"Booked and paid: {result['status']}.")

    @staticmethod
    def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = {
            "id": f"call_{name}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return {
            "model": "gpt-4.1-mini",
            "choices": [{"message": {"role": "assistant", "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 18},
        }

    @staticmethod
    def _answer(text: str) -> dict[str, Any]:
        return {
            "model": "gpt-4.1-mini",
            "choices": [{"message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 150, "completion_tokens": 9},
        }


TOOLS = [
    {"type": "function", "function": {"name": n}}
    for n in ("search_flights", "book_flight", "charge_card")
]
client = ScriptedLLM()


def run_agent(question: str) -> str:
    """The agent loop: ask the model, run the tool it picks, until it answers."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You book flights. Use the tools."},
        {"role": "user", "content": question},
    ]
    for _ in range(8):
        reply = llm_request(
            provider="openai",
            model="gpt-4.1-mini",
            input={"messages": messages, "tools": TOOLS},
            call=functools.partial(client.complete, messages, TOOLS),
        )
        message = reply["choices"][0]["message"]
        if not message.get("tool_calls"):
            return str(message["content"])
        call = message["tool_calls"][0]["function"]
        args = json.loads(call["arguments"])
        if call["name"] == "search_flights":
            result: Any = search_flights(**args)
        elif call["name"] == "book_flight":
            result = book_flight(**args)
        else:
            result = charge_card(card_token=CARD_TOKEN, **args)
        messages = [
            *messages,
            {"role": "tool", "name": call["name"], "content": json.dumps(result)},
        ]
    raise RuntimeError("agent did not finish in 8 steps")


def main(out_dir: str = "examples/out") -> int:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, question in (
        ("failure", "Book me the cheapest flight to Paris."),
        ("success", "Book me the cheapest flight to London."),
    ):
        path = out / f"{name}.sftrace"
        try:
            with record(
                path,
                input={"question": question},
                name="booking_agent",
                entrypoint="examples.booking_agent:run_agent",
            ) as run:
                run.set_output(run_agent(question))
            print(f"{name}: completed -> {path}")
        except SeatUnavailableError as exc:
            print(f"{name}: failed with {type(exc).__name__} -> {path}")
    print(
        f"\nnext: stepfork replay {out / 'failure.sftrace'} --entrypoint examples.booking_agent:run_agent"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
