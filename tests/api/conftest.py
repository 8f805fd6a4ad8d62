"""A real Memoria server on 127.0.0.1:0 (SQLite and PostgreSQL), called through the stubs."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import (
    audit_service_pb2_grpc,
    conversation_search_service_pb2_grpc,
    memory_block_service_pb2_grpc,
)
from server.adapters.embedding.minilm import OnnxMiniLmEmbedder
from server.domain.ports import ChunkIndex, Embedder
from server.runtime.app import Running, start
from server.runtime.settings import Settings
from server.telemetry import Telemetry
from tests.conftest import CITUS, PGBOUNCER, SQL_KINDS, PgDatabase, PooledDatabase

Metadata = tuple[tuple[str, str], ...]
"""Call metadata as grpc's stubs type it (a tuple of pairs; grpc itself takes any sequence)."""


@dataclass
class Api:
    """Stubs bound to one running server, plus helpers to call as a given identity."""

    running: Running
    channel: grpc.Channel
    blocks: memory_block_service_pb2_grpc.MemoryBlockServiceStub
    audit: audit_service_pb2_grpc.AuditServiceStub
    tenant: str
    search: conversation_search_service_pb2_grpc.ConversationSearchServiceStub

    def who(self, principal: str, tenant: str | None = None, roles: str = "") -> Metadata:
        """Trusted-headers metadata for a principal (of this test's tenant by default)."""
        md: Metadata = (
            ("x-memoria-tenant", tenant or self.tenant),
            ("x-memoria-principal", principal),
        )
        return (*md, ("x-memoria-roles", roles)) if roles else md


_EMBEDDER: list[Embedder] = []


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """One embedding model for the whole session (loading it per server would dominate)."""
    return shared_embedder()


def shared_embedder() -> Embedder:
    """The model a new store gets (DEFAULT_LOCAL_MODEL, MiniLM in 8 bits), so a store made by
    a `memoria serve` subprocess opens with it."""
    if not _EMBEDDER:
        _EMBEDDER.append(OnnxMiniLmEmbedder(intra_op_threads=1, quantized=True))
    return _EMBEDDER[0]


def start_server(
    settings: Settings, *, index: ChunkIndex | None = None, telemetry: Telemetry | None = None
) -> tuple[Running, grpc.Channel]:
    running = start(settings, embedder=shared_embedder(), index=index, telemetry=telemetry)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    grpc.channel_ready_future(channel).result(timeout=10)
    return running, channel


def server_settings(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, **extra: object
) -> Settings:
    database_url = None
    if kind == "postgres":
        db: PgDatabase = request.getfixturevalue("postgres")
        database_url = db.app_url
    if kind == "citus":
        # A Citus coordinator with two workers, every table distributed by tenant.
        on_citus: PgDatabase = request.getfixturevalue("citus")
        database_url = on_citus.app_url
    if kind == "pgbouncer":
        # Through the transaction pooler, as declared; the read cache's LISTEN goes direct.
        pooled: PooledDatabase = request.getfixturevalue("pgbouncer")
        database_url = pooled.pooled_url
        extra = {"db_pooler": "transaction", "database_listen_url": pooled.direct.app_url} | extra
    return Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=database_url,
        page_token_secret="test-page-token-secret-0123456789",
        shutdown_grace_seconds=1,
        **extra,
    )


ON_POOLER_AND_CITUS = pytest.mark.parametrize("api", [*SQL_KINDS, PGBOUNCER, CITUS], indirect=True)
"""Marks an API case that also runs behind the transaction-pooling PgBouncer (`api` of the
"pgbouncer" kind) and on a Citus coordinator with two workers ("citus"). Chosen cases only:
each one exercises a path the pooler or the sharding could break (the hot paths' SQL
functions, the write transactions, the audit pages, indexing and search, deletion and
erasure) without running the whole API suite twice more."""


@pytest.fixture(params=SQL_KINDS)
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    """A server in trusted-headers mode on loopback, on SQLite or PostgreSQL (or behind
    PgBouncer, or on Citus: ON_POOLER_AND_CITUS)."""
    with serving(server_settings(request.param, request, tmp_path)) as api:
        yield api


@contextmanager
def serving(settings: Settings) -> Iterator[Api]:
    """A server started with `settings`, and stubs bound to it; stopped on exit."""
    running, channel = start_server(settings)
    try:
        yield Api(
            running,
            channel,
            memory_block_service_pb2_grpc.MemoryBlockServiceStub(channel),
            audit_service_pb2_grpc.AuditServiceStub(channel),
            tenant=f"t-{uuid.uuid4().hex[:10]}",
            search=conversation_search_service_pb2_grpc.ConversationSearchServiceStub(channel),
        )
    finally:
        channel.close()
        running.stop(0)


def expect_error(call: Callable[[], object], code: grpc.StatusCode, reason: str) -> grpc.RpcError:
    """Run `call`, which must fail with `code` and an ErrorInfo of `reason` in memoria.v1."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = caught.value
    assert isinstance(error, grpc.Call)
    assert error.code() == code, error.details()
    info = error_info(error)
    assert info.reason == reason
    assert info.domain == "memoria.v1"
    return error


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call (fails the test if there is none)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "error carries no google.rpc.Status details"
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo in the status details")


def field_violations(error: grpc.RpcError) -> dict[str, str]:
    """BadRequest field violations of a failed call, field -> description."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            return {v.field: v.description for v in bad.field_violations}
    return {}
