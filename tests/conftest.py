"""Shared fixtures: stores over every adapter, a real PostgreSQL, a running server.

PostgreSQL: the tests use MEMORIA_TEST_PG_OWNER_URL / MEMORIA_TEST_PG_APP_URL when set, else
start the throwaway server of scripts/pg.sh. Each session gets a fresh database migrated by
the owner role; the tests connect as the non-superuser service role, so row-level security is
in force. With MEMORIA_REQUIRE_POSTGRES=1 (the README's test command and CI) PostgreSQL tests
never skip: they fail if PostgreSQL cannot be had, and the run fails if none of them ran.

Qdrant: one real server per session (tests/qdrant_server.py: MEMORIA_TEST_QDRANT_URL, else the
binary of MEMORIA_TEST_QDRANT_BIN or ../shared/qdrant/qdrant started on loopback); each test
takes a collection of its own (`qdrant_collection`). MEMORIA_REQUIRE_QDRANT=1 does for it what
MEMORIA_REQUIRE_POSTGRES=1 does for PostgreSQL.

PgBouncer: the "pgbouncer" kinds run the same tests through a transaction-pooling PgBouncer in
front of the session's database (tests/postgres_server.py: MEMORIA_TEST_PGBOUNCER_URL, else
scripts/pgbouncer.sh); MEMORIA_REQUIRE_PGBOUNCER=1 makes a missing one a failure.

Citus: the "citus" kinds run the same tests on a Citus coordinator with two workers
(scripts/citus.sh, started once per session; MEMORIA_TEST_CITUS_OWNER_URL / _APP_URL when set),
on a fresh database migrated as for PostgreSQL (migration 0014 distributes every table by
tenant). MEMORIA_REQUIRE_CITUS=1 makes a missing Citus a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.cache import CachedMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.domain.ports import MemoryStore
from tests.embedding_endpoint import EmbeddingEndpoint, embedding_endpoint
from tests.fakes import InMemoryMemoryStore
from tests.postgres_server import (
    OwnPostgres,
    citus_database,
    citus_urls,
    free_port,
    pg_urls,
    pgbouncer_url,
)
from tests.qdrant_server import QdrantEndpoint, suite_qdrant
from tests.replication import ReplicatedPostgres, free_low_port

ROOT = Path(__file__).resolve().parent.parent
REQUIRE_POSTGRES = os.environ.get("MEMORIA_REQUIRE_POSTGRES") == "1"
REQUIRE_QDRANT = os.environ.get("MEMORIA_REQUIRE_QDRANT") == "1"
REQUIRE_PGBOUNCER = os.environ.get("MEMORIA_REQUIRE_PGBOUNCER") == "1"
REQUIRE_CITUS = os.environ.get("MEMORIA_REQUIRE_CITUS") == "1"
APP_ROLE = "memoria_app"


@dataclass(frozen=True)
class PgDatabase:
    """A migrated test database: the owner's URL and the service role's URL."""

    owner_url: str
    app_url: str


def _pg_admin() -> tuple[Engine, str, str]:
    """The admin engine and the two URLs of the test PostgreSQL, or fail/skip the test."""
    try:
        owner_url, app_url = pg_urls()
        admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as error:
        message = f"PostgreSQL is not available: {error}"
        if REQUIRE_POSTGRES:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return admin, owner_url, app_url


@contextmanager
def _fresh_database() -> Iterator[PgDatabase]:
    """A new database, migrated by the owner with grants for the service; dropped after."""
    admin, owner_url, app_url = _pg_admin()
    name = f"memoria_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(text(f'GRANT CONNECT ON DATABASE "{name}" TO {APP_ROLE}'))
    owner_db = make_url(owner_url).set(database=name).render_as_string(hide_password=False)
    app_db = make_url(app_url).set(database=name).render_as_string(hide_password=False)
    owner_engine = create_store_engine(owner_db, pool_size=1)
    migrate.upgrade(owner_engine, app_role=APP_ROLE)
    owner_engine.dispose()
    try:
        yield PgDatabase(owner_db, app_db)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgDatabase]:
    """A fresh PostgreSQL database for this session, migrated, with grants for the service."""
    with _fresh_database() as database:
        yield database


@pytest.fixture(scope="session")
def citus() -> Iterator[PgDatabase]:
    """A fresh database on the test Citus cluster (a coordinator and two workers), migrated
    by the owner with grants for the service: every table distributed by tenant (0014)."""
    name = f"memoria_test_{uuid.uuid4().hex[:12]}"
    try:
        owner_url, app_url = citus_urls()
        citus_database(name)
    except Exception as error:
        message = f"Citus is not available: {error}"
        if REQUIRE_CITUS:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    owner_db = make_url(owner_url).set(database=name).render_as_string(hide_password=False)
    app_db = make_url(app_url).set(database=name).render_as_string(hide_password=False)
    try:
        owner_engine = create_store_engine(owner_db, pool_size=1)
        migrate.upgrade(owner_engine, app_role=APP_ROLE)
        owner_engine.dispose()
        yield PgDatabase(owner_db, app_db)
    finally:
        citus_database(name, drop=True)


@dataclass(frozen=True)
class PooledDatabase:
    """The session's database, reached by the service role through the test PgBouncer
    (`pooled_url`, transaction pooling) and directly (`direct`)."""

    pooled_url: str
    direct: PgDatabase


@pytest.fixture(scope="session")
def pgbouncer(postgres: PgDatabase) -> PooledDatabase:
    """The session's database through a transaction-pooling PgBouncer (fails or skips the test
    when there is none)."""
    try:
        url = pgbouncer_url()
    except Exception as error:
        message = f"PgBouncer is not available: {error}"
        if REQUIRE_PGBOUNCER:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    name = make_url(postgres.app_url).database
    pooled = make_url(url).set(database=name).render_as_string(hide_password=False)
    return PooledDatabase(pooled, postgres)


@pytest.fixture
def private_postgres() -> Iterator[PgDatabase]:
    """A database of this test's own, for tests that must know every server connected to it
    (the session's database may have other tests' servers on it)."""
    with _fresh_database() as database:
        yield database


@pytest.fixture
def own_postgres() -> Iterator[OwnPostgres]:
    """A PostgreSQL cluster of this test's own, for tests that stop and start the database
    (the shared one serves other tests meanwhile): the roles and a migrated `memoria`
    database; stopped and removed at the end. Its directory is under /tmp, open to the server
    user (pytest's tmp_path is not reachable by `postgres` when the tests run as root)."""
    directory = Path(tempfile.mkdtemp(prefix="memoria-pg-outage-"))
    directory.chmod(0o755)
    cluster = OwnPostgres(directory, free_port())
    try:
        try:
            cluster.start()
        except Exception as error:
            message = f"cannot start a PostgreSQL of this test's own: {error}"
            if REQUIRE_POSTGRES:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        owner = create_store_engine(cluster.owner_url, pool_size=1)
        try:
            migrate.upgrade(owner, app_role=APP_ROLE)
        finally:
            owner.dispose()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def replicated_postgres() -> Iterator[ReplicatedPostgres]:
    """The primary and its synchronous standby, migrated; stopped and removed at the end. Under
    /tmp, open to the server user (pytest's tmp_path is not reachable by `postgres` as root)."""
    directory = Path(tempfile.mkdtemp(prefix="memoria-failover-"))
    directory.chmod(0o755)
    cluster = ReplicatedPostgres(directory, free_low_port(), free_low_port())
    try:
        try:
            cluster.start_primary()
            owner = create_store_engine(cluster.owner_url, pool_size=1)
            try:
                migrate.upgrade(owner, app_role=APP_ROLE)
            finally:
                owner.dispose()
            cluster.start_standby()
        except Exception as error:
            message = f"cannot start a primary and a synchronous standby: {error}"
            if REQUIRE_POSTGRES:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def qdrant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QdrantEndpoint]:
    """The session's real Qdrant server (fails or skips the test when there is none)."""
    with contextlib.ExitStack() as stack:
        try:
            endpoint = stack.enter_context(suite_qdrant(tmp_path_factory.mktemp("qdrant")))
        except RuntimeError as error:
            message = f"no Qdrant server for the tests: {error}"
            if REQUIRE_QDRANT:
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        yield endpoint


