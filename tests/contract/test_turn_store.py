"""The turn queue, tombstones and erasure, on SQLite, on PostgreSQL as the service role (directly,
through a transaction-pooling PgBouncer, and on Citus), and on the unit tests' in-memory fakes
(tests/fakes.py: the turn store and its units of work), which are held to what the databases do
here."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from server.adapters.sql.blocks import SqlMemoryStore
from server.domain.model import (
    AcceptOutcome,
    AuditAction,
    AuditQuery,
    ListCursor,
    NewAuditEvent,
    NewTurn,
    StoredBlock,
    StoredSettings,
    TurnKey,
    Writer,
)
from tests.conftest import CITUS, make_store
from tests.turn_operations import FakeTurnOperations, TurnOperations

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
LATER = T0 + timedelta(hours=1)


Operations = TurnOperations | FakeTurnOperations


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
        CITUS,
        "fake",
    ]
)
def turns(request: pytest.FixtureRequest, tmp_path: Path) -> Operations:
    if request.param == "fake":
        return FakeTurnOperations()
    sql = make_store(request.param, request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    return TurnOperations(sql.db)


def key(tenant: str, principal: str = "ana", conversation: str = "c1", turn: str = "t1") -> TurnKey:
    return TurnKey(tenant, principal, conversation, turn)


def accept(turns: Operations, k: TurnKey, text: str = "hello there") -> AcceptOutcome:
    return turns.accept_turn(NewTurn(key=k, text=text, turn_time=T0, accept_time=T0))


def event(principal: str, action: AuditAction, conversation: str = "") -> NewAuditEvent:
    return NewAuditEvent(
        principal_id=principal,
        action=action,
        writer=Writer.USER,
        create_time=T0,
        conversation_id=conversation,
    )


def test_accept_claim_index_drops_the_text(turns: Operations, tenant: str) -> None:
    k = key(tenant)
    assert accept(turns, k, "question\n\nanswer") is AcceptOutcome.ACCEPTED
    with turns.claim(10, LATER) as batch:
        mine = [t for t in batch.turns if t.key == k]
        assert len(mine) == 1 and mine[0].text == "question\n\nanswer"
        batch.indexed(mine[0])
    assert turns.stored_text(k) == ("indexed", None)
    with turns.claim(10, LATER) as batch:
        assert k not in [t.key for t in batch.turns]


def test_resend_replaces_the_turn_even_after_indexing(turns: Operations, tenant: str) -> None:
    k = key(tenant)
    accept(turns, k, "first")
    accept(turns, k, "second")
    with turns.claim(10, LATER, only=k) as batch:
        (turn,) = batch.turns
        assert turn.text == "second"
        batch.indexed(turn)
    accept(turns, k, "third")
    with turns.claim(10, LATER, only=k) as batch:
        assert [t.text for t in batch.turns] == ["third"]


def test_resend_during_processing_keeps_the_new_version_queued(
    turns: Operations, tenant: str
) -> None:
    k = key(tenant)
    accept(turns, k, "old")
    resent = threading.Thread(target=accept, args=(turns, k, "new"))
    with turns.claim(10, LATER, only=k) as batch:
        (turn,) = batch.turns
        resent.start()
        resent.join(0.5)  # SQLite: done already; PostgreSQL: waits for the claim
        batch.indexed(turn)
    resent.join(10)
    assert not resent.is_alive()
    assert turns.stored_text(k) == ("pending", "new")


def test_memory_off_refuses_turns(turns: Operations, tenant: str) -> None:
    turns.put_memory(tenant, "ana", settings=StoredSettings(memory_enabled=False, update_time=T0))
    assert accept(turns, key(tenant)) is AcceptOutcome.MEMORY_DISABLED
    with turns.claim(10, LATER, only=key(tenant)) as batch:
        assert batch.turns == ()


def test_delete_conversation_tombstones_refuses_and_purges(turns: Operations, tenant: str) -> None:
    for turn_id in ("t1", "t2"):
        accept(turns, key(tenant, turn=turn_id))
    accept(turns, key(tenant, conversation="c2"))
    assert turns.deleted_conversations(tenant, "ana") == set()  # read (and cached) before
    deleted = turns.delete_conversation(
        tenant, "ana", "c1", event("ana", AuditAction.CONVERSATION_DELETED, "c1")
    )
    assert deleted == 2
    assert turns.deleted_conversations(tenant, "ana") == {"c1"}
    assert turns.deleted_conversations(tenant, "bob") == set()
    assert accept(turns, key(tenant, turn="t3")) is AcceptOutcome.CONVERSATION_DELETED
    assert accept(turns, key(tenant, principal="bob")) is AcceptOutcome.ACCEPTED
    assert (
        turns.delete_conversation(
            tenant, "ana", "c1", event("ana", AuditAction.CONVERSATION_DELETED)
        )
        is None
    )
    (audit,) = turns.memory.list_audit(tenant, AuditQuery(principal_id="ana"))
    assert (audit.action, audit.deleted_turn_count) == (AuditAction.CONVERSATION_DELETED, 2)
    assert audit.conversation_id == "c1"
    assert turns.deleted_conversations(tenant, "ana") == {"c1"}
    with turns.claim_purges(100) as purges:
        assert (tenant, "ana", "c1") in [
            (p.tenant_id, p.principal_id, p.conversation_id) for p in purges
        ]
    assert turns.deleted_conversations(tenant, "ana") == set()
    # Purged, but still refused: a late turn can never bring the conversation back.
    assert accept(turns, key(tenant, turn="t4")) is AcceptOutcome.CONVERSATION_DELETED


def test_failed_purge_stays_pending(turns: Operations, tenant: str) -> None:
    turns.delete_conversation(tenant, "ana", "c1", event("ana", AuditAction.CONVERSATION_DELETED))
    with pytest.raises(RuntimeError), turns.claim_purges(100):
        raise RuntimeError("index down")
    assert turns.deleted_conversations(tenant, "ana") == {"c1"}


def test_failures_retry_later_then_give_up(turns: Operations, tenant: str) -> None:
    k = key(tenant)
    accept(turns, k)
    with turns.claim(1, LATER, only=k) as batch:
        batch.failed(batch.turns[0], "ConnectionError", LATER + timedelta(minutes=1))
    with turns.claim(1000, LATER) as batch:
        assert k not in [t.key for t in batch.turns]
    with turns.claim(1000, LATER + timedelta(minutes=2)) as batch:
        (mine,) = [t for t in batch.turns if t.key == k]
        assert mine.attempts == 1
        batch.failed(mine, "ConnectionError", None)
    assert turns.stored_text(k)[0] == "failed"
    with turns.claim(1000, LATER + timedelta(days=1)) as batch:
        assert k not in [t.key for t in batch.turns]


def test_erase_removes_everything_but_counts(turns: Operations, tenant: str) -> None:
    turns.put_memory(
        tenant,
        "ana",
        StoredBlock("line one\nline two", "e1", T0),
        StoredSettings(memory_enabled=True, update_time=T0),
    )
    accept(turns, key(tenant, turn="a"))
    accept(turns, key(tenant, turn="b"))
    accept(turns, key(tenant, principal="bob"))
    purged: list[str] = []
    erased = turns.erase_principal(
        tenant, "ana", event("ana", AuditAction.PRINCIPAL_DATA_ERASED), lambda: purged.append("x")
    )
    assert (erased.removed_line_count, erased.deleted_turn_count) == (2, 2)
    assert purged == ["x"]
    memory = turns.memory.read(tenant, "ana")
    assert memory.block is None and memory.settings is None
    with turns.claim(1000, LATER) as batch:
        keys = [t.key for t in batch.turns]
    assert key(tenant, principal="bob") in keys
    assert not [k for k in keys if k.tenant_id == tenant and k.principal_id == "ana"]
    (audit,) = turns.memory.list_audit(tenant, AuditQuery(principal_id="ana"))
    assert (audit.removed_line_count, audit.deleted_turn_count) == (2, 2)


def test_erase_whose_purge_fails_erases_nothing(turns: Operations, tenant: str) -> None:
    turns.put_memory(tenant, "ana", StoredBlock("keep me", "e1", T0))
    accept(turns, key(tenant))

    def fail() -> None:
        raise ConnectionError("index unavailable")

    with pytest.raises(ConnectionError):
        turns.erase_principal(tenant, "ana", event("ana", AuditAction.PRINCIPAL_DATA_ERASED), fail)
    assert turns.memory.read(tenant, "ana").block is not None
    assert turns.memory.list_audit(tenant, AuditQuery(principal_id="ana")) == []
    with turns.claim(1, LATER, only=key(tenant)) as batch:
        assert len(batch.turns) == 1


@pytest.mark.postgres
@pytest.mark.parametrize("turns", ["postgres"], indirect=True)
def test_postgres_claims_skip_each_others_turns_across_tenants(
    turns: Operations, tenant: str
) -> None:
    other = tenant + "-b"
    for i in range(4):
        accept(turns, key(tenant, turn=f"t{i}"))
        accept(turns, key(other, turn=f"t{i}"))
    mine = {key(tenant, turn=f"t{i}") for i in range(4)} | {
        key(other, turn=f"t{i}") for i in range(4)
    }
    with turns.claim(1000, LATER) as first:
        first_keys = {t.key for t in first.turns} & mine
        with turns.claim(1000, LATER) as second:
            second_keys = {t.key for t in second.turns} & mine
    # The service role claims across tenants (through the definer function) ...
    assert first_keys == mine
    # ... and a second claimer never gets a turn the first one holds.
    assert second_keys == set()


# --- Listing conversations and their turns (ConversationListing) ---------------------------


def offer(turns: Operations, k: TurnKey, when: datetime, opening: str = "") -> None:
    """Accept a turn of time `when` whose question opens with `opening`."""
    turn = NewTurn(k, f"{opening}\n\nanswer", when, T0, question_opening=opening)
    assert turns.accept_turn(turn) is AcceptOutcome.ACCEPTED


def listed(turns: Operations, tenant: str, principal: str = "ana") -> list[tuple[str, int]]:
    """The principal's conversations (id, turn count), newest first, read one at a time."""
    out: list[tuple[str, int]] = []
    after = None
    while page := turns.list_conversations(tenant, principal, after, 1):
        out += [(c.conversation_id, c.turn_count) for c in page]
        after = page[-1].cursor
    return out


