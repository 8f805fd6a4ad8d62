"""Memoria on Citus (scripts/citus.sh: a coordinator and two workers; migration 0014): every
statement of a call routed to one shard, one tenant's rows on one node, and a database without
the SET LOCAL forwarding refused at start in one line (issue 22 items 3 and 4).

The store contract, turn, inspection, retention, cache and isolation suites run on Citus as
their "citus" kinds; these are what only Citus has.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase, scope_to_tenant
from server.adapters.sql.engine import create_store_engine
from server.adapters.sql.inspections import SqlInspectionStore
from server.adapters.sql.tables import metadata
from server.domain.model import (
    AcceptOutcome,
    AuditAction,
    AuditQuery,
    Change,
    NewAuditEvent,
    NewTurn,
    RenderRecord,
    StoredBlock,
    TurnKey,
    Writer,
)
from tests.conftest import APP_ROLE, PgDatabase
from tests.postgres_server import citus_database
from tests.processes import clean_env, failed_in_one_line
from tests.turn_operations import TurnOperations

pytestmark = [pytest.mark.postgres, pytest.mark.citus]
T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
ROUTED_ONLY = "-c citus.multi_task_query_log_level=error"
"""A session option: any statement Citus plans as more than one task (more than one shard)
fails instead of running."""


def routed_only(database: PgDatabase) -> Engine:
    """The service role's engine on `database` where a multi-shard statement is an error."""
    url = make_url(database.app_url).update_query_dict({"options": ROUTED_ONLY})
    return create_store_engine(url.render_as_string(hide_password=False), pool_size=2)


def one_call_of_each_kind(db: SqlDatabase, tenant: str) -> list[object]:
    """A call of every kind a served request makes on the relational store, for one principal
    of `tenant`: block read and write (both write paths), audit list, turn accept, the lists,
    the search's deleted conversations, inspection records, a conversation's deletion and the
    principal's erasure. What each returned (so a silently empty answer shows)."""
    fast = SqlMemoryStore(db)
    plain = SqlMemoryStore(db, fast_writes=False)
    turns = TurnOperations(db)
    inspections = SqlInspectionStore(db)
    seen: list[object] = []
    for store, text_ in ((fast, "first"), (plain, "second")):
        current = store.read(tenant, "ana")
        written = store.apply(
            tenant,
            Change(
                "ana",
                current,
                NewAuditEvent("ana", AuditAction.BLOCK_REWRITTEN, Writer.USER, T0),
                block=StoredBlock(text_, f"e-{text_}", T0),
            ),
        )
        seen.append((written, store.read(tenant, "ana").block))
    seen.append(len(fast.list_audit(tenant, AuditQuery(principal_id="ana"))))
    key = TurnKey(tenant, "ana", "c1", "t1")
    seen.append(turns.accept_turn(NewTurn(key, "hello there", T0, T0)))
    inspections.record_render(key, RenderRecord("e-first", 5, T0))
    seen.append(len(inspections.read(key).renders))
    seen.append(len(turns.list_conversations(tenant, "ana", None, 10)))
    seen.append(len(turns.list_conversation_turns(tenant, "ana", "c1", None, 10)))
    deleted = NewAuditEvent("ana", AuditAction.CONVERSATION_DELETED, Writer.USER, T0)
    seen.append(turns.delete_conversation(tenant, "ana", "c1", deleted))
    seen.append(turns.deleted_conversations(tenant, "ana"))
    erased = NewAuditEvent("ana", AuditAction.BLOCK_DELETED, Writer.USER, T0)
    seen.append(turns.erase_principal(tenant, "ana", erased, lambda: None).deleted_turn_count)
    seen.append(fast.read(tenant, "ana").block)
    return seen


