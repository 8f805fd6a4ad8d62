"""Memoria for an agent loop: the model's two tools, the memory prompt section, the turn adapter.

`MemoriaTurnAdapter` is a thin layer over the server's ModelToolService: it gives the model's
tools in each provider's shape, renders the memory section of the system prompt, passes the
model's tool calls to the server (which checks, performs and words them) and sends finished
turns to conversation search, every call carrying the turn. `load_tools(shape)` reads the same
tools from the files in the repository's `tools/` (rendered from the server's definition). The
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
