"""The SQL memory store: blocks, settings and audit events on SQLite or PostgreSQL.

One adapter serves both dialects. Every query names the tenant and the principal explicitly,
and on PostgreSQL row-level security enforces the tenant once more.

PostgreSQL's hot paths are one statement each, sent through psycopg on a pool of autocommit
connections: a read is a call of `memoria_read_principal()` (migration 0003), a write a call of
`memoria_write()` (migration 0009), which locks the principal, checks the state the write was
decided on, writes, appends the audit event and announces the change, in the statement's own
transaction. What a write carries is declared once, as rows (`write_rows`): the SQLAlchemy
path executes them on SQLite (and on PostgreSQL with `fast_writes=False`), the function
receives them as JSON. Measured on the render and rewrite paths, SQLAlchemy's execution layer
and the BEGIN / set_config / ... / COMMIT round trips cost several times the work itself
(docs/decisions.md). SQLAlchemy still builds the schema, owns the pools and runs everything else.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import logging
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.adapt
import psycopg.errors
from psycopg.adapt import PyFormat
from psycopg.types.json import Jsonb
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

from server.domain.errors import ErrorReason, MemoriaError, StorageFull
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
from server.storage.disk import FreeSpace
from server.storage.engine import (
    KEY_SEPARATOR,
    WRITE_OPTION,
    create_postgres_autocommit_engine,
)
from server.storage.tables import audit_events, memory_blocks, memory_settings

log = logging.getLogger(__name__)

UNAVAILABLE_ERRORS = (
    exc.OperationalError,
    exc.InterfaceError,
    exc.TimeoutError,
    psycopg.OperationalError,
)


@contextmanager
def store_errors() -> Iterator[None]:
    """The one place the SQL adapters (this module, turns.py) turn a failure of the database
    into the caller's error: a driver or pool error that means "cannot reach or write the
    store now" (UNAVAILABLE_ERRORS) becomes `store_unavailable(error)`; anything else (a
    bug, a constraint) propagates as it is. Wrap each operation's whole use of a connection."""
    try:
        yield
    except UNAVAILABLE_ERRORS as error:
        raise store_unavailable(error) from error


def store_unavailable(error: Exception) -> MemoriaError:
    """The error a caller gets for a store failure: STORAGE_FULL when the database's disk is
    full (PostgreSQL SQLSTATE 53100 "could not extend file", SQLite's SQLITE_FULL), else
    STORE_UNAVAILABLE. Either way nothing was committed and the caller may retry."""
    if _disk_full(error):
        log.warning("store refused a write: its disk is full (%s)", type(error).__name__)
        return MemoriaError(
            ErrorReason.STORAGE_FULL,
            "the database's disk is full; nothing was written, reads keep working; retry "
            "with backoff",
            details=StorageFull(),
        )
    # Connection refused or lost, server shutting down, pool exhausted, lock timeout: nothing
    # was committed, and the caller may retry.
    log.warning("store unavailable: %s", type(error).__name__)
    return MemoriaError(
        ErrorReason.STORE_UNAVAILABLE,
        "the memory store is unavailable; nothing was changed, retry with backoff",
    )


def _disk_full(error: BaseException) -> bool:
    """The driver's error (unwrapped from SQLAlchemy's) says the database's disk is full."""
    cause = getattr(error, "orig", None) or error
    if isinstance(cause, psycopg.errors.DiskFull):
        return True
    return isinstance(cause, sqlite3.Error) and cause.sqlite_errorcode == sqlite3.SQLITE_FULL


def as_utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; everything Memoria stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_READ_PRINCIPAL_PG = "SELECT * FROM memoria_read_principal(%s, %s)"
_WRITE_PG = "SELECT memoria_write(%s, %s, %s, %s, %s, %s)"


