"""The model's tool calls, served: check the arguments, perform the call, word the outcome.

One tool call arrives exactly as the model produced it (a tool name and its arguments as JSON
text) with the turn it is made in. Its arguments are checked against the tool's published
schema (server/domain/model_words.py, TOOLS) before anything is performed, so a broken call
cannot write anything; `memory_rewrite` then writes the block as the model, attributed to the
turn in the audit log, and `conversation_search` searches and records the search for the turn.
Every outcome the model can cause or meet (its own mistakes, the block's rules, memory off, a
store unavailable) becomes words for the model, never an error of the call: only the backend's
own mistakes (no turn, invalid ids) are errors here.

The cap: after MAX_FAILED_WRITES failed memory writes in one turn, further writes in that turn
are refused without being attempted, so a model stuck in a retry loop cannot hammer the
service or the person's block. The count is kept in the database (`FailedWrites`), so it holds
for the turn on whichever replica serves each call. Calls of one turn made in parallel may
each pass the check before any of their failures is counted (at most one extra attempt per
call in flight); a model retrying one call at a time is stopped exactly.

Pure Python on the domain's operations and ports; the transport converts (server/rpc/).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from server.domain import model_words as words
from server.domain.errors import (
    BlockTooLong,
    ErrorReason,
    FieldViolation,
    MemoriaError,
    SecretDetected,
    invalid,
)
from server.domain.ids import turn_reference_violations
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, SearchBounds, SearchHit, TurnKey, TurnRef, Writer
from server.domain.ports import Clock, FailedWrites
from server.domain.search import ConversationSearch

MAX_FAILED_WRITES = words.DEFAULT_MAX_FAILED_WRITES
"""Failed memory writes one turn may make; the next is refused without being attempted."""


class ToolOutcome(enum.Enum):
    """What a tool call did (the contract's ToolCallOutcome), for the backend's logs."""

    MEMORY_SAVED = enum.auto()
    MEMORY_UNCHANGED = enum.auto()
    SEARCH_HITS = enum.auto()
    SEARCH_NO_HITS = enum.auto()
    INVALID_ARGUMENTS = enum.auto()
    UNKNOWN_TOOL = enum.auto()
    REFUSED = enum.auto()
    FAILED_WRITES_EXHAUSTED = enum.auto()


@dataclass(frozen=True)
class ToolResult:
    """What the model reads (`text`, and whether the call failed), and what happened."""

    text: str
    is_error: bool
    outcome: ToolOutcome
    error_reason: ErrorReason | None = None
    """The refusal's reason, for ToolOutcome.REFUSED."""
    failed_write_count: int = 0
    """For memory_rewrite: the turn's failed writes after this call."""


@dataclass(frozen=True)
class PromptSection:
    """The memory part of the system prompt and the block version in it."""

    text: str
    etag: str
    char_count: int
    char_limit: int

    @property
    def section_char_count(self) -> int:
        """Code points of the whole section (what a backend budgets its prompt by)."""
        return len(self.text)


@dataclass(frozen=True)
class SearchArguments:
    """conversation_search's arguments; `max_turns` None means the server's default, and
    `bounds` holds the optional conversation and time span (search.py decides their rules)."""

    query: str
    max_turns: int | None
    bounds: SearchBounds = field(default_factory=SearchBounds)


class ArgumentError(ValueError):
    """The arguments do not fit the tool's schema; the message says how, for the model."""


class ToolCalls:
    """The model's side of Memoria for authenticated callers: prompt section and tool calls."""

    def __init__(
        self,
        blocks: MemoryBlocks,
        search: ConversationSearch,
        failures: FailedWrites,
        clock: Clock,
        *,
        max_failed_writes: int = MAX_FAILED_WRITES,
    ) -> None:
        if max_failed_writes < 1:
            raise ValueError("max_failed_writes must be at least 1")
        self._blocks = blocks
        self._search = search
        self._failures = failures
        self._clock = clock
        self._max_failed = max_failed_writes

    def prompt_section(self, who: Identity, turn: TurnRef | None) -> PromptSection:
        """The instructions, then the block as rendered (recorded for `turn` when given)."""
        rendered = self._blocks.render(who, turn)
        return PromptSection(
            words.prompt_section(rendered.prompt_section),
            rendered.etag,
            rendered.char_count,
            rendered.char_limit,
        )

    def execute(
        self, who: Identity, turn: TurnRef | None, tool_name: str, arguments_json: str
    ) -> ToolResult:
        """Check, perform and word one tool call of the model, made in `turn` (required)."""
        if turn is None:
            raise invalid(FieldViolation("turn", "is required"))
        violations = turn_reference_violations(turn)
        if violations:
            raise invalid(*violations)
        if tool_name == words.REWRITE:
            return self._rewrite(who, turn, arguments_json)
        if tool_name == words.SEARCH:
            return self._search_conversations(who, turn, arguments_json)
        return ToolResult(words.unknown_tool(tool_name), True, ToolOutcome.UNKNOWN_TOOL)

    def _rewrite(self, who: Identity, turn: TurnRef, arguments_json: str) -> ToolResult:
        key = TurnKey(who.tenant_id, who.principal_id, turn.conversation_id, turn.turn_id)
        try:
            failed = self._failures.failed_writes(key)
        except MemoriaError:
            # The count cannot be read (its store is down): the write itself meets the same
            # store and is answered on its own terms; the cap is not a reason to refuse it.
            failed = 0
        if failed >= self._max_failed:
            return ToolResult(
                words.refused_after_failures(self._max_failed),
                True,
                ToolOutcome.FAILED_WRITES_EXHAUSTED,
                failed_write_count=failed,
            )
        try:
            text = parse_rewrite(arguments_json)
        except ArgumentError as error:
            problem = words.bad_arguments(words.REWRITE, str(error))
            return self._failed(key, failed, problem, ToolOutcome.INVALID_ARGUMENTS, None)
        try:
            result = self._blocks.rewrite(who, text, Writer.MODEL, None, turn)
        except MemoriaError as error:
            return self._failed(
                key, failed, rewrite_refusal(error), ToolOutcome.REFUSED, error.reason
            )
        block = result.block
        if not result.changed:
            return ToolResult(
                words.unchanged(block.char_count, block.char_limit),
                False,
                ToolOutcome.MEMORY_UNCHANGED,
                failed_write_count=failed,
            )
        return ToolResult(
            words.saved(
                block.char_count,
                block.char_limit,
                result.removed_lines,
                result.added_lines,
                result.duplicates,
            ),
            False,
            ToolOutcome.MEMORY_SAVED,
            failed_write_count=failed,
        )

    def _failed(
        self,
        key: TurnKey,
        before: int,
        text: str,
        outcome: ToolOutcome,
        reason: ErrorReason | None,
    ) -> ToolResult:
        """A failed write: counted for the turn, and the model told how many remain."""
        try:
            failed = self._failures.record_failed_write(key, self._clock())
        except MemoriaError:
            failed = before + 1  # not kept (its store is down); this call still says so
        return ToolResult(
            f"{text}\n{words.failures_left(failed, self._max_failed)}",
            True,
            outcome,
            error_reason=reason,
            failed_write_count=failed,
        )

    def _search_conversations(
        self, who: Identity, turn: TurnRef, arguments_json: str
    ) -> ToolResult:
        try:
            args = parse_search(arguments_json)
        except ArgumentError as error:
            return ToolResult(
                words.bad_arguments(words.SEARCH, str(error)), True, ToolOutcome.INVALID_ARGUMENTS
            )
        try:
            hits = self._search.search(who, args.query, args.max_turns or 0, turn, args.bounds)
        except MemoriaError as error:
            if error.reason is ErrorReason.STORE_UNAVAILABLE:
                text = words.SEARCH_UNAVAILABLE
            else:
                text = words.search_failed(
                    reason_name(error.reason), error.message, _violations(error)
                )
            return ToolResult(text, True, ToolOutcome.REFUSED, error_reason=error.reason)
        if not hits:
            return ToolResult(words.no_hits(args.query), False, ToolOutcome.SEARCH_NO_HITS)
        return ToolResult(hits_text(args.query, hits), False, ToolOutcome.SEARCH_HITS)


def hits_text(query: str, hits: list[SearchHit]) -> str:
    """A search's hits as the model reads them, best first."""
    parts = [words.hits_header(len(hits), query)]
    for position, hit in enumerate(hits, start=1):
        when = hit.turn_time.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
        why = words.why_matched(hit.keyword_rank, hit.semantic_rank)
        parts.append(words.hit(position, hit.conversation_id, hit.turn_id, when, why, hit.text))
    return "\n\n".join(parts)


def rewrite_refusal(error: MemoriaError) -> str:
    """The words for a refused memory write, from the domain's error."""
    reason = error.reason
    details = error.details
    if reason is ErrorReason.BLOCK_TOO_LONG:
        if isinstance(details, BlockTooLong):
            return words.too_long(details.char_count, details.char_limit)
        return words.too_long(None, None)
    if reason is ErrorReason.SECRET_DETECTED:
        kinds = ",".join(details.secret_types) if isinstance(details, SecretDetected) else ""
        return words.secret_detected(kinds, _violations(error))
    fixed = _REWRITE_WORDS.get(reason)
    if fixed is not None:
        return fixed
    return words.rejected(reason_name(reason), error.message, _violations(error))


_REWRITE_WORDS: Mapping[ErrorReason, str] = {
    ErrorReason.BLOCK_EMPTY: words.BLOCK_EMPTY,
    ErrorReason.MEMORY_DISABLED: words.MEMORY_DISABLED,
    ErrorReason.STORE_UNAVAILABLE: words.STORE_UNAVAILABLE,
    ErrorReason.STORAGE_FULL: words.STORAGE_FULL,
    ErrorReason.WRITE_CONFLICT: words.WRITE_CONFLICT,
    ErrorReason.UNAUTHENTICATED: words.REWRITE_UNAUTHENTICATED,
}


def unauthenticated_words(tool_name: str) -> str:
    """What the model reads when its call's identity is not confirmed (nothing was touched)."""
    if tool_name == words.REWRITE:
        return words.REWRITE_UNAUTHENTICATED
    if tool_name == words.SEARCH:
        return words.SEARCH_UNAUTHENTICATED
    return words.unknown_tool(tool_name)


def internal_words(trace_id: str) -> str:
    """What the model reads when the service failed unexpectedly (the log has `trace_id`)."""
    return words.internal(trace_id)


def reason_name(reason: ErrorReason) -> str:
    """The contract's name of a reason, as the model's words quote it."""
    return f"ERROR_REASON_{reason.name}"


def _violations(error: MemoriaError) -> list[tuple[str, str]]:
    return [(v.field, v.description) for v in error.violations]


# The arguments. JSON text as the model produced it; the rules mirror TOOLS' schemas exactly
# (a test checks them with a JSON Schema validator on the same samples).


def _object(arguments_json: str) -> Mapping[str, object]:
    """The arguments as a JSON object (blank text counts as no arguments)."""
    if not arguments_json.strip():
        return {}
    try:
        decoded = json.loads(arguments_json)
    except json.JSONDecodeError as error:
        raise ArgumentError(words.not_json(error.msg)) from None
    except RecursionError:
        raise ArgumentError(words.not_json("nested too deeply")) from None
    except ValueError:  # an integer past Python's digit limit
        raise ArgumentError(words.not_json("a number is too long")) from None
    if not isinstance(decoded, dict):
        raise ArgumentError(words.NOT_AN_OBJECT)
    return decoded


def _no_unknown(arguments: Mapping[str, object], allowed: set[str]) -> None:
    extra = sorted(str(key) for key in arguments if key not in allowed)
    if extra:
        raise ArgumentError(words.unknown_arguments(extra))


def parse_rewrite(arguments_json: str) -> str:
    """memory_rewrite's `text`, or ArgumentError."""
    args = _object(arguments_json)
    _no_unknown(args, {"text"})
    if "text" not in args:
        raise ArgumentError(words.missing_argument("text"))
    text = args["text"]
    if not isinstance(text, str):
        raise ArgumentError(words.wrong_type("text", "a string", text))
    _encodable("text", text)
    return text


_SEARCH_ARGUMENTS = {"query", "max_turns", "conversation_id", "start_time", "end_time"}
_DATE_TIME = re.compile(words.DATE_TIME_PATTERN)


def parse_search(arguments_json: str) -> SearchArguments:
    """conversation_search's arguments, or ArgumentError. The bounds are only read here (a
    conversation id as a string, each time as a date or date-time that exists); whether they
    are valid for a search (the id rule, an empty span) the search decides, and its refusal
    reaches the model as words too."""
    args = _object(arguments_json)
    _no_unknown(args, _SEARCH_ARGUMENTS)
    if "query" not in args:
        raise ArgumentError(words.missing_argument("query"))
    query = args["query"]
    if not isinstance(query, str):
        raise ArgumentError(words.wrong_type("query", "a string", query))
    if not query.strip():
        raise ArgumentError(words.empty_argument("query"))
    _encodable("query", query)
    bounds = SearchBounds(
        conversation_id=_conversation(args),
        start_time=_moment(args, "start_time"),
        end_time=_moment(args, "end_time"),
    )
    return SearchArguments(query, _max_turns(args), bounds)


def _conversation(args: Mapping[str, object]) -> str | None:
    if "conversation_id" not in args:
        return None
    value = args["conversation_id"]
    if not isinstance(value, str):
        raise ArgumentError(words.wrong_type("conversation_id", "a string", value))
    if not value:
        raise ArgumentError(words.empty_argument("conversation_id"))
    _encodable("conversation_id", value)
    return value


def _moment(args: Mapping[str, object], name: str) -> datetime | None:
    """A date (00:00 UTC that day) or a date-time (UTC when it has no offset)."""
    if name not in args:
        return None
    value = args[name]
    if not isinstance(value, str):
        raise ArgumentError(words.wrong_type(name, "a string", value))
    if not _DATE_TIME.fullmatch(value):
        raise ArgumentError(words.not_a_time(name))
    try:
        moment = datetime.fromisoformat(value.upper().replace(",", "."))
    except ValueError:  # a day or an hour that does not exist (2026-02-30, 24:00)
        raise ArgumentError(words.not_a_time(name)) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _max_turns(args: Mapping[str, object]) -> int | None:
    if "max_turns" not in args:
        return None
    max_turns = args["max_turns"]
    # JSON Schema's integer: any number with no fractional part (5 and 5.0), never a boolean.
    if isinstance(max_turns, bool) or not isinstance(max_turns, int | float):
        raise ArgumentError(words.wrong_type("max_turns", "an integer", max_turns))
    if isinstance(max_turns, float) and not max_turns.is_integer():
        raise ArgumentError(words.not_whole("max_turns"))
    turns = int(max_turns)
    if not 1 <= turns <= words.MAX_TURNS_LIMIT:
        raise ArgumentError(words.out_of_range("max_turns", 1, words.MAX_TURNS_LIMIT, turns))
    return turns


def _encodable(name: str, value: str) -> None:
    # JSON may escape a lone UTF-16 surrogate ("\ud800"), which no UTF-8 string can carry:
    # the call could not be performed, so say so instead of failing further in.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentError(words.invalid_character(name)) from None