def test_every_statement_of_a_call_routes_to_one_shard(citus: PgDatabase, tenant: str) -> None:
    engine = routed_only(citus)
    db = SqlDatabase(engine)
    try:
        # The guard is live: a statement without the tenant predicate (the policy's own does
        # not route) is refused on this engine.
        refused = pytest.raises(DBAPIError, match="multi-task query about to be executed")
        with refused, engine.begin() as conn:
            scope_to_tenant(conn, tenant, citus=True)
            conn.exec_driver_sql("SELECT count(*) FROM memory_blocks").scalar_one()
        seen = one_call_of_each_kind(db, tenant)
    finally:
        db.dispose()
    assert seen[:2] == [
        (True, StoredBlock("first", "e-first", T0)),
        (True, StoredBlock("second", "e-second", T0)),
    ]
    # audit events, the turn accepted, its render record, the conversation listed with its
    # one turn, then deleted (one turn), hidden from search, nothing left for the erasure
    assert seen[2:10] == [2, AcceptOutcome.ACCEPTED, 1, 1, 1, 1, frozenset({"c1"}), 0]
    assert seen[10] is None  # erased


def test_the_store_statements_explain_as_single_shard_router_plans(
    citus: PgDatabase, tenant: str
) -> None:
    """EXPLAIN of each statement the SQLAlchemy paths sent (the plain write path, the turns, the
    lists, inspections, deletion and erasure, the worker's claim): one task, on one shard."""
    engine = create_store_engine(citus.app_url, pool_size=2)
    sent: list[tuple[str, Any]] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "INSERT", "UPDATE", "DELETE")):
            sent.append((statement, params))

    db = SqlDatabase(engine)
    try:
        one_call_of_each_kind(db, tenant)
        # The worker's claim: its per-tenant claim and the update of what it indexed (the
        # owner's look-up of the tenants with due work crosses shards by design).
        turns = TurnOperations(db)
        key = TurnKey(tenant, "bo", "c9", "t9")
        turns.accept_turn(NewTurn(key, "claimed on its shard", T0, T0))
        with turns.claim(1000, T0 + timedelta(hours=1)) as batch:
            batch.indexed(next(t for t in batch.turns if t.key == key))
        event.remove(engine, "before_cursor_execute", record)
        tables = ("memory_", "audit_events", "conversation_", "turn_inspections")
        checked = [(s, p) for s, p in sent if any(t in s for t in tables)]
        assert len(checked) >= 15, sent
        with engine.begin() as conn:
            scope_to_tenant(conn, tenant, citus=True)
            for statement, params in checked:
                plan = "\n".join(
                    row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, params)
                )
                assert "Citus Adaptive" in plan and "Task Count: 1\n" in plan, (statement, plan)
    finally:
        db.dispose()


def test_one_tenants_rows_live_on_one_node(citus: PgDatabase, tenant: str) -> None:
    db = SqlDatabase(create_store_engine(citus.app_url, pool_size=2))
    try:
        one_call_of_each_kind(db, tenant)
        SqlMemoryStore(db).apply(
            tenant,
            Change(
                "bob",
                SqlMemoryStore(db).read(tenant, "bob"),
                NewAuditEvent("bob", AuditAction.BLOCK_REWRITTEN, Writer.USER, T0),
                block=StoredBlock("kept", "e", T0),
            ),
        )
    finally:
        db.dispose()
    owner = create_engine(citus.owner_url)
    try:
        with owner.connect() as conn:
            nodes = conn.execute(
                text(
                    "SELECT DISTINCT s.nodename, s.nodeport FROM citus_shards s "
                    "JOIN citus_tables t ON t.table_name = s.table_name "
                    "WHERE s.shardid = "
                    "get_shard_id_for_distribution_column(s.table_name, CAST(:t AS text))"
                ),
                {"t": tenant},
            ).all()
            workers = conn.execute(text("SELECT count(*) FROM citus_get_active_worker_nodes()"))
            assert workers.scalar_one() == 2
    finally:
        owner.dispose()
    assert len(nodes) == 1, nodes  # every table's shard for the tenant, on one worker


@pytest.fixture
def unforwarded_citus() -> Iterator[PgDatabase]:
    """A migrated Citus database of this test's own, with citus.propagate_set_commands reset
    (Citus then forwards no SET LOCAL to the workers)."""
    name = f"memoria_test_{uuid.uuid4().hex[:12]}"
    from tests.postgres_server import citus_urls

    owner_url, app_url = citus_urls()
    citus_database(name)
    try:
        database = PgDatabase(
            make_url(owner_url).set(database=name).render_as_string(hide_password=False),
            make_url(app_url).set(database=name).render_as_string(hide_password=False),
        )
        owner = create_store_engine(database.owner_url, pool_size=1)
        try:
            migrate.upgrade(owner, app_role=APP_ROLE)
            with owner.connect() as conn:
                conn.exec_driver_sql(
                    f'ALTER DATABASE "{name}" RESET citus.propagate_set_commands'
                ).close()
                conn.commit()
        finally:
            owner.dispose()
        yield database
    finally:
        citus_database(name, drop=True)


