"""The SQL store's health probe (`SqlMemoryStore.check`, used by server/runtime/health.py).

It passes on a live store (SQLite and PostgreSQL). On a PostgreSQL cluster of this test's own,
stopped and started again: it fails while the database is down, the first probe after the
restart passes, and no call then fails on a connection the outage killed (the probe has had
both pools drop them). On a primary lost and its standby promoted (tests/replication.py), with
no probe running, the first call that meets a dead connection has its pool drop the others.
"""

from __future__ import annotations

import threading
import time

import pytest

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import AuditQuery
from tests.postgres_server import OwnPostgres
from tests.replication import ReplicatedPostgres

PROBE_BOUND_S = 5.0


def test_check_passes_on_a_live_store(sql_store: SqlMemoryStore) -> None:
    sql_store.db.check()


def use_both_pools(store: SqlMemoryStore, tenant: str, threads: int = 6) -> list[Exception]:
    """Calls from several threads at once, so that each pool holds several connections: reads
    (PostgreSQL: the autocommit pool) and audit listings (SQLAlchemy's pool). Returns what
    they raised."""
    errors: list[Exception] = []
    start = threading.Barrier(threads)

    def calls() -> None:
        start.wait(timeout=30)
        for _ in range(10):
            try:
                store.read(tenant, "ana")
                store.list_audit(tenant, AuditQuery(principal_id="ana", limit=5))
            except Exception as error:
                errors.append(error)

    workers = [threading.Thread(target=calls) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not any(worker.is_alive() for worker in workers)
    return errors


@pytest.mark.postgres
def test_after_a_restart_the_first_check_passes_and_no_call_meets_a_dead_connection(
    own_postgres: OwnPostgres,
) -> None:
    store = SqlMemoryStore(SqlDatabase(create_store_engine(own_postgres.app_url, pool_size=8)))
    try:
        assert use_both_pools(store, "t1") == []
        store.db.check()

        own_postgres.stop()
        started = time.monotonic()
        with pytest.raises(Exception):  # noqa: B017 - whatever the driver raises
            store.db.check()
        assert time.monotonic() - started < PROBE_BOUND_S
        with pytest.raises(MemoriaError) as raised:
            store.read("t1", "ana")
        assert raised.value.reason is ErrorReason.STORE_UNAVAILABLE

        own_postgres.start()
        store.db.check()  # passes at once: stale connections are dropped, not reported
        assert use_both_pools(store, "t1") == []
    finally:
        store.db.dispose()


@pytest.mark.postgres
def test_after_a_failover_at_most_one_call_per_pool_meets_a_connection_to_the_lost_primary(
    replicated_postgres: ReplicatedPostgres,
) -> None:
    """No probe runs here (the health monitor's would drop the stale connections within a
    second): the calls themselves must. The first call that meets a connection the lost primary
    took with it tells its pool to drop every connection opened before then, as SQLAlchemy does
    for its own pool, so the calls after the promotion do not each fail once per pooled
    connection."""
    cluster = replicated_postgres
    store = SqlMemoryStore(SqlDatabase(create_store_engine(cluster.app_url, pool_size=8)))
    try:
        assert use_both_pools(store, "t1") == []
        cluster.kill_primary()
        cluster.promote()
        failed = 0
        for _ in range(16):  # more than either pool holds
            try:
                store.read("t1", "ana")
                store.list_audit("t1", AuditQuery(principal_id="ana", limit=5))
            except MemoriaError as error:
                assert error.reason is ErrorReason.STORE_UNAVAILABLE
                failed += 1
        assert failed <= 2, f"{failed} calls met a dead connection"
        assert use_both_pools(store, "t1") == []
    finally:
        store.db.dispose()
