"""The SQL database every SQL adapter shares: engines and pools, transactions, one-statement
calls, the probe, and how a failure of the database becomes the caller's error.

The memory store (blocks.py), the turn queue (turns.py), the inspector's records
(inspections.py) and the units of work that span them (unit_of_work.py) all run on one
`SqlDatabase`; none reaches into another's internals.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.adapt
import psycopg.errors
import psycopg.sql
from psycopg.adapt import PyFormat
from sqlalchemy import Connection, Engine, exc, text

from server.adapters.disk import FreeSpace
from server.adapters.sql.engine import (
    KEY_SEPARATOR,
    WRITE_OPTION,
    behind_pooler,
    create_postgres_autocommit_engine,
)
from server.domain.errors import ErrorReason, MemoriaError, StorageFull

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

# Citus (docs/decisions.md, "Citus, sharded by tenant"): a transaction's settings reach the
# worker nodes that hold the shards only as `SET LOCAL` statements, and only with
# citus.propagate_set_commands = 'local' (measured: after set_config(..., true) the policies on
# the shards see no tenant and every read returns nothing). So there the tenant is set with SET
# LOCAL, which takes no bind parameter: the tenant is quoted as a literal by psycopg
# (`tenant_scope_sql`). The lock and the announcement stay on the coordinator, where every
# server's listener is connected.
_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")
_LOCK_AND_ANNOUNCE = text(
    "SELECT pg_advisory_xact_lock(hashtextextended(:key, 0)), memoria_announce(:origin, :key)"
)
_HAS_CITUS = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"


def scope_to_tenant(conn: Connection, tenant_id: str, *, citus: bool) -> None:
    """PostgreSQL: scope the rest of `conn`'s transaction to `tenant_id` (row-level security);
    the outbox claim reads each claimed tenant's turns in turn this way."""
    if citus:
        # On the driver's connection (the same one, in the same transaction) with no
        # parameters at all: SQLAlchemy would hand psycopg an empty parameter set, and psycopg
        # would then read a `%` in the tenant as a placeholder.
        driver: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        driver.execute(tenant_scope_sql(tenant_id).encode())
    else:
        conn.execute(_SET_TENANT, {"tenant": tenant_id})


def tenant_scope_sql(tenant_id: str) -> str:
    """`SET LOCAL app.tenant_id = '<tenant>'`, the tenant quoted as a string literal (Citus)."""
    literal = psycopg.sql.Literal(tenant_id).as_string(None)
    return f"SET LOCAL app.tenant_id = {literal}"


Listener = Callable[[str, str], None]
"""Told (tenant id, principal id) after a commit."""


class SqlTransaction:
    """One open transaction on one connection, in one tenant."""

    def __init__(
        self, conn: Connection, tenant_id: str, postgres: bool, origin: str, citus: bool = False
    ):
        self._conn = conn
        self._tenant = tenant_id
        self._postgres = postgres
        self._origin = origin
        self._citus = citus

    @property
    def connection(self) -> Connection:
        return self._conn

    @property
    def tenant_id(self) -> str:
        return self._tenant

    @property
    def postgres(self) -> bool:
        return self._postgres

    def begin(self, lock_principal: str | None, *, announce: bool = True) -> None:
        """PostgreSQL: scope to the tenant and lock the writer's principal, announcing the
        change unless told not to (SQLite's writers are serialized by BEGIN IMMEDIATE and
        the store's lock)."""
        if not self._postgres:
            return
        if self._citus:
            self._begin_citus(lock_principal, announce)
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

    def _begin_citus(self, lock_principal: str | None, announce: bool) -> None:
        """Citus: SET LOCAL the tenant (forwarded to the workers), then lock and announce on
        the coordinator."""
        self.scope(self._tenant)
        if lock_principal is None:
            return
        key = f"{self._tenant}{KEY_SEPARATOR}{lock_principal}"
        if announce:
            self._conn.execute(_LOCK_AND_ANNOUNCE, {"key": key, "origin": self._origin})
        else:
            self._conn.execute(_LOCK, {"key": key})

    def scope(self, tenant_id: str) -> None:
        """Scope the rest of the transaction to `tenant_id` (PostgreSQL)."""
        if self._postgres:
            scope_to_tenant(self._conn, tenant_id, citus=self._citus)

    def announce(self, principal_id: str) -> None:
        """PostgreSQL: tell other servers' read caches, if any listens, that the principal's
        memory changes with this transaction (delivered only if it commits)."""
        if self._postgres:
            key = f"{self._tenant}{KEY_SEPARATOR}{principal_id}"
            self._conn.execute(_ANNOUNCE, {"origin": self._origin, "key": key})


_ANNOUNCE = text("SELECT memoria_announce(:origin, :key)")


