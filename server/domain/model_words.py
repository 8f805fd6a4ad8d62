"""Every sentence the model reads from Memoria, in one place: the one definition for every
language and transport.

The model acts on these words: a result that sounds unfinished invites a repeated call, and an
error that does not say what to do next invites a guess. So each outcome says what happened to
the stored block, and whether and how to try again. The tools' descriptions and argument
schemas and the memory instructions for the system prompt are here too: ModelToolService
serves all of it (server/rpc/model_tools.py), and the files in `tools/` are rendered from it
(scripts/render-tools.py; `--check` fails when they differ). Keeping the wording here, away
from the call logic (server/domain/tool_calls.py), lets a reviewer read every outcome at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from server.domain.duplicates import DuplicateGroup, DuplicateKind

REWRITE = "memory_rewrite"
SEARCH = "conversation_search"

MAX_TURNS_LIMIT = 50
"""conversation_search's `max_turns` is from 1 to this (the schema's maximum)."""

DATE_TIME_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"([Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}([.,][0-9]{1,6})?)?([Zz]|[+-][0-9]{2}:[0-9]{2})?)?$"
)
"""conversation_search's `start_time` and `end_time`: an ISO 8601 / RFC 3339 date, or a
date-time whose offset may be left out (then UTC). A pattern cannot say how many days a month
has: 2026-02-30 matches it and is refused by the call (server/domain/tool_calls.py)."""


@dataclass(frozen=True)
class ToolDefinition:
    """One tool as the model is given it: name, description, JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def parameters_json(self) -> str:
        """The schema as JSON text, as GetModelTools serves it."""
        return json.dumps(self.parameters, ensure_ascii=False)


TOOLS: tuple[ToolDefinition, ...] = (
    ToolDefinition(
        name="memory_rewrite",
        description=(
            "Save the person's personal memory block (shown at the end of the system prompt under"
            ' "Personal memory") by sending the entire block you want it to become, in `text`: '
            "not a patch, not just the new line. Start from the block as shown, edit it, send all"
            " of it back. If a line already covers what you want to add, edit that line instead "
            "of adding a near-duplicate; merge duplicates and drop stale lines in the same write."
            " Call this in the same turn in which you say you will remember something: saying it "
            "stores nothing. Keep lasting facts only (preferred name, how they like answers, "
            "their accounts elsewhere); leave out anything tied to one date, one ticket or one "
            "question. Write an account in an outside system only once that service confirmed it "
            "(its current-user lookup, or a lookup keyed on the person's whole login address), "
            "never a guessed or near-spelled id. Never store passwords, keys or tokens. The "
            "result lists the lines removed and added: check every removal was intended, and if "
            "one was not, write again with that line restored. A saved result is final: do not "
            "repeat the call."
        ),
        parameters={
            "type": "object",
            "properties": {
                "text": {
                    "type": "string",
                    "description": (
                        "The whole memory block as it should read after this write, "
                        "one fact per line."
                    ),
                }
            },
            "required": ["text"],
            "additionalProperties": False,
        },
    ),
    ToolDefinition(
        name="conversation_search",
        description=(
            "Search this person's past conversations with you (keyword and semantic matching "
            "together). Use it only when the question points back to an earlier conversation "
            "(something discussed, decided or looked up before); what the memory block already "
            "says needs no search. Returns the matching turns best first, each with its "
            "conversation, date, text and why it matched. When the question names a time "
            '("last week", "in March"), bound the search with start_time and end_time, worked '
            "out from the current date your instructions give."
        ),
        parameters={
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        "What to look for: the distinctive words, names or ids of the "
                        "earlier conversation, or a short paraphrase."
                    ),
                },
                "max_turns": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 50,
                    "description": (
                        "How many past turns to return, 1 to 50. Leave it out for the "
                        "server's default (10)."
                    ),
                },
                "conversation_id": {
                    "type": "string",
                    "minLength": 1,
                    "description": (
                        "Search only this conversation: its id as an earlier result showed "
                        "it. Leave it out to search every conversation."
                    ),
                },
                "start_time": {
                    "type": "string",
                    "pattern": DATE_TIME_PATTERN,
                    "description": (
                        "Only turns at or after this time (inclusive), RFC 3339 / ISO 8601: a "
                        "date (2026-03-01, from 00:00 UTC) or a date-time "
                        "(2026-03-01T09:00:00+01:00). Work it out from the current date in "
                        "your instructions; leave it out when no date is given there."
                    ),
                },
                "end_time": {
                    "type": "string",
                    "pattern": DATE_TIME_PATTERN,
                    "description": (
                        "Only turns before this time (exclusive), in the same form: for all "
                        "of March, start_time 2026-03-01 and end_time 2026-04-01."
                    ),
                },
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
)
"""The model's tools, in the order they are listed: write the block, search the past."""

