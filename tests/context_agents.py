"""Agents whose tools take framework context beside their arguments, as the frameworks' docs show
them, with ``@trace_tool`` under the framework's own decorator and nothing else stepfork-specific:
pydantic-ai's ``ctx: RunContext[...]`` and LangChain's ``config: RunnableConfig``.

No ``from __future__ import annotations`` here: the tools are defined inside the scenarios (the
frameworks are imported only there), and the frameworks read their annotations as objects.

Run as ``python tests/context_agents.py SCENARIO record|replay BUNDLE OUT.json URL``; ``extra``
is every city a tool ran for (empty in a frozen replay).
"""

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepfork_otel import trace_tool

TOOL_RAN: list[str] = []


@dataclass
class Units:
    name: str


def pydantic_ai_ctx(url: str) -> Any:
    from pydantic_ai import Agent, RunContext
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("gpt-4o", provider=OpenAIProvider(base_url=url, api_key="sk-test"))
    agent = Agent(model, deps_type=Units, instructions="Answer with the weather.")

    @agent.tool
    @trace_tool
    def get_weather(ctx: RunContext[Units], city: str) -> str:
        """The weather in a city."""
        TOOL_RAN.append(city)
        return f"sunny in {city}, 21 degrees {ctx.deps.name}"

    return agent.run_sync("What is the weather in Paris?", deps=Units("celsius")).output


def langgraph_config(url: str) -> Any:
    import warnings

    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    @tool
    @trace_tool
    def get_weather(city: str, config: RunnableConfig) -> str:
        """The weather in a city."""
        TOOL_RAN.append(city)
        units = config.get("configurable", {}).get("units", "?")
        return f"sunny in {city}, 21 degrees {units}"

    chat = ChatOpenAI(model="gpt-4o", base_url=url, api_key="sk-test")
    with warnings.catch_warnings():  # LangGraph 1.x points to langchain.agents; same graph
        warnings.simplefilter("ignore")
        graph = create_react_agent(chat, tools=[get_weather])
    state = graph.invoke(
        {"messages": [("user", "What is the weather in Paris?")]},
        config={"configurable": {"units": "celsius"}},
    )
    return [type(m).__name__ + ": " + str(m.content) for m in state["messages"][1:]]


SCENARIOS: dict[str, Callable[[str], Any]] = {
    "pydantic_ai_ctx": pydantic_ai_ctx,
    "langgraph_config": langgraph_config,
}


if __name__ == "__main__":
    from agent_runner import main

    sys.exit(main(sys.argv[1:], SCENARIOS, extra=lambda: TOOL_RAN))
