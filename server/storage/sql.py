"""The SQL memory store: blocks, settings and audit events on SQLite or PostgreSQL.

One adapter serves both dialects; the differences (how a transaction begins, upsert syntax,
time zones) are isolated in small functions. Every query names the tenant and the principal
explicitly, and on PostgreSQL row-level security enforces the tenant once more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Json
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Table,
    bindparam,
    delete,
    exc,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import BindParameter

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import (
    AuditAction,
    AuditEvent,
    AuditQuery,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
    Writer,
)
from server.storage.engine import (
    CHANGE_CHANNEL,
    KEY_SEPARATOR,
    WRITE_OPTION,
    create_postgres_read_engine,
)
from server.storage.tables import audit_events, memory_blocks, memory_settings

log = logging.getLogger(__name__)


def _utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; everything Memoria stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_UNAVAILABLE = (
    exc.OperationalError,
    exc.InterfaceError,
    exc.TimeoutError,
    psycopg.OperationalError,
)


def _unavailable(error: Exception) -> MemoriaError:
    # Connection refused or lost, server shutting down, pool exhausted, lock timeout: nothing
    # was committed, and the caller may retry.
    log.warning("store unavailable: %s", type(error).__name__)
    return MemoriaError(
        ErrorReason.STORE_UNAVAILABLE,
        "the memory store is unavailable; nothing was changed, retry with backoff",
    )


_READ_PRINCIPAL_PG = "SELECT * FROM memoria_read_principal(%s, %s)"


class SqlMemoryStore:
    """`MemoryStore` over a SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        # SQLite: one process owns the embedded database, so writers queue on this lock
        # instead of SQLite's busy handler, which sleeps and made write p99 spike.
        self._sqlite_writer = None if self._postgres else threading.Lock()
        self._reads = create_postgres_read_engine(engine) if self._postgres else None

    def dispose(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()
        if self._reads is not None:
            self._reads.dispose()

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        """See `MemoryStore.read`. On PostgreSQL: one autocommit call of a SQL function.

        This path uses the psycopg connection under SQLAlchemy's pool directly: measured on
        the render path, SQLAlchemy's execution layer and the BEGIN/set_config/COMMIT round
        trips cost several times the read itself (bench/README.md).
        """
        if self._reads is None:
            with self.transaction(tenant_id) as tx:
                return tx.load(principal_id)
        try:
            pooled = self._reads.raw_connection()
        except _UNAVAILABLE as error:
            raise _unavailable(error) from error
        try:
            conn: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
            row = conn.execute(_READ_PRINCIPAL_PG, (tenant_id, principal_id)).fetchone()
        except psycopg.OperationalError as error:
            pooled.invalidate(error)
            raise _unavailable(error) from error
        finally:
            pooled.close()
        assert row is not None  # the function always returns one row
        return _principal_memory(row)

    @property
    def engine(self) -> Engine:
        return self._engine

    @contextmanager
    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None
    ) -> Iterator[SqlMemoryTransaction]:
        """See `MemoryStore.transaction`. Store outages become STORE_UNAVAILABLE."""
        writer = self._sqlite_writer if lock_principal is not None else None
        try:
            with writer or nullcontext(), self._engine.connect() as conn:
                if lock_principal is not None:
                    conn.execution_options(**{WRITE_OPTION: True})
                with conn.begin():
                    tx = (
                        PostgresMemoryTransaction(conn, tenant_id)
                        if self._postgres
                        else SqlMemoryTransaction(conn, tenant_id)
                    )
                    tx.begin(lock_principal)
                    yield tx
        except _UNAVAILABLE as error:
            raise _unavailable(error) from error


