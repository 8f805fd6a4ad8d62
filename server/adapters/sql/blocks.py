"""The SQL memory store: blocks, settings and audit events on SQLite or PostgreSQL.

One adapter serves both dialects. Every query names the tenant and the principal explicitly,
and on PostgreSQL row-level security enforces the tenant once more.

PostgreSQL's hot paths are one statement each, sent through psycopg on a pool of autocommit
connections: a read is a call of `memoria_read_principal()` (migration 0003), a write a call of
`memoria_write()` (migration 0009), which locks the principal, checks the state the write was
decided on, writes, appends the audit event and announces the change, in the statement's own
transaction. What a write carries is declared once, as rows (`write_rows`): the SQLAlchemy
path executes them on SQLite (and on PostgreSQL with `fast_writes=False`), the function
receives them as arguments of the tables' row types. Measured on the render and rewrite paths,
SQLAlchemy's execution layer and the BEGIN / set_config / ... / COMMIT round trips cost
several times the work itself (docs/decisions.md). SQLAlchemy still builds the schema, owns the
pools and runs everything else.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg.errors
from sqlalchemy import (
    Connection,
    Row,
    Table,
    bindparam,
    delete,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import BindParameter

from server.adapters.sql.database import SqlDatabase, SqlTransaction, as_utc
from server.adapters.sql.tables import audit_events, memory_blocks, memory_settings
from server.domain.model import (
    AuditAction,
    AuditEvent,
    AuditQuery,
    Change,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
    Writer,
)

_READ_PRINCIPAL_PG = "SELECT * FROM memoria_read_principal(%s, %s)"
_WRITE_PG = "SELECT memoria_write(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
# The tables' columns in the database's order: a row-typed argument of memoria_write() is a
# row literal of its table, whatever order the migrations gave the columns.
_COLUMNS_PG = (
    "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute "
    "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
)
_ROW_TABLES = ("memory_blocks", "memory_settings", "audit_events")


@dataclass(frozen=True)
class WriteRows:
    """What a `Change` writes, as rows keyed by column name: the one declaration both
    dialects execute (SQLite and PostgreSQL's plain path through SQLAlchemy, PostgreSQL's
    fast path as the row-typed arguments of `memoria_write()`, migration 0009). A field added
    to the audit event reaches both with no other change (tests/contract/test_write_rows.py)."""

    block: dict[str, Any] | None
    delete_block: bool
    blank_audit_lines: bool
    settings: dict[str, Any] | None
    event: dict[str, Any]

    def as_pg_arguments(self, columns: dict[str, tuple[str, ...]]) -> tuple[Any, ...]:
        """The rows as `memoria_write()`'s row-typed arguments (block, delete, blank,
        settings, event), each a row literal of its table (`_row_literal`, in the column
        order of `columns`). A column the rows do not name is NULL (the event's id: the
        function takes it from its sequence)."""
        block = None if self.block is None else _row(self.block, columns["memory_blocks"])
        settings = (
            None if self.settings is None else _row(self.settings, columns["memory_settings"])
        )
        event = _row(self.event, columns["audit_events"])
        return (block, self.delete_block, self.blank_audit_lines, settings, event)


def write_rows(tenant_id: str, change: Change) -> WriteRows:
    """The rows `change` writes in `tenant_id` (see `WriteRows`)."""
    key = {"tenant_id": tenant_id, "principal_id": change.principal_id}
    block, settings = change.block, change.settings
    return WriteRows(
        block=None if block is None else {**key, **_columns(block)},
        delete_block=change.delete_block,
        blank_audit_lines=change.blank_audit_lines,
        settings=None if settings is None else {**key, **_columns(settings)},
        event=audit_row(tenant_id, change.event),
    )


def audit_row(tenant_id: str, event: NewAuditEvent) -> dict[str, Any]:
    """An audit event's row: the tenant and every field of the event, by name."""
    return {"tenant_id": tenant_id, **_columns(event)}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(kind)
    if names is None:
        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return names


def _columns(record: Any) -> dict[str, Any]:
    """A domain record's fields as column values: enums by value, tuples as lists."""
    values: dict[str, Any] = {}
    for name in _field_names(type(record)):
        value = getattr(record, name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, tuple):
            value = list(value)
        values[name] = value
    return values


