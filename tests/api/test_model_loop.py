"""A scripted model drives MemoriaTurnAdapter against the real server (SQLite and PostgreSQL).

No LLM is reachable here, so the script plays the model: it reads the system prompt section,
makes the tool calls a careful model would make (as JSON argument strings, as OpenAI sends
them), and the test checks what the model would read back (the server's words,
server/domain/model_words.py) and what GetTurnInspection shows each turn read and wrote. A
counting interceptor on the adapter's channel proves which calls reached the server.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria_client import MemoriaTurnAdapter, load_tools
from server.domain import model_words as wording
from tests.api.conftest import Api, Metadata

ACCOUNT = "acct-7731"
SEARCH_DEADLINE_SECONDS = 30.0


@dataclass
class CountingInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]  # not generic at run time
    """Counts the unary calls sent through a channel, by method name."""

    calls: Counter[str] = field(default_factory=Counter)

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        self.calls[details.method.rsplit("/", 1)[1]] += 1
        return continuation(details, request)


def call(name: str, **arguments: object) -> tuple[str, str]:
    """A tool call as a model sends it: the tool's name and its arguments as JSON text."""
    assert name in {t["name"] for t in load_tools("openai_responses")}
    return name, json.dumps(arguments)


def search_until_found(adapter: MemoriaTurnAdapter, query: str, expect: str) -> tuple[str, int]:
    """Search until `expect` shows (the worker indexes finished turns in the background).

    Bounded: fails after SEARCH_DEADLINE_SECONDS. Returns the result and how many searches ran.
    """
    deadline = time.monotonic() + SEARCH_DEADLINE_SECONDS
    attempts = 0
    while True:
        attempts += 1
        result = adapter.execute(*call("conversation_search", query=query))
        assert not result.is_error, result.text
        if expect in result.text or time.monotonic() > deadline:
            return result.text, attempts
        time.sleep(0.05)  # polling a background worker, bounded by the deadline above


def test_a_scripted_model_remembers_an_account_and_finds_the_earlier_conversation(
    api: Api,
) -> None:
    counting = CountingInterceptor()
    channel = grpc.intercept_channel(api.channel, counting)
    who = api.who("ana")

    # Conversation 1, turn 1: the person gives an account id the service confirmed.
    adapter = MemoriaTurnAdapter(channel, who)
    assert counting.calls["GetModelTools"] == 1
    adapter.start_turn("conv-1", "1")
    section = adapter.prompt_section()
    assert section == wording.BASE_INSTRUCTIONS + "\n\n" + wording.EMPTY_BLOCK
    question = f"My Jira account is {ACCOUNT} (it's what the Jira current-user lookup shows)."
    result = adapter.execute(*call("memory_rewrite", text=f"Jira account: {ACCOUNT}"))
    assert not result.is_error
    assert result.text.startswith("Saved. The memory block now has 23/4,000 characters.")
    assert f"Added lines:\n+ Jira account: {ACCOUNT}\n" in result.text
    answer = f"Got it: I'll remember your Jira account {ACCOUNT}."
    adapter.finish_turn(question, answer, datetime(2026, 11, 2, 10, 0, tzinfo=UTC))
    assert adapter.flush(timeout=30) == 0  # durably accepted (indexing follows in the background)
    assert counting.calls["IndexTurn"] == 1

    # Conversation 2, new (a new adapter, as a new process would make): the id is in the
    # prompt, and a question that points back finds the earlier turn.
    adapter = adapter.for_identity(who)
    adapter.start_turn("conv-2", "1")
    section = adapter.prompt_section()
    block = f"Personal memory (23/4,000 characters)\nJira account: {ACCOUNT}"
    assert section.endswith("\n\n" + block)  # the block comes last
    assert section.startswith(wording.BASE_INSTRUCTIONS)
    found, searches = search_until_found(adapter, ACCOUNT, "conversation conv-1, turn 1")
    assert found.startswith(f"1 past turn matched {ACCOUNT!r}, best first:"), found
    assert "2026-11-02 10:00 UTC; matched by keywords (rank 1)" in found
    assert question in found and answer in found
    assert counting.calls["ExecuteToolCall"] == 1 + searches

    # Turn 2 of conversation 2: the model's first write is over the limit; the warning gives
    # the count, and the trimmed retry succeeds.
    adapter.finish_turn(f"Which Jira account is {ACCOUNT}?", "The one from conversation 1.")
    adapter.start_turn("conv-2", "2")
    long_block = f"Jira account: {ACCOUNT}\n" + "\n".join(
        f"Note {i}: " + "x" * 90 for i in range(45)
    )
    too_long = adapter.execute(*call("memory_rewrite", text=long_block))
    assert too_long.is_error
    count = len(long_block)
    assert too_long.text == (
        wording.too_long(count, 4000) + "\n(Failed memory writes this turn: 1 of 3.)"
    )
    assert f"the block has {count:,} characters and the limit is 4,000" in too_long.text
    trimmed = f"Jira account: {ACCOUNT}\nLikes short answers"
    retry = adapter.execute(*call("memory_rewrite", text=trimmed))
    assert not retry.is_error
    assert "Removed lines: none.\nAdded lines:\n+ Likes short answers\n" in retry.text
    adapter.finish_turn("Also, keep answers short.", "Noted, short answers.")

    # Turn 3: three failed writes, then the fourth is refused without being attempted.
    adapter.start_turn("conv-2", "3")
    empty = adapter.execute(*call("memory_rewrite", text="  \u200b  "))
    assert empty.text.startswith(wording.BLOCK_EMPTY)
    malformed = adapter.execute("memory_rewrite", json.dumps({"lines": ["x"]}))
    assert malformed.text.startswith("Not sent: unknown argument(s): lines.")
    over = adapter.execute(*call("memory_rewrite", text="y" * 4001))
    assert over.text.endswith("(Failed memory writes this turn: 3 of 3; no more will be sent.)")
    fourth = adapter.execute(*call("memory_rewrite", text="Jira account: something-else"))
    assert fourth.is_error
    assert fourth.text == wording.refused_after_failures(3)
    stored = api.blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=who)
    assert stored.memory_block.text == trimmed
    adapter.finish_turn("Remember nothing else.", "Nothing else remembered.")
    assert adapter.flush(timeout=30) == 0
    # Every call named its turn: the inspector shows what each turn read and wrote.
    assert counting.calls["RenderMemoryBlock"] == counting.calls["RewriteMemoryBlock"] == 0
    first = inspection(api, who, "conv-1", "1")
    assert len(first.renders) == 1
    assert [list(w.added_lines) for w in first.writes] == [[f"Jira account: {ACCOUNT}"]]
    second = inspection(api, who, "conv-2", "1")
    assert (len(second.renders), len(second.searches)) == (1, searches)
    third = inspection(api, who, "conv-2", "2")
    assert [list(w.added_lines) for w in third.writes] == [["Likes short answers"]]
    assert third.failed_write_count == 1
    assert inspection(api, who, "conv-2", "3").failed_write_count == 3


