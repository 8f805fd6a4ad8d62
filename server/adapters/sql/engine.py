"""SQLAlchemy engines for the two relational back ends: SQLite (embedded default) and PostgreSQL.

The dialect-specific behaviour is all here: how a transaction begins, how a writer of one
principal excludes the others, how a transaction is scoped to one tenant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url

WRITE_OPTION = "memoria_write"
"""Connection execution option that marks a transaction which will write."""

CHANGE_CHANNEL = "memoria_memory_changed"
"""PostgreSQL NOTIFY channel announcing committed writes to the other servers' read caches;
the payload is origin (the writing server), tenant and principal joined by KEY_SEPARATOR.
(Migration 0007's memoria_announce() names the channel too: migrations are frozen, not
imported.)"""
KEY_SEPARATOR = "\x1f"

STATEMENT_TIMEOUT_MS = 15_000
"""PostgreSQL: no statement (or lock wait) runs longer than this; the call then fails fast."""


def sqlite_url(data_dir: Path) -> str:
    """The embedded default's database file under the data directory."""
    return f"sqlite:///{data_dir / 'memoria.sqlite3'}"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_store_engine(url: str, *, pool_size: int = 8) -> Engine:
    """An engine for `url` tuned for the service: SQLite in WAL mode or PostgreSQL via psycopg 3."""
    if is_sqlite(url):
        return _sqlite_engine(url, pool_size)
    if make_url(url).get_backend_name() != "postgresql":
        raise ValueError("database URL must be sqlite:/// or postgresql+psycopg://")
    return _postgres_engine(url, pool_size)


def _sqlite_engine(url: str, pool_size: int) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        connect_args={"check_same_thread": False, "timeout": 30},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event below emit BEGIN itself (pysqlite's own is deferred).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A writer takes SQLite's write lock up front, so two writers of one principal cannot
        # both read the old state and then both write (the lock serializes them).
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _postgres_engine(url: str, pool_size: int, **options: Any) -> Engine:
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        pool_recycle=1800,
        connect_args={"connect_timeout": 5, "application_name": "memoria"},
        **options,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        dbapi_connection.commit()

    return engine


def create_postgres_autocommit_engine(write_engine: Engine) -> Engine:
    """A second pool, of autocommit connections, for the one-statement reads and writes of
    the hot paths (SQL functions that run in the statement's own transaction).

    Autocommit, so a call is one round trip with no BEGIN/COMMIT; no reset on return, since an
    autocommit connection carries no transaction (and the tenant setting is local to the
    statement's own transaction).
    """
    return _postgres_engine(
        write_engine.url.render_as_string(hide_password=False),
        write_engine.pool.size(),  # type: ignore[attr-defined]
        isolation_level="AUTOCOMMIT",
        pool_reset_on_return=None,
    )
