"""Row-level security and grants on PostgreSQL, proven as the service role, on one server and on
a Citus coordinator with two workers (the policies enforced on the shards).

A bug in a query must still not cross tenants: these tests run deliberately unscoped SQL as
the non-superuser service role and show that PostgreSQL itself returns only the current
tenant's rows, refuses rows for another tenant, and keeps the audit log append-only.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase, scope_to_tenant
from server.domain.model import AuditAction, NewAuditEvent, NewTurn, StoredBlock, TurnKey, Writer
from tests.conftest import PgDatabase
from tests.turn_operations import TurnOperations

pytestmark = pytest.mark.postgres
NOW = datetime(2026, 5, 1, tzinfo=UTC)


@pytest.fixture(params=["postgres", pytest.param("citus", marks=pytest.mark.citus)])
def app_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    database: PgDatabase = request.getfixturevalue(request.param)
    engine = create_engine(database.app_url)
    yield engine
    engine.dispose()


@pytest.fixture
def two_tenants(app_engine: Engine, tenant: str, request: pytest.FixtureRequest) -> tuple[str, str]:
    store = SqlMemoryStore(SqlDatabase(app_engine))
    request.addfinalizer(store.db.dispose)
    other = tenant + "-b"
    for t in (tenant, other):
        with store.transaction(t, lock_principal="ana") as tx:
            tx.put_block("ana", StoredBlock(f"block of {t}", "e", NOW))
            tx.append_audit(NewAuditEvent("ana", AuditAction.BLOCK_REWRITTEN, Writer.USER, NOW))
    return tenant, other


def scoped(conn: Connection, tenant: str) -> None:
    """Scope the transaction as the store does (on Citus: SET LOCAL, forwarded to the workers)."""
    citus = conn.exec_driver_sql(
        "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"
    ).scalar_one()
    scope_to_tenant(conn, tenant, citus=citus)


def test_service_role_is_not_superuser_nor_owner(app_engine: Engine) -> None:
    with app_engine.connect() as conn:
        role = conn.execute(
            text("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")
        ).one()
        owners = set(
            conn.execute(
                text(
                    "SELECT tableowner FROM pg_tables WHERE tablename IN "
                    "('memory_blocks', 'memory_settings', 'audit_events')"
                )
            ).scalars()
        )
        user = conn.execute(text("SELECT current_user")).scalar_one()
    assert tuple(role) == (False, False)
    assert user not in owners


def test_unscoped_query_sees_only_the_current_tenant(
    app_engine: Engine, two_tenants: tuple[str, str]
) -> None:
    mine, other = two_tenants
    with app_engine.begin() as conn:
        scoped(conn, mine)
        # Deliberately no WHERE tenant_id: the bug RLS exists to contain.
        texts = conn.execute(text("SELECT text FROM memory_blocks")).scalars().all()
        audit_tenants = set(conn.execute(text("SELECT tenant_id FROM audit_events")).scalars())
    assert texts == [f"block of {mine}"]
    assert audit_tenants == {mine}
    with app_engine.begin() as conn:
        scoped(conn, other)
        assert conn.execute(text("SELECT text FROM memory_blocks")).scalars().all() == [
            f"block of {other}"
        ]


def test_no_tenant_set_sees_nothing(app_engine: Engine, two_tenants: tuple[str, str]) -> None:
    with app_engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM memory_blocks")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM audit_events")).scalar_one() == 0


def test_tenant_setting_does_not_outlive_its_transaction(
    app_engine: Engine, two_tenants: tuple[str, str]
) -> None:
    with app_engine.connect() as conn:
        with conn.begin():
            scoped(conn, two_tenants[0])
        with conn.begin():
            assert conn.execute(text("SELECT count(*) FROM memory_blocks")).scalar_one() == 0


def test_writing_a_row_for_another_tenant_is_refused(
    app_engine: Engine, two_tenants: tuple[str, str]
) -> None:
    mine, other = two_tenants
    with pytest.raises(DBAPIError, match="row-level security"), app_engine.begin() as conn:
        scoped(conn, mine)
        conn.execute(
            text(
                "INSERT INTO memory_blocks (tenant_id, principal_id, text, etag, update_time) "
                "VALUES (:t, 'mallory', 'x', 'e', now())"
            ),
            {"t": other},
        )
    with app_engine.begin() as conn:
        scoped(conn, mine)
        moved = conn.execute(
            text("UPDATE memory_blocks SET text = 'hijacked' WHERE tenant_id = :t"), {"t": other}
        )
        assert moved.rowcount == 0


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_events SET principal_id = 'x'",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
    ],
)
def test_audit_log_is_append_only_for_the_service(
    app_engine: Engine, two_tenants: tuple[str, str], statement: str
) -> None:
    with pytest.raises(ProgrammingError, match="permission denied"), app_engine.begin() as conn:
        scoped(conn, two_tenants[0])
        conn.execute(text(statement))
    with app_engine.begin() as conn:
        scoped(conn, two_tenants[0])
        assert conn.execute(text("SELECT count(*) FROM audit_events")).scalar_one() == 1


def test_redaction_function_cannot_reach_another_tenant(
    app_engine: Engine, two_tenants: tuple[str, str]
) -> None:
    mine, other = two_tenants
    with app_engine.begin() as conn:
        scoped(conn, other)
        conn.execute(
            text(
                "INSERT INTO audit_events (tenant_id, principal_id, action, writer, create_time,"
                " removed_lines, added_lines, removed_line_count, added_line_count, char_count)"
                " VALUES (:t, 'ana', 'block_rewritten', 'user', now(), '[]', '[\"x\"]', 0, 1, 1)"
            ),
            {"t": other},
        )
    with app_engine.begin() as conn:
        scoped(conn, mine)
        conn.execute(text("SELECT memoria_redact_audit_lines('ana')"))
    with app_engine.begin() as conn:
        scoped(conn, other)
        kept = conn.execute(
            text("SELECT count(*) FROM audit_events WHERE json_array_length(added_lines) > 0")
        ).scalar_one()
    assert kept == 1


def test_service_cannot_change_the_schema_or_disable_rls(app_engine: Engine) -> None:
    for ddl in (
        "ALTER TABLE memory_blocks DISABLE ROW LEVEL SECURITY",
        "DROP POLICY tenant_isolation ON memory_blocks",
        "CREATE TABLE sneaky (x int)",
    ):
        with pytest.raises(ProgrammingError), app_engine.begin() as conn:
            conn.execute(text(ddl))


def test_turn_queue_and_tombstones_are_tenant_scoped(app_engine: Engine, tenant: str) -> None:
    """The queue's cross-tenant claim goes through the definer function, which returns ids
    only; a plain (buggy) query as the service role still sees only its own tenant's turns."""
    store = SqlMemoryStore(SqlDatabase(app_engine))
    turns = TurnOperations(store.db)
    other = tenant + "-b"
    try:
        for t in (tenant, other):
            key = TurnKey(t, "ana", "c1", "t1")
            turns.accept_turn(NewTurn(key, f"turn of {t}", NOW, NOW))
            turns.delete_conversation(
                t,
                "ana",
                "c2",
                NewAuditEvent("ana", AuditAction.CONVERSATION_DELETED, Writer.USER, NOW),
            )
        with app_engine.begin() as conn:
            scoped(conn, tenant)
            texts = conn.execute(text("SELECT text FROM conversation_turns")).scalars().all()
            stones = set(
                conn.execute(text("SELECT tenant_id FROM conversation_tombstones")).scalars()
            )
            ids = {
                row.tenant_id
                for row in conn.execute(
                    text("SELECT tenant_id FROM memoria_claim_turns(1000, now())")
                )
            }
        assert texts == [f"turn of {tenant}"]
        assert stones == {tenant}
        assert {tenant, other} <= ids  # ids only, across tenants, for the worker
        with app_engine.begin() as conn, pytest.raises(ProgrammingError):
            scoped(conn, tenant)
            conn.execute(
                text(
                    "INSERT INTO conversation_turns (tenant_id, principal_id, conversation_id,"
                    " turn_id, version, status, text, turn_time, accept_time, due_time, attempts)"
                    " VALUES (:other, 'ana', 'c', 't', 1, 'pending', 'x', now(), now(), now(), 0)"
                ),
                {"other": other},
            )
    finally:
        store.db.dispose()