def test_conversations_newest_first_with_their_first_question(
    turns: Operations, tenant: str
) -> None:
    h = timedelta(hours=1)
    offer(turns, key(tenant, conversation="old", turn="2"), T0 + 2 * h, "later question")
    offer(turns, key(tenant, conversation="old", turn="1"), T0, "first question")
    offer(turns, key(tenant, conversation="new", turn="1"), T0 + 5 * h, "newest")
    offer(turns, key(tenant, conversation="mid", turn="1"), T0 + 3 * h, "in between")
    # Two conversations whose last turns share a time: a fixed order, the same on every page.
    offer(turns, key(tenant, conversation="tie-a", turn="1"), T0 + h, "tie a")
    offer(turns, key(tenant, conversation="tie-b", turn="1"), T0 + h, "tie b")
    whole = turns.list_conversations(tenant, "ana", None, 100)
    assert [c.conversation_id for c in whole] == ["new", "mid", "old", "tie-b", "tie-a"]
    old = whole[2]
    assert (old.first_turn_time, old.last_turn_time, old.turn_count) == (T0, T0 + 2 * h, 2)
    assert old.first_question_opening == "first question"
    assert [c.first_question_opening for c in whole] == [
        "newest",
        "in between",
        "first question",
        "tie b",
        "tie a",
    ]
    # Paging by the cursor of the last row gives the same list, one at a time and by two.
    assert listed(turns, tenant) == [(c.conversation_id, c.turn_count) for c in whole]
    first_two = turns.list_conversations(tenant, "ana", None, 2)
    rest = turns.list_conversations(tenant, "ana", first_two[-1].cursor, 100)
    assert [c.conversation_id for c in first_two + rest] == [c.conversation_id for c in whole]
    assert turns.list_conversations(tenant, "ana", whole[-1].cursor, 100) == []


