"""ModelToolService end to end: the tools, the prompt section and every tool call outcome.

A real server on SQLite and PostgreSQL, called through the generated stubs. Each outcome is
checked word for word against server/domain/model_words.py (the one definition; the adapters
pass these words through and hold no copy), and what a turn did shows up where a person
looks: the audit event names the turn, GetTurnInspection lists the turn's writes (read from
the audit, so deleting the block blanks them) and its failed writes. The per-turn cap is also
checked across two servers on one PostgreSQL database.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import model_tool_service_pb2 as pb
from memoria.v1 import model_tool_service_pb2_grpc as pb_grpc
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.domain import model_words as words
from tests.api.conftest import (
    Api,
    Metadata,
    expect_error,
    field_violations,
    server_settings,
    serving,
    shared_embedder,
    start_server,
)

ROOT = Path(__file__).resolve().parents[2]
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"  # AWS's documentation example, not a real key
TURN = block_pb.TurnReference(conversation_id="conv-1", turn_id="1")
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def tools(api: Api) -> pb_grpc.ModelToolServiceStub:
    return pb_grpc.ModelToolServiceStub(api.channel)


def execute(
    api: Api,
    who: Metadata,
    tool: str,
    arguments: object,
    turn: block_pb.TurnReference = TURN,
) -> pb.ExecuteToolCallResponse:
    """One tool call; `arguments` as a dict (sent as JSON) or as the raw text."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    response: pb.ExecuteToolCallResponse = tools(api).ExecuteToolCall(
        pb.ExecuteToolCallRequest(turn=turn, tool_name=tool, arguments_json=text), metadata=who
    )
    return response


def outcome(response: pb.ExecuteToolCallResponse) -> str:
    return pb.ToolCallOutcome.Name(response.outcome)


