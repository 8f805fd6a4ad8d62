"""MemoriaTurnAdapter against a scripted gRPC server: a thin layer that words nothing itself.

tests/fake_memoria.py answers ModelToolService as the real server does (including a
LocalizedMessage on a failed call, and outcomes hard to provoke in a real server: a service
that cannot be reached, a render that fails), so the adapter's handling runs for real. What
the model reads for each outcome is the server's, checked word for word by the conformance
data (tests/conformance) and tests/api/test_model_loop.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import pytest

from memoria_client import SHAPES, MemoriaTurnAdapter, ToolResult, load_tools
from server.domain import model_words
from tests.fake_memoria import WHO, Script, answer, failure, localized, scripted_server


@dataclass
class Served:
    script: Script
    channel: grpc.Channel
    adapter: MemoriaTurnAdapter


@pytest.fixture
def served() -> Iterator[Served]:
    with scripted_server() as (script, channel, _port):
        yield Served(script, channel, MemoriaTurnAdapter(channel, WHO, timeout=10))


def turn_of(request: object) -> tuple[str, str]:
    turn = request.turn  # type: ignore[attr-defined]
    return turn.conversation_id, turn.turn_id


def test_the_tools_are_fetched_once_and_given_in_every_provider_shape(served: Served) -> None:
    assert served.script.tool_fetches == 1
    assert served.script.metadata[0]["x-memoria-principal"] == "ana"
    for shape in SHAPES:
        # The packaged tools/ files are rendered from the same definition the server serves.
        assert served.adapter.tools(shape) == load_tools(shape)
    other = served.adapter.for_identity(
        [("x-memoria-tenant", "acme"), ("x-memoria-principal", "bo")]
    )
    assert other.tools("anthropic_messages") == load_tools("anthropic_messages")
    assert served.script.tool_fetches == 1  # another person's adapter shares the fetch


def test_nothing_is_called_outside_a_turn(served: Served) -> None:
    with pytest.raises(RuntimeError, match="start_turn"):
        served.adapter.prompt_section()
    with pytest.raises(RuntimeError, match="start_turn"):
        served.adapter.execute("memory_rewrite", {"text": "x"})
    with pytest.raises(RuntimeError, match="start_turn"):
        served.adapter.finish_turn("q", "a")
    assert served.script.renders == [] and served.script.calls == []


def test_the_section_is_the_servers_for_the_turn(served: Served) -> None:
    served.script.section = "the server's section"
    served.adapter.start_turn("c-1", "7")
    assert served.adapter.prompt_section() == "the server's section"
    assert served.adapter.system_prompt_section() == "the server's section"  # the old name
    assert [turn_of(r) for r in served.script.renders] == [("c-1", "7"), ("c-1", "7")]


def test_a_call_is_passed_through_with_its_turn_and_answered_with_the_servers_words(
    served: Served,
) -> None:
    served.script.execute = answer("the server's words", is_error=True)
    served.adapter.start_turn("c-1", "2")
    result = served.adapter.execute("memory_rewrite", '{"text": "Ana"}')
    assert result == ToolResult("the server's words", is_error=True)
    # An object (Anthropic, MCP) is sent as compact JSON; a name the server does not know too.
    served.script.execute = answer("saved")
    assert served.adapter.execute("memory_delete", {"text": "Ana é"}) == ToolResult("saved", False)
    first, second = served.script.calls
    assert (first.tool_name, first.arguments_json) == ("memory_rewrite", '{"text": "Ana"}')
    assert (second.tool_name, second.arguments_json) == ("memory_delete", '{"text":"Ana é"}')
    assert [turn_of(r) for r in served.script.calls] == [("c-1", "2"), ("c-1", "2")]


def test_an_unloadable_section_is_the_servers_words_and_writes_wait_for_a_render(
    served: Served,
) -> None:
    served.script.render = failure(grpc.StatusCode.UNAVAILABLE)
    served.adapter.start_turn("c-1", "1")
    assert served.adapter.prompt_section() == model_words.UNAVAILABLE_PROMPT_SECTION
    refused = served.adapter.execute("memory_rewrite", {"text": "Preferred name: Ana"})
    assert refused == ToolResult(model_words.REWRITE_BLOCK_UNSEEN, is_error=True)
    assert served.script.calls == []  # refused without a call
    served.script.execute = answer("no hits")
    assert served.adapter.execute("conversation_search", {"query": "x"}).text == "no hits"
    # The next turn's section loads: writes go through again.
    served.script.render = None
    served.adapter.start_turn("c-1", "2")
    served.adapter.prompt_section()
    served.script.execute = answer("saved")
    assert served.adapter.execute("memory_rewrite", {"text": "Ana"}).text == "saved"


@pytest.mark.parametrize(
    ("tool", "words"),
    [
        ("memory_rewrite", model_words.UNREACHABLE_WRITE),
        ("conversation_search", model_words.SEARCH_UNAVAILABLE),
    ],
)
@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_call_without_an_answer_reads_the_fetched_unreachable_words(
    served: Served, tool: str, words: str, code: grpc.StatusCode
) -> None:
    served.script.execute = failure(code)
    served.adapter.start_turn("c-1", "1")
    assert served.adapter.execute(tool, {"query": "x"}) == ToolResult(words, is_error=True)


def test_a_refused_call_reads_the_servers_localized_message(served: Served) -> None:
    served.script.execute = localized(
        grpc.StatusCode.UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED", "not confirmed"
    )
    served.adapter.start_turn("c-1", "1")
    assert served.adapter.execute("conversation_search", {"query": "x"}) == ToolResult(
        "not confirmed", is_error=True
    )


def test_the_backends_own_mistake_is_raised_not_read_to_the_model(served: Served) -> None:
    served.script.execute = failure(
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
        violations=[("turn.turn_id", "must not be empty")],
    )
    served.adapter.start_turn("c-1", "")
    with pytest.raises(grpc.RpcError):
        served.adapter.execute("memory_rewrite", {"text": "x"})


def test_finish_turn_sends_the_turn_without_waiting_and_ends_it(served: Served) -> None:
    when = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    served.adapter.start_turn("c-9", "4")
    served.adapter.finish_turn("Which account?", "acct-4821", turn_time=when)
    assert served.adapter.flush(timeout=10) == 0
    (request,) = served.script.indexed
    assert (request.conversation_id, request.turn_id) == ("c-9", "4")
    assert (request.question, request.answer) == ("Which account?", "acct-4821")
    assert request.turn_time.ToDatetime(tzinfo=UTC) == when
    assert request.wait is False
    with pytest.raises(RuntimeError, match="start_turn"):
        served.adapter.execute("memory_rewrite", {"text": "x"})


def test_flush_counts_turns_that_were_not_accepted(served: Served) -> None:
    served.script.index_refusals["gone"] = failure(
        grpc.StatusCode.FAILED_PRECONDITION, "ERROR_REASON_CONVERSATION_DELETED"
    )
    served.adapter.start_turn("gone", "1")
    served.adapter.finish_turn("q", "a")
    # A later turn (accepted) does not make the earlier failure disappear.
    served.adapter.start_turn("c", "2")
    served.adapter.finish_turn("q", "a")
    assert served.adapter.flush(timeout=10) == 1
    assert served.adapter.flush(timeout=10) == 0  # nothing left in flight
    assert sorted(r.conversation_id for r in served.script.indexed) == ["c", "gone"]


def test_an_adapter_cannot_be_made_without_the_tools() -> None:
    # No local copy of any words: without GetModelTools' answer there is no adapter.
    with grpc.insecure_channel("127.0.0.1:1") as channel, pytest.raises(grpc.RpcError):
        MemoriaTurnAdapter(channel, WHO, timeout=5)
