"""Memoria behind a transaction-pooling PgBouncer (scripts/pgbouncer.sh): what a start refuses,
in one line, and what it allows (docs/decisions.md, "Behind a transaction pooler").

The pooled cases of the API and store suites (ON_POOLER_AND_CITUS, the "pgbouncer" store kinds)
show that a declared pooler works; these show that a pooler nobody declared, or a cache
listener pointed at it, never starts quietly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from server.adapters.sql.engine import reaches_postgres_directly
from server.runtime.settings import Settings
from tests.api.conftest import serving
from tests.conftest import PooledDatabase
from tests.processes import clean_env, failed_in_one_line

pytestmark = [pytest.mark.postgres, pytest.mark.pgbouncer]


def serve(database_url: str) -> list[str]:
    return ["serve", "--listen", "127.0.0.1:0", "--database-url", database_url]


def test_the_probe_tells_the_pooler_from_postgresql(pgbouncer: PooledDatabase) -> None:
    assert reaches_postgres_directly(pgbouncer.direct.app_url)
    assert not reaches_postgres_directly(pgbouncer.pooled_url)


def test_a_pooler_nobody_declared_is_refused_in_one_line(
    pgbouncer: PooledDatabase, tmp_path: Path
) -> None:
    # Without the setting the hot paths' named prepared statements would fail once PgBouncer
    # lends another server connection: refused before anything is served.
    last, stderr = failed_in_one_line(serve(pgbouncer.pooled_url), tmp_path, clean_env())
    assert last == (
        "memoria serve: the database URL leads through a connection pooler, not to PostgreSQL "
        "itself: declare it with MEMORIA_DB_POOLER=transaction (docs/operations.md); check "
        "MEMORIA_DATABASE_URL (or --database-url), MEMORIA_DB_POOLER"
    )
    assert "memoria_app@" not in stderr  # the URL's password is not echoed, nor the URL


def test_a_cache_listener_through_the_pooler_is_refused_in_one_line(
    pgbouncer: PooledDatabase, tmp_path: Path
) -> None:
    # A LISTEN on a pooled connection is deaf once its transaction ends: the cache would serve
    # blocks other replicas have changed.
    env = clean_env(
        MEMORIA_DB_POOLER="transaction", MEMORIA_DATABASE_LISTEN_URL=pgbouncer.pooled_url
    )
    last, _ = failed_in_one_line(serve(pgbouncer.pooled_url), tmp_path, env)
    assert last == (
        "memoria serve: the listen URL leads through a connection pooler: the read cache's "
        "LISTEN needs a connection to PostgreSQL itself; check MEMORIA_DATABASE_LISTEN_URL"
    )


def test_a_pooler_without_a_listen_url_is_refused_in_one_line(
    pgbouncer: PooledDatabase, tmp_path: Path
) -> None:
    env = clean_env(MEMORIA_DB_POOLER="transaction")
    last, _ = failed_in_one_line(serve(pgbouncer.pooled_url), tmp_path, env)
    assert last.startswith("memoria serve: ")
    assert "MEMORIA_DATABASE_LISTEN_URL" in last and "MEMORIA_READ_CACHE_ENTRIES" in last


def test_a_pooler_declared_on_a_direct_url_is_harmless(
    pgbouncer: PooledDatabase, tmp_path: Path
) -> None:
    # Only the prepared statements are given up: the server starts and serves.
    direct = pgbouncer.direct.app_url
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=direct,
        db_pooler="transaction",
        database_listen_url=direct,
        page_token_secret="test-page-token-secret-0123456789",
        shutdown_grace_seconds=1,
    )
    with serving(settings) as api:
        who = api.who("ana")
        write = pb.RewriteMemoryBlockRequest(text="Likes tea", writer=block_pb.WRITER_USER)
        api.blocks.RewriteMemoryBlock(write, metadata=who)
        rendered = api.blocks.RenderMemoryBlock(pb.RenderMemoryBlockRequest(), metadata=who)
        assert rendered.prompt_section.endswith("Likes tea")
