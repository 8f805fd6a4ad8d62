"""Memoria for an agent loop: the model's two tools, the memory prompt section, the turn adapter.

`load_tools(shape)` gives the tool definitions to send to a provider; `MemoriaTurnAdapter` renders
the memory section of the system prompt, executes the model's tool calls against a Memoria server
and words every outcome for the model, and sends finished turns to conversation search. The
generated stubs come with the package (`memoria.v1`); it needs only the gRPC packages.
"""

from memoria_client.adapter import MemoriaTurnAdapter, ToolResult
from memoria_client.tool_files import SHAPES, Shape, base_system_prompt, load_tools

__all__ = [
    "SHAPES",
    "MemoriaTurnAdapter",
    "Shape",
    "ToolResult",
    "base_system_prompt",
    "load_tools",
]