BASE_INSTRUCTIONS = """\
# Memory

You have a personal memory of the person you are talking to: a short block of lasting facts,
shown at the end of this prompt under "Personal memory (N/limit characters)". It is loaded into
every conversation with them, whatever they ask, and it is all you remember of them between
conversations. You change it only with the memory_rewrite tool, by sending the whole block as
it should read.

- When the person gives or corrects something worth keeping (the name they want to be called,
  how they like answers, their account in another system), call memory_rewrite in that same
  turn. Saying you will remember stores nothing; only the call does. Record a preferred name
  the moment it is given or corrected: every later conversation addresses them by it.
- Edit the block as shown: change the line that already covers a fact instead of adding a
  near-duplicate, and merge duplicates and drop stale lines in the same write. Keep lasting
  facts only; leave out what belongs to one date, one ticket or one question.
- Record an account in an outside system only once that service confirmed it (its current-user
  lookup, or a lookup keyed on the person's whole login address); never a guessed or
  near-spelled id.
- Read the removed lines in the tool's result; if a removal was not intended, write again with
  the line restored. A saved result is final: do not repeat the call.
- Deleting all memory is the person's own action in their settings, not a tool of yours.
- Past conversations are not in this prompt. Call conversation_search only when the question
  points back to an earlier conversation."""
"""The memory instructions that open the prompt section (Markdown; tools/system_prompt.md)."""


def prompt_section(block_section: str) -> str:
    """The memory part of the system prompt: the instructions, a blank line, then the block
    section (or the line saying nothing is remembered yet)."""
    return f"{BASE_INSTRUCTIONS}\n\n{block_section or EMPTY_BLOCK}"


#: The line that follows the base section when the person has no block (or memory is off).
EMPTY_BLOCK = "Personal memory: empty (nothing is remembered about this person yet)."

#: The line that follows the base section when the block could not be loaded for this turn.
BLOCK_UNAVAILABLE = (
    "Personal memory: could not be loaded for this turn (the memory service did not answer). "
    "Do not call memory_rewrite in this turn: it replaces the whole block, which you cannot see."
)

#: How many failed memory writes one turn may make before no more are attempted.
DEFAULT_MAX_FAILED_WRITES = 3


def _named(violations: Sequence[tuple[str, str]]) -> str:
    """Field violations as one clause: 'text[line 2]: looks like an API key; ...'."""
    return "; ".join(f"{field}: {why.rstrip('.')}" for field, why in violations)


def chars(count: int, limit: int) -> str:
    """'1,234/4,000 characters', as in the rendered header."""
    return f"{count:,}/{limit:,} characters"


def _lines(prefix: str, lines: Sequence[str]) -> list[str]:
    return [f"{prefix} {line}" for line in lines]


def saved(
    count: int,
    limit: int,
    removed: Sequence[str],
    added: Sequence[str],
    duplicates: Sequence[DuplicateGroup] = (),
) -> str:
    """A rewrite that changed the block: final, with the diff to check, and the block's
    repeated and near-duplicate lines pointed out (when there are any) so the next write merges
    them. Without any, the words are exactly those of a plain saved result."""
    out = [f"Saved. The memory block now has {chars(count, limit)}."]
    if removed:
        out.append("Removed lines (check that each removal was intended):")
        out += _lines("-", removed)
    else:
        out.append("Removed lines: none.")
    if added:
        out.append("Added lines:")
        out += _lines("+", added)
    else:
        out.append("Added lines: none.")
    if duplicates:
        out.append(
            "Lines that repeat each other (saved as written; next time you write the block, "
            "merge each group into one line unless the repetition is meant):"
        )
        out += [_duplicate_group(group) for group in duplicates]
    out.append(
        "This write is done: do not call memory_rewrite again for it. Only if a removal above "
        "was not intended, call it once more with that line restored."
    )
    return "\n".join(out)


def _duplicate_group(group: DuplicateGroup) -> str:
    """One group, with the block's line numbers counted from 1 as a person would."""
    numbers = [str(i + 1) for i in group.line_indexes]
    which = ", ".join(numbers[:-1]) + " and " + numbers[-1]
    kind = "the same line" if group.kind is DuplicateKind.REPEATED else "near-duplicates"
    head = f"* lines {which} ({kind}):"
    return "\n".join(
        [head, *(f"  {n}: {line}" for n, line in zip(numbers, group.lines, strict=True))]
    )


def unchanged(count: int, limit: int) -> str:
    """A rewrite identical to the stored block."""
    return (
        "Nothing changed: the text is identical to the stored memory block "
        f"({chars(count, limit)}), so it is already saved. Do not call memory_rewrite again "
        "for it."
    )


