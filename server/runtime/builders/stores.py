"""The stores every serving or indexing process runs on: the relational database (SQLite in
the data directory, or PostgreSQL), its read cache, the free-space watermark, and the search
parts (server/runtime/builders/search.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from sqlalchemy import Engine

from server.adapters.disk import FreeSpace, startup_refusal
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.cache import CachedMemoryStore, PostgresChangeListener
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import (
    create_store_engine,
    libpq_conninfo,
    reaches_postgres_directly,
    sqlite_url,
)
from server.domain.ports import ChunkIndex, Embedder, MemoryStore
from server.runtime.builders.search import SearchParts, build_search_parts
from server.runtime.settings import Settings, StartupRefusal
from server.telemetry import Telemetry, setup_telemetry

log = logging.getLogger(__name__)


def build_free_space(settings: Settings) -> FreeSpace | None:
    """The data dir's free-space watermark, when an embedded store keeps its files there
    (None on PostgreSQL with a Qdrant server). Refuses the start when the data dir is short
    already: opening the stores writes (migrations, the engine's WAL), and a server that starts
    only to refuse every write helps nobody."""
    store = settings.store
    if not (store.embedded or settings.qdrant.embedded):
        return None
    store.data_dir.mkdir(parents=True, exist_ok=True)
    space = FreeSpace(
        store.data_dir,
        min_free_bytes=store.disk_min_free_bytes,
        min_free_percent=store.disk_min_free_percent,
    )
    if (reason := startup_refusal(space)) is not None:
        raise StartupRefusal(reason, "data_dir", "disk_min_free_bytes", "disk_min_free_percent")
    return space


def build_engine(settings: Settings) -> Engine:
    """The relational store: SQLite under the data dir (migrated now) or PostgreSQL, directly
    or through the transaction pooler the settings declare (checked: `check_pooler`)."""
    store = settings.store
    if store.database_url is None:
        store.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_store_engine(sqlite_url(store.data_dir), pool_size=store.db_pool_size)
        migrate.upgrade(engine)
        return engine
    engine = create_store_engine(
        store.database_url.get_secret_value(),
        pool_size=store.db_pool_size,
        pooler=store.db_pooler == "transaction",
    )
    if not migrate.is_current(engine):
        raise StartupRefusal(
            "the PostgreSQL schema is not at the newest revision: run "
            "`memoria migrate --database-url <owner url> --app-role <service role>` first",
            "database_url",
        )
    check_pooler(settings)
    _check_primary(engine)
    _check_citus(engine)
    if store.db_pooler != "none":
        _check_statement_timeout(engine)
    return engine


def _check_primary(engine: Engine) -> None:
    """Refuse a database URL that reaches a standby: every write would fail there (read-only
    transactions), and the read cache would hear nobody's writes. A multi-host URL with
    `target_session_attrs=read-write` reaches the primary of the moment (docs/operations.md,
    "Failover")."""
    with engine.connect() as conn:
        in_recovery = conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar_one()
    if in_recovery:
        raise StartupRefusal(
            "the database URL reaches a standby (read-only, in recovery), not the primary: name "
            "the primary, or every host with target_session_attrs=read-write "
            "(docs/operations.md, Failover)",
            "database_url",
        )


def _check_citus(engine: Engine) -> None:
    """On a Citus coordinator, refuse a start where `citus.propagate_set_commands` is not
    'local' for the service role: Citus would not forward the tenant's SET LOCAL to the
    workers, and the shards' policies would see no tenant (every read empty, every write
    refused), a silent failure of every call (docs/operations.md, "Running on Citus")."""
    with engine.connect() as conn:
        setting = conn.exec_driver_sql(
            "SELECT current_setting('citus.propagate_set_commands', true) "
            "FROM pg_extension WHERE extname = 'citus'"
        ).scalar()
    if setting is not None and setting != "local":
        raise StartupRefusal(
            f"the database is a Citus coordinator with citus.propagate_set_commands = "
            f"'{setting}': set it to 'local' for the service role (ALTER DATABASE ... SET "
            "citus.propagate_set_commands = 'local'; docs/operations.md, Running on Citus)",
            "database_url",
        )


def _check_statement_timeout(engine: Engine) -> None:
    """Behind a transaction pooler Memoria cannot set the statement timeout on its sessions
    (engine.py, STATEMENT_TIMEOUT_MS): say so when the role has none, since a stuck lock
    would then hold a call until the client gives up. A warning, not a refusal: nothing is
    wrong with the data, and some operators bound statements elsewhere."""
    with engine.connect() as conn:
        timeout = conn.exec_driver_sql("SHOW statement_timeout").scalar_one()
    if timeout == "0":
        log.warning(
            "behind the pooler no statement timeout is in force: set one for the service role "
            "(ALTER ROLE ... SET statement_timeout = '15s'; docs/operations.md)"
        )


def check_pooler(settings: Settings) -> None:
    """Refuse a start whose connections would break on the way to PostgreSQL: a database URL
    that leads through a pooler when none is declared (the named prepared statements of the
    hot paths would fail, or run on the wrong connection, once a transaction pooler lends
    another server connection), or a listen URL that does not reach PostgreSQL itself (a
    LISTEN on a pooled connection goes deaf, and the read cache would serve stale blocks).
    A pooler declared where there is none costs only the prepared statements: allowed."""
    store = settings.store
    declared = store.db_pooler != "none"
    url = store.database_listen_url if declared else store.database_url
    if url is None:
        return
    try:
        direct = reaches_postgres_directly(url.get_secret_value())
    except psycopg.OperationalError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        name = "database_listen_url" if declared else "database_url"
        raise StartupRefusal(f"cannot use the database: {first}", name) from None
    if direct:
        return
    if declared:
        raise StartupRefusal(
            "the listen URL leads through a connection pooler: the read cache's LISTEN needs a "
            "connection to PostgreSQL itself",
            "database_listen_url",
        )
    raise StartupRefusal(
        "the database URL leads through a connection pooler, not to PostgreSQL itself: "
        "declare it with MEMORIA_DB_POOLER=transaction (docs/operations.md)",
        "database_url",
        "db_pooler",
    )


def build_read_cache(
    settings: Settings, store: SqlMemoryStore
) -> tuple[MemoryStore, PostgresChangeListener | None]:
    """The store the block operations use: cached for reads unless turned off.

    Embedded: one process owns the database, so local invalidation is complete. PostgreSQL:
    the cache is on only while a listener hears the other replicas' writes.
    """
    config = settings.store
    if config.read_cache_entries == 0:
        return store, None
    cache = CachedMemoryStore(
        store,
        max_entries=config.read_cache_entries,
        ttl_seconds=config.read_cache_ttl_seconds,
        enabled=config.embedded,
    )
    # A unit of work that changes the memory (an erasure) makes it forget the principal.
    store.db.on_memory_change(cache.invalidate)
    if config.database_url is None:
        return cache, None
    listen_url = config.listen_url
    assert listen_url is not None  # PostgreSQL
    listener = PostgresChangeListener(libpq_conninfo(listen_url), cache, own_origin=store.db.origin)
    listener.start()
    return cache, listener


@dataclass
class Stores:
    """What every serving or indexing process runs on (`memoria serve` and `memoria
    worker`), built in one place by `build_stores`, closed by `close`."""

    db: SqlDatabase
    store: SqlMemoryStore
    space: FreeSpace | None
    telemetry: Telemetry
    search: SearchParts

    def close(self) -> None:
        """After everything using them stopped: flush telemetry, close the index and pools."""
        self.telemetry.shutdown()  # flushes what is buffered (the outbox gauges read SQL)
        self.search.index.close()
        self.db.dispose()


def build_stores(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    index: ChunkIndex | None = None,
    telemetry: Telemetry | None = None,
) -> Stores:
    """The database, the stores on it, the chunk index and the embedder, instrumented by
    telemetry (the OTEL_* environment's unless one is passed in). `embedder` and `index`
    replace the ones the settings describe (tests share one model across servers)."""
    telemetry = telemetry or setup_telemetry()
    space = build_free_space(settings)
    db = SqlDatabase(build_engine(settings), space=space)
    telemetry.instrument_sql(db)
    search = build_search_parts(settings, db, embedder=embedder, index=index, telemetry=telemetry)
    return Stores(db, SqlMemoryStore(db), space, telemetry, search)