def inspection(
    api: Api, who: Metadata, conversation_id: str, turn_id: str
) -> search_pb.TurnInspection:
    """What GetTurnInspection shows for one turn."""
    turn = block_pb.TurnReference(conversation_id=conversation_id, turn_id=turn_id)
    return api.search.GetTurnInspection(
        search_pb.GetTurnInspectionRequest(turn=turn), metadata=who
    ).inspection


def test_memory_off_and_an_unconfirmed_identity_read_as_the_design_says(api: Api) -> None:
    who = api.who("ben")
    adapter = MemoriaTurnAdapter(api.channel, who)
    adapter.start_turn("conv-ben", "1")
    saved = adapter.execute(*call("memory_rewrite", text="Preferred name: Ben"))
    assert not saved.is_error
    again = adapter.execute(*call("memory_rewrite", text="Preferred name: Ben"))
    assert again.text == wording.unchanged(19, 4000)

    # The person turns memory off: no section, writes refused for good, nothing indexed.
    api.blocks.UpdateMemorySettings(
        blocks_pb.UpdateMemorySettingsRequest(memory_enabled=False, writer=block_pb.WRITER_USER),
        metadata=who,
    )
    assert adapter.prompt_section().endswith("\n\n" + wording.EMPTY_BLOCK)
    refused = adapter.execute(*call("memory_rewrite", text="Preferred name: Benjamin"))
    assert refused.is_error
    assert refused.text.startswith(wording.MEMORY_DISABLED)
    found = adapter.execute(*call("conversation_search", query="Ben"))
    assert found.text == wording.no_hits("Ben")

    # No identity at all (an adapter shares the tools fetched by another): the search finds
    # nothing, the write is a clear refusal, both in the server's words.
    nobody = adapter.for_identity([])
    nobody.start_turn("conv-ben", "2")
    search = nobody.execute(*call("conversation_search", query="Ben"))
    assert (search.text, search.is_error) == (wording.SEARCH_UNAUTHENTICATED, True)
    write = nobody.execute(*call("memory_rewrite", text="Preferred name: Ben"))
    assert (write.text, write.is_error) == (wording.REWRITE_UNAUTHENTICATED, True)
