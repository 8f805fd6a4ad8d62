"""ListConversations and ListConversationTurns end to end (issue 24, item 3), on SQLite and
PostgreSQL: the caller's conversations newest first, paged (AIP-158: sizes, signed tokens, an
invalid token, the last page), each titled by the opening of its first question; one
conversation's turns oldest first with their text; only the caller's (tenant, principal),
never a deleted conversation, nothing after an erasure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import grpc

from memoria.v1 import conversation_search_service_pb2 as pb
from tests.api.conftest import Api, Metadata, expect_error, field_violations
from tests.api.test_search_api import ts

T0 = datetime(2026, 3, 2, 9, tzinfo=UTC)
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"  # AWS's documentation example, not a real key


def offer(
    api: Api,
    who: Metadata,
    conversation: str,
    turn: str,
    when: datetime,
    question: str = "a question",
    *,
    wait: bool = False,
) -> None:
    """Send one turn of time `when` (queued, or indexed in the call when `wait`)."""
    api.search.IndexTurn(
        pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id=turn,
            question=question,
            answer="an answer",
            turn_time=ts(when),
            wait=wait,
        ),
        metadata=who,
    )


def conversations(api: Api, who: Metadata, page_size: int = 0) -> list[pb.Conversation]:
    """Every conversation of the caller, page by page; checks each page's size."""
    out: list[pb.Conversation] = []
    token = ""
    while True:
        page = api.search.ListConversations(
            pb.ListConversationsRequest(page_size=page_size, page_token=token), metadata=who
        )
        assert len(page.conversations) <= (page_size or 50)
        out += page.conversations
        token = page.next_page_token
        if not token:
            return out
        assert len(page.conversations) == page_size  # only the last page may be short


def ids(listed: list[pb.Conversation]) -> list[str]:
    return [c.conversation_id for c in listed]


def test_conversations_newest_first_in_pages_of_any_size(api: Api) -> None:
    ana = api.who("ana")
    # Seven conversations, sent out of order; c3 has two turns, its last the newest of all.
    for n in (4, 1, 6, 0, 5, 2, 3):
        offer(api, ana, f"c{n}", "1", T0 + timedelta(days=n), f"question {n}")
    offer(api, ana, "c3", "2", T0 + timedelta(days=9), "a follow-up")
    whole = conversations(api, ana)
    assert ids(whole) == ["c3", "c6", "c5", "c4", "c2", "c1", "c0"]
    c3 = whole[0]
    assert c3.turn_count == 2
    assert c3.first_turn_time.ToDatetime(UTC) == T0 + timedelta(days=3)
    assert c3.last_turn_time.ToDatetime(UTC) == T0 + timedelta(days=9)
    assert c3.first_question_opening == "question 3"
    assert [c.first_question_opening for c in whole[1:]] == [
        f"question {n}" for n in (6, 5, 4, 2, 1, 0)
    ]
    for size in (1, 3, 7, 500, 100_000):  # past the maximum is capped, not refused
        assert conversations(api, ana, size) == whole
    first = api.search.ListConversations(pb.ListConversationsRequest(page_size=3), metadata=ana)
    assert ids(list(first.conversations)) == ["c3", "c6", "c5"] and first.next_page_token
    second = api.search.ListConversations(
        pb.ListConversationsRequest(page_size=3, page_token=first.next_page_token), metadata=ana
    )
    assert ids(list(second.conversations)) == ["c4", "c2", "c1"] and second.next_page_token
    last = api.search.ListConversations(
        pb.ListConversationsRequest(page_size=3, page_token=second.next_page_token), metadata=ana
    )
    assert ids(list(last.conversations)) == ["c0"] and last.next_page_token == ""
    # A page that ends exactly at the last conversation says so: no token, no empty page.
    exact = api.search.ListConversations(pb.ListConversationsRequest(page_size=7), metadata=ana)
    assert len(exact.conversations) == 7 and exact.next_page_token == ""


def test_equal_last_times_keep_one_order_across_pages(api: Api) -> None:
    ana = api.who("ana")
    for name in ("x", "y", "z", "w"):
        offer(api, ana, name, "1", T0)
    whole = ids(conversations(api, ana))
    assert sorted(whole) == ["w", "x", "y", "z"]
    assert ids(conversations(api, ana, 1)) == whole
    assert ids(conversations(api, ana, 3)) == whole


