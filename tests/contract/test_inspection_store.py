"""One contract over every InspectionStore: the in-memory fake (on its own and under the fake
units of work), SQLite and PostgreSQL (as the service role, so row-level security applies),
each written in the call and through the background writer. The unit tests' fake therefore
records, scopes and purges as the real adapters do, and a deleted conversation or an erasure
removes records in every one."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.dialects import sqlite as sqlite_dialect

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.inspections import (
    BufferedInspectionStore,
    SqlInspectionStore,
    TimeText,
)
from server.adapters.sql.tables import turn_inspections
from server.domain.model import (
    AuditAction,
    InspectedHit,
    NewAuditEvent,
    RenderRecord,
    SearchRecord,
    TurnKey,
    Writer,
)
from server.domain.ports import InspectionStore
from tests.conftest import make_store
from tests.fakes import InMemoryInspectionStore
from tests.turn_operations import FakeTurnOperations, TurnOperations

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
KINDS = [
    "memory",
    "memory-uow",  # the fake deleted and erased through the fake units of work
    "sqlite",
    "sqlite-buffered",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("postgres-buffered", marks=pytest.mark.postgres),
    pytest.param("pgbouncer-buffered", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
    pytest.param("citus-buffered", marks=[pytest.mark.postgres, pytest.mark.citus]),
]


@dataclass
class Subject:
    """An InspectionStore and how to delete a conversation and erase a principal with it."""

    store: InspectionStore
    delete_conversation: Callable[[str, str, str], object]
    erase: Callable[[str, str], int]


@pytest.fixture(params=KINDS)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    kind: str = request.param
    if kind == "memory":
        fake = InMemoryInspectionStore()
        yield Subject(fake, fake.delete_conversation, fake.erase)
        return
    if kind == "memory-uow":
        fake = InMemoryInspectionStore()
        yield _subject(fake, FakeTurnOperations(fake))
        return
    sql = make_store(kind.split("-")[0], request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    inner = SqlInspectionStore(sql.db)
    store: InspectionStore = BufferedInspectionStore(inner) if "buffered" in kind else inner
    yield _subject(store, TurnOperations(sql.db))
    if isinstance(store, BufferedInspectionStore):
        store.close()


def _subject(store: InspectionStore, turns: TurnOperations | FakeTurnOperations) -> Subject:
    """`store`, with conversations deleted and principals erased by the domain on `turns`."""

    def delete_conversation(tenant: str, principal: str, conversation: str) -> None:
        store.flush()
        event = NewAuditEvent(principal, AuditAction.CONVERSATION_DELETED, Writer.USER, T0)
        turns.delete_conversation(tenant, principal, conversation, event)

    def erase(tenant: str, principal: str) -> int:
        store.flush()
        event = NewAuditEvent(principal, AuditAction.PRINCIPAL_DATA_ERASED, Writer.USER, T0)
        return turns.erase_principal(
            tenant, principal, event, lambda: None
        ).deleted_inspection_count

    return Subject(store, delete_conversation, erase)


def key(tenant: str, principal: str = "ana", conversation: str = "c1", turn: str = "t1") -> TurnKey:
    return TurnKey(tenant, principal, conversation, turn)


HIT = InspectedHit("c0", "t9", 2, T0 - timedelta(days=3), 0.0325, 1, 4)


def test_records_come_back_in_order_with_every_field(subject: Subject, tenant: str) -> None:
    store = subject.store
    store.record_render(key(tenant), RenderRecord("e1", 42, T0))
    store.record_search(key(tenant), SearchRecord("acct-4821 refund", T0, (HIT,)))
    whole_second = T0.replace(microsecond=0) + timedelta(seconds=1)
    store.record_render(key(tenant), RenderRecord("", 0, whole_second))
    store.record_search(key(tenant), SearchRecord("nothing", T0, ()))
    got = store.read(key(tenant))
    assert got.renders == (
        RenderRecord("e1", 42, T0),
        RenderRecord("", 0, whole_second),
    )
    assert got.searches == (
        SearchRecord("acct-4821 refund", T0, (HIT,)),
        SearchRecord("nothing", T0, ()),
    )
    assert got.renders[0].record_time.utcoffset() == timedelta(0)
    assert got.searches[0].hits[0].turn_time.utcoffset() == timedelta(0)


def test_a_record_belongs_to_one_turn_of_one_principal(subject: Subject, tenant: str) -> None:
    subject.store.record_render(key(tenant), RenderRecord("e1", 1, T0))
    for other in (
        key(tenant, principal="bob"),
        key(tenant, conversation="c2"),
        key(tenant, turn="t2"),
        key(tenant + "-other"),
    ):
        got = subject.store.read(other)
        assert (got.renders, got.searches) == ((), ())


def test_deleting_a_conversation_removes_its_records_and_refuses_new_ones(
    subject: Subject, tenant: str
) -> None:
    store = subject.store
    store.record_render(key(tenant), RenderRecord("e1", 1, T0))
    store.record_render(key(tenant, conversation="c2"), RenderRecord("e1", 1, T0))
    store.record_render(key(tenant, principal="bob"), RenderRecord("e1", 1, T0))
    subject.delete_conversation(tenant, "ana", "c1")
    assert store.read(key(tenant)).renders == ()
    store.record_render(key(tenant), RenderRecord("e2", 2, T0))
    assert store.read(key(tenant)).renders == ()
    assert len(store.read(key(tenant, conversation="c2")).renders) == 1
    assert len(store.read(key(tenant, principal="bob")).renders) == 1


def test_erasure_removes_and_counts_the_principals_records(subject: Subject, tenant: str) -> None:
    store = subject.store
    store.record_render(key(tenant), RenderRecord("e1", 1, T0))
    store.record_search(key(tenant, turn="t2"), SearchRecord("q", T0, (HIT,)))
    store.record_render(key(tenant, principal="bob"), RenderRecord("e1", 1, T0))
    assert subject.erase(tenant, "ana") == 2
    assert store.read(key(tenant)).renders == ()
    assert store.read(key(tenant, turn="t2")).searches == ()
    assert len(store.read(key(tenant, principal="bob")).renders) == 1


def test_purge_removes_only_records_older_than_the_cutoff(subject: Subject, tenant: str) -> None:
    store = subject.store
    # Far in the past, so no other test's records in a shared database are as old.
    old = datetime(1990, 1, 1, tzinfo=UTC)
    for i in range(3):
        store.record_render(key(tenant), RenderRecord(f"old{i}", 1, old + timedelta(seconds=i)))
    store.record_render(key(tenant), RenderRecord("new", 1, T0))
    store.flush()
    assert store.purge(old + timedelta(seconds=1, microseconds=1), 10) == 2
    assert store.purge(old + timedelta(days=1), 10) == 1
    assert store.purge(old + timedelta(days=1), 10) == 0
    assert [r.etag for r in store.read(key(tenant)).renders] == ["new"]


@pytest.mark.postgres
def test_records_are_tenant_scoped_for_the_service_role(
    request: pytest.FixtureRequest, tmp_path: Path, tenant: str
) -> None:
    sql = make_store("postgres", request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    SqlInspectionStore(sql.db).record_render(key(tenant), RenderRecord("e1", 1, T0))
    count = select(func.count()).select_from(turn_inspections)
    with sql.db.engine.connect() as conn, conn.begin():
        # No tenant set: nothing visible, even with no WHERE clause.
        assert conn.execute(count).scalar_one() == 0
        conn.execute(text("SELECT set_config('app.tenant_id', :t, true)"), {"t": tenant + "-x"})
        assert conn.execute(count).scalar_one() == 0
    with sql.db.engine.connect() as conn, conn.begin():
        conn.execute(text("SELECT set_config('app.tenant_id', :t, true)"), {"t": tenant})
        assert conn.execute(count).scalar_one() == 1
        with pytest.raises(Exception, match="row-level security"):
            conn.execute(
                turn_inspections.insert().values(
                    tenant_id=tenant + "-x",
                    principal_id="ana",
                    conversation_id="c",
                    turn_id="t",
                    kind="render",
                    record_time=T0,
                )
            )


SQL_KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_the_writer_keeps_every_record_queued_from_many_threads(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, tenant: str
) -> None:
    """Callers append without a lock: records queued at once from threads, with flushes
    among them, all arrive in each turn's order, none twice."""
    sql = make_store(kind, request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    store = BufferedInspectionStore(SqlInspectionStore(sql.db), batch_size=7, linger_s=0.001)
    per_thread = 60

    def record(thread: int) -> None:
        for i in range(per_thread):
            store.record_render(key(tenant, turn=f"t{thread}"), RenderRecord(f"e{i}", i, T0))
            if i % 25 == 0:
                store.flush()

    try:
        threads = [threading.Thread(target=record, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for n in range(6):
            renders = store.read(key(tenant, turn=f"t{n}")).renders
            assert [r.char_count for r in renders] == list(range(per_thread))
    finally:
        store.close()


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_a_batch_larger_than_one_statement_arrives_whole_and_in_order(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, tenant: str
) -> None:
    """SQLite cuts a batch into statements of a power of two rows, at most 1,024: a batch of
    2,000 + 77 rows spread over three turns takes seven, and every record is written once,
    each turn's in its order, a deleted conversation's skipped in every statement. Its times
    cross two seconds (a batch's time texts reuse the last second's): each comes back
    exact."""
    sql = make_store(kind, request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    store = SqlInspectionStore(sql.db)
    subject = _subject(store, TurnOperations(sql.db))
    gone = key(tenant, conversation="c-gone")
    subject.delete_conversation(tenant, gone.principal_id, gone.conversation_id)
    turns = [key(tenant, turn="t0"), key(tenant, turn="t1"), gone]

    def at(i: int) -> datetime:
        return T0 + timedelta(microseconds=997 * i)

    store.write([(turns[i % 3], RenderRecord(f"e{i}", i, at(i))) for i in range(2_077)])
    for n in (0, 1):
        renders = store.read(turns[n]).renders
        assert [r.char_count for r in renders] == list(range(n, 2_077, 3))
        assert [r.record_time for r in renders] == [at(i) for i in range(n, 2_077, 3)]
    assert store.read(gone).renders == ()


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_close_writes_what_is_queued_and_later_records_are_written_in_the_call(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, tenant: str
) -> None:
    sql = make_store(kind, request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    inner = SqlInspectionStore(sql.db)
    store = BufferedInspectionStore(inner, linger_s=60)  # nothing written until close
    for i in range(5):
        store.record_render(key(tenant), RenderRecord(f"e{i}", i, T0))
    store.close()
    assert len(inner.read(key(tenant)).renders) == 5
    store.record_render(key(tenant), RenderRecord("late", 9, T0))
    assert [r.etag for r in inner.read(key(tenant)).renders][-1] == "late"


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_records_beyond_max_pending_are_written_in_the_call(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, tenant: str
) -> None:
    sql = make_store(kind, request, tmp_path)
    assert isinstance(sql, SqlMemoryStore)
    inner = SqlInspectionStore(sql.db)
    store = BufferedInspectionStore(inner, max_pending=2, linger_s=60)
    try:
        for i in range(3):
            store.record_render(key(tenant), RenderRecord(f"e{i}", i, T0))
        # Two wait in the queue (the writer lingers); the third was written in the call.
        assert [r.etag for r in inner.read(key(tenant)).renders] == ["e2"]
        assert [r.etag for r in store.read(key(tenant)).renders] == ["e2", "e0", "e1"]
    finally:
        store.close()


def test_time_text_is_sqlalchemys_sqlite_text_and_the_exact_instant_for_postgres() -> None:
    """The writer formats record times itself (cheaper than SQLAlchemy's conversion): on
    SQLite the very text SQLAlchemy writes, which every other writer and `purge` compare
    with; for PostgreSQL the same instant with its offset. The same second twice, a second
    with no microseconds, a year below 1000 and another zone, in one sequence, since the
    text up to the second is reused from the last time formatted."""
    dialect = sqlite_dialect.dialect()
    column_type = turn_inspections.c.record_time.type.dialect_impl(dialect)
    sqlalchemy_text = column_type.bind_processor(dialect)
    assert sqlalchemy_text is not None
    plus_two = timezone(timedelta(hours=2))
    times = [
        T0,
        T0 + timedelta(microseconds=1),
        T0.replace(microsecond=0),
        T0 + timedelta(seconds=1),
        datetime(987, 6, 5, 4, 3, 2, 10, tzinfo=UTC),
        T0.replace(tzinfo=plus_two),
        T0,
    ]
    sqlite_text, postgres_text = TimeText(with_offset=False), TimeText(with_offset=True)
    for moment in times:
        assert sqlite_text(moment) == sqlalchemy_text(moment)
        parsed = datetime.strptime(postgres_text(moment), "%Y-%m-%d %H:%M:%S.%f%z")
        assert parsed == moment
        assert parsed.utcoffset() == moment.utcoffset()
