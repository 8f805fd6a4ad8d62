"""The tool files in tools/: one source, three provider shapes in sync, valid JSON Schema, fresh.

Its argument samples (valid or not by the schema) are also those with which
tests/unit/test_tool_calls.py checks the server's argument checks.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs here

from memoria_client import SHAPES, load_tools
from memoria_client.tool_files import (
    Shape,
    dumps,
    load_source,
    render,
    strict_compatible,
    tools_dir,
)

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"
# Both providers: ^[a-zA-Z0-9_-]{1,64}$ for a function/tool name.
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def source() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads((TOOLS / "memoria_tools.json").read_text())["tools"]
    return tools


def flat(shape: str, tool: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """(name, description, parameters) of one rendered tool, whatever its shape."""
    if shape == "openai_chat_completions":
        function = tool["function"]
        return function["name"], function["description"], function["parameters"]
    if shape == "openai_responses":
        return tool["name"], tool["description"], tool["parameters"]
    return tool["name"], tool["description"], tool["input_schema"]


def test_the_package_carries_the_repository_tool_files() -> None:
    assert Path(str(tools_dir())).resolve() == TOOLS
    assert load_source() == source()


def test_exactly_the_two_tools_and_no_delete() -> None:
    assert [tool["name"] for tool in source()] == ["memory_rewrite", "conversation_search"]
    assert not any("delete" in tool["name"] for tool in source())


@pytest.mark.parametrize("shape", SHAPES)
def test_rendered_file_is_fresh(shape: Shape) -> None:
    path = TOOLS / f"{shape}.json"
    assert path.read_text("utf-8") == dumps(render(shape, source())), (
        f"{path.name} is stale: run scripts/render-tools.py"
    )


def test_render_script_check_passes_on_the_committed_files() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render-tools.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes_carry_the_same_names_descriptions_and_parameters(shape: Shape) -> None:
    rendered = [flat(shape, tool) for tool in load_tools(shape)]
    assert rendered == [(t["name"], t["description"], t["parameters"]) for t in source()]


def test_chat_completions_shape() -> None:
    for tool in load_tools("openai_chat_completions"):
        assert set(tool) == {"type", "function"}
        assert tool["type"] == "function"
        assert set(tool["function"]) == {"name", "description", "parameters", "strict"}
        assert NAME.match(tool["function"]["name"])


def test_responses_shape() -> None:
    for tool in load_tools("openai_responses"):
        assert set(tool) == {"type", "name", "description", "parameters", "strict"}
        assert tool["type"] == "function"
        assert NAME.match(tool["name"])


def test_anthropic_shape() -> None:
    for tool in load_tools("anthropic_messages"):
        assert set(tool) == {"name", "description", "input_schema"}
        assert NAME.match(tool["name"])
        assert tool["input_schema"]["type"] == "object"


@pytest.mark.parametrize("shape", ["openai_chat_completions", "openai_responses"])
def test_strict_is_claimed_only_where_openai_accepts_it(shape: Shape) -> None:
    # Strict mode requires every property in `required` and additionalProperties false.
    strict = {}
    for tool in load_tools(shape):
        body = tool.get("function", tool)
        params = body["parameters"]
        if body["strict"]:
            assert params["additionalProperties"] is False
            assert set(params["required"]) == set(params["properties"])
        strict[body["name"]] = body["strict"]
    assert strict == {"memory_rewrite": True, "conversation_search": False}


def test_strict_compatible_refuses_optional_properties() -> None:
    base = {"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": False}
    assert strict_compatible({**base, "required": ["a", "b"]})
    assert not strict_compatible({**base, "required": ["a"]})
    assert not strict_compatible({**base, "required": ["a", "b"], "additionalProperties": True})


@pytest.mark.parametrize("tool", source(), ids=lambda t: t["name"])
def test_parameters_are_valid_json_schema_objects(tool: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(tool["parameters"])
    assert tool["parameters"]["type"] == "object"
    assert tool["parameters"]["additionalProperties"] is False


REWRITE_SAMPLES: list[tuple[object, bool]] = [
    ({"text": "Preferred name: Ana"}, True),
    ({"text": ""}, True),  # valid shape; the server refuses it as BLOCK_EMPTY
    ({}, False),
    ({"text": 42}, False),
    ({"text": None}, False),
    ({"text": ["a"]}, False),
    ({"text": "a", "mode": "append"}, False),
    ({"lines": ["a"]}, False),
    (["text"], False),
]
SEARCH_SAMPLES: list[tuple[object, bool]] = [
    ({"query": "acct-4821"}, True),
    ({"query": "refund", "max_turns": 1}, True),
    ({"query": "refund", "max_turns": 50}, True),
    ({"query": "refund", "max_turns": 5.0}, True),
    ({"query": "refund", "max_turns": 0}, False),
    ({"query": "refund", "max_turns": 51}, False),
    ({"query": "refund", "max_turns": 2.5}, False),
    ({"query": "refund", "max_turns": "5"}, False),
    ({"query": "refund", "max_turns": True}, False),
    ({"query": "refund", "max_turns": None}, False),
    ({"query": ""}, False),
    ({}, False),
    ({"max_turns": 3}, False),
    ({"query": 7}, False),
    ({"query": "refund", "page_size": 5}, False),
    ({"query": "refund", "conversation_id": "conv-0"}, True),
    ({"query": "refund", "conversation_id": ""}, False),
    ({"query": "refund", "conversation_id": 7}, False),
    ({"query": "refund", "start_time": "2026-03-01", "end_time": "2026-04-01"}, True),
    ({"query": "refund", "start_time": "2026-03-01T09:00:00Z"}, True),
    ({"query": "refund", "start_time": "2026-03-01t09:00:00.123456z"}, True),
    ({"query": "refund", "end_time": "2026-03-01 09:00+01:00"}, True),
    ({"query": "refund", "end_time": "2026-03-01T09:00:00,5-05:30"}, True),
    ({"query": "refund", "start_time": "2026-03-01T09:00"}, True),
    ({"query": "refund", "start_time": "last week"}, False),
    ({"query": "refund", "start_time": "20260301"}, False),
    ({"query": "refund", "start_time": "2026-03-01T09"}, False),
    ({"query": "refund", "start_time": "2026-03-01T09:00:00+0100"}, False),
    ({"query": "refund", "start_time": " 2026-03-01"}, False),
    ({"query": "refund", "end_time": 1772323200}, False),
    ({"query": "refund", "end_time": None}, False),
]
"""A pattern cannot say how many days a month has: 2026-02-30 matches the schema's and is
refused by the call (tests/unit/test_tool_calls.py)."""


# The design's rules (DESIGN 2 and 3) each appear in the model-facing text: a phrase per rule.
REWRITE_RULES = [
    "entire block",  # send the whole block
    "Start from the block as shown, edit it, send all of it back",
    "instead of adding a near-duplicate",
    "merge duplicates and drop stale lines in the same write",
    "same turn in which you say you will remember",
    "current-user lookup",
    "whole login address",
    "never a guessed or near-spelled id",
    "one date, one ticket or one question",
    "check every removal was intended",
]


def test_memory_rewrite_description_carries_the_rules() -> None:
    description = source()[0]["description"]
    missing = [rule for rule in REWRITE_RULES if rule not in description]
    assert not missing


def test_search_description_says_when_to_search() -> None:
    description = source()[1]["description"]
    assert "only when the question points back to an earlier conversation" in description


def test_search_description_says_dates_come_from_the_current_date_in_the_prompt() -> None:
    (search,) = [t for t in source() if t["name"] == "conversation_search"]
    assert "worked out from the current date your instructions give" in search["description"]
    start = search["parameters"]["properties"]["start_time"]["description"]
    assert "RFC 3339 / ISO 8601" in start and "inclusive" in start
    assert "exclusive" in search["parameters"]["properties"]["end_time"]["description"]


def test_descriptions_stay_compact() -> None:
    # Models read every description on every turn: a budget keeps them from growing unnoticed.
    assert len(source()[0]["description"]) < 1600
    assert len(source()[1]["description"]) < 600


def test_system_prompt_section_names_the_tools_and_the_same_turn_rule() -> None:
    text = " ".join((TOOLS / "system_prompt.md").read_text("utf-8").split())
    assert "memory_rewrite" in text and "conversation_search" in text
    assert "call memory_rewrite in that same turn" in text
    assert "Record a preferred name the moment it is given or corrected" in text
