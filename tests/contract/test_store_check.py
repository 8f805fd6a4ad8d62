"""The SQL store's health probe (`SqlMemoryStore.check`, used by server/runtime/health.py).

It passes on a live store (SQLite and PostgreSQL). On a PostgreSQL cluster of this test's own,
stopped and started again: it fails while the database is down, the first probe after the
restart passes, and no call then fails on a connection the outage killed (the probe has had
both pools drop them).
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
