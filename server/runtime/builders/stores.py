"""The stores every serving or indexing process runs on: the relational database (SQLite in
the data directory, or PostgreSQL), its read cache, the free-space watermark, and the search
parts (server/runtime/builders/search.py)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from server.adapters.disk import FreeSpace, startup_refusal
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.cache import CachedMemoryStore, PostgresChangeListener
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.domain.ports import ChunkIndex, Embedder, MemoryStore
from server.runtime.builders.search import SearchParts, build_search_parts
from server.runtime.settings import Settings, StartupRefusal
from server.telemetry import Telemetry, setup_telemetry


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
    """The relational store: SQLite under the data dir (migrated now) or PostgreSQL."""
    store = settings.store
    if store.database_url is None:
        store.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_store_engine(sqlite_url(store.data_dir), pool_size=store.db_pool_size)
        migrate.upgrade(engine)
        return engine
    engine = create_store_engine(
        store.database_url.get_secret_value(), pool_size=store.db_pool_size
    )
    if not migrate.is_current(engine):
        raise StartupRefusal(
            "the PostgreSQL schema is not at the newest revision: run "
            "`memoria migrate --database-url <owner url> --app-role <service role>` first",
            "database_url",
        )
    return engine


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
    url = make_url(config.database_url.get_secret_value()).set(drivername="postgresql")
    listener = PostgresChangeListener(
        url.render_as_string(hide_password=False), cache, own_origin=store.db.origin
    )
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