class SqlDatabase:
    """A SQLAlchemy engine (SQLite or PostgreSQL) and what every SQL adapter shares on it."""

    def __init__(
        self, engine: Engine, origin: str | None = None, *, space: FreeSpace | None = None
    ):
        """`space`: the embedded data dir's free-space watermark (server/adapters/disk.py);
        while it is short, writes that add data are refused with STORAGE_FULL."""
        self._engine = engine
        self.space = space
        self._postgres = engine.dialect.name == "postgresql"
        # Behind a transaction pooler `call` cannot keep prepared statements on a connection.
        self._pooler = behind_pooler(engine)
        # Names this store's writes in their change notifications (storage/cache.py): 16 hex
        # digits of a 62-bit number, the form migration 0007 recognises as a server's.
        self.origin = origin if origin is not None else f"{secrets.randbits(62):016x}"
        # SQLite: one process owns the embedded database, so writers queue on this lock
        # instead of SQLite's busy handler, which sleeps and made write p99 spike.
        self._sqlite_writer = None if self._postgres else threading.Lock()
        # SQLite: one indexing processor at a time, and erasure waits for it (turns.py).
        self.processing: threading.Lock | None = None if self._postgres else threading.Lock()
        self._autocommit = create_postgres_autocommit_engine(engine) if self._postgres else None
        self._span: Callable[[str], AbstractContextManager[object]] = _untraced

        self._memory_listeners: list[Listener] = []
        self._deletion_listeners: list[Listener] = []
        self._citus: bool | None = None if self._postgres else False

    @property
    def postgres(self) -> bool:
        return self._postgres

    @property
    def citus(self) -> bool:
        """Whether the database is a Citus coordinator (the citus extension is installed in it):
        asked once, on first use, so a store built while the database is down still starts."""
        if self._citus is None:
            # On the autocommit pool: a transaction asks while it holds one of the other's.
            assert self._autocommit is not None
            with store_errors(), self._autocommit.connect() as conn:
                self._citus = bool(conn.exec_driver_sql(_HAS_CITUS).scalar_one())
        return self._citus

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

    def on_memory_change(self, listener: Listener) -> None:
        """Call `listener(tenant, principal)` after each unit of work that changed the
        principal's block or settings commits (the read cache forgets it)."""
        self._memory_listeners.append(listener)

    def on_deletion_change(self, listener: Listener) -> None:
        """Call `listener(tenant, principal)` after each commit that changed the principal's
        deleted conversations (tombstones added, purged or erased)."""
        self._deletion_listeners.append(listener)

    def memory_changed(self, tenant_id: str, principal_id: str) -> None:
        for listener in self._memory_listeners:
            listener(tenant_id, principal_id)

    def deletions_changed(self, tenant_id: str, principal_id: str) -> None:
        for listener in self._deletion_listeners:
            listener(tenant_id, principal_id)

    def call(
        self, sql: str, params: Sequence[Any], *, tenant: str | None = None
    ) -> tuple[Any, ...]:
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

        Behind a transaction pooler the next statement may run on another server connection,
        where the prepared one does not exist: there it runs as libpq's unnamed statement
        (PQexecParams, parsed each time, still one blocking round trip).

        On Citus a function that scopes itself with set_config would scope only the coordinator
        (the shards' policies would see no tenant), so there the statement runs in a transaction
        that `tenant` (the functions' own first argument) is SET LOCAL in first: three round
        trips instead of one, each unnamed (a failed statement leaves nothing prepared behind).

        Telemetry sees each statement through `trace_calls`.
        """
        assert self._autocommit is not None
        citus = tenant is not None and self.citus
        with store_errors(), self._span(sql):
            pooled = self._autocommit.raw_connection()
            try:
                conn: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
                if citus:
                    assert tenant is not None
                    row = _execute_in_tenant(conn, tenant, sql, params)
                elif self._pooler:
                    row = _execute_unnamed(conn, sql, params)
                else:
                    row = _execute_prepared(conn, pooled.info, sql, params)
            except psycopg.OperationalError as error:
                pooled.invalidate(error)  # never hand this connection out again
                if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                    # The server went away (restarted, or lost and its standby promoted): the
                    # pool's other connections are as dead as this one, and without this each
                    # would fail one more call once the database serves again. SQLAlchemy does
                    # the same for its own pool when it sees a disconnect.
                    self._autocommit.dispose()
                raise
            finally:
                pooled.close()
        return row

    @contextmanager
    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None, announce: bool = False
    ) -> Iterator[SqlTransaction]:
        """A transaction in one tenant, through SQLAlchemy; commits when the block exits
        cleanly. With `lock_principal`, writers of that principal are serialized first (even
        when it has no row yet) and, if `announce`, other replicas are told the principal's
        memory changed. Store outages become STORE_UNAVAILABLE."""
        writer = self._sqlite_writer if lock_principal is not None else None
        with store_errors(), writer or nullcontext(), self._engine.connect() as conn:
            if lock_principal is not None:
                conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                tx = SqlTransaction(conn, tenant_id, self._postgres, self.origin, self.citus)
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
    return _one_row(tx, result)


def _execute_unnamed(
    conn: psycopg.Connection[Any], sql: str, params: Sequence[Any]
) -> tuple[Any, ...]:
    """Run `sql` as libpq's unnamed statement (parse, bind and execute in one round trip,
    nothing left on the server connection): for a transaction pooler; the first row."""
    _, text_ = _prepared_statement(sql)
    tx = psycopg.adapt.Transformer(conn)
    values = tx.dump_sequence(params, [PyFormat.TEXT] * len(params))
    result = conn.pgconn.exec_params(text_, values, None, None, psycopg.pq.Format.TEXT)
    if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
        raise _error(conn, result)
    return _one_row(tx, result)


def _execute_in_tenant(
    conn: psycopg.Connection[Any], tenant: str, sql: str, params: Sequence[Any]
) -> tuple[Any, ...]:
    """Citus: `sql` (unnamed) in a transaction scoped to `tenant` by SET LOCAL; the first row."""
    pgconn = conn.pgconn
    begin = f"BEGIN; {tenant_scope_sql(tenant)}".encode()
    result = pgconn.exec_(begin)
    if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
        raise _error(conn, result)
    try:
        row = _execute_unnamed(conn, sql, params)
    except psycopg.Error:
        if pgconn.status == psycopg.pq.ConnStatus.OK:
            pgconn.exec_(b"ROLLBACK")
        raise
    result = pgconn.exec_(b"COMMIT")
    if result.status != psycopg.pq.ExecStatus.COMMAND_OK:
        raise _error(conn, result)
    return row


def _one_row(tx: Any, result: Any) -> tuple[Any, ...]:
    """The one row of `result`, loaded by `tx` (the psycopg Transformer that dumped the
    parameters)."""
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
