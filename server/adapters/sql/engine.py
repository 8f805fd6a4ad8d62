"""SQLAlchemy engines for the two relational back ends: SQLite (embedded default) and PostgreSQL.

The dialect-specific behaviour is all here: how a transaction begins, how a writer of one
principal excludes the others, how a transaction is scoped to one tenant, and what changes
behind a transaction-pooling PgBouncer (`pooler=True`; docs/decisions.md, "Behind a
transaction pooler").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
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
"""PostgreSQL: no statement (or lock wait) runs longer than this; the call then fails fast.
Behind a transaction pooler a session setting cannot be kept, so there it is the service
role's own (`ALTER ROLE ... SET statement_timeout`, docs/operations.md)."""

POOLER_OPTION = "memoria_pooler"
"""Engine execution option: the engine's connections go through a transaction pooler, so
nothing may outlive a transaction on them (no named prepared statements, no session settings).
Set by `create_store_engine(..., pooler=True)`; read with `behind_pooler(engine)`."""

_PROBE = "memoria.pooler_probe"
"""A custom setting that `reaches_postgres_directly` sends as a startup option."""


def sqlite_url(data_dir: Path) -> str:
    """The embedded default's database file under the data directory."""
    return f"sqlite:///{data_dir / 'memoria.sqlite3'}"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_store_engine(url: str, *, pool_size: int = 8, pooler: bool = False) -> Engine:
    """An engine for `url` tuned for the service: SQLite in WAL mode or PostgreSQL via psycopg 3.
    `pooler`: PostgreSQL reached through a transaction-pooling PgBouncer (see POOLER_OPTION)."""
    if is_sqlite(url):
        return _sqlite_engine(url, pool_size)
    if make_url(url).get_backend_name() != "postgresql":
        raise ValueError("database URL must be sqlite:/// or postgresql+psycopg://")
    return _postgres_engine(url, pool_size, pooler=pooler)


def behind_pooler(engine: Engine) -> bool:
    """Whether `engine` was made for a transaction pooler (`create_store_engine(pooler=True)`)."""
    return bool(engine.get_execution_options().get(POOLER_OPTION, False))


def libpq_conninfo(url: str) -> str:
    """A SQLAlchemy `postgresql+psycopg://` URL as libpq (psycopg.connect) takes it, with the
    same meaning the engine gives it.

    Built from what the psycopg dialect would pass to `psycopg.connect`, not by renaming the
    URL's scheme: SQLAlchemy's multi-host form (`?host=a:5432&host=b:5433`, docs/operations.md,
    "Failover") is SQLAlchemy's own, and libpq would read `a:5432` as a host name and keep
    only the last `host`. So the read cache's listener and the pooler check reach the same
    servers, in the same order and with the same `target_session_attrs`, as the pools.
    """
    parsed = make_url(url)
    dialect = parsed.get_dialect()()
    _, params = dialect.create_connect_args(parsed)
    params.pop("context", None)  # the dialect's adapters, not a connection parameter
    return make_conninfo(**{name: str(value) for name, value in params.items()})


def reaches_postgres_directly(url: str) -> bool:
    """Whether a connection to `url` reaches PostgreSQL itself rather than a pooler.

    PostgreSQL applies the `options` startup parameter (`-c name=value`) to the session it
    starts. PgBouncer cannot hand a client's startup options to server connections that other
    clients share: before 1.20 it refuses the parameter ("unsupported startup parameter:
    options"), from 1.20 it refuses options it does not track ("unsupported options startup
    parameter"), and with `ignore_startup_parameters = options` it drops them. So a custom
    setting sent that way and read back tells the two apart; a plain TCP proxy or a port
    mapping passes it through. Any other failure (refused, wrong password) is raised.
    """
    conninfo = libpq_conninfo(url)
    options = f"{conninfo_to_dict(conninfo).get('options') or ''} -c {_PROBE}=on".strip()
    try:
        with psycopg.connect(conninfo, options=options, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting(%s, true)", (_PROBE,)).fetchone()
    except psycopg.OperationalError as error:
        if "unsupported" in str(error) and "startup parameter" in str(error):
            return False
        raise
    return row is not None and row[0] == "on"


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


def _postgres_engine(url: str, pool_size: int, *, pooler: bool, **options: Any) -> Engine:
    connect_args: dict[str, Any] = {"connect_timeout": 5, "application_name": "memoria"}
    if pooler:
        # psycopg prepares a statement it ran 5 times on a connection under a name; behind a
        # transaction pooler the next transaction may run on another server connection, where
        # that name does not exist. None: never prepare (each statement is parsed afresh).
        connect_args["prepare_threshold"] = None
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        pool_recycle=1800,
        connect_args=connect_args,
        execution_options={POOLER_OPTION: pooler},
        **options,
    )
    if pooler:
        # A SET here would land on whichever server connection the pooler lent for it, and stay
        # there for other clients; the statement timeout is the role's (STATEMENT_TIMEOUT_MS).
        return engine

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
        pooler=behind_pooler(write_engine),
        isolation_level="AUTOCOMMIT",
        pool_reset_on_return=None,
    )