def too_long(count: int | None, limit: int | None) -> str:
    """BLOCK_TOO_LONG: the count against the limit and what to do."""
    if count is not None and limit is not None:
        size = (
            f"the block has {count:,} characters and the limit is {limit:,} "
            f"({count - limit:,} over)"
        )
    else:
        size = "the block is longer than the limit"
    return (
        f"Not saved: {size}. Nothing was cut and the stored block is unchanged. Merge related "
        "lines, shorten long ones and drop stale ones, then call memory_rewrite again with the "
        "whole shortened block."
    )


BLOCK_EMPTY = (
    "Not saved: the text is empty once whitespace and invisible characters are removed. The "
    "stored memory block is unchanged; an empty write never deletes it. Deleting everything is "
    "the person's own action in their memory settings: if they asked for that, tell them where "
    "to do it."
)

MEMORY_DISABLED = (
    "Not saved: this person has turned memory off, so nothing can be remembered. Do not retry. "
    "If it matters, tell them that memory is off and that they can turn it back on in their "
    "settings."
)

STORE_UNAVAILABLE = (
    "Not saved: the memory store is temporarily unavailable, and nothing changed. Tell the "
    "person it could not be saved right now; sending the same block again later is safe."
)

STORAGE_FULL = (
    "Not saved: the memory store is out of space for now, and nothing changed. Do not retry in "
    "this turn; tell the person it could not be saved right now."
)

WRITE_CONFLICT = (
    "Not saved: other writes to this memory kept landing at the same moment, and nothing "
    "changed. Call memory_rewrite once more with the whole block."
)

REWRITE_UNAUTHENTICATED = (
    "Not saved: this person's identity is not confirmed, so their memory cannot be written. "
    "Do not retry."
)

REWRITE_BLOCK_UNSEEN = (
    "Not sent: the memory block could not be loaded into this prompt, so a rewrite would "
    "replace a block you have not seen. Do not call memory_rewrite in this turn; tell the "
    "person it could not be saved right now."
)

UNREACHABLE_WRITE = (
    "Not saved: the memory service could not be reached (or did not answer in time). The "
    "write may not have happened; sending the same whole block again is safe, as an identical "
    "write changes nothing."
)


def secret_detected(kinds: str, violations: Sequence[tuple[str, str]]) -> str:
    """SECRET_DETECTED: which lines hold a credential (never the credential itself)."""
    where = _named(violations)
    found = f" ({kinds})" if kinds else ""
    return (
        f"Not saved: the block contains a credential{found}"
        + (f" - {where}" if where else "")
        + ". Passwords, keys and tokens must never be stored. The stored block is unchanged; "
        "remove that content and call memory_rewrite again with the rest of the block."
    )


def rejected(reason: str, message: str, violations: Sequence[tuple[str, str]]) -> str:
    """Any other refused write, described from the server's ErrorInfo and BadRequest."""
    detail = _named(violations) or message.rstrip(".")
    return (
        f"Not saved ({reason or 'error'}): {detail}. The stored block is unchanged. Fix what "
        "is named and call memory_rewrite again with the whole block, or tell the person it "
        "could not be saved."
    )


def internal(trace_id: str) -> str:
    """An unexpected server error: nothing known, nothing to fix on the model's side."""
    ref = f" (reference {trace_id})" if trace_id else ""
    return (
        f"Not saved: the memory service had an unexpected error{ref}. Do not retry in this "
        "turn; tell the person it may not have been saved."
    )


def refused_after_failures(limit: int) -> str:
    """The terminal refusal once a turn has used up its failed writes (no call is made)."""
    return (
        f"Not sent: memory_rewrite already failed {limit} times in this turn, so no further "
        "write is attempted until the next turn. Do not call it again now; tell the person "
        "that this could not be remembered."
    )


def failures_left(failed: int, limit: int) -> str:
    """Appended to a failed write, so the model knows how many attempts remain this turn."""
    left = limit - failed
    if left <= 0:
        return f"(Failed memory writes this turn: {failed} of {limit}; no more will be sent.)"
    return f"(Failed memory writes this turn: {failed} of {limit}.)"


# Malformed calls: answered before anything is performed.


def bad_arguments(tool: str, problem: str) -> str:
    """A tool call whose arguments do not match the tool's schema."""
    if tool == REWRITE:
        usage = (
            "memory_rewrite takes exactly one argument, `text`: a string with the entire "
            "memory block you want to end up with"
        )
    else:
        usage = (
            "conversation_search takes `query` (a non-empty string) and optionally "
            "`max_turns` (an integer from 1 to 50), `conversation_id` (a conversation's id) "
            "and `start_time` and `end_time` (a date such as 2026-03-01 or a date-time such "
            "as 2026-03-01T09:00:00Z)"
        )
    return f"Not sent: {problem}. {usage}. Nothing was called; fix the arguments and call again."