def test_conversation_turns_oldest_first_with_their_text(turns: Operations, tenant: str) -> None:
    offer(turns, key(tenant, turn="b"), T0 + timedelta(minutes=1), "second")
    offer(turns, key(tenant, turn="a"), T0, "first")
    offer(turns, key(tenant, turn="c"), T0 + timedelta(minutes=1), "third")  # same time as b
    offer(turns, key(tenant, conversation="other"), T0, "elsewhere")
    with turns.claim(10, LATER, only=key(tenant, turn="a")) as batch:
        batch.indexed(batch.turns[0])
    whole = turns.list_conversation_turns(tenant, "ana", "c1", None, 100)
    assert [(t.turn_id, t.indexed, t.text) for t in whole] == [
        ("a", True, None),  # indexed: its text is in the chunk index now
        ("b", False, "second\n\nanswer"),
        ("c", False, "third\n\nanswer"),
    ]
    after = turns.list_conversation_turns(tenant, "ana", "c1", None, 2)
    assert [t.turn_id for t in after] == ["a", "b"]
    cursor = ListCursor(after[-1].turn_time, after[-1].row_id)
    assert [t.turn_id for t in turns.list_conversation_turns(tenant, "ana", "c1", cursor, 9)] == [
        "c"
    ]
    assert turns.list_conversation_turns(tenant, "bob", "c1", None, 100) == []
    assert turns.list_conversation_turns(tenant, "ana", "unknown", None, 100) == []


def test_listing_is_the_principals_own_and_forgets_deleted_and_erased(
    turns: Operations, tenant: str
) -> None:
    other_tenant = tenant + "-x"
    offer(turns, key(tenant, conversation="kept"), T0, "kept")
    offer(turns, key(tenant, conversation="queued"), T0, "still queued")  # never indexed
    offer(turns, key(tenant, principal="bob", conversation="bobs"), T0, "bob's")
    offer(turns, key(other_tenant, conversation="theirs"), T0, "another tenant's")
    assert listed(turns, tenant) == [("queued", 1), ("kept", 1)]
    assert listed(turns, tenant, "bob") == [("bobs", 1)]
    assert listed(turns, other_tenant) == [("theirs", 1)]
    turns.delete_conversation(
        tenant, "ana", "queued", event("ana", AuditAction.CONVERSATION_DELETED, "queued")
    )
    assert listed(turns, tenant) == [("kept", 1)]
    assert turns.list_conversation_turns(tenant, "ana", "queued", None, 10) == []
    turns.erase_principal(
        tenant, "ana", event("ana", AuditAction.PRINCIPAL_DATA_ERASED), lambda: None
    )
    assert listed(turns, tenant) == []
    assert listed(turns, tenant, "bob") == [("bobs", 1)]