def localized(error: grpc.RpcError) -> str:
    """The LocalizedMessage of a failed call (fails the test if there is none)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        message = error_details_pb2.LocalizedMessage()
        if detail.Unpack(message):
            assert message.locale == "en-US"
            return str(message.message)
    raise AssertionError("no LocalizedMessage in the status details")


def inspection(
    api: Api, who: Metadata, turn: block_pb.TurnReference = TURN
) -> search_pb.TurnInspection:
    response = api.search.GetTurnInspection(
        search_pb.GetTurnInspectionRequest(turn=turn), metadata=who
    )
    result: search_pb.TurnInspection = response.inspection
    return result


# The tools and the prompt section.


def test_the_served_tools_and_instructions_are_the_files_in_tools(api: Api) -> None:
    response = tools(api).GetModelTools(pb.GetModelToolsRequest(), metadata=api.who("ana"))
    source = json.loads((ROOT / "tools" / "memoria_tools.json").read_text("utf-8"))["tools"]
    served = [
        {
            "name": t.name,
            "description": t.description,
            "parameters": json.loads(t.parameters_json_schema),
        }
        for t in response.tools
    ]
    assert served == source
    instructions = (ROOT / "tools" / "system_prompt.md").read_text("utf-8").strip()
    assert response.base_instructions == instructions
    # What an adapter answers when it cannot reach the service, so it needs no copy either.
    assert response.unavailable_prompt_section == f"{instructions}\n\n{words.BLOCK_UNAVAILABLE}"
    assert response.rewrite_refused_unseen_text == words.REWRITE_BLOCK_UNSEEN
    unreachable = {t.name: t.unreachable_text for t in response.tools}
    assert unreachable == {
        "memory_rewrite": words.UNREACHABLE_WRITE,
        "conversation_search": words.SEARCH_UNAVAILABLE,
    }


def test_the_prompt_section_is_the_instructions_then_the_block_and_is_recorded(api: Api) -> None:
    who = api.who("ana")
    stub = tools(api)
    empty = stub.RenderPromptSection(pb.RenderPromptSectionRequest(turn=TURN), metadata=who)
    assert empty.prompt_section == f"{words.BASE_INSTRUCTIONS}\n\n{words.EMPTY_BLOCK}"
    assert (empty.etag, empty.char_count, empty.char_limit) == ("", 0, 4000)
    assert empty.section_char_count == len(empty.prompt_section)

    saved = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ana"})
    assert outcome(saved) == "TOOL_CALL_OUTCOME_MEMORY_SAVED"
    section = stub.RenderPromptSection(pb.RenderPromptSectionRequest(turn=TURN), metadata=who)
    block = api.blocks.RenderMemoryBlock(blocks_pb.RenderMemoryBlockRequest(), metadata=who)
    assert section.prompt_section == f"{words.BASE_INSTRUCTIONS}\n\n{block.prompt_section}"
    assert section.prompt_section.endswith(
        "Personal memory (19/4,000 characters)\nPreferred name: Ana"
    )
    assert (section.etag, section.char_count) == (block.etag, 19)
    # Without a turn nothing more is recorded: the turn has its two renders.
    stub.RenderPromptSection(pb.RenderPromptSectionRequest(), metadata=who)
    renders = inspection(api, who).renders
    assert [(r.etag, r.char_count) for r in renders] == [("", 0), (block.etag, 19)]

    error = expect_error(
        lambda: stub.RenderPromptSection(
            pb.RenderPromptSectionRequest(turn=block_pb.TurnReference(conversation_id="c")),
            metadata=who,
        ),
        INVALID,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert field_violations(error) == {"turn.turn_id": "is required"}


# Memory writes.


def test_a_saved_rewrite_lists_removed_and_added_lines_and_is_attributed_to_its_turn(
    api: Api,
) -> None:
    who = api.who("ana")
    first = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ana\nJira: acct-1"})
    assert (first.text, first.is_error, first.failed_write_count) == (
        words.saved(32, 4000, [], ["Preferred name: Ana", "Jira: acct-1"]),
        False,
        0,
    )
    second = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ana\nLikes tea"})
    assert second.text == words.saved(29, 4000, ["Jira: acct-1"], ["Likes tea"])
    assert second.text.startswith("Saved. The memory block now has 29/4,000 characters.")
    assert "Removed lines (check that each removal was intended):\n- Jira: acct-1\n" in second.text
    assert (outcome(second), second.error_reason) == ("TOOL_CALL_OUTCOME_MEMORY_SAVED", "")

    events = api.audit.ListAuditEvents(audit_pb.ListAuditEventsRequest(), metadata=who).events
    assert [(e.turn.conversation_id, e.turn.turn_id, e.writer) for e in events] == [
        ("conv-1", "1", block_pb.WRITER_MODEL),
    ] * 2
    writes = inspection(api, who).writes
    assert [(list(w.removed_lines), list(w.added_lines)) for w in writes] == [
        ([], ["Preferred name: Ana", "Jira: acct-1"]),
        (["Jira: acct-1"], ["Likes tea"]),
    ]
    assert [(w.writer, w.char_count) for w in writes] == [
        (block_pb.WRITER_MODEL, 32),
        (block_pb.WRITER_MODEL, 29),
    ]
    assert writes[0].write_time.ToDatetime() <= writes[1].write_time.ToDatetime()
    other = block_pb.TurnReference(conversation_id="conv-1", turn_id="2")
    assert list(inspection(api, who, other).writes) == []

    # Deleting the block blanks the lines in the audit, so the inspection keeps none either.
    api.blocks.DeleteMemoryBlock(
        blocks_pb.DeleteMemoryBlockRequest(writer=block_pb.WRITER_USER), metadata=who
    )
    blanked = inspection(api, who).writes
    assert [(list(w.removed_lines), list(w.added_lines)) for w in blanked] == [([], [])] * 2
    assert [(w.removed_line_count, w.added_line_count) for w in blanked] == [(0, 2), (1, 1)]


def test_a_rewrite_names_its_turn_in_the_audit_and_invalid_ids_are_refused(api: Api) -> None:
    who = api.who("ana")
    api.blocks.RewriteMemoryBlock(
        blocks_pb.RewriteMemoryBlockRequest(
            text="Preferred name: Ana", writer=block_pb.WRITER_MODEL, turn=TURN
        ),
        metadata=who,
    )
    api.blocks.RewriteMemoryBlock(
        blocks_pb.RewriteMemoryBlockRequest(
            text="Preferred name: Anna", writer=block_pb.WRITER_USER
        ),
        metadata=who,
    )
    newest, oldest = api.audit.ListAuditEvents(
        audit_pb.ListAuditEventsRequest(), metadata=who
    ).events
    assert oldest.HasField("turn") and oldest.turn == TURN
    assert not newest.HasField("turn")
    error = expect_error(
        lambda: api.blocks.RewriteMemoryBlock(
            blocks_pb.RewriteMemoryBlockRequest(
                text="x",
                writer=block_pb.WRITER_MODEL,
                turn=block_pb.TurnReference(conversation_id="c\x01", turn_id="1"),
            ),
            metadata=who,
        ),
        INVALID,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert set(field_violations(error)) == {"turn.conversation_id"}


def test_an_identical_rewrite_changes_nothing(api: Api) -> None:
    who = api.who("ana")
    execute(api, who, "memory_rewrite", {"text": "Preferred name: Ben"})
    again = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ben"})
    assert (again.text, again.is_error) == (words.unchanged(19, 4000), False)
    assert outcome(again) == "TOOL_CALL_OUTCOME_MEMORY_UNCHANGED"
    assert len(inspection(api, who).writes) == 1


REFUSED_WRITES = [
    pytest.param({"text": "  \u200b  "}, words.BLOCK_EMPTY, "ERROR_REASON_BLOCK_EMPTY", id="empty"),
    pytest.param(
        {"text": "y" * 4001},
        words.too_long(4001, 4000),
        "ERROR_REASON_BLOCK_TOO_LONG",
        id="over-the-limit",
    ),
    pytest.param(
        {"text": f"Preferred name: Ana\nBackup key {AWS_KEY}"},
        words.secret_detected(
            "AWS access key",
            [
                (
                    "text[line 2]",
                    "contains a credential (AWS access key); credentials are never stored",
                )
            ],
        ),
        "ERROR_REASON_SECRET_DETECTED",
        id="credential",
    ),
]


@pytest.mark.parametrize(("arguments", "text", "reason"), REFUSED_WRITES)
def test_a_refused_write_is_worded_and_counted(
    api: Api, arguments: dict[str, str], text: str, reason: str
) -> None:
    who = api.who("ana")
    refused = execute(api, who, "memory_rewrite", arguments)
    assert refused.text == f"{text}\n(Failed memory writes this turn: 1 of 3.)"
    assert (refused.is_error, outcome(refused), refused.error_reason) == (
        True,
        "TOOL_CALL_OUTCOME_REFUSED",
        reason,
    )
    assert refused.failed_write_count == 1
    assert AWS_KEY not in refused.text
    block = api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=who)
    assert block.memory_block.text == ""
    assert inspection(api, who).failed_write_count == 1


BAD_ARGUMENTS = [
    pytest.param(
        "memory_rewrite",
        '{"text": ',
        words.bad_arguments(words.REWRITE, words.not_json("Expecting value")),
        id="rewrite-malformed-json",
    ),
    pytest.param(
        "memory_rewrite",
        {"text": "x", "lines": ["x"]},
        words.bad_arguments(words.REWRITE, "unknown argument(s): lines"),
        id="rewrite-extra-argument",
    ),
    pytest.param(
        "memory_rewrite",
        {},
        words.bad_arguments(words.REWRITE, "the required argument `text` is missing"),
        id="rewrite-missing-argument",
    ),
    pytest.param(
        "memory_rewrite",
        "[1]",
        words.bad_arguments(words.REWRITE, "the arguments must be a JSON object"),
        id="rewrite-not-an-object",
    ),
    pytest.param(
        "conversation_search",
        {"query": "x", "max_turns": 51},
        words.bad_arguments(words.SEARCH, "`max_turns` must be from 1 to 50, not 51"),
        id="search-out-of-range",
    ),
    pytest.param(
        "conversation_search",
        {"query": "x", "max_turns": True},
        words.bad_arguments(words.SEARCH, "`max_turns` must be an integer, not a boolean"),
        id="search-mistyped",
    ),
    pytest.param(
        "conversation_search",
        {"query": "  "},
        words.bad_arguments(words.SEARCH, "`query` is empty"),
        id="search-empty-query",
    ),
    pytest.param(
        "conversation_search",
        {"query": "x", "start_time": "last week"},
        words.bad_arguments(words.SEARCH, words.not_a_time("start_time")),
        id="search-start-not-a-date",
    ),
    pytest.param(
        "conversation_search",
        {"query": "x", "end_time": "2026-02-30"},
        words.bad_arguments(words.SEARCH, words.not_a_time("end_time")),
        id="search-end-not-on-the-calendar",
    ),
    pytest.param(
        "conversation_search",
        {"query": "x", "conversation_id": 12},
        words.bad_arguments(words.SEARCH, "`conversation_id` must be a string, not a number"),
        id="search-conversation-mistyped",
    ),
]


@pytest.mark.parametrize(("tool", "arguments", "text"), BAD_ARGUMENTS)
def test_arguments_that_do_not_fit_the_schema_are_answered_without_performing_anything(
    api: Api, tool: str, arguments: object, text: str
) -> None:
    who = api.who("ana")
    response = execute(api, who, tool, arguments)
    counted = tool == "memory_rewrite"
    suffix = "\n(Failed memory writes this turn: 1 of 3.)" if counted else ""
    assert (response.text, response.is_error) == (text + suffix, True)
    assert outcome(response) == "TOOL_CALL_OUTCOME_INVALID_ARGUMENTS"
    assert response.failed_write_count == int(counted)
    seen = inspection(api, who)
    assert (len(seen.writes), len(seen.searches), seen.failed_write_count) == (0, 0, int(counted))


def test_an_unknown_tool_is_named_and_nothing_is_counted(api: Api) -> None:
    who = api.who("ana")
    response = execute(api, who, "memory_delete", {})
    assert (response.text, response.is_error) == (words.unknown_tool("memory_delete"), True)
    assert outcome(response) == "TOOL_CALL_OUTCOME_UNKNOWN_TOOL"
    assert inspection(api, who).failed_write_count == 0


def test_memory_off_refuses_the_write_and_finds_nothing(api: Api) -> None:
    who = api.who("ana")
    api.blocks.UpdateMemorySettings(
        blocks_pb.UpdateMemorySettingsRequest(memory_enabled=False, writer=block_pb.WRITER_USER),
        metadata=who,
    )
    refused = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ana"})
    assert refused.text == f"{words.MEMORY_DISABLED}\n(Failed memory writes this turn: 1 of 3.)"
    assert refused.error_reason == "ERROR_REASON_MEMORY_DISABLED"
    found = execute(api, who, "conversation_search", {"query": "Ana"})
    assert (found.text, found.is_error) == (words.no_hits("Ana"), False)
    assert outcome(found) == "TOOL_CALL_OUTCOME_SEARCH_NO_HITS"


def test_the_fourth_failed_write_of_a_turn_is_not_attempted(api: Api) -> None:
    who = api.who("ana")
    for n in (1, 2, 3):
        failed = execute(api, who, "memory_rewrite", {"text": ""})
        assert failed.failed_write_count == n
    assert failed.text.endswith("(Failed memory writes this turn: 3 of 3; no more will be sent.)")
    fourth = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ana"})
    assert (fourth.text, fourth.is_error) == (words.refused_after_failures(3), True)
    assert (outcome(fourth), fourth.failed_write_count) == (
        "TOOL_CALL_OUTCOME_FAILED_WRITES_EXHAUSTED",
        3,
    )
    block = api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=who)
    assert block.memory_block.text == ""  # nothing was attempted
    # The next turn starts from zero.
    nxt = block_pb.TurnReference(conversation_id="conv-1", turn_id="2")
    saved = execute(api, who, "memory_rewrite", {"text": "Preferred name: Ana"}, turn=nxt)
    assert outcome(saved) == "TOOL_CALL_OUTCOME_MEMORY_SAVED"
    assert inspection(api, who).failed_write_count == 3


@pytest.mark.postgres
def test_the_cap_holds_for_a_turn_served_by_two_servers_on_one_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with ExitStack() as stack:
        one = stack.enter_context(serving(server_settings("postgres", request, tmp_path / "a")))
        two = stack.enter_context(serving(server_settings("postgres", request, tmp_path / "b")))
        who = one.who("ana")
        counts = [
            execute(server, who, "memory_rewrite", {"text": " "}).failed_write_count
            for server in (one, two, one)
        ]
        assert counts == [1, 2, 3]
        fourth = execute(two, who, "memory_rewrite", {"text": "Preferred name: Ana"})
        assert outcome(fourth) == "TOOL_CALL_OUTCOME_FAILED_WRITES_EXHAUSTED"
        assert fourth.text == words.refused_after_failures(3)


# Search.


def test_search_with_hits_and_with_none_is_recorded_for_the_turn(api: Api) -> None:
    who = api.who("ana")
    none = execute(api, who, "conversation_search", {"query": "acct-4821"})
    assert (none.text, none.is_error) == (words.no_hits("acct-4821"), False)
    when = search_pb.IndexTurnRequest(
        conversation_id="conv-0",
        turn_id="7",
        question="My billing account is acct-4821.",
        answer="Noted: acct-4821.",
        wait=True,
    )
    when.turn_time.FromJsonString("2026-11-02T10:00:00Z")
    api.search.IndexTurn(when, metadata=who)
    found = execute(api, who, "conversation_search", {"query": "acct-4821", "max_turns": 3})
    assert not found.is_error
    assert outcome(found) == "TOOL_CALL_OUTCOME_SEARCH_HITS"
    assert found.text.startswith("1 past turn matched 'acct-4821', best first:\n\n")
    assert (
        "[1] conversation conv-0, turn 7, 2026-11-02 10:00 UTC; matched by keywords" in found.text
    )
    assert found.text.endswith("My billing account is acct-4821.\n\nNoted: acct-4821.")
    searches = inspection(api, who).searches
    assert [(s.query, s.hit_count) for s in searches] == [("acct-4821", 0), ("acct-4821", 1)]


def test_search_bounds_reach_the_search_and_invalid_ones_are_worded(api: Api) -> None:
    who = api.who("ana")
    for conversation, turn, day in [
        ("conv-0", "1", "01"),
        ("conv-0", "2", "09"),
        ("c2", "1", "05"),
    ]:
        request = search_pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id=turn,
            question="The kayak trip.",  # the same words: equal scores, the newer first
            answer="Noted, kayak trip.",
            wait=True,
        )
        request.turn_time.FromJsonString(f"2026-11-{day}T10:00:00Z")
        api.search.IndexTurn(request, metadata=who)

    def found(**bounds: str) -> list[tuple[str, str, str]]:
        response = execute(api, who, "conversation_search", {"query": "kayak trip", **bounds})
        assert not response.is_error, response.text
        return re.findall(r"\[\d+\] conversation (\S+), turn (\S+), 2026-11-(\d\d)", response.text)

    assert found(start_time="2026-11-02", end_time="2026-11-09T10:00:00Z") == [("c2", "1", "05")]
    assert found(start_time="2026-11-09T11:00:00+01:00") == [("conv-0", "2", "09")]
    assert found(conversation_id="conv-0") == [("conv-0", "2", "09"), ("conv-0", "1", "01")]
    empty = execute(api, who, "conversation_search", {"query": "kayak", "conversation_id": "none"})
    assert (empty.text, outcome(empty)) == (
        words.no_hits("kayak"),
        "TOOL_CALL_OUTCOME_SEARCH_NO_HITS",
    )
    span = {"query": "kayak", "start_time": "2026-11-09", "end_time": "2026-11-02"}
    refused = execute(api, who, "conversation_search", span)
    assert refused.is_error and outcome(refused) == "TOOL_CALL_OUTCOME_REFUSED"
    assert refused.text == words.search_failed(
        "ERROR_REASON_INVALID_ARGUMENT",
        "",
        [("end_time", "must be after start_time")],
    )
    assert refused.error_reason == "ERROR_REASON_INVALID_ARGUMENT"


def test_an_unavailable_index_reads_as_search_unavailable(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    embedder = shared_embedder()
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", embedder.dimension, embedder.model_id)
    running, channel = start_server(server_settings("sqlite", request, tmp_path), index=index)
    try:
        stub = pb_grpc.ModelToolServiceStub(channel)
        who = (("x-memoria-tenant", "t-broken"), ("x-memoria-principal", "ana"))
        index.close()
        response = stub.ExecuteToolCall(
            pb.ExecuteToolCallRequest(
                turn=TURN, tool_name="conversation_search", arguments_json='{"query": "x"}'
            ),
            metadata=who,
            timeout=30,
        )
        assert (response.text, response.is_error) == (words.SEARCH_UNAVAILABLE, True)
        assert response.error_reason == "ERROR_REASON_STORE_UNAVAILABLE"
    finally:
        channel.close()
        running.stop(0)


# The backend's own mistakes and an unconfirmed identity: errors of the call.


def test_an_unconfirmed_identity_touches_nothing_and_carries_the_models_words(api: Api) -> None:
    stub = tools(api)
    for tool, text in (
        ("memory_rewrite", words.REWRITE_UNAUTHENTICATED),
        ("conversation_search", words.SEARCH_UNAUTHENTICATED),
    ):
        error = expect_error(
            lambda tool=tool: stub.ExecuteToolCall(  # type: ignore[misc]
                pb.ExecuteToolCallRequest(
                    turn=TURN, tool_name=tool, arguments_json='{"text": "x"}'
                ),
                metadata=(),
            ),
            grpc.StatusCode.UNAUTHENTICATED,
            "ERROR_REASON_UNAUTHENTICATED",
        )
        assert localized(error) == text
    # A hostile tool name is quoted cut, so the words fit in the status's trailer.
    error = expect_error(
        lambda: stub.ExecuteToolCall(
            pb.ExecuteToolCallRequest(turn=TURN, tool_name="x" * 70_000), metadata=()
        ),
        grpc.StatusCode.UNAUTHENTICATED,
        "ERROR_REASON_UNAUTHENTICATED",
    )
    assert localized(error) == words.unknown_tool("x" * 64 + "…")
    expect_error(
        lambda: stub.RenderPromptSection(pb.RenderPromptSectionRequest(), metadata=()),
        grpc.StatusCode.UNAUTHENTICATED,
        "ERROR_REASON_UNAUTHENTICATED",
    )


def test_a_call_without_a_valid_turn_is_the_backends_mistake(api: Api) -> None:
    who = api.who("ana")
    stub = tools(api)
    error = expect_error(
        lambda: stub.ExecuteToolCall(
            pb.ExecuteToolCallRequest(tool_name="memory_rewrite", arguments_json='{"text": "x"}'),
            metadata=who,
        ),
        INVALID,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert field_violations(error) == {"turn": "is required"}
    error = expect_error(
        lambda: stub.ExecuteToolCall(
            pb.ExecuteToolCallRequest(
                turn=block_pb.TurnReference(conversation_id="c" * 129, turn_id="1"),
                tool_name="memory_rewrite",
                arguments_json='{"text": "x"}',
            ),
            metadata=who,
        ),
        INVALID,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert set(field_violations(error)) == {"turn.conversation_id"}
    block = api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=who)
    assert block.memory_block.text == ""