def _row(values: dict[str, Any], columns: tuple[str, ...]) -> str:
    """PostgreSQL's text form of a row (a composite value) with `values` in `columns` order:
    every value double-quoted with `"` and `\\` escaped, NULL left empty, lists (the JSON
    columns) as JSON. Written here rather than through psycopg's tuple dumper, which dumps
    field by field in Python: measured, it cost the rewrite ~29 us of the server's CPU more
    per call than 0004's positional arguments; this costs ~5 us."""
    fields = []
    for column in columns:
        value = values.get(column)
        if value is None:
            fields.append("")
            continue
        if isinstance(value, str):
            text_ = value
        elif isinstance(value, bool):
            text_ = "t" if value else "f"
        elif isinstance(value, int):
            text_ = str(value)
        elif isinstance(value, datetime):
            text_ = value.isoformat()
        elif isinstance(value, list):
            text_ = _dumps(value)
        else:
            raise TypeError(f"{column}: {type(value).__name__} is not a column value")
        fields.append('"' + text_.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "(" + ",".join(fields) + ")"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class SqlMemoryStore:
    """`MemoryStore` on a `SqlDatabase` (SQLite or PostgreSQL)."""

    def __init__(self, db: SqlDatabase, *, fast_writes: bool = True):
        """`fast_writes=False` makes PostgreSQL write through SQLAlchemy as SQLite does,
        instead of one call of `memoria_write()` (the contract suite runs over both paths).
        While the embedded data dir is short of space (`db.space`), `apply` refuses a change
        that writes a block or settings, with STORAGE_FULL."""
        self.db = db
        self._fast = fast_writes and db.autocommit_engine is not None
        self._columns: dict[str, tuple[str, ...]] | None = None

    def _load_columns(self) -> dict[str, tuple[str, ...]]:
        """The row tables' columns, read once from the database (see `_COLUMNS_PG`)."""
        columns = {t: tuple(self.db.call(_COLUMNS_PG, (t,))[0]) for t in _ROW_TABLES}
        self._columns = columns
        return columns

    def confirm(self, tenant_id: str, principal_id: str, memory: PrincipalMemory) -> bool:
        """See `MemoryStore.confirm` (this store's reads are its own state)."""
        return _same_state(self.read(tenant_id, principal_id), memory)

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        """See `MemoryStore.read` (never lags: it reads the database)."""
        if self.db.autocommit_engine is None:
            with self.transaction(tenant_id) as tx:
                return tx.load(principal_id)
        row = self.db.call(_READ_PRINCIPAL_PG, (tenant_id, principal_id), tenant=tenant_id)
        return _principal_memory(row)

    def apply(self, tenant_id: str, change: Change) -> bool:
        """See `MemoryStore.apply`. The rows written are `write_rows(change)`, on either path."""
        if self.db.space is not None and (change.block is not None or change.settings is not None):
            self.db.space.ensure_room()  # deleting a block alone frees space: it passes
        rows = write_rows(tenant_id, change)
        expected = (change.expected_etag, change.expected_enabled)
        if self._fast:
            head = (tenant_id, change.principal_id, *expected)
            try:
                arguments = rows.as_pg_arguments(self._columns or self._load_columns())
                return bool(
                    self.db.call(_WRITE_PG, (*head, *arguments, self.db.origin), tenant=head[0])[0]
                )
            except psycopg.errors.InvalidTextRepresentation:
                # "malformed record literal": a migration changed a table's columns while this
                # server ran (a rolling upgrade); nothing was written. Read them again, once.
                arguments = rows.as_pg_arguments(self._load_columns())
                return bool(
                    self.db.call(_WRITE_PG, (*head, *arguments, self.db.origin), tenant=head[0])[0]
                )
        with self.transaction(tenant_id, lock_principal=change.principal_id) as tx:
            memory = tx.load(change.principal_id)
            etag = memory.block.etag if memory.block is not None else ""
            if (etag, memory.memory_enabled) != expected:
                return False
            tx.write(rows)
            return True

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        """See `MemoryStore.list_audit`."""
        with self.transaction(tenant_id) as tx:
            return tx.list_audit(query)

    @contextmanager
    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None, announce: bool = True
    ) -> Iterator[MemoryRows]:
        """The principal's memory rows on a transaction in one tenant (`SqlDatabase.
        transaction`, announcing a locked principal's change unless told not to). The plain
        write path, the audit listing, and tests that prepare data."""
        with self.db.transaction(
            tenant_id, lock_principal=lock_principal, announce=announce and bool(lock_principal)
        ) as tx:
            yield MemoryRows(tx)


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
_DELETE_SETTINGS = delete(_s).where(_s.c.tenant_id == _T, _s.c.principal_id == _P)
_APPEND_AUDIT = insert(audit_events)
_REDACT_AUDIT_LINES = (
    update(audit_events)
    .where(
        audit_events.c.tenant_id == bindparam("tenant"),
        audit_events.c.principal_id == bindparam("principal"),
    )
    .values(removed_lines=[], added_lines=[])
)
# The service role may not UPDATE the audit log, so blanking goes through a SECURITY DEFINER
# function (migration 0002) that can change nothing but the line arrays.
_REDACT_AUDIT_LINES_PG = text("SELECT memoria_redact_audit_lines(:principal)")


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


