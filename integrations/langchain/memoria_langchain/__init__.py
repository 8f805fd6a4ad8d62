"""Memoria for LangChain and LangGraph: the model's two tools as LangChain tools.

A thin layer over the turn adapter (memoria_client.MemoriaTurnAdapter), which passes every call
to the server with the current turn. `memoria_tools(memory)` gives the server's tools as
StructuredTools (for `llm.bind_tools(...)` and LangGraph's ToolNode): each passes the model's
arguments to `memory.execute` and returns exactly the server's text, as a ToolMessage with
status "error" when the call did not do what was asked. The arguments are not validated here
(the JSON Schema is the server's, given as a dict): the server checks them and words every
outcome. The backend starts each turn with `memory.start_turn(...)`, ends the system prompt
with `memory.prompt_section()`, and finishes the turn with `memory.finish_turn(question,
answer)`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from langchain_core.tools import StructuredTool, ToolException

from memoria_client import MemoriaTurnAdapter

__all__ = ["memoria_tools"]


def memoria_tools(memory: MemoriaTurnAdapter) -> list[StructuredTool]:
    """The server's two tools (memory_rewrite, conversation_search) as StructuredTools."""
    return [
        _structured_tool(memory, tool.name, tool.description, tool.parameters_json_schema)
        for tool in memory.model_tools.tools
    ]


def _structured_tool(
    memory: MemoriaTurnAdapter, name: str, description: str, schema: str
) -> StructuredTool:
    def run(**arguments: Any) -> str:
        result = memory.execute(name, arguments)
        if result.is_error:
            # handle_tool_error=True turns this into a ToolMessage with status "error" whose
            # content is the text, unchanged: the model reads the server's words either way.
            raise ToolException(result.text)
        return result.text

    async def arun(**arguments: Any) -> str:
        # The adapter is synchronous (grpc); a thread keeps the event loop free meanwhile.
        return await asyncio.to_thread(run, **arguments)

    return StructuredTool(
        name=name,
        description=description,
        args_schema=json.loads(schema),
        func=run,
        coroutine=arun,
        handle_tool_error=True,
    )
