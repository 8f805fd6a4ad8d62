"""The SQL memory store: blocks, settings and audit events on SQLite or PostgreSQL.

One adapter serves both dialects; the differences (how a transaction begins, upsert syntax,
time zones) are isolated in small functions. Every query names the tenant and the principal
explicitly, and on PostgreSQL row-level security enforces the tenant once more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, delete, exc, insert, literal, select
from sqlalchemy.dialects import postgresql, sqlite

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
from server.storage.engine import WRITE_OPTION, begin_postgres_scope
from server.storage.tables import audit_events, memory_blocks, memory_settings

log = logging.getLogger(__name__)


def _utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; everything Memoria stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class SqlMemoryStore:
    """`MemoryStore` over a SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._postgres = engine.dialect.name == "postgresql"

    @property
    def engine(self) -> Engine:
        return self._engine

    @contextmanager
    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None
    ) -> Iterator[SqlMemoryTransaction]:
        """See `MemoryStore.transaction`. Store outages become STORE_UNAVAILABLE."""
        try:
            with self._engine.connect() as conn:
                if lock_principal is not None:
                    conn.execution_options(**{WRITE_OPTION: True})
                with conn.begin():
                    if self._postgres:
                        begin_postgres_scope(conn, tenant_id, lock_principal)
                    yield SqlMemoryTransaction(conn, tenant_id, self._postgres)
        except (exc.OperationalError, exc.InterfaceError, exc.TimeoutError) as error:
            # Connection refused or lost, server shutting down, pool exhausted, lock timeout:
            # nothing was committed, and the caller may retry.
            log.warning("store unavailable: %s", type(error).__name__)
            raise MemoriaError(
                ErrorReason.STORE_UNAVAILABLE,
                "the memory store is unavailable; nothing was changed, retry with backoff",
            ) from error


class SqlMemoryTransaction:
    """`MemoryTransaction` on one connection inside one open transaction."""

    def __init__(self, conn: Connection, tenant_id: str, postgres: bool):
        self._conn = conn
        self._tenant = tenant_id
        self._insert = postgresql.insert if postgres else sqlite.insert

    def load(self, principal_id: str) -> PrincipalMemory:
        b, s = memory_blocks, memory_settings
        one = select(literal(1).label("one")).subquery()
        row = self._conn.execute(
            select(
                b.c.text, b.c.etag, b.c.update_time, s.c.memory_enabled, s.c.update_time
            ).select_from(
                one.outerjoin(
                    b, (b.c.tenant_id == self._tenant) & (b.c.principal_id == principal_id)
                ).outerjoin(s, (s.c.tenant_id == self._tenant) & (s.c.principal_id == principal_id))
            )
        ).one()
        block = None if row[0] is None else StoredBlock(row[0], row[1], _utc(row[2]))
        settings = None if row[3] is None else StoredSettings(bool(row[3]), _utc(row[4]))
        return PrincipalMemory(block=block, settings=settings)

    def put_block(self, principal_id: str, block: StoredBlock) -> None:
        values = {"text": block.text, "etag": block.etag, "update_time": block.update_time}
        self._upsert(memory_blocks, principal_id, values)

    def delete_block(self, principal_id: str) -> None:
        self._conn.execute(
            delete(memory_blocks).where(
                memory_blocks.c.tenant_id == self._tenant,
                memory_blocks.c.principal_id == principal_id,
            )
        )

    def put_settings(self, principal_id: str, settings: StoredSettings) -> None:
        values = {"memory_enabled": settings.memory_enabled, "update_time": settings.update_time}
        self._upsert(memory_settings, principal_id, values)

    def _upsert(self, table: Any, principal_id: str, values: dict[str, Any]) -> None:
        stmt = self._insert(table).values(
            tenant_id=self._tenant, principal_id=principal_id, **values
        )
        self._conn.execute(
            stmt.on_conflict_do_update(index_elements=["tenant_id", "principal_id"], set_=values)
        )

    def append_audit(self, event: NewAuditEvent) -> None:
        self._conn.execute(
            insert(audit_events).values(
                tenant_id=self._tenant,
                principal_id=event.principal_id,
                action=event.action.value,
                writer=event.writer.value,
                create_time=event.create_time,
                removed_lines=list(event.removed_lines),
                added_lines=list(event.added_lines),
                removed_line_count=event.removed_line_count,
                added_line_count=event.added_line_count,
                char_count=event.char_count,
                memory_enabled=event.memory_enabled,
            )
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
