"""Agents built with frameworks, as their docs show, with zero stepfork-specific code besides
``instrument_openai()``/``instrument_anthropic()`` and ``@trace_tool`` on the tools.

Run as ``python tests/framework_agents.py SCENARIO record|replay BUNDLE OUT.json URL``; the output
is the agent's final answer and every tool call it made (the tool's own log, which stays empty in
a frozen replay because tools are served from the recording).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from stepfork_otel import trace_tool

TOOL_RAN: list[str] = []


@trace_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    TOOL_RAN.append(city)
    return f"sunny in {city}"


def pydantic_ai_openai(url: str) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=url, api_key="sk-test"))
    agent = Agent(model, instructions="Answer with the weather.", tools=[get_weather])
    return agent.run_sync("What is the weather in Paris?").output


def pydantic_ai_anthropic(url: str) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    model = AnthropicModel(
        "claude-sonnet-4-5", provider=AnthropicProvider(base_url=url, api_key="sk-ant-test")
    )
    agent = Agent(model, instructions="Answer with the weather.", tools=[get_weather])
    return agent.run_sync("What is the weather in Paris?").output


def pydantic_ai_stream(url: str) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=url, api_key="sk-test"))
    agent = Agent(model, instructions="Be brief.")

    async def run() -> list[str]:
        async with agent.run_stream("Say hello") as result:
            return [text async for text in result.stream_text(delta=True)]

    return asyncio.run(run())


def _langgraph(chat_model: Any) -> Any:
    import warnings

    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():  # LangGraph 1.x points to langchain.agents; same graph
        warnings.simplefilter("ignore")
        graph = create_react_agent(chat_model, tools=[tool(get_weather)])
    state = graph.invoke({"messages": [("user", "What is the weather in Paris?")]})
    return [type(m).__name__ + ": " + str(m.content) for m in state["messages"][1:]]


def langgraph_openai(url: str) -> Any:
    from langchain_openai import ChatOpenAI

    return _langgraph(ChatOpenAI(model="gpt-4o", base_url=url, api_key="sk-test"))


def langgraph_anthropic(url: str) -> Any:
    from langchain_anthropic import ChatAnthropic

    return _langgraph(ChatAnthropic(model="claude-sonnet-4-5", base_url=url, api_key="sk-ant-test"))


def openai_agents(url: str) -> Any:
    from agents import (
        Agent,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the Agents SDK exports its own traces to OpenAI otherwise
    client = AsyncOpenAI(base_url=url, api_key="sk-test")
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[function_tool(get_weather)],
        model=OpenAIResponsesModel(model="gpt-4o", openai_client=client),
    )
    return Runner.run_sync(agent, "What is the weather in Paris?").final_output


SCENARIOS: dict[str, Callable[[str], Any]] = {
    "pydantic_ai_openai": pydantic_ai_openai,
    "pydantic_ai_anthropic": pydantic_ai_anthropic,
    "pydantic_ai_stream": pydantic_ai_stream,
    "langgraph_openai": langgraph_openai,
    "langgraph_anthropic": langgraph_anthropic,
    "openai_agents": openai_agents,
}


if __name__ == "__main__":
    from agent_runner import main

    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    sys.exit(main(sys.argv[1:], SCENARIOS, extra=lambda: TOOL_RAN))