@pytest.fixture
def qdrant_collection(qdrant: QdrantEndpoint) -> Iterator[str]:
    """A collection name no other test uses on the session's server; dropped at the end."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    client = qdrant.client()
    try:
        client.delete_collection(name)
    finally:
        client.close()


@pytest.fixture
def tenant() -> str:
    """A tenant id no other test uses, so tests share one database without interfering."""
    return f"t-{uuid.uuid4().hex[:10]}"


def _sqlite_store(tmp_path: Path) -> SqlMemoryStore:
    engine = create_store_engine(sqlite_url(tmp_path), pool_size=8)
    migrate.upgrade(engine)
    return SqlMemoryStore(SqlDatabase(engine))


STORE_KINDS = [
    "memory",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    # PostgreSQL writing through SQLAlchemy as SQLite does, instead of memoria_write().
    pytest.param("postgres-plain", marks=pytest.mark.postgres),
    # The read cache is a decorator of any store: it keeps the same contract.
    "sqlite-cached",
    pytest.param("postgres-cached", marks=pytest.mark.postgres),
    # The same PostgreSQL through a transaction-pooling PgBouncer, on both write paths.
    pytest.param("pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
    pytest.param("pgbouncer-plain", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
    # A Citus coordinator with two workers, every table distributed by tenant; both write paths,
    # and the read cache.
    pytest.param("citus", marks=[pytest.mark.postgres, pytest.mark.citus]),
    pytest.param("citus-plain", marks=[pytest.mark.postgres, pytest.mark.citus]),
    pytest.param("citus-cached", marks=[pytest.mark.postgres, pytest.mark.citus]),
]
SQL_KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
PGBOUNCER = pytest.param("pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer])
CITUS = pytest.param("citus", marks=[pytest.mark.postgres, pytest.mark.citus])
"""The store kind on the test Citus cluster, for contract files with kinds of their own."""
"""The server kind of `api` behind a transaction-pooling PgBouncer, for the API cases that run
there too (`@pytest.mark.parametrize("api", [*SQL_KINDS, PGBOUNCER], indirect=True)`)."""


def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> MemoryStore:
    if kind.endswith("-cached"):
        inner = make_store(kind.removesuffix("-cached"), request, tmp_path)
        assert isinstance(inner, SqlMemoryStore)
        cache = CachedMemoryStore(inner, max_entries=1000, ttl_seconds=60.0)
        inner.db.on_memory_change(cache.invalidate)  # as the server wires it
        return cache
    if kind == "memory":
        return InMemoryMemoryStore()
    if kind == "sqlite":
        store = _sqlite_store(tmp_path)
    elif kind.startswith("citus"):
        on_citus: PgDatabase = request.getfixturevalue("citus")
        engine = create_store_engine(on_citus.app_url, pool_size=16)
        store = SqlMemoryStore(SqlDatabase(engine), fast_writes=kind != "citus-plain")
    elif kind.startswith("pgbouncer"):
        pooled: PooledDatabase = request.getfixturevalue("pgbouncer")
        engine = create_store_engine(pooled.pooled_url, pool_size=16, pooler=True)
        store = SqlMemoryStore(SqlDatabase(engine), fast_writes=kind != "pgbouncer-plain")
    else:
        db: PgDatabase = request.getfixturevalue("postgres")
        engine = create_store_engine(db.app_url, pool_size=16)
        store = SqlMemoryStore(SqlDatabase(engine), fast_writes=kind != "postgres-plain")
    request.addfinalizer(store.db.dispose)
    return store


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryStore:
    """The same contract runs over the in-memory fake and every real adapter."""
    return make_store(request.param, request, tmp_path)


@pytest.fixture(params=SQL_KINDS)
def sql_store(request: pytest.FixtureRequest, tmp_path: Path) -> SqlMemoryStore:
    store = make_store(request.param, request, tmp_path)
    assert isinstance(store, SqlMemoryStore)
    return store


_postgres_passed = 0
_qdrant_passed = 0
_pgbouncer_passed = 0
_citus_passed = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    global _postgres_passed, _qdrant_passed, _pgbouncer_passed, _citus_passed
    if report.when == "call" and report.passed and "postgres" in report.keywords:
        _postgres_passed += 1
    if report.when == "call" and report.passed and "qdrant" in report.keywords:
        _qdrant_passed += 1
    if report.when == "call" and report.passed and "pgbouncer" in report.keywords:
        _pgbouncer_passed += 1
    if report.when == "call" and report.passed and "citus" in report.keywords:
        _citus_passed += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With MEMORIA_REQUIRE_POSTGRES=1 (MEMORIA_REQUIRE_QDRANT=1, MEMORIA_REQUIRE_PGBOUNCER=1,
    MEMORIA_REQUIRE_CITUS=1), a run in which no PostgreSQL (Qdrant server, PgBouncer, Citus)
    test passed fails."""
    if exitstatus != 0 or not session.testscollected:
        return
    if REQUIRE_POSTGRES and _postgres_passed == 0:
        print("\nFAILED: MEMORIA_REQUIRE_POSTGRES=1 but no PostgreSQL test passed")
        session.exitstatus = 1
    if REQUIRE_QDRANT and _qdrant_passed == 0:
        print("\nFAILED: MEMORIA_REQUIRE_QDRANT=1 but no Qdrant server test passed")
        session.exitstatus = 1
    if REQUIRE_PGBOUNCER and _pgbouncer_passed == 0:
        print("\nFAILED: MEMORIA_REQUIRE_PGBOUNCER=1 but no PgBouncer test passed")
        session.exitstatus = 1
    if REQUIRE_CITUS and _citus_passed == 0:
        print("\nFAILED: MEMORIA_REQUIRE_CITUS=1 but no Citus test passed")
        session.exitstatus = 1


@pytest.fixture(scope="module")
def endpoint() -> Iterator[EmbeddingEndpoint]:
    """A real OpenAI-compatible embeddings server answering the local model's vectors
    (tests/embedding_endpoint.py), one per test module, reset before each test."""
    from tests.api.conftest import shared_embedder

    with embedding_endpoint(shared_embedder()) as running:
        yield running


@pytest.fixture
def _fresh_endpoint(endpoint: EmbeddingEndpoint) -> None:
    endpoint.faults.clear()
    endpoint.failing = None
    endpoint.requests.clear()