def test_page_tokens_and_sizes_are_checked(api: Api) -> None:
    ana, bob = api.who("ana"), api.who("bob")
    for n in range(3):
        offer(api, ana, f"c{n}", "1", T0 + timedelta(hours=n))
        offer(api, bob, f"c{n}", "1", T0 + timedelta(hours=n))
    offer(api, ana, "c0", "2", T0)
    token = api.search.ListConversations(
        pb.ListConversationsRequest(page_size=1), metadata=ana
    ).next_page_token
    turns_token = api.search.ListConversationTurns(
        pb.ListConversationTurnsRequest(conversation_id="c0", page_size=1), metadata=ana
    ).next_page_token
    assert token and turns_token
    for who, bad in (
        (ana, "not-a-token"),
        (ana, token[:-2]),
        (ana, token + "A"),
        (bob, token),  # ana's token is not bob's
        (api.who("ana", tenant=api.tenant + "-other"), token),
        (ana, turns_token),  # a token of another listing
    ):
        request = pb.ListConversationsRequest(page_token=bad)
        error = expect_error(
            partial(api.search.ListConversations, request, metadata=who),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_INVALID_PAGE_TOKEN",
        )
        assert "page_token" in field_violations(error)
    error = expect_error(
        lambda: api.search.ListConversations(
            pb.ListConversationsRequest(page_size=-1), metadata=ana
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert field_violations(error) == {"page_size": "must not be negative"}
    expect_error(
        lambda: api.search.ListConversations(pb.ListConversationsRequest()),
        grpc.StatusCode.UNAUTHENTICATED,
        "ERROR_REASON_UNAUTHENTICATED",
    )


def test_only_the_callers_conversations_and_never_deleted_ones(api: Api) -> None:
    ana, bob = api.who("ana"), api.who("bob")
    elsewhere = api.who("ana", tenant=api.tenant + "-other")
    offer(api, ana, "kept", "1", T0, "kept", wait=True)
    offer(api, ana, "indexed", "1", T0 + timedelta(hours=1), "to delete", wait=True)
    offer(api, ana, "queued", "1", T0 + timedelta(hours=2), "deleted while queued")
    offer(api, bob, "bobs", "1", T0, "bob's own")
    offer(api, elsewhere, "theirs", "1", T0, "another tenant's")
    assert ids(conversations(api, ana)) == ["queued", "indexed", "kept"]
    assert ids(conversations(api, bob)) == ["bobs"]
    assert ids(conversations(api, elsewhere)) == ["theirs"]
    for name in ("indexed", "queued"):
        api.search.DeleteConversation(
            pb.DeleteConversationRequest(conversation_id=name), metadata=ana
        )
    assert ids(conversations(api, ana)) == ["kept"]
    assert ids(conversations(api, bob)) == ["bobs"]
    api.search.ErasePrincipalData(pb.ErasePrincipalDataRequest(), metadata=ana)
    assert conversations(api, ana) == []
    assert ids(conversations(api, bob)) == ["bobs"]


def test_the_opening_is_bounded_and_sanitized(api: Api) -> None:
    ana = api.who("ana")
    question = "My key\u200b is " + AWS_KEY + ",\n\n  please   rotate it. " + "word " * 100
    offer(api, ana, "c1", "1", T0, question)
    offer(api, ana, "c1", "0", T0 - timedelta(minutes=1), "")  # the first turn: no question
    offer(api, ana, "c2", "1", T0, question)
    c2, c1 = conversations(api, ana)
    assert c1.first_question_opening == ""
    opening = c2.first_question_opening
    assert len(opening) == 100
    assert AWS_KEY not in opening and "\u200b" not in opening and "\n" not in opening
    assert opening.startswith("My key is [") and ", please rotate it. word word" in opening


def test_a_conversations_turns_oldest_first_with_their_text(api: Api) -> None:
    ana, bob = api.who("ana"), api.who("bob")
    offer(api, ana, "c1", "late", T0 + timedelta(hours=2), "third", wait=True)
    offer(api, ana, "c1", "early", T0, "first", wait=True)
    offer(api, ana, "c1", "middle", T0 + timedelta(hours=1), "second")  # perhaps still queued
    offer(api, ana, "c2", "1", T0, "elsewhere")
    turns: list[pb.ExportedTurn] = []
    token = ""
    while True:
        page = api.search.ListConversationTurns(
            pb.ListConversationTurnsRequest(conversation_id="c1", page_size=2, page_token=token),
            metadata=ana,
        )
        assert len(page.turns) <= 2
        turns += page.turns
        token = page.next_page_token
        if not token:
            break
    assert [(t.turn_id, t.text) for t in turns] == [
        ("early", "first\n\nan answer"),
        ("middle", "second\n\nan answer"),
        ("late", "third\n\nan answer"),
    ]
    assert turns[0].indexed and turns[0].turn_time.ToDatetime(UTC) == T0
    assert {t.conversation_id for t in turns} == {"c1"}
    whole = api.search.ListConversationTurns(
        pb.ListConversationTurnsRequest(conversation_id="c1"), metadata=ana
    )
    # The same turns as the pages read; "middle" may have been indexed in between, so its
    # `indexed` flag is not compared.
    same = [(t.turn_id, t.text, t.turn_time.ToDatetime(UTC)) for t in whole.turns]
    assert same == [(t.turn_id, t.text, t.turn_time.ToDatetime(UTC)) for t in turns]
    assert whole.next_page_token == ""
    # Owner only: another principal, an unknown id and a deleted conversation have no turns.
    for who, name in ((bob, "c1"), (ana, "unknown")):
        empty = api.search.ListConversationTurns(
            pb.ListConversationTurnsRequest(conversation_id=name), metadata=who
        )
        assert list(empty.turns) == [] and empty.next_page_token == ""
    api.search.DeleteConversation(pb.DeleteConversationRequest(conversation_id="c1"), metadata=ana)
    gone = api.search.ListConversationTurns(
        pb.ListConversationTurnsRequest(conversation_id="c1"), metadata=ana
    )
    assert list(gone.turns) == []


def test_conversation_turns_requests_are_checked(api: Api) -> None:
    ana, bob = api.who("ana"), api.who("bob")
    for n in range(2):
        offer(api, ana, "c1", str(n), T0 + timedelta(minutes=n))
    token = api.search.ListConversationTurns(
        pb.ListConversationTurnsRequest(conversation_id="c1", page_size=1), metadata=ana
    ).next_page_token
    assert token
    error = expect_error(
        lambda: api.search.ListConversationTurns(
            pb.ListConversationTurnsRequest(conversation_id="", page_size=-1), metadata=ana
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert set(field_violations(error)) == {"conversation_id", "page_size"}
    for who, name in ((bob, "c1"), (ana, "c2")):  # bound to the caller and the conversation
        request = pb.ListConversationTurnsRequest(conversation_id=name, page_token=token)
        expect_error(
            partial(api.search.ListConversationTurns, request, metadata=who),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ERROR_REASON_INVALID_PAGE_TOKEN",
        )