class MemoryRows:
    """The block, settings and audit rows of one tenant, on an open transaction: storage
    only executes here, what to write is decided by the domain."""

    def __init__(self, tx: SqlTransaction):
        self._tx = tx
        self._conn = tx.connection
        self._tenant = tx.tenant_id
        self._postgres = tx.postgres
        self._put_block, self._put_settings = _UPSERTS["postgresql" if tx.postgres else "sqlite"]

    @property
    def connection(self) -> Connection:
        """The transaction's connection (tests prepare rows on it)."""
        return self._conn

    def delete_settings(self, principal_id: str) -> None:
        self._conn.execute(
            _DELETE_SETTINGS, {"tenant_id": self._tenant, "principal_id": principal_id}
        )

    def load(self, principal_id: str) -> PrincipalMemory:
        params = {"tenant_id": self._tenant, "principal_id": principal_id}
        return _principal_memory(tuple(self._conn.execute(_LOAD, params).one()))

    def write(self, rows: WriteRows) -> None:
        """Execute a change's rows (the plain path of `SqlMemoryStore.apply`)."""
        principal = rows.event["principal_id"]
        if rows.block is not None:
            self._conn.execute(self._put_block, rows.block)
        if rows.delete_block:
            self.delete_block(principal)
        if rows.blank_audit_lines:
            self.redact_audit_lines(principal)
        if rows.settings is not None:
            self._conn.execute(self._put_settings, rows.settings)
        self._conn.execute(_APPEND_AUDIT, rows.event)

    def put_block(self, principal_id: str, block: StoredBlock) -> None:
        key = {"tenant_id": self._tenant, "principal_id": principal_id}
        self._conn.execute(self._put_block, {**key, **_columns(block)})

    def put_settings(self, principal_id: str, settings: StoredSettings) -> None:
        key = {"tenant_id": self._tenant, "principal_id": principal_id}
        self._conn.execute(self._put_settings, {**key, **_columns(settings)})

    def delete_block(self, principal_id: str) -> None:
        self._conn.execute(_DELETE_BLOCK, {"tenant_id": self._tenant, "principal_id": principal_id})

    def redact_audit_lines(self, principal_id: str) -> None:
        """Blank the line content of the principal's audit events (counts stay)."""
        stmt = _REDACT_AUDIT_LINES_PG if self._postgres else _REDACT_AUDIT_LINES
        self._conn.execute(stmt, {"tenant": self._tenant, "principal": principal_id})

    def append_audit(self, event: NewAuditEvent) -> None:
        self._conn.execute(_APPEND_AUDIT, audit_row(self._tenant, event))

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
        if query.turn is not None:
            stmt = stmt.where(
                a.c.turn_conversation_id == query.turn.conversation_id,
                a.c.turn_id == query.turn.turn_id,
            )
        stmt = stmt.order_by(a.c.event_id.desc()).limit(query.limit)
        return [_audit_event(row) for row in self._conn.execute(stmt)]


def _same_state(now: PrincipalMemory, then: PrincipalMemory) -> bool:
    """The block etag and memory setting that a write is decided on are the same."""
    etag = now.block.etag if now.block is not None else ""
    then_etag = then.block.etag if then.block is not None else ""
    return (etag, now.memory_enabled) == (then_etag, then.memory_enabled)


def _principal_memory(row: tuple[Any, ...]) -> PrincipalMemory:
    """Block text, etag, time, then settings enabled, time (NULLs where there is no row)."""
    block = None if row[0] is None else StoredBlock(row[0], row[1], as_utc(row[2]))
    settings = None if row[3] is None else StoredSettings(bool(row[3]), as_utc(row[4]))
    return PrincipalMemory(block=block, settings=settings)


_AUDIT_FIELDS = tuple(f.name for f in dataclasses.fields(AuditEvent))


def _audit_event(row: Row[Any]) -> AuditEvent:
    """An audit row as the domain's event: every field of `AuditEvent` read by its name."""
    m = row._mapping
    values = {name: m[name] for name in _AUDIT_FIELDS}
    values["event_id"] = int(values["event_id"])
    values["action"] = AuditAction(values["action"])
    values["writer"] = Writer(values["writer"])
    values["create_time"] = as_utc(values["create_time"])
    values["removed_lines"] = tuple(values["removed_lines"])
    values["added_lines"] = tuple(values["added_lines"])
    return AuditEvent(**values)
