"""One contract over every MemoryStore: the in-memory fake, SQLite and PostgreSQL.

The same assertions run on each, so the fake used by the unit tests behaves like the real
adapters, and the two real adapters behave like each other.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import (
    AuditAction,
    AuditQuery,
    Identity,
    NewAuditEvent,
    StoredBlock,
    StoredSettings,
    Writer,
)
from server.domain.ports import MemoryStore

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def event(principal: str, action: AuditAction, at: datetime, **extra: object) -> NewAuditEvent:
    return NewAuditEvent(principal, action, Writer.USER, at, **extra)  # type: ignore[arg-type]


def test_read_sees_committed_block_and_settings_of_one_principal(
    store: MemoryStore, tenant: str
) -> None:
    assert store.read(tenant, "ana").block is None
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("Zoë \U0001f600", "e1", T0))
        tx.put_settings("ana", StoredSettings(False, T0))
    with store.transaction(tenant + "-other", lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("other tenant", "e2", T0))
    memory = store.read(tenant, "ana")
    assert memory.block == StoredBlock("Zoë \U0001f600", "e1", T0)
    assert memory.settings == StoredSettings(False, T0)
    assert store.read(tenant, "bob").block is None
    assert store.read(tenant + "-other", "ana").block.text == "other tenant"  # type: ignore[union-attr]
    assert store.read(tenant + "-third", "ana").block is None


def test_read_does_not_see_uncommitted_writes(store: MemoryStore, tenant: str) -> None:
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("pending", "e1", T0))
        assert store.read(tenant, "ana").block is None  # readers never wait for the writer
    assert store.read(tenant, "ana").block is not None


def test_absent_principal_loads_empty(store: MemoryStore, tenant: str) -> None:
    with store.transaction(tenant) as tx:
        memory = tx.load("nobody")
    assert memory.block is None and memory.settings is None
    assert memory.memory_enabled


def test_block_round_trip_keeps_text_and_utc_time(store: MemoryStore, tenant: str) -> None:
    text = "Name: Zoë\n\U0001f600 emoji\n\ttab"
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock(text, "e1", T0))
    with store.transaction(tenant) as tx:
        block = tx.load("ana").block
    assert block == StoredBlock(text, "e1", T0)
    assert block.update_time.utcoffset() == timedelta(0)


def test_put_replaces_and_delete_removes(store: MemoryStore, tenant: str) -> None:
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("one", "e1", T0))
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("two", "e2", T0 + timedelta(seconds=1)))
    with store.transaction(tenant) as tx:
        assert tx.load("ana").block == StoredBlock("two", "e2", T0 + timedelta(seconds=1))
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.delete_block("ana")
    with store.transaction(tenant) as tx:
        assert tx.load("ana").block is None


def test_settings_round_trip(store: MemoryStore, tenant: str) -> None:
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_settings("ana", StoredSettings(False, T0))
    with store.transaction(tenant) as tx:
        memory = tx.load("ana")
    assert memory.settings == StoredSettings(False, T0)
    assert not memory.memory_enabled
    assert memory.block is None


def test_scoped_to_tenant_and_principal(store: MemoryStore, tenant: str) -> None:
    other = tenant + "-other"
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("tenant ana", "e1", T0))
        tx.append_audit(event("ana", AuditAction.BLOCK_REWRITTEN, T0))
    with store.transaction(other, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("other ana", "e2", T0))
    with store.transaction(tenant) as tx:
        assert tx.load("ana").block.text == "tenant ana"  # type: ignore[union-attr]
        assert tx.load("bob").block is None
    with store.transaction(other) as tx:
        assert tx.load("ana").block.text == "other ana"  # type: ignore[union-attr]
        assert tx.list_audit(AuditQuery(principal_id=None)) == []


def test_failed_transaction_commits_nothing(store: MemoryStore, tenant: str) -> None:
    with pytest.raises(RuntimeError), store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("half", "e1", T0))
        tx.append_audit(event("ana", AuditAction.BLOCK_REWRITTEN, T0))
        raise RuntimeError("crash between the change and the commit")
    with store.transaction(tenant) as tx:
        assert tx.load("ana").block is None
        assert tx.list_audit(AuditQuery(principal_id="ana")) == []


def test_audit_round_trip_filters_and_order(store: MemoryStore, tenant: str) -> None:
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.append_audit(
            event(
                "ana",
                AuditAction.BLOCK_REWRITTEN,
                T0,
                added_lines=("a", "Zoë \U0001f600"),
                removed_lines=("old",),
                added_line_count=2,
                removed_line_count=1,
                char_count=12,
            )
        )
        tx.append_audit(
            event(
                "ana", AuditAction.SETTINGS_UPDATED, T0 + timedelta(minutes=1), memory_enabled=False
            )
        )
        tx.append_audit(
            event("bob", AuditAction.BLOCK_DELETED, T0 + timedelta(minutes=2), removed_line_count=3)
        )
    with store.transaction(tenant) as tx:
        everyone = tx.list_audit(AuditQuery(principal_id=None))
        ana = tx.list_audit(AuditQuery(principal_id="ana"))
        deletes = tx.list_audit(
            AuditQuery(principal_id=None, actions=frozenset({AuditAction.BLOCK_DELETED}))
        )
        window = tx.list_audit(
            AuditQuery(
                principal_id=None,
                start_time=T0 + timedelta(seconds=30),
                end_time=T0 + timedelta(minutes=2),
            )
        )
        first = tx.list_audit(AuditQuery(principal_id=None, limit=1))
        below = tx.list_audit(AuditQuery(principal_id=None, before_event_id=first[0].event_id))
    assert [e.principal_id for e in everyone] == ["bob", "ana", "ana"]
    ids = [e.event_id for e in everyone]
    assert ids == sorted(ids, reverse=True)
    assert [e.action for e in ana] == [AuditAction.SETTINGS_UPDATED, AuditAction.BLOCK_REWRITTEN]
    rewrite = ana[1]
    assert rewrite.added_lines == ("a", "Zoë \U0001f600")
    assert rewrite.removed_lines == ("old",)
    assert (rewrite.added_line_count, rewrite.removed_line_count, rewrite.char_count) == (2, 1, 12)
    assert rewrite.create_time == T0
    assert rewrite.memory_enabled is None
    assert ana[0].memory_enabled is False
    assert [e.removed_line_count for e in deletes] == [3]
    assert [e.action for e in window] == [AuditAction.SETTINGS_UPDATED]
    assert len(first) == 1
    assert [e.event_id for e in below] == ids[1:]


def test_redact_blanks_lines_of_one_principal_only(store: MemoryStore, tenant: str) -> None:
    other = tenant + "-other"
    lines = {"added_lines": ("secret",), "added_line_count": 1}
    for t in (tenant, other):
        with store.transaction(t, lock_principal="ana") as tx:
            tx.append_audit(event("ana", AuditAction.BLOCK_REWRITTEN, T0, **lines))
            tx.append_audit(event("bob", AuditAction.BLOCK_REWRITTEN, T0, **lines))
    with store.transaction(tenant, lock_principal="ana") as tx:
        tx.redact_audit_lines("ana")
    with store.transaction(tenant) as tx:
        ana = tx.list_audit(AuditQuery(principal_id="ana"))
        bob = tx.list_audit(AuditQuery(principal_id="bob"))
    with store.transaction(other) as tx:
        other_ana = tx.list_audit(AuditQuery(principal_id="ana"))
    assert [(e.added_lines, e.added_line_count) for e in ana] == [((), 1)]
    assert [e.added_lines for e in bob] == [("secret",)]
    assert [e.added_lines for e in other_ana] == [("secret",)]


class Ticker:
    """A thread-safe clock for the concurrency tests."""

    def __call__(self) -> datetime:
        return datetime.now(UTC)


def test_parallel_model_rewrites_leave_one_of_them_and_one_event_each(
    store: MemoryStore, tenant: str
) -> None:
    blocks = MemoryBlocks(store, Ticker())
    who = Identity(tenant, "ana")
    texts = [f"fact number {i}\nshared line" for i in range(50)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda t: blocks.rewrite(who, t, Writer.MODEL), texts))
    final = blocks.get(who).text
    assert final in texts
    assert final == results[-1].block.text or any(r.block.text == final for r in results)
    effective = sum(r.changed for r in results)
    assert effective == 50  # all texts differ, so every write changed the block
    with store.transaction(tenant) as tx:
        events = tx.list_audit(AuditQuery(principal_id="ana", limit=1000))
    assert len(events) == effective
    # Serialized writers: each event's removed line is the text the previous writer left.
    added = [e.added_lines[0] for e in reversed(events)]
    removed = [e.removed_lines[0] for e in reversed(events) if e.removed_lines]
    assert removed == added[:-1]
    assert added[-1] == final.split("\n")[0]


def test_parallel_etag_writes_from_one_etag_let_exactly_one_succeed(
    store: MemoryStore, tenant: str
) -> None:
    blocks = MemoryBlocks(store, Ticker())
    who = Identity(tenant, "ana")
    etag = blocks.rewrite(who, "start", Writer.USER).block.etag

    def attempt(i: int) -> str:
        try:
            blocks.rewrite(who, f"edit {i}", Writer.USER, etag=etag)
            return "ok"
        except MemoriaError as error:
            assert error.reason is ErrorReason.ETAG_MISMATCH
            return "conflict"

    with ThreadPoolExecutor(max_workers=10) as pool:
        outcomes = list(pool.map(attempt, range(10)))
    assert outcomes.count("ok") == 1
    assert outcomes.count("conflict") == 9
    with store.transaction(tenant) as tx:
        assert len(tx.list_audit(AuditQuery(principal_id="ana"))) == 2
