"""Memoria for the OpenAI Agents SDK: the model's two tools, and instructions ending in memory.

A thin layer over the turn adapter (memoria_client.MemoriaTurnAdapter), which passes every call
to the server with the current turn: `memoria_tools(memory)` gives the server's tools as the
SDK's FunctionTools, each handing the model's raw JSON arguments to `memory.execute` and
returning exactly the server's text; `memoria_instructions(base, memory)` gives the agent's
dynamic instructions, `base` followed by the memory section (last, so a changed block costs
only the end of the provider's prompt cache). The SDK asks for the instructions before each
model call, so a model that writes in one step sees the saved block in the next. The backend
starts each turn with `memory.start_turn(...)` before `Runner.run` and finishes it with
`memory.finish_turn(question, answer)` after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper, Tool
from agents.tool_context import ToolContext

from memoria_client import MemoriaTurnAdapter

__all__ = ["memoria_instructions", "memoria_tools"]


def memoria_tools(memory: MemoriaTurnAdapter) -> list[Tool]:
    """The server's two tools (memory_rewrite, conversation_search) as FunctionTools.

    The definitions are the adapter's Responses-API shape (names, descriptions, JSON Schemas
    and strict flags as the server gives them). The SDK passes the arguments as the model wrote
    them; the server checks them and words every outcome, so nothing is validated here.
    """
    return [_function_tool(memory, spec) for spec in memory.tools("openai_responses")]


def _function_tool(memory: MemoriaTurnAdapter, spec: dict[str, Any]) -> FunctionTool:
    name = str(spec["name"])

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        # The adapter is synchronous (grpc); a thread keeps the event loop free meanwhile.
        result = await asyncio.to_thread(memory.execute, name, arguments)
        return result.text

    return FunctionTool(
        name=name,
        description=str(spec["description"]),
        params_json_schema=spec["parameters"],
        on_invoke_tool=invoke,
        strict_json_schema=bool(spec["strict"]),
    )


def memoria_instructions(
    base: str, memory: MemoriaTurnAdapter
) -> Callable[[RunContextWrapper[Any], Agent[Any]], Awaitable[str]]:
    """The agent's instructions: `base`, then the memory section rendered for the current turn."""

    async def instructions(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        return f"{base}\n\n{await asyncio.to_thread(memory.prompt_section)}"

    return instructions