TOOL_NAME_MAX_CHARS = 64
"""Providers allow tool names of at most 64 characters; a longer name is quoted cut to this,
so the words stay small (they can travel in an error status's trailer, whose size is capped)."""


def unknown_tool(name: str) -> str:
    """A tool name that is not one of the model's tools."""
    if len(name) > TOOL_NAME_MAX_CHARS:
        name = name[:TOOL_NAME_MAX_CHARS] + "…"
    return (
        f"Unknown tool {name!r}: the memory tools are memory_rewrite and conversation_search. "
        "Nothing was called."
    )


# Search results.


def no_hits(query: str) -> str:
    """A search that found nothing (also what a person with memory off gets)."""
    return (
        f"No past conversation matched {query!r}. Do not invent one; if it matters, ask the person."
    )


SEARCH_UNAUTHENTICATED = (
    "No past conversations: this person's identity is not confirmed, so nothing was searched "
    "and there are no results. Do not retry."
)

SEARCH_UNAVAILABLE = (
    "Search failed: conversation search is temporarily unavailable (or did not answer in "
    "time), so past conversations cannot be looked up right now. Answer without them and say "
    "so."
)


def search_failed(reason: str, message: str, violations: Sequence[tuple[str, str]]) -> str:
    """Any other refused search, from the server's ErrorInfo and BadRequest."""
    detail = _named(violations) or message.rstrip(".")
    return f"Search failed ({reason or 'error'}): {detail}. Nothing was found."


def why_matched(keyword_rank: int, semantic_rank: int) -> str:
    """Why a hit matched, from its keyword and semantic ranks (0 = not found by that side)."""
    if keyword_rank and semantic_rank:
        return f"matched by keywords (rank {keyword_rank}) and meaning (rank {semantic_rank})"
    if keyword_rank:
        return f"matched by keywords only (rank {keyword_rank})"
    if semantic_rank:
        return f"matched by meaning only (rank {semantic_rank})"
    return "matched"


def hits_header(count: int, query: str) -> str:
    """The first line of a search result with hits."""
    turns = "turn" if count == 1 else "turns"
    return f"{count} past {turns} matched {query!r}, best first:"


def hit(position: int, conversation: str, turn: str, when: str, why: str, text: str) -> str:
    """One hit: where it comes from, when, why it matched, and its text."""
    return f"[{position}] conversation {conversation}, turn {turn}, {when}; {why}\n{text}"


# What a problem with the arguments is called (the `problem` of `bad_arguments`).


def not_json(detail: str) -> str:
    """Arguments that are not JSON text."""
    return f"the arguments are not valid JSON ({detail})"


NOT_AN_OBJECT = "the arguments must be a JSON object"


def unknown_arguments(names: Sequence[str]) -> str:
    """Arguments the tool's schema does not have."""
    return f"unknown argument(s): {', '.join(names)}"


def missing_argument(name: str) -> str:
    """A required argument left out."""
    return f"the required argument `{name}` is missing"


def wrong_type(name: str, expected: str, value: object) -> str:
    """An argument of the wrong JSON type ('a string', 'an integer')."""
    return f"`{name}` must be {expected}, not {json_type(value)}"


def empty_argument(name: str) -> str:
    """A string argument that must not be empty."""
    return f"`{name}` is empty"


def not_whole(name: str) -> str:
    """A number with a fractional part where an integer is wanted."""
    return f"`{name}` must be a whole number"


def out_of_range(name: str, low: int, high: int, value: int) -> str:
    """An integer outside the schema's bounds."""
    return f"`{name}` must be from {low} to {high}, not {value}"


def not_a_time(name: str) -> str:
    """A time argument that is not an RFC 3339 / ISO 8601 date or date-time."""
    return (
        f"`{name}` must be a date (2026-03-01) or a date-time (2026-03-01T09:00:00Z) that "
        "exists on the calendar"
    )


def invalid_character(name: str) -> str:
    """A string holding a lone UTF-16 surrogate escape, which no UTF-8 text can carry."""
    return f"`{name}` contains an invalid character (an unpaired surrogate escape)"


def json_type(value: object) -> str:
    """A decoded JSON value's type as the model's words name it."""
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


# What an adapter answers by itself, when no answer of the service can be read.

UNAVAILABLE_PROMPT_SECTION = f"{BASE_INSTRUCTIONS}\n\n{BLOCK_UNAVAILABLE}"
"""The prompt section when RenderPromptSection could not be answered."""

UNREACHABLE_TEXT = {REWRITE: UNREACHABLE_WRITE, SEARCH: SEARCH_UNAVAILABLE}
"""What a tool call reads when the service could not be reached, by tool."""
