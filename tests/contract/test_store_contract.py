"""One contract over every MemoryStore: the in-memory fake, SQLite and PostgreSQL.

The same assertions run on each, so the fake used by the unit tests behaves like the real
adapters, and the two real adapters behave like each other.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import (
    AuditAction,
    AuditQuery,
    Change,
    Identity,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
    Writer,
)
from server.domain.ports import MemoryStore

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def event(principal: str, action: AuditAction, at: datetime = T0, **extra: object) -> NewAuditEvent:
    return NewAuditEvent(principal, action, Writer.USER, at, **extra)  # type: ignore[arg-type]


def change(
    store: MemoryStore,
    tenant: str,
    principal: str,
    what: NewAuditEvent | None = None,
    **extra: object,
) -> bool:
    """Apply a change decided on the principal's current state."""
    current = store.read(tenant, principal)
    return store.apply(
        tenant,
        Change(
            principal,
            current,
            what or event(principal, AuditAction.BLOCK_REWRITTEN),
            **extra,  # type: ignore[arg-type]
        ),
    )


def test_absent_principal_reads_empty(store: MemoryStore, tenant: str) -> None:
    memory = store.read(tenant, "nobody")
    assert memory.block is None and memory.settings is None
    assert memory.memory_enabled


def test_block_round_trip_keeps_text_and_utc_time(store: MemoryStore, tenant: str) -> None:
    text = "Name: Zoë\n\U0001f600 emoji\n\ttab"
    assert change(store, tenant, "ana", block=StoredBlock(text, "e1", T0))
    block = store.read(tenant, "ana").block
    assert block == StoredBlock(text, "e1", T0)
    assert block.update_time.utcoffset() == timedelta(0)


def test_replace_then_delete(store: MemoryStore, tenant: str) -> None:
    assert change(store, tenant, "ana", block=StoredBlock("one", "e1", T0))
    later = T0 + timedelta(seconds=1)
    assert change(store, tenant, "ana", block=StoredBlock("two", "e2", later))
    assert store.read(tenant, "ana").block == StoredBlock("two", "e2", later)
    assert change(store, tenant, "ana", event("ana", AuditAction.BLOCK_DELETED), delete_block=True)
    assert store.read(tenant, "ana").block is None


def test_settings_round_trip(store: MemoryStore, tenant: str) -> None:
    settings_event = event("ana", AuditAction.SETTINGS_UPDATED, memory_enabled=False)
    assert change(store, tenant, "ana", settings_event, settings=StoredSettings(False, T0))
    memory = store.read(tenant, "ana")
    assert memory.settings == StoredSettings(False, T0)
    assert not memory.memory_enabled
    assert memory.block is None


def test_apply_refuses_when_the_block_changed(store: MemoryStore, tenant: str) -> None:
    assert change(store, tenant, "ana", block=StoredBlock("one", "e1", T0))
    no_block = PrincipalMemory(None, None)
    rewrite = event("ana", AuditAction.BLOCK_REWRITTEN)
    stale = Change("ana", no_block, rewrite, block=StoredBlock("x", "e2", T0))
    assert not store.apply(tenant, stale)
    other_block = PrincipalMemory(StoredBlock("one", "e0", T0), None)
    wrong = Change("ana", other_block, event("ana", AuditAction.BLOCK_DELETED), delete_block=True)
    assert not store.apply(tenant, wrong)
    assert store.read(tenant, "ana").block == StoredBlock("one", "e1", T0)
    assert len(store.list_audit(tenant, AuditQuery(principal_id="ana"))) == 1


def test_apply_refuses_when_the_setting_changed(store: MemoryStore, tenant: str) -> None:
    off = event("ana", AuditAction.SETTINGS_UPDATED, memory_enabled=False)
    assert change(store, tenant, "ana", off, settings=StoredSettings(False, T0))
    decided_while_on = Change(
        "ana",
        PrincipalMemory(None, None),  # memory on (no settings row)
        event("ana", AuditAction.BLOCK_REWRITTEN),
        block=StoredBlock("x", "e", T0),
    )
    assert not store.apply(tenant, decided_while_on)
    assert store.read(tenant, "ana").block is None


def test_scoped_to_tenant_and_principal(store: MemoryStore, tenant: str) -> None:
    other = tenant + "-other"
    assert change(store, tenant, "ana", block=StoredBlock("tenant ana", "e1", T0))
    assert change(store, other, "ana", block=StoredBlock("other ana", "e2", T0))
    assert store.read(tenant, "ana").block.text == "tenant ana"  # type: ignore[union-attr]
    assert store.read(tenant, "bob").block is None
    assert store.read(other, "ana").block.text == "other ana"  # type: ignore[union-attr]
    assert store.read(tenant + "-third", "ana").block is None
    assert [e.principal_id for e in store.list_audit(other, AuditQuery(principal_id=None))] == [
        "ana"
    ]


