"""The read cache across replicas on PostgreSQL: one replica's committed write reaches the
other's cache through LISTEN/NOTIFY (also when the replicas write through a transaction-pooling
PgBouncer and listen on a direct connection), and a lost listener turns the cache off until it
is back.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.cache import (
    LISTENER_APPLICATION_NAME,
    CachedMemoryStore,
    PostgresChangeListener,
)
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import CHANGE_CHANNEL, create_store_engine
from server.domain.model import AuditAction, Change, NewAuditEvent, StoredBlock, Writer
from tests.conftest import PgDatabase, PooledDatabase

pytestmark = pytest.mark.postgres
NOW = datetime(2026, 1, 1, tzinfo=UTC)
WAIT = 10.0  # seconds; generous bound for a notification on a loaded machine


class Recorder(CachedMemoryStore):
    """A cache that signals each invalidation and reset it receives from the listener."""

    def __init__(self, inner: SqlMemoryStore) -> None:
        super().__init__(inner, max_entries=100, ttl_seconds=600, enabled=False)
        self.invalidated = threading.Event()
        self.reset_off = threading.Event()
        self.reset_on = threading.Event()
        self.heard: list[tuple[str, str]] = []  # what the listener invalidated, in order

    def invalidate(self, tenant_id: str, principal_id: str) -> None:
        super().invalidate(tenant_id, principal_id)
        if threading.current_thread().name == "memoria-listen":
            self.heard.append((tenant_id, principal_id))
        self.invalidated.set()

    def reset(self, *, enabled: bool) -> None:
        super().reset(enabled=enabled)
        (self.reset_on if enabled else self.reset_off).set()


@dataclass
class Replica:
    store: SqlMemoryStore
    cache: Recorder
    listener: PostgresChangeListener


def conninfo(database: PgDatabase) -> str:
    return make_url(database.app_url).set(drivername="postgresql").render_as_string(False)


def start_replica(
    database: PgDatabase, *, wait: bool = True, pooled_url: str | None = None
) -> Replica:
    """A server's store, read cache and listener; with `wait`, once its cache is on. With
    `pooled_url` the store goes through the transaction pooler there, the listener direct."""
    engine = (
        create_store_engine(pooled_url, pool_size=2, pooler=True)
        if pooled_url is not None
        else create_store_engine(database.app_url, pool_size=2)
    )
    store = SqlMemoryStore(SqlDatabase(engine))
    cache = Recorder(store)
    listener = PostgresChangeListener(
        conninfo(database), cache, own_origin=store.db.origin, check_seconds=0.2
    )
    listener.start()
    if wait:
        assert cache.reset_on.wait(WAIT), "listener did not start listening"
    return Replica(store, cache, listener)


def stop_replica(replica: Replica) -> None:
    replica.listener.stop()
    replica.store.db.dispose()


@pytest.fixture(
    params=[
        "postgres",
        pytest.param("pgbouncer", marks=pytest.mark.pgbouncer),
        pytest.param("citus", marks=pytest.mark.citus),
    ]
)
def replicas(request: pytest.FixtureRequest) -> Iterator[tuple[Replica, Replica]]:
    """Two replicas; "pgbouncer": writing through the transaction pooler, listening direct;
    "citus": on a Citus coordinator, where the writes' shards live on the workers and the
    announcement must still come from the coordinator the listeners are connected to."""
    pooled_url = None
    database: PgDatabase = request.getfixturevalue(
        "citus" if request.param == "citus" else "postgres"
    )
    if request.param == "pgbouncer":
        pooled: PooledDatabase = request.getfixturevalue("pgbouncer")
        pooled_url = pooled.pooled_url
    made = [start_replica(database, pooled_url=pooled_url) for _ in range(2)]
    yield made[0], made[1]
    for replica in made:
        stop_replica(replica)


@pytest.fixture
def watcher(private_postgres: PgDatabase) -> Iterator[psycopg.Connection[Any]]:
    """A plain LISTEN on the change channel, not a registered server: it hears exactly the
    notifications that writers send."""
    with psycopg.connect(conninfo(private_postgres), autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANGE_CHANNEL}")
        yield conn


def listeners_value(database: PgDatabase) -> int:
    """Migration 0007's record of who listens (0 nobody, n > 0 one origin, -1 several)."""
    admin = create_engine(database.owner_url)
    try:
        with admin.connect() as conn:
            return int(
                conn.execute(text("SELECT last_value FROM memoria_cache_listeners")).scalar_one()
            )
    finally:
        admin.dispose()


def write(replica: Replica, tenant: str, text: str, principal: str = "ana") -> None:
    current = replica.store.read(tenant, principal)  # the database, not the cached copy
    event = NewAuditEvent(principal, AuditAction.BLOCK_REWRITTEN, Writer.USER, NOW)
    change = Change(principal, current, event, block=StoredBlock(text, text, NOW))
    assert replica.cache.apply(tenant, change)


def test_a_replica_skips_its_own_announcements(
    replicas: tuple[Replica, Replica], tenant: str
) -> None:
    a, b = replicas
    write(a, tenant, "by a", principal="ana")
    a.cache.invalidated.clear()
    write(b, tenant, "by b", principal="bob")
    assert a.cache.invalidated.wait(WAIT), "replica a heard nothing"
    # Notifications arrive in commit order: a's own came first and was skipped.
    assert a.cache.heard == [(tenant, "bob")]
    assert a.cache.read(tenant, "ana").block.text == "by a"  # type: ignore[union-attr]


