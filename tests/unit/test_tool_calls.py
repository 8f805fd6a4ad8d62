"""The model's tool calls in the domain (server/domain/tool_calls.py) on in-memory fakes.

The argument checks accept and refuse exactly what the published schema does (the samples of
test_tools.py, validated with jsonschema); and the outcomes no API test can provoke on the real
server (the block's store down, the count's store down) are worded and counted as the design
says. The adapters hold no copy of these words (they pass the server's through).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from google.rpc import error_details_pb2, status_pb2
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]  # no stubs here

from memoria.v1 import model_tool_service_pb2 as pb
from server.domain import model_words as words
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, PrincipalMemory, SearchBounds, TurnKey, TurnRef
from server.domain.tool_calls import (
    ArgumentError,
    ToolCalls,
    ToolOutcome,
    parse_rewrite,
    parse_search,
)
from server.rpc.errors import internal_error, to_status
from server.rpc.tool_refusals import EXECUTE_TOOL_CALL, refusal_words
from tests.fakes import InMemoryInspectionStore, InMemoryMemoryStore
from tests.unit.test_tools import REWRITE_SAMPLES, SEARCH_SAMPLES

WHO = Identity("t1", "ana")
TURN = TurnRef("conv-1", "1")
KEY = TurnKey("t1", "ana", "conv-1", "1")


def now() -> datetime:
    return datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def schema(name: str) -> dict[str, Any]:
    (tool,) = [t for t in words.TOOLS if t.name == name]
    return tool.parameters


def problem(parse: Any, sample: str) -> str | None:
    try:
        parse(sample)
    except ArgumentError as error:
        return str(error)
    return None


@pytest.mark.parametrize(("sample", "valid"), REWRITE_SAMPLES)
def test_rewrite_arguments_agree_with_the_schema(sample: object, valid: bool) -> None:
    assert Draft202012Validator(schema(words.REWRITE)).is_valid(sample) is valid
    text = json.dumps(sample)
    assert (problem(parse_rewrite, text) is None) is valid


@pytest.mark.parametrize(("sample", "valid"), SEARCH_SAMPLES)
def test_search_arguments_agree_with_the_schema(sample: object, valid: bool) -> None:
    assert Draft202012Validator(schema(words.SEARCH)).is_valid(sample) is valid
    text = json.dumps(sample)
    assert (problem(parse_search, text) is None) is valid


@pytest.mark.parametrize(
    "text", ["", "   ", "{", '{"text": "\\ud800"}', "1" * 5000, "[" * 100_000, "null"]
)
def test_odd_argument_texts_are_worded_not_raised(text: str) -> None:
    found = problem(parse_rewrite, text)
    assert found is not None


class DownStore(InMemoryMemoryStore):
    """A memory store whose database cannot be reached."""

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        raise MemoriaError(ErrorReason.STORE_UNAVAILABLE, "the database is unreachable")


class DownCounter(InMemoryInspectionStore):
    """An inspection store that cannot count (its database is unreachable)."""

    def failed_writes(self, key: TurnKey) -> int:
        raise MemoriaError(ErrorReason.STORE_UNAVAILABLE, "down")

    def record_failed_write(self, key: TurnKey, record_time: datetime) -> int:
        raise MemoriaError(ErrorReason.STORE_UNAVAILABLE, "down")


class NoSearch:
    """A search that must not be reached by these tests."""

    def search(self, *args: object, **kwargs: object) -> list[object]:
        raise AssertionError("no search expected")


def calls(store: InMemoryMemoryStore, counter: InMemoryInspectionStore) -> ToolCalls:
    blocks = MemoryBlocks(store, now, inspections=counter)
    return ToolCalls(blocks, NoSearch(), counter, now)  # type: ignore[arg-type]


def test_an_unreachable_block_store_is_worded_and_counted() -> None:
    counter = InMemoryInspectionStore()
    result = calls(DownStore(), counter).execute(
        WHO, TURN, words.REWRITE, '{"text": "Preferred name: Ana"}'
    )
    assert result.text == f"{words.STORE_UNAVAILABLE}\n(Failed memory writes this turn: 1 of 3.)"
    assert (result.is_error, result.outcome, result.error_reason) == (
        True,
        ToolOutcome.REFUSED,
        ErrorReason.STORE_UNAVAILABLE,
    )
    assert counter.failed_writes(KEY) == 1


def test_a_count_that_cannot_be_kept_still_lets_the_write_through_and_says_so() -> None:
    store = InMemoryMemoryStore()
    down = DownCounter()
    saved = calls(store, down).execute(WHO, TURN, words.REWRITE, '{"text": "Likes tea"}')
    assert saved.outcome is ToolOutcome.MEMORY_SAVED
    empty = calls(store, down).execute(WHO, TURN, words.REWRITE, '{"text": ""}')
    assert empty.text == f"{words.BLOCK_EMPTY}\n(Failed memory writes this turn: 1 of 3.)"


def test_a_turn_of_its_own_counts_its_own_failures() -> None:
    counter = InMemoryInspectionStore()
    tool_calls = calls(InMemoryMemoryStore(), counter)
    for _ in range(3):
        tool_calls.execute(WHO, TURN, words.REWRITE, "{}")
    capped = tool_calls.execute(WHO, TURN, words.REWRITE, '{"text": "x"}')
    assert capped.outcome is ToolOutcome.FAILED_WRITES_EXHAUSTED
    other = tool_calls.execute(WHO, TurnRef("conv-1", "2"), words.REWRITE, '{"text": "x"}')
    assert other.outcome is ToolOutcome.MEMORY_SAVED
    elsewhere = tool_calls.execute(Identity("t1", "ben"), TURN, words.REWRITE, '{"text": "x"}')
    assert elsewhere.outcome is ToolOutcome.MEMORY_SAVED


def test_the_words_a_refused_call_carries_are_only_execute_tool_calls() -> None:
    request = pb.ExecuteToolCallRequest(tool_name=words.SEARCH)
    nobody = MemoriaError(ErrorReason.UNAUTHENTICATED, "no identity")
    assert refusal_words(EXECUTE_TOOL_CALL, request, nobody) == words.SEARCH_UNAUTHENTICATED
    internal = internal_error("0f" * 16)
    assert refusal_words(EXECUTE_TOOL_CALL, request, internal) == words.internal("0f" * 16)
    other = "/memoria.v1.MemoryBlockService/RewriteMemoryBlock"
    assert refusal_words(other, request, nobody) is None
    assert refusal_words(EXECUTE_TOOL_CALL, object(), nobody) is None  # undecodable bytes
    invalid = MemoriaError(ErrorReason.INVALID_ARGUMENT, "no turn")
    assert refusal_words(EXECUTE_TOOL_CALL, request, invalid) is None
    status = to_status(internal, words.internal("0f" * 16))
    ((_, encoded),) = status.trailing_metadata
    message = error_details_pb2.LocalizedMessage()
    details = status_pb2.Status.FromString(encoded).details
    assert [d.Unpack(message) for d in details] == [False, True]
    assert (message.locale, message.message) == ("en-US", words.internal("0f" * 16))


def test_search_bounds_are_read_as_instants() -> None:
    args = parse_search(
        json.dumps(
            {
                "query": "refund",
                "conversation_id": "conv-0",
                "start_time": "2026-03-01",
                "end_time": "2026-03-01T09:30:00.5+01:00",
            }
        )
    )
    assert args.bounds.conversation_id == "conv-0"
    assert args.bounds.start_time == datetime(2026, 3, 1, tzinfo=UTC)
    assert args.bounds.end_time == datetime(2026, 3, 1, 8, 30, 0, 500000, tzinfo=UTC)
    no_offset = parse_search('{"query": "refund", "start_time": "2026-03-01T09:00"}')
    assert no_offset.bounds.start_time == datetime(2026, 3, 1, 9, tzinfo=UTC)
    assert parse_search('{"query": "refund"}').bounds == SearchBounds()


@pytest.mark.parametrize("value", ["2026-02-30", "2026-03-01T24:00", "0000-01-01", "2026-13-01"])
def test_a_time_that_is_not_on_the_calendar_is_worded(value: str) -> None:
    found = problem(parse_search, json.dumps({"query": "q", "end_time": value}))
    assert found == words.not_a_time("end_time")
    assert "2026-03-01T09:00:00Z" in words.bad_arguments(words.SEARCH, found)