def test_citus_without_set_local_forwarding_is_refused_in_one_line(
    unforwarded_citus: PgDatabase, tmp_path: Path
) -> None:
    serve = ["serve", "--listen", "127.0.0.1:0", "--database-url", unforwarded_citus.app_url]
    last, stderr = failed_in_one_line(serve, tmp_path, clean_env())
    assert last == (
        "memoria serve: the database is a Citus coordinator with citus.propagate_set_commands = "
        "'none': set it to 'local' for the service role (ALTER DATABASE ... SET "
        "citus.propagate_set_commands = 'local'; docs/operations.md, Running on Citus); check "
        "MEMORIA_DATABASE_URL (or --database-url)"
    )
    assert "memoria_app@" not in stderr


def test_claims_cross_tenants_and_lock_per_tenant(citus: PgDatabase, tenant: str) -> None:
    """The worker's claim finds due turns of several tenants (the owner's function names the
    tenants) and a second claim meanwhile skips what the first holds; the outbox gauges count
    every tenant's pending turns."""
    db = SqlDatabase(create_store_engine(citus.app_url, pool_size=4))
    turns = TurnOperations(db)
    other = tenant + "-b"
    try:
        for t in (tenant, other):
            turns.accept_turn(NewTurn(TurnKey(t, "ana", "c1", "t1"), f"turn of {t}", T0, T0))
        stats = turns.outbox_stats()
        assert stats.pending >= 2 and stats.oldest_accept_time is not None
        later = T0 + timedelta(hours=1)
        with turns.claim(1000, later) as first:
            mine = {t.key.tenant_id for t in first.turns}
            assert {tenant, other} <= mine
            with turns.claim(1000, later) as second:
                assert not {t.key.tenant_id for t in second.turns} & {tenant, other}
    finally:
        db.dispose()


def test_a_tenant_with_quotes_backslashes_and_percents_is_scoped_as_written(
    citus: PgDatabase, tenant: str
) -> None:
    """SET LOCAL takes no bind parameter: the tenant (any printable ASCII) goes in as a
    literal, on the one-statement calls and in the transactions alike."""
    odd = tenant + " o'brien \\' %s %(x)s"
    db = SqlDatabase(create_store_engine(citus.app_url, pool_size=2))
    try:
        for store in (SqlMemoryStore(db), SqlMemoryStore(db, fast_writes=False)):
            current = store.read(odd, "ana")
            assert store.apply(
                odd,
                Change(
                    "ana",
                    current,
                    NewAuditEvent("ana", AuditAction.BLOCK_REWRITTEN, Writer.USER, T0),
                    block=StoredBlock(f"v{current.block is not None}", "e", T0),
                ),
            )
        assert SqlMemoryStore(db).read(odd, "ana").block == StoredBlock("vTrue", "e", T0)
        assert len(SqlMemoryStore(db).list_audit(odd, AuditQuery(principal_id="ana"))) == 2
        assert SqlMemoryStore(db).read(tenant + " o", "ana").block is None
    finally:
        db.dispose()


def test_every_table_is_distributed_by_tenant_in_one_colocation_group(citus: PgDatabase) -> None:
    owner = create_engine(citus.owner_url)
    try:
        with owner.connect() as conn:
            tables = conn.execute(
                text(
                    "SELECT table_name::text, citus_table_type, distribution_column, "
                    "colocation_id FROM citus_tables ORDER BY 1"
                )
            ).all()
            local = conn.execute(
                text(
                    "SELECT count(*) FROM citus_tables "
                    "WHERE table_name = 'alembic_version'::regclass"
                )
            ).scalar_one()
    finally:
        owner.dispose()
    assert sorted(t[0] for t in tables) == sorted(metadata.tables)
    assert {(t[1], t[2]) for t in tables} == {("distributed", "tenant_id")}
    assert len({t[3] for t in tables}) == 1  # co-located: a tenant's shards on one node
    assert local == 0  # the schema's revision stays the coordinator's own table
