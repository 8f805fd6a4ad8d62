"""The tool definitions as shipped in the repository's `tools/` directory, and their renderer.

`tools/memoria_tools.json` is the one definition of the model's tools (names, descriptions,
JSON Schema of the arguments). The three shapes callers paste into a provider's request are
rendered from it by `render` (run by `scripts/render-tools.py`) and committed, so a caller in any
language reads a plain JSON file; a test fails when a committed file differs from a fresh
rendering. The package carries the same files (`memoria_client/tools` is that directory).
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Literal, get_args

Shape = Literal["openai_chat_completions", "openai_responses", "anthropic_messages"]
SHAPES: tuple[Shape, ...] = get_args(Shape)

SOURCE_FILE = "memoria_tools.json"
SYSTEM_PROMPT_FILE = "system_prompt.md"


def tools_dir() -> Traversable:
    """The directory holding the tool files (inside the installed package)."""
    return resources.files("memoria_client") / "tools"


def load_source() -> list[dict[str, Any]]:
    """The tool definitions: each a dict with `name`, `description` and `parameters`."""
    tools: list[dict[str, Any]] = json.loads((tools_dir() / SOURCE_FILE).read_text("utf-8"))[
        "tools"
    ]
    return tools


def load_tools(shape: Shape) -> list[dict[str, Any]]:
    """The `tools` list to send to a provider, in the shape its API expects."""
    if shape not in SHAPES:
        raise ValueError(f"unknown tool shape {shape!r}; expected one of {', '.join(SHAPES)}")
    tools: list[dict[str, Any]] = json.loads((tools_dir() / f"{shape}.json").read_text("utf-8"))
    return tools


def base_system_prompt() -> str:
    """The memory instructions that belong in the system prompt (without the block)."""
    return (tools_dir() / SYSTEM_PROMPT_FILE).read_text("utf-8").strip()


def strict_compatible(parameters: dict[str, Any]) -> bool:
    """Whether OpenAI's strict mode accepts the schema: every property required, no others.

    Strict mode (guaranteed schema adherence) rejects a schema with an optional property, so a
    tool with one (conversation_search's `max_turns`) is sent with `strict: false`, explicitly:
    the Responses API otherwise defaults to strict and refuses the request.
    """
    properties = set(parameters.get("properties", {}))
    return (
        parameters.get("additionalProperties") is False
        and set(parameters.get("required", [])) == properties
    )


def render(shape: Shape, source: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One provider's `tools` list from the source definitions."""
    out: list[dict[str, Any]] = []
    for tool in source:
        name, description, parameters = tool["name"], tool["description"], tool["parameters"]
        if shape == "openai_chat_completions":
            function = {
                "name": name,
                "description": description,
                "parameters": parameters,
                "strict": strict_compatible(parameters),
            }
            out.append({"type": "function", "function": function})
        elif shape == "openai_responses":
            out.append(
                {
                    "type": "function",
                    "name": name,
                    "description": description,
                    "parameters": parameters,
                    "strict": strict_compatible(parameters),
                }
            )
        elif shape == "anthropic_messages":
            out.append({"name": name, "description": description, "input_schema": parameters})
        else:
            raise ValueError(f"unknown tool shape {shape!r}")
    return out


def dumps(tools: list[dict[str, Any]]) -> str:
    """The file text of a rendered shape (stable, so a stale file shows as a diff)."""
    return json.dumps(tools, indent=2, ensure_ascii=False) + "\n"