# Statements are built once: constructing a SQLAlchemy statement costs more than running it
# (measured: the render path went from ~580 to ~250 microseconds per call on PostgreSQL).
_T: BindParameter[str] = bindparam("tenant_id")
_P: BindParameter[str] = bindparam("principal_id")
_b, _s = memory_blocks, memory_settings
_LOAD = select(
    _b.c.text, _b.c.etag, _b.c.update_time, _s.c.memory_enabled, _s.c.update_time
).select_from(
    select(literal_column("1").label("one"))
    .subquery()
    .outerjoin(_b, (_b.c.tenant_id == _T) & (_b.c.principal_id == _P))
    .outerjoin(_s, (_s.c.tenant_id == _T) & (_s.c.principal_id == _P))
)
_DELETE_BLOCK = delete(_b).where(_b.c.tenant_id == _T, _b.c.principal_id == _P)
_APPEND_AUDIT = (
    insert(audit_events)
    .values({c.name: bindparam(c.name) for c in audit_events.c if c.name != "event_id"})
    .inline()  # no RETURNING: the id is not needed
)
_REDACT_AUDIT_LINES = (
    update(audit_events)
    .where(
        audit_events.c.tenant_id == bindparam("tenant"),
        audit_events.c.principal_id == bindparam("principal"),
    )
    .values(removed_lines=[], added_lines=[])
)
# PostgreSQL: the service role may not UPDATE the audit log, so blanking goes through a
# SECURITY DEFINER function (migration 0002) that can change nothing but the line arrays.
_REDACT_AUDIT_LINES_PG = text("SELECT memoria_redact_audit_lines(:principal)")

# PostgreSQL: scope the transaction to one tenant for row-level security. `set_config(...,
# true)` lasts until the transaction ends, so a pooled connection never carries a tenant into
# the next one. A writer also takes an advisory lock on the principal (it exists even when the
# principal has no row yet, unlike SELECT ... FOR UPDATE) and announces the principal on the
# change channel; PostgreSQL delivers the NOTIFY only if the transaction commits, and other
# replicas drop their cached copy (storage/cache.py).
_SET_TENANT = text("SELECT set_config('app.tenant_id', :tenant, true)")
_SET_TENANT_AND_LOCK = text(
    "SELECT set_config('app.tenant_id', :tenant, true), "
    "pg_advisory_xact_lock(hashtextextended(:key, 0)), "
    f"pg_notify('{CHANGE_CHANNEL}', :key)"
)


def _upsert(dialect: Any, table: Table, columns: tuple[str, ...]) -> Any:
    values: dict[str, BindParameter[Any]] = {
        c: bindparam(c) for c in ("tenant_id", "principal_id", *columns)
    }
    stmt = dialect.insert(table).values(values)
    return stmt.on_conflict_do_update(
        index_elements=["tenant_id", "principal_id"],
        set_={c: stmt.excluded[c] for c in columns},
    )


_BLOCK_COLUMNS = ("text", "etag", "update_time")
_SETTINGS_COLUMNS = ("memory_enabled", "update_time")
_UPSERTS = {
    name: (_upsert(dialect, _b, _BLOCK_COLUMNS), _upsert(dialect, _s, _SETTINGS_COLUMNS))
    for name, dialect in (("postgresql", postgresql), ("sqlite", sqlite))
}


