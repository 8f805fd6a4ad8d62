"""Checks a tool call's arguments against the tool's schema before anything is sent.

A model's arguments arrive as JSON text (OpenAI) or an object (Anthropic, MCP), and may be
missing, mistyped or carry fields the schema does not have. Such a call is answered with a tool
error and never reaches the server, so a broken call cannot write anything. The rules mirror
`tools/memoria_tools.json` exactly (a test checks them against `jsonschema` on the same
samples); the package does not depend on a JSON Schema library, as it installs with the gRPC
packages only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

MAX_TURNS_LIMIT = 50


class ArgumentError(ValueError):
    """The arguments do not fit the tool's schema; the message says how, for the model."""


@dataclass(frozen=True)
class RewriteArguments:
    """memory_rewrite's arguments: the whole block to end up with."""

    text: str


@dataclass(frozen=True)
class SearchArguments:
    """conversation_search's arguments; `max_turns` None means the server's default."""

    query: str
    max_turns: int | None


def as_object(arguments: str | Mapping[str, object]) -> Mapping[str, object]:
    """The arguments as a JSON object (blank text counts as no arguments)."""
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise ArgumentError(f"the arguments are not valid JSON ({error.msg})") from None
        arguments = decoded
    if not isinstance(arguments, Mapping):
        raise ArgumentError("the arguments must be a JSON object")
    return arguments


def _unknown(arguments: Mapping[str, object], allowed: set[str]) -> None:
    extra = sorted(str(key) for key in arguments if key not in allowed)
    if extra:
        raise ArgumentError(f"unknown argument(s): {', '.join(extra)}")


def parse_rewrite(arguments: str | Mapping[str, object]) -> RewriteArguments:
    """memory_rewrite's arguments, or ArgumentError."""
    args = as_object(arguments)
    _unknown(args, {"text"})
    if "text" not in args:
        raise ArgumentError("the required argument `text` is missing")
    text = args["text"]
    if not isinstance(text, str):
        raise ArgumentError(f"`text` must be a string, not {_json_type(text)}")
    _encodable("text", text)
    return RewriteArguments(text)


def parse_search(arguments: str | Mapping[str, object]) -> SearchArguments:
    """conversation_search's arguments, or ArgumentError."""
    args = as_object(arguments)
    _unknown(args, {"query", "max_turns"})
    if "query" not in args:
        raise ArgumentError("the required argument `query` is missing")
    query = args["query"]
    if not isinstance(query, str):
        raise ArgumentError(f"`query` must be a string, not {_json_type(query)}")
    if not query.strip():
        raise ArgumentError("`query` is empty")
    _encodable("query", query)
    max_turns = args.get("max_turns")
    if "max_turns" not in args:
        return SearchArguments(query, None)
    # JSON Schema's integer: any number with no fractional part (5 and 5.0), never a boolean.
    if isinstance(max_turns, bool) or not isinstance(max_turns, int | float):
        raise ArgumentError(f"`max_turns` must be an integer, not {_json_type(max_turns)}")
    if isinstance(max_turns, float) and not max_turns.is_integer():
        raise ArgumentError("`max_turns` must be a whole number")
    turns = int(max_turns)
    if not 1 <= turns <= MAX_TURNS_LIMIT:
        raise ArgumentError(f"`max_turns` must be from 1 to {MAX_TURNS_LIMIT}, not {turns}")
    return SearchArguments(query, turns)


def _encodable(name: str, value: str) -> None:
    # JSON may escape a lone UTF-16 surrogate ("\ud800"), which no UTF-8 string can carry:
    # the request could not even be encoded, so say so instead of failing in the stub.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentError(
            f"`{name}` contains an invalid character (an unpaired surrogate escape)"
        ) from None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