@dataclass(frozen=True)
class WriteRows:
    """What a `Change` writes, as rows keyed by column name: the one declaration both
    dialects execute (SQLite and PostgreSQL's plain path through SQLAlchemy, PostgreSQL's
    fast path as the JSON argument of `memoria_write()`, migration 0009). A field added to
    the audit event reaches both without any other change (tests/contract/test_write_rows.py)."""

    block: dict[str, Any] | None
    delete_block: bool
    blank_audit_lines: bool
    settings: dict[str, Any] | None
    event: dict[str, Any]

    def as_json(self) -> Jsonb:
        """The `p_write` argument of `memoria_write()`."""
        return Jsonb(
            {
                "block": self.block,
                "delete_block": self.delete_block,
                "blank_audit_lines": self.blank_audit_lines,
                "settings": self.settings,
                "event": self.event,
            },
            dumps=_dumps,
        )


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


@functools.cache
def _field_names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


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


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a column value")


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


class SqlMemoryStore:
    """`MemoryStore` over a SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(
        self,
        engine: Engine,
        origin: str | None = None,
        *,
        space: FreeSpace | None = None,
        fast_writes: bool = True,
    ):
        """`space`: the embedded data dir's free-space watermark (server/storage/disk.py);
        while it is short, `apply` refuses a change that writes a block or settings and
        `SqlTurnStore` refuses to accept turns, with STORAGE_FULL. `fast_writes=False` makes
        PostgreSQL write through SQLAlchemy as SQLite does instead of `memoria_write()` (the
        contract suite runs over both paths)."""
        self._engine = engine
        self._fast_writes = fast_writes
        self.space = space
        self._postgres = engine.dialect.name == "postgresql"
        # Names this store's writes in their change notifications (storage/cache.py): 16 hex
        # digits of a 62-bit number, the form migration 0007 recognises as a server's.
        self.origin = origin if origin is not None else f"{secrets.randbits(62):016x}"
        # SQLite: one process owns the embedded database, so writers queue on this lock
        # instead of SQLite's busy handler, which sleeps and made write p99 spike.
        self._sqlite_writer = None if self._postgres else threading.Lock()
        self._autocommit = create_postgres_autocommit_engine(engine) if self._postgres else None
        self._span: Callable[[str], AbstractContextManager[object]] = _untraced

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def autocommit_engine(self) -> Engine | None:
        """PostgreSQL: the pool of autocommit connections behind `call` (None on SQLite)."""
        return self._autocommit

    def trace_calls(self, span: Callable[[str], AbstractContextManager[object]]) -> None:
        """Run each of `call`'s statements inside `span(statement)` from now on (telemetry's
        client span). The statement runs the same way traced or not: a span around it, not
        another driver path (PostgreSQL; SQLite has no such calls)."""
        self._span = span

    def dispose(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()
        if self._autocommit is not None:
            self._autocommit.dispose()

    def check(self) -> None:
        """Return if the database answers `SELECT 1` now, else raise (for the health monitor).

        The probe runs on each pool the calls use (PostgreSQL: the autocommit pool of the hot
        paths and SQLAlchemy's own), so it sees what a call would see: the server, the
        network, the service role's login. It goes through SQLAlchemy's connection layer on
        purpose: when the probe meets a connection that an outage killed, SQLAlchemy marks
        every connection of that pool opened before then as stale, to be replaced on its next
        checkout, and the probe asks once more on a fresh connection (as a pool pre-ping
        would). So after the database returns, the first probe reports it, and calls do not
        each fail once on a dead connection. Unlike a call's failure, a probe's is not logged
        here: the monitor logs transitions.
        """
        engines = [self._engine] if self._autocommit is None else [self._autocommit, self._engine]
        for engine in engines:
            try:
                _select_one(engine)
            except exc.DBAPIError as error:
                if not error.connection_invalidated:
                    raise
                _select_one(engine)  # the pool has dropped its stale connections

    def read(self, tenant_id: str, principal_id: str, *, fresh: bool = False) -> PrincipalMemory:
        """See `MemoryStore.read` (this store is always fresh)."""
        if self._autocommit is None:
            with self.transaction(tenant_id) as tx:
                return tx.load(principal_id)
        row = self.call(_READ_PRINCIPAL_PG, (tenant_id, principal_id))
        return _principal_memory(row)

    def apply(self, tenant_id: str, change: Change) -> bool:
        """See `MemoryStore.apply`. The rows written are `write_rows(change)`, on either path."""
        if self.space is not None and (change.block is not None or change.settings is not None):
            self.space.ensure_room()  # deleting a block alone frees space: it passes
        rows = write_rows(tenant_id, change)
        expected = (change.expected_etag, change.expected_enabled)
        if self._autocommit is not None and self._fast_writes:
            params = (tenant_id, change.principal_id, *expected, rows.as_json(), self.origin)
            return bool(self.call(_WRITE_PG, params)[0])
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

    def call(self, sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
        """One autocommit statement on PostgreSQL (`%s` for each of `params`, `%%` for a literal
        `%`, as psycopg takes them); its one row.
        For the hot paths' SQL functions, which scope their own transaction to the tenant.

        It runs as a statement prepared on the connection (on its first use there), through
        libpq's blocking PQexecPrepared, with psycopg's own adapters for the parameters and
        the row. That call releases the GIL once for the whole round trip. psycopg's `execute`
        drives libpq step by step instead, releasing the GIL and taking it back around each
        step, 9 times per statement (counted with a probe on PyEval_SaveThread); with gRPC's
        threads waiting for the GIL, every release hands it over, and those hand-offs cost
        more of the server's CPU than the statement itself (docs/decisions.md).

        Telemetry sees each statement through `trace_calls`.
        """
        assert self._autocommit is not None
        with store_errors(), self._span(sql):
            pooled = self._autocommit.raw_connection()
            try:
                conn: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
                row = _execute_prepared(conn, pooled.info, sql, params)
            except psycopg.OperationalError as error:
                pooled.invalidate(error)  # the connection is gone: never hand it out again
                raise
            finally:
                pooled.close()
        return row

    @contextmanager
    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None, announce: bool = True
    ) -> Iterator[SqlMemoryTransaction]:
        """A unit of work in one tenant, through SQLAlchemy; commits when the block exits
        cleanly. With `lock_principal`, writers of that principal are serialized first (even
        when it has no row yet) and, if `announce`, other replicas are told the principal's
        memory changed. Store outages become STORE_UNAVAILABLE.

        On SQLite this is how every operation runs; on PostgreSQL it serves the audit listing
        (and tests that prepare data).
        """
        writer = self._sqlite_writer if lock_principal is not None else None
        with store_errors(), writer or nullcontext(), self._engine.connect() as conn:
            if lock_principal is not None:
                conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                tx = SqlMemoryTransaction(conn, tenant_id, self._postgres, self.origin)
                tx.begin(lock_principal, announce=announce)
                yield tx


@functools.cache
def _prepared_statement(sql: str) -> tuple[bytes, bytes]:
    """A name for `sql` and its text with `$1`, `$2`, ... in place of each `%s`."""
    name = b"memoria_" + hashlib.blake2b(sql.encode(), digest_size=8).hexdigest().encode()
    return name, (sql % tuple(f"${i}" for i in range(1, sql.count("%s") + 1))).encode()


def _execute_prepared(
    conn: psycopg.Connection[Any], prepared: dict[Any, Any], sql: str, params: Sequence[Any]
) -> tuple[Any, ...]:
    """Run `sql` as a statement prepared on `conn`, preparing it first if `prepared` (the
    connection's pool info dictionary) does not name it yet; the first row."""
    pgconn = conn.pgconn
    name, text_ = _prepared_statement(sql)
    if name not in prepared:
        result = pgconn.prepare(name, text_)
        if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
            raise _error(conn, result)
        prepared[name] = True
    tx = psycopg.adapt.Transformer(conn)
    values = tx.dump_sequence(params, [PyFormat.TEXT] * len(params))
    result = pgconn.exec_prepared(name, values, None, psycopg.pq.Format.TEXT)  # type: ignore[arg-type]
    if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
        error = _error(conn, result)
        if not isinstance(error, psycopg.OperationalError):
            # Prepared afresh by the next call: a plan gone stale (a migration changed what
            # a function returns) would otherwise fail on this connection for good.
            del prepared[name]
            pgconn.exec_(b"DEALLOCATE " + name)
        raise error
    assert result.ntuples == 1  # the functions called here always return one row
    tx.set_pgresult(result)
    row: tuple[Any, ...] = tx.load_row(0, tuple)
    return row


def _error(conn: psycopg.Connection[Any], result: Any) -> psycopg.Error:
    """The psycopg error for a failed statement's result, as psycopg's cursor would raise it;
    OperationalError when the connection is gone."""
    if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
        return psycopg.OperationalError("the connection to PostgreSQL was lost")
    return psycopg.errors.error_from_result(result, encoding=conn.info.encoding)


def _untraced(statement: str) -> AbstractContextManager[object]:
    return nullcontext()


def _select_one(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1").scalar_one()


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
# PostgreSQL: scope the transaction to one tenant for row-level security. `set_config(...,
# true)` lasts until the transaction ends, so a pooled connection never carries a tenant into
# the next one. A writer also takes an advisory lock on the principal (it exists even when the
# principal has no row yet, unlike SELECT ... FOR UPDATE) and announces the principal to the
# other servers' read caches, if any listens (migration 0007's memoria_announce()); PostgreSQL
# delivers the NOTIFY only if the transaction commits, and the others drop their cached copy
# (storage/cache.py). memoria_write() does the same.
_SET_TENANT = text("SELECT set_config('app.tenant_id', :tenant, true)")
_SET_TENANT_AND_LOCK = text(
    "SELECT set_config('app.tenant_id', :tenant, true), "
    "pg_advisory_xact_lock(hashtextextended(:key, 0)), "
    "memoria_announce(:origin, :key)"
)
_SET_TENANT_AND_LOCK_QUIETLY = text(
    "SELECT set_config('app.tenant_id', :tenant, true), "
    "pg_advisory_xact_lock(hashtextextended(:key, 0))"
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


class SqlMemoryTransaction:
    """One unit of work on one connection inside one open transaction, in one tenant."""

    def __init__(self, conn: Connection, tenant_id: str, postgres: bool, origin: str):
        self._conn = conn
        self._tenant = tenant_id
        self._postgres = postgres
        self._origin = origin
        self._put_block, self._put_settings = _UPSERTS["postgresql" if postgres else "sqlite"]

    @property
    def connection(self) -> Connection:
        """The transaction's connection, for other adapters' statements in the same unit."""
        return self._conn

    def begin(self, lock_principal: str | None, *, announce: bool = True) -> None:
        """PostgreSQL: scope to the tenant and lock the writer's principal, announcing the
        change unless told not to (SQLite's writers are serialized by BEGIN IMMEDIATE and
        the store's lock)."""
        if not self._postgres:
            return
        if lock_principal is None:
            self._conn.execute(_SET_TENANT, {"tenant": self._tenant})
            return
        key = f"{self._tenant}{KEY_SEPARATOR}{lock_principal}"
        if not announce:
            self._conn.execute(_SET_TENANT_AND_LOCK_QUIETLY, {"tenant": self._tenant, "key": key})
            return
        self._conn.execute(
            _SET_TENANT_AND_LOCK, {"tenant": self._tenant, "key": key, "origin": self._origin}
        )

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
        stmt = stmt.order_by(a.c.event_id.desc()).limit(query.limit)
        return [_audit_event(row) for row in self._conn.execute(stmt)]


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