class SqlMemoryTransaction:
    """`MemoryTransaction` on one connection inside one open transaction (SQLite)."""

    DIALECT = "sqlite"

    def __init__(self, conn: Connection, tenant_id: str):
        self._conn = conn
        self._tenant = tenant_id
        self._put_block, self._put_settings = _UPSERTS[self.DIALECT]
        self._redact: Any = _REDACT_AUDIT_LINES

    def begin(self, lock_principal: str | None) -> None:
        """Whatever the dialect needs at the start (SQLite: its lock is taken by BEGIN)."""

    def _execute(self, stmt: Any, params: dict[str, Any]) -> None:
        self._conn.execute(stmt, params)

    def _fetch_one(self, stmt: Any, params: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(self._conn.execute(stmt, params).one())

    def load(self, principal_id: str) -> PrincipalMemory:
        params = {"tenant_id": self._tenant, "principal_id": principal_id}
        return _principal_memory(self._fetch_one(_LOAD, params))

    def put_block(self, principal_id: str, block: StoredBlock) -> None:
        self._execute(
            self._put_block,
            {
                "tenant_id": self._tenant,
                "principal_id": principal_id,
                "text": block.text,
                "etag": block.etag,
                "update_time": block.update_time,
            },
        )

    def delete_block(self, principal_id: str) -> None:
        self._execute(_DELETE_BLOCK, {"tenant_id": self._tenant, "principal_id": principal_id})

    def put_settings(self, principal_id: str, settings: StoredSettings) -> None:
        self._execute(
            self._put_settings,
            {
                "tenant_id": self._tenant,
                "principal_id": principal_id,
                "memory_enabled": settings.memory_enabled,
                "update_time": settings.update_time,
            },
        )

    def redact_audit_lines(self, principal_id: str) -> None:
        self._execute(self._redact, {"tenant": self._tenant, "principal": principal_id})

    def append_audit(self, event: NewAuditEvent) -> None:
        self._execute(
            _APPEND_AUDIT,
            {
                "tenant_id": self._tenant,
                "principal_id": event.principal_id,
                "action": event.action.value,
                "writer": event.writer.value,
                "create_time": event.create_time,
                "removed_lines": list(event.removed_lines),
                "added_lines": list(event.added_lines),
                "removed_line_count": event.removed_line_count,
                "added_line_count": event.added_line_count,
                "char_count": event.char_count,
                "memory_enabled": event.memory_enabled,
            },
        )

    def list_audit(self, query: AuditQuery) -> list[AuditEvent]:
        a = audit_events
        stmt = select(a).where(a.c.tenant_id == self._tenant)
        if query.principal_id is not None:
            stmt = stmt.where(a.c.principal_id == query.principal_id)
        if query.actions:
            stmt = stmt.where(a.c.action.in_(sorted(x.value for x in query.actions)))
        if query.start_time is not None:
            stmt = stmt.where(a.c.create_time >= query.start_time)
        if query.end_time is not None:
            stmt = stmt.where(a.c.create_time < query.end_time)
        if query.before_event_id is not None:
            stmt = stmt.where(a.c.event_id < query.before_event_id)
        stmt = stmt.order_by(a.c.event_id.desc()).limit(query.limit)
        return [_audit_event(row) for row in self._conn.execute(stmt)]


_PG_DIALECT = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
_PG_SQL: dict[Any, str] = {}


def _pg_sql(stmt: Any) -> str:
    """A statement compiled once for psycopg (`%(name)s` parameters)."""
    sql = _PG_SQL.get(stmt)
    if sql is None:
        sql = _PG_SQL[stmt] = str(stmt.compile(dialect=_PG_DIALECT))
    return sql


class PostgresMemoryTransaction(SqlMemoryTransaction):
    """The same unit of work on PostgreSQL, its statements sent through psycopg directly.

    The statements are the SQLAlchemy ones above, compiled once. Measured on the write path,
    SQLAlchemy's execution layer cost several times the round trips themselves; SQLAlchemy
    still owns the connection, the transaction (commit, rollback) and the audit queries.
    """

    DIALECT = "postgresql"

    def __init__(self, conn: Connection, tenant_id: str):
        super().__init__(conn, tenant_id)
        self._raw: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        self._redact = _REDACT_AUDIT_LINES_PG

    def begin(self, lock_principal: str | None) -> None:
        if lock_principal is None:
            self._execute(_SET_TENANT, {"tenant": self._tenant})
        else:
            key = f"{self._tenant}{KEY_SEPARATOR}{lock_principal}"
            self._execute(_SET_TENANT_AND_LOCK, {"tenant": self._tenant, "key": key})

    def _execute(self, stmt: Any, params: dict[str, Any]) -> None:
        self._raw.execute(_pg_sql(stmt), _pg_params(params))

    def _fetch_one(self, stmt: Any, params: dict[str, Any]) -> tuple[Any, ...]:
        row = self._raw.execute(_pg_sql(stmt), _pg_params(params)).fetchone()
        assert row is not None
        return tuple(row)


def _pg_params(params: dict[str, Any]) -> dict[str, Any]:
    """Lists go to json columns: psycopg needs them wrapped."""
    return {k: Json(v) if isinstance(v, list) else v for k, v in params.items()}


def _principal_memory(row: tuple[Any, ...]) -> PrincipalMemory:
    """Block text, etag, time, then settings enabled, time (NULLs where there is no row)."""
    block = None if row[0] is None else StoredBlock(row[0], row[1], _utc(row[2]))
    settings = None if row[3] is None else StoredSettings(bool(row[3]), _utc(row[4]))
    return PrincipalMemory(block=block, settings=settings)


def _audit_event(row: Row[Any]) -> AuditEvent:
    m = row._mapping
    return AuditEvent(
        event_id=int(m["event_id"]),
        principal_id=m["principal_id"],
        action=AuditAction(m["action"]),
        writer=Writer(m["writer"]),
        create_time=_utc(m["create_time"]),
        removed_lines=tuple(m["removed_lines"]),
        added_lines=tuple(m["added_lines"]),
        removed_line_count=m["removed_line_count"],
        added_line_count=m["added_line_count"],
        char_count=m["char_count"],
        memory_enabled=m["memory_enabled"],
    )