def test_blank_audit_lines_of_its_principal_only(store: MemoryStore, tenant: str) -> None:
    other = tenant + "-other"
    for t in (tenant, other):
        for p in ("ana", "bob"):
            assert change(
                store,
                t,
                p,
                event(p, AuditAction.BLOCK_REWRITTEN, added_lines=("secret",), added_line_count=1),
                block=StoredBlock("secret", "e", T0),
            )
    deleted = event("ana", AuditAction.BLOCK_DELETED, removed_line_count=1)
    assert change(store, tenant, "ana", deleted, delete_block=True, blank_audit_lines=True)
    ana = store.list_audit(tenant, AuditQuery(principal_id="ana"))
    assert [(e.action, e.added_lines, e.added_line_count) for e in ana] == [
        (AuditAction.BLOCK_DELETED, (), 0),
        (AuditAction.BLOCK_REWRITTEN, (), 1),
    ]
    assert [e.added_lines for e in store.list_audit(tenant, AuditQuery(principal_id="bob"))] == [
        ("secret",)
    ]
    assert [e.added_lines for e in store.list_audit(other, AuditQuery(principal_id="ana"))] == [
        ("secret",)
    ]


def test_audit_round_trip_filters_and_order(store: MemoryStore, tenant: str) -> None:
    rewrite = event(
        "ana",
        AuditAction.BLOCK_REWRITTEN,
        added_lines=("a", "Zoë \U0001f600"),
        removed_lines=("old",),
        added_line_count=2,
        removed_line_count=1,
        char_count=12,
    )
    assert change(store, tenant, "ana", rewrite, block=StoredBlock("a", "e1", T0))
    off = event(
        "ana", AuditAction.SETTINGS_UPDATED, T0 + timedelta(minutes=1), memory_enabled=False
    )
    assert change(store, tenant, "ana", off, settings=StoredSettings(False, T0))
    gone = event("bob", AuditAction.BLOCK_DELETED, T0 + timedelta(minutes=2), removed_line_count=3)
    assert change(store, tenant, "bob", gone)

    everyone = store.list_audit(tenant, AuditQuery(principal_id=None))
    ana = store.list_audit(tenant, AuditQuery(principal_id="ana"))
    deletes = store.list_audit(
        tenant, AuditQuery(principal_id=None, actions=frozenset({AuditAction.BLOCK_DELETED}))
    )
    window = store.list_audit(
        tenant,
        AuditQuery(
            principal_id=None,
            start_time=T0 + timedelta(seconds=30),
            end_time=T0 + timedelta(minutes=2),
        ),
    )
    first = store.list_audit(tenant, AuditQuery(principal_id=None, limit=1))
    below = store.list_audit(
        tenant, AuditQuery(principal_id=None, before_event_id=first[0].event_id)
    )
    assert [e.principal_id for e in everyone] == ["bob", "ana", "ana"]
    ids = [e.event_id for e in everyone]
    assert ids == sorted(ids, reverse=True)
    assert [e.action for e in ana] == [AuditAction.SETTINGS_UPDATED, AuditAction.BLOCK_REWRITTEN]
    stored = ana[1]
    assert stored.added_lines == ("a", "Zoë \U0001f600")
    assert stored.removed_lines == ("old",)
    assert (stored.added_line_count, stored.removed_line_count, stored.char_count) == (2, 1, 12)
    assert stored.create_time == T0
    assert stored.writer is Writer.USER
    assert stored.memory_enabled is None
    assert ana[0].memory_enabled is False
    assert [e.removed_line_count for e in deletes] == [3]
    assert [e.action for e in window] == [AuditAction.SETTINGS_UPDATED]
    assert len(first) == 1
    assert [e.event_id for e in below] == ids[1:]


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
    assert all(r.changed for r in results)  # all texts differ: every write is a change
    events = store.list_audit(tenant, AuditQuery(principal_id="ana", limit=1000))
    assert len(events) == 50
    # Writers were serialized: each event's removed line is the text the previous one left.
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
    assert len(store.list_audit(tenant, AuditQuery(principal_id="ana"))) == 2


def test_confirm_holds_until_the_state_changes(store: MemoryStore, tenant: str) -> None:
    before = store.read(tenant, "ana")
    assert store.confirm(tenant, "ana", before)
    assert change(store, tenant, "ana", block=StoredBlock("one", "e1", T0))
    assert not store.confirm(tenant, "ana", before)
    after = store.read(tenant, "ana")
    assert after.block is not None and after.block.text == "one"
    assert store.confirm(tenant, "ana", after)
    off = StoredSettings(memory_enabled=False, update_time=T0)
    assert change(store, tenant, "ana", event("ana", AuditAction.SETTINGS_UPDATED), settings=off)
    assert not store.confirm(tenant, "ana", after)
