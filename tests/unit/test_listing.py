"""The conversation list's rules on the fakes: page sizes (default, cap, negative), tokens
that carry a cursor exactly (to the microsecond, for times before 1970 too) and are bound to
the caller, the opening of a question, and a turn's text from its chunks once indexed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from server.adapters.secret_detector import DetectSecretsDetector
from server.domain.audit import PageTokens
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.listing import (
    DEFAULT_CONVERSATIONS,
    DEFAULT_TURNS,
    MAX_CONVERSATIONS,
    MAX_TURNS,
    OPENING_CHARS,
    ConversationList,
    question_opening,
)
from server.domain.model import Identity, NewTurn, TurnKey
from tests.fakes import InMemoryChunkIndex, InMemoryTurnStore

T0 = datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC)  # before the epoch, to the µs
ANA = Identity("acme", "ana")


@pytest.fixture
def store() -> InMemoryTurnStore:
    return InMemoryTurnStore()


def listing(store: InMemoryTurnStore) -> ConversationList:
    return ConversationList(store, InMemoryChunkIndex(), PageTokens(b"0123456789abcdef"))


def put(store: InMemoryTurnStore, conversation: str, turn: str, when: datetime) -> None:
    with store.units("acme", "ana") as uow:
        uow.turns.put(NewTurn(TurnKey("acme", "ana", conversation, turn), "q\n\na", when, T0))
        uow.commit()


def test_page_sizes_default_cap_and_negative(store: InMemoryTurnStore) -> None:
    for n in range(MAX_CONVERSATIONS + 1):
        put(store, f"c{n}", "1", T0 + timedelta(microseconds=n))
    for n in range(MAX_TURNS + 1):
        put(store, "c0", f"t{n}", T0 + timedelta(microseconds=n))
    lists = listing(store)
    assert len(lists.conversations(ANA, 0, "").conversations) == DEFAULT_CONVERSATIONS
    capped = lists.conversations(ANA, 10**6, "")
    assert len(capped.conversations) == MAX_CONVERSATIONS and capped.next_page_token
    rest = lists.conversations(ANA, 10**6, capped.next_page_token)
    assert [c.conversation_id for c in rest.conversations] == ["c1"]  # the oldest last turn
    assert rest.next_page_token == ""
    assert len(lists.turns(ANA, "c0", 0, "").turns) == DEFAULT_TURNS
    assert len(lists.turns(ANA, "c0", 10**6, "").turns) == MAX_TURNS
    with pytest.raises(MemoriaError) as raised:
        lists.conversations(ANA, -1, "")
    assert raised.value.reason is ErrorReason.INVALID_ARGUMENT


def test_tokens_carry_the_cursor_exactly_and_only_for_their_caller(
    store: InMemoryTurnStore,
) -> None:
    # Two turns one microsecond apart, and two of the same time: the cursor tells them apart.
    for turn, when in (("a", T0), ("b", T0), ("c", T0 + timedelta(microseconds=1))):
        put(store, "c1", turn, when)
    lists = listing(store)
    seen, token = [], ""
    while True:
        page = lists.turns(ANA, "c1", 1, token)
        seen += [t.turn_id for t in page.turns]
        if not (token := page.next_page_token):
            break
    assert seen == ["a", "b", "c"]
    token = lists.turns(ANA, "c1", 1, "").next_page_token
    for who, conversation in ((Identity("acme", "bob"), "c1"), (ANA, "c2")):
        with pytest.raises(MemoriaError) as raised:
            lists.turns(who, conversation, 1, token)
        assert raised.value.reason is ErrorReason.INVALID_PAGE_TOKEN
    with pytest.raises(MemoriaError) as raised:
        lists.conversations(ANA, 1, token)
    assert raised.value.reason is ErrorReason.INVALID_PAGE_TOKEN


def test_question_opening() -> None:
    detector = DetectSecretsDetector()
    opening = question_opening(detector, "  Where\u200b is\n\n my\tinvoice? ")
    assert opening == "Where is my invoice?"
    assert question_opening(None, "x" * 500) == "x" * OPENING_CHARS
    # The whole question is scanned before it is cut: a credential across the cut is replaced.
    secret = "AKIAIOSFODNN7EXAMPLE"
    opening = question_opening(detector, "y " * 45 + "key " + secret)
    assert "AKIA" not in opening and len(opening) <= OPENING_CHARS
    assert question_opening(detector, "") == ""