def test_a_write_on_one_replica_reaches_the_others_cache(
    replicas: tuple[Replica, Replica], tenant: str
) -> None:
    a, b = replicas
    write(a, tenant, "v1")
    assert b.cache.read(tenant, "ana").block.text == "v1"  # type: ignore[union-attr]
    b.cache.invalidated.clear()
    write(a, tenant, "v2")
    assert b.cache.invalidated.wait(WAIT), "replica b heard nothing"
    assert b.cache.read(tenant, "ana").block.text == "v2"  # type: ignore[union-attr]


def test_a_rolled_back_write_announces_nothing(
    replicas: tuple[Replica, Replica], tenant: str
) -> None:
    a, b = replicas
    write(a, tenant, "kept")
    b.cache.invalidated.clear()
    # A unit of work that fails after writing: its NOTIFY must never be delivered.
    with pytest.raises(RuntimeError), a.store.transaction(tenant, lock_principal="ana") as tx:
        tx.put_block("ana", StoredBlock("rolled back", "x", NOW))
        raise RuntimeError
    write(a, tenant + "-marker", "after")  # a committed write after the rolled back one
    assert b.cache.invalidated.wait(WAIT)
    assert b.cache.read(tenant, "ana").block.text == "kept"  # type: ignore[union-attr]


def test_losing_the_listener_turns_the_cache_off_until_it_is_back(
    replicas: tuple[Replica, Replica], tenant: str, request: pytest.FixtureRequest
) -> None:
    _, b = replicas
    b.cache.reset_on.clear()
    on_citus = request.node.callspec.params["replicas"] == "citus"
    database: PgDatabase = request.getfixturevalue("citus" if on_citus else "postgres")
    admin = create_engine(database.owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        # The listener's connection is the app role's one whose last query was LISTEN or its
        # liveness check.
        pids = (
            conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = :name"
                ),
                {"name": f"{LISTENER_APPLICATION_NAME} {b.store.db.origin}"},
            )
            .scalars()
            .all()
        )
        terminate = text("SELECT pg_terminate_backend(CAST(:p AS integer))")
        ended = [
            # The cast: Citus adds pg_terminate_backend(bigint) for its global process ids.
            conn.execute(terminate, {"p": pid}).scalar_one()
            for pid in pids
        ]
    admin.dispose()
    assert ended and all(ended), f"no listener connection found ({pids})"
    assert b.cache.reset_off.wait(WAIT), "the cache stayed on without a listener"
    assert b.cache.reset_on.wait(WAIT), "the listener did not come back"
    assert b.cache.enabled


def test_a_lone_server_announces_nothing_until_another_listens(
    private_postgres: PgDatabase, watcher: psycopg.Connection[Any], tenant: str
) -> None:
    a = start_replica(private_postgres)
    b: Replica | None = None
    # A writer without a listener of its own, as a `memoria worker` is.
    worker = SqlMemoryStore(SqlDatabase(create_store_engine(private_postgres.app_url, pool_size=1)))
    try:
        assert listeners_value(private_postgres) == int(a.store.db.origin, 16) + 1
        write(a, tenant, "alone")
        assert list(watcher.notifies(timeout=0.5)) == []  # nobody else to tell
        assert a.cache.heard == []

        b = start_replica(private_postgres)
        assert listeners_value(private_postgres) == -1  # several
        write(a, tenant, "b listens")
        heard = [n.payload for n in watcher.notifies(timeout=WAIT, stop_after=1)]
        assert heard == [f"{a.store.db.origin}\x1f{tenant}\x1fana"]
        assert b.cache.read(tenant, "ana").block.text == "b listens"  # type: ignore[union-attr]

        b.cache.invalidated.clear()
        with worker.transaction(tenant, lock_principal="bob") as tx:
            tx.put_block("bob", StoredBlock("by the worker", "e", NOW))
        assert b.cache.invalidated.wait(WAIT)
        assert (tenant, "bob") in b.cache.heard
    finally:
        worker.db.dispose()
        stop_replica(a)
        if b is not None:
            stop_replica(b)


def test_a_server_starts_listening_only_after_the_writes_in_flight(
    private_postgres: PgDatabase, tenant: str
) -> None:
    """A write that decided not to announce (its server listened alone) holds the
    registration back: the new listener's cache turns on only after that write committed,
    so it can never cache the value the write replaced."""
    a = start_replica(private_postgres)
    b: Replica | None = None
    try:
        write(a, tenant, "before")
        with a.store.transaction(tenant, lock_principal="ana") as tx:
            tx.put_block("ana", StoredBlock("in flight", "e2", NOW))
            b = start_replica(private_postgres, wait=False)
            assert not b.cache.reset_on.wait(1.0), "registered while a write was in flight"
        assert b.cache.reset_on.wait(WAIT)
        assert b.cache.read(tenant, "ana").block.text == "in flight"  # type: ignore[union-attr]
        write(a, tenant, "after")  # announced now: b listens
        assert b.cache.invalidated.wait(WAIT)
        assert b.cache.read(tenant, "ana").block.text == "after"  # type: ignore[union-attr]
    finally:
        stop_replica(a)
        if b is not None:
            stop_replica(b)
