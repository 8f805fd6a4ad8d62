"""MemoriaTurnAdapter against a scripted gRPC server: what the model reads for every outcome.

tests/fake_memoria.py answers with the exact statuses and details the real server sends
(including reasons hard to provoke in a real server, such as STORE_UNAVAILABLE), so the
adapter's decoding runs for real. The real server's loop is tests/api/test_model_loop.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria_client import MemoriaTurnAdapter, ToolResult, base_system_prompt, wording
from tests.fake_memoria import WHO, Script, failure, saved_response, scripted_server


@dataclass
class Served:
    script: Script
    channel: grpc.Channel
    adapter: MemoriaTurnAdapter


@pytest.fixture
def served() -> Iterator[Served]:
    with scripted_server() as (script, channel, _port):
        yield Served(script, channel, MemoriaTurnAdapter(channel, WHO, timeout=10))


def test_section_is_the_base_instructions_then_the_block_last(served: Served) -> None:
    served.script.section = "Personal memory (19/4,000 characters)\nPreferred name: Ana"
    section = served.adapter.system_prompt_section()
    assert section == base_system_prompt() + "\n\n" + served.script.section
    assert served.adapter.render_block() == served.script.section
    assert served.script.metadata[0]["x-memoria-principal"] == "ana"


def test_section_without_a_block_says_nothing_is_remembered(served: Served) -> None:
    section = served.adapter.system_prompt_section()
    assert section.endswith("\n\n" + wording.EMPTY_BLOCK)


def test_an_unloadable_block_says_so_and_writes_wait_for_a_render(served: Served) -> None:
    served.script.render = failure(grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_STORE_UNAVAILABLE")
    section = served.adapter.system_prompt_section()
    assert section == base_system_prompt() + "\n\n" + wording.BLOCK_UNAVAILABLE
    with pytest.raises(grpc.RpcError):
        served.adapter.render_block()  # the bare render reports the failure as it is
    refused = served.adapter.execute("memory_rewrite", {"text": "Preferred name: Ana"})
    assert refused == ToolResult(wording.REWRITE_BLOCK_UNSEEN, is_error=True)
    assert served.script.rewrites == []
    served.script.render = None
    served.adapter.system_prompt_section()
    served.script.rewrite = saved_response("Preferred name: Ana", [], ["Preferred name: Ana"])
    assert not served.adapter.execute("memory_rewrite", {"text": "Preferred name: Ana"}).is_error
    assert len(served.script.rewrites) == 1


def test_saved_write_lists_removed_and_added_lines_and_is_final(served: Served) -> None:
    served.script.rewrite = saved_response(
        "Preferred name: Ana B.\nLikes short answers",
        ["Preferred name: Ana"],
        ["Preferred name: Ana B."],
    )
    result = served.adapter.execute(
        "memory_rewrite", '{"text": "Preferred name: Ana B.\\nLikes short answers"}'
    )
    assert result == ToolResult(
        "Saved. The memory block now has 42/4,000 characters.\n"
        "Removed lines (check that each removal was intended):\n"
        "- Preferred name: Ana\n"
        "Added lines:\n"
        "+ Preferred name: Ana B.\n"
        "This write is done: do not call memory_rewrite again for it. Only if a removal above "
        "was not intended, call it once more with that line restored.",
        is_error=False,
    )
    (request,) = served.script.rewrites
    assert request.text == "Preferred name: Ana B.\nLikes short answers"
    assert request.writer == block_pb.WRITER_MODEL
    assert not request.HasField("etag")  # the model's path: last write wins


def test_unchanged_write_says_nothing_changed(served: Served) -> None:
    served.script.rewrite = saved_response("Preferred name: Ana", [], [], changed=False)
    result = served.adapter.execute("memory_rewrite", {"text": "Preferred name: Ana"})
    assert not result.is_error
    assert result.text.startswith("Nothing changed: the text is identical")
    assert "(19/4,000 characters)" in result.text
    assert "Do not call memory_rewrite again" in result.text


INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            failure(
                INVALID,
                "ERROR_REASON_BLOCK_TOO_LONG",
                {"char_count": "4321", "char_limit": "4000"},
            ),
            wording.too_long(4321, 4000),
        ),
        (failure(INVALID, "ERROR_REASON_BLOCK_EMPTY"), wording.BLOCK_EMPTY),
        (
            failure(grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_MEMORY_DISABLED"),
            wording.MEMORY_DISABLED,
        ),
        (
            failure(grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_STORE_UNAVAILABLE"),
            wording.STORE_UNAVAILABLE,
        ),
        (
            failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "ERROR_REASON_STORAGE_FULL"),
            wording.STORAGE_FULL,
        ),
        (
            failure(grpc.StatusCode.ABORTED, "ERROR_REASON_WRITE_CONFLICT"),
            wording.WRITE_CONFLICT,
        ),
        (
            failure(grpc.StatusCode.UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED"),
            wording.REWRITE_UNAUTHENTICATED,
        ),
        (
            failure(grpc.StatusCode.INTERNAL, "ERROR_REASON_INTERNAL", {"trace_id": "abc123"}),
            wording.internal("abc123"),
        ),
        # A status without details: the service was not reached (a proxy, a dead connection).
        (failure(grpc.StatusCode.UNAVAILABLE), wording.UNREACHABLE_WRITE),
        # Past the server's 1 MiB message limit, refused before any rule ran.
        (failure(grpc.StatusCode.RESOURCE_EXHAUSTED), wording.too_long(None, None)),
    ],
)
def test_each_refusal_has_its_wording(served: Served, status: grpc.Status, expected: str) -> None:
    served.script.rewrite = status
    result = served.adapter.execute("memory_rewrite", {"text": "x"})
    assert result == ToolResult(f"{expected}\n(Failed memory writes this turn: 1 of 3.)", True)


def test_too_long_gives_the_count_the_limit_and_what_to_do() -> None:
    text = wording.too_long(4321, 4000)
    assert "4,321 characters and the limit is 4,000 (321 over)" in text
    assert "Nothing was cut and the stored block is unchanged" in text
    assert "call memory_rewrite again with the whole shortened block" in text


def test_secret_names_the_line_and_kind_never_the_secret(served: Served) -> None:
    served.script.rewrite = failure(
        INVALID,
        "ERROR_REASON_SECRET_DETECTED",
        {"secret_types": "api_key"},
        [("text[line 2]", "looks like an API key")],
    )
    result = served.adapter.execute("memory_rewrite", {"text": "Name: Ana\nkey sk-123"})
    assert result.is_error
    assert "credential (api_key) - text[line 2]: looks like an API key" in result.text
    assert "sk-123" not in result.text


def test_other_field_violations_are_named(served: Served) -> None:
    served.script.rewrite = failure(
        INVALID, "ERROR_REASON_INVALID_ARGUMENT", violations=[("text", "must be valid.")]
    )
    result = served.adapter.execute("memory_rewrite", {"text": "x"})
    assert result.text.startswith("Not saved (ERROR_REASON_INVALID_ARGUMENT): text: must be valid.")


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "the required argument `text` is missing"),
        ({"text": 5}, "`text` must be a string, not a number"),
        ({"text": "a", "append": True}, "unknown argument(s): append"),
        ("{not json", "the arguments are not valid JSON"),
        ('["a"]', "the arguments must be a JSON object"),
        ('{"text": "Name: \\ud800"}', "`text` contains an invalid character"),
    ],
)
def test_malformed_writes_make_no_call(served: Served, arguments: object, problem: str) -> None:
    result = served.adapter.execute("memory_rewrite", arguments)  # type: ignore[arg-type]
    assert result.is_error
    assert result.text.startswith(f"Not sent: {problem}")
    assert "takes exactly one argument, `text`" in result.text
    assert served.script.rewrites == []


def test_fourth_failed_write_of_a_turn_is_refused_without_a_call(served: Served) -> None:
    served.script.rewrite = failure(
        INVALID, "ERROR_REASON_BLOCK_TOO_LONG", {"char_count": "4100", "char_limit": "4000"}
    )
    texts = [served.adapter.execute("memory_rewrite", {"text": "x"}).text for _ in range(3)]
    assert texts[2].endswith("(Failed memory writes this turn: 3 of 3; no more will be sent.)")
    assert len(served.script.rewrites) == 3
    fourth = served.adapter.execute("memory_rewrite", {"text": "y"})
    assert fourth == ToolResult(wording.refused_after_failures(3), is_error=True)
    assert len(served.script.rewrites) == 3
    # The next turn may write again.
    served.adapter.start_turn()
    served.script.rewrite = saved_response("y", [], ["y"])
    assert not served.adapter.execute("memory_rewrite", {"text": "y"}).is_error
    assert len(served.script.rewrites) == 4


def test_malformed_calls_count_as_failed_writes_and_finish_turn_resets(served: Served) -> None:
    for _ in range(3):
        served.adapter.execute("memory_rewrite", {"txt": "x"})
    assert served.adapter.execute("memory_rewrite", {"text": "x"}).text == (
        wording.refused_after_failures(3)
    )
    served.adapter.finish_turn("c", "1", "q", "a")
    assert served.adapter.flush(timeout=10) == 0
    served.script.rewrite = saved_response("x", [], ["x"])
    assert not served.adapter.execute("memory_rewrite", {"text": "x"}).is_error


def test_the_failed_write_budget_is_configurable(served: Served) -> None:
    served.script.rewrite = failure(INVALID, "ERROR_REASON_BLOCK_EMPTY")
    adapter = MemoriaTurnAdapter(served.channel, WHO, max_failed_writes_per_turn=1)
    assert adapter.execute("memory_rewrite", {"text": " "}).is_error
    assert adapter.execute("memory_rewrite", {"text": " "}).text == (
        wording.refused_after_failures(1)
    )
    assert len(served.script.rewrites) == 1
    with pytest.raises(ValueError):
        MemoriaTurnAdapter(served.channel, WHO, max_failed_writes_per_turn=0)


def test_unknown_tool_makes_no_call(served: Served) -> None:
    result = served.adapter.execute("memory_delete", {})
    assert result == ToolResult(wording.unknown_tool("memory_delete"), is_error=True)
    assert served.script.rewrites == [] and served.script.searches == []


def hit(
    conversation: str, turn: str, text: str, keyword: int, semantic: int
) -> search_pb.SearchHit:
    when = Timestamp()
    when.FromDatetime(datetime(2026, 11, 2, 10, 0, tzinfo=UTC))
    return search_pb.SearchHit(
        conversation_id=conversation,
        turn_id=turn,
        text=text,
        turn_time=when,
        keyword_rank=keyword,
        semantic_rank=semantic,
    )


def test_search_hits_show_conversation_date_text_and_why(served: Served) -> None:
    served.script.search = search_pb.SearchConversationsResponse(
        hits=[hit("c-1", "1", "To acct-4821.", 1, 2), hit("c-7", "3", "Refunds...", 0, 1)]
    )
    result = served.adapter.execute("conversation_search", {"query": "acct-4821", "max_turns": 5})
    assert result == ToolResult(
        "2 past turns matched 'acct-4821', best first:\n\n"
        "[1] conversation c-1, turn 1, 2026-11-02 10:00 UTC; matched by keywords (rank 1) and "
        "meaning (rank 2)\nTo acct-4821.\n\n"
        "[2] conversation c-7, turn 3, 2026-11-02 10:00 UTC; matched by meaning only (rank 1)\n"
        "Refunds...",
        is_error=False,
    )
    assert served.script.searches[0].query == "acct-4821"
    assert served.script.searches[0].page_size == 5


def test_search_without_max_turns_asks_for_the_server_default(served: Served) -> None:
    served.script.search = search_pb.SearchConversationsResponse()
    result = served.adapter.execute("conversation_search", '{"query": "refund"}')
    assert result == ToolResult(wording.no_hits("refund"), is_error=False)
    assert served.script.searches[0].page_size == 0


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"query": ""},
        {"query": "  "},
        {"query": "a", "max_turns": 99},
        {"q": "a"},
        '{"query": "\\udfff"}',
    ],
)
def test_malformed_searches_make_no_call(served: Served, arguments: object) -> None:
    result = served.adapter.execute("conversation_search", arguments)  # type: ignore[arg-type]
    assert result.is_error and result.text.startswith("Not sent: ")
    assert served.script.searches == []


def test_unconfirmed_identity_gives_an_empty_search_result(served: Served) -> None:
    served.script.search = failure(grpc.StatusCode.UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED")
    result = served.adapter.execute("conversation_search", {"query": "refund"})
    assert result == ToolResult(wording.SEARCH_UNAUTHENTICATED, is_error=False)


def test_search_outage_fails_loudly(served: Served) -> None:
    served.script.search = failure(grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_STORE_UNAVAILABLE")
    result = served.adapter.execute("conversation_search", {"query": "refund"})
    assert result == ToolResult(wording.SEARCH_UNAVAILABLE, is_error=True)


def test_refused_search_names_the_field(served: Served) -> None:
    served.script.search = failure(
        INVALID, "ERROR_REASON_INVALID_ARGUMENT", violations=[("query", "at most 4,000.")]
    )
    result = served.adapter.execute("conversation_search", {"query": "x"})
    assert (
        result.text
        == "Search failed (ERROR_REASON_INVALID_ARGUMENT): query: at most 4,000. Nothing was found."
    )


def test_finish_turn_sends_the_turn_without_waiting(served: Served) -> None:
    when = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    served.adapter.finish_turn("c-9", "4", "Which account?", "acct-4821", turn_time=when)
    assert served.adapter.flush(timeout=10) == 0
    (request,) = served.script.indexed
    assert (request.conversation_id, request.turn_id) == ("c-9", "4")
    assert (request.question, request.answer) == ("Which account?", "acct-4821")
    assert request.turn_time.ToDatetime(tzinfo=UTC) == when
    assert request.wait is False


def test_flush_counts_turns_that_were_not_accepted(served: Served) -> None:
    served.script.index_refusals["gone"] = failure(
        grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_CONVERSATION_DELETED"
    )
    served.adapter.finish_turn("gone", "1", "q", "a")
    # A later turn (accepted) does not make the earlier failure disappear.
    served.adapter.finish_turn("c", "2", "q", "a")
    assert served.adapter.flush(timeout=10) == 1
    assert served.adapter.flush(timeout=10) == 0  # nothing left in flight
    assert sorted(r.conversation_id for r in served.script.indexed) == ["c", "gone"]
