"""`SqlMemoryStore.call` on PostgreSQL: the hot paths' one-statement calls, run as statements
prepared on each pooled connection through libpq's blocking call (storage/sql.py), traced
(inside telemetry's span) or not, the same way: parameters and rows adapted, the server's
error raised as psycopg would, the pool left usable.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg.types.json import Json
from sqlalchemy.engine import make_url

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine
from server.domain.errors import ErrorReason, MemoriaError
from tests.conftest import PgDatabase

pytestmark = pytest.mark.postgres

ECHO = "SELECT %s::text, %s::int, %s::boolean, %s::timestamptz, %s::json, %s::text IS NULL"
WHEN = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)
TEXT = "Zoë \u00e9 \u2018quoted\u2019 %s $1"  # placeholders in a value are only text
VALUES: tuple[Any, ...] = (TEXT, 41, True, WHEN, Json(["a", "ü"]), None)
EXPECTED = (TEXT, 41, True, WHEN, ["a", "ü"], True)


SPANS: list[str] = []
"""The statements traced calls ran inside their span for (the "traced" store)."""


@contextlib.contextmanager
def _span(statement: str) -> Iterator[None]:
    SPANS.append(statement)
    yield


@pytest.fixture(params=["untraced", "traced"])
def store(request: pytest.FixtureRequest, postgres: PgDatabase) -> Iterator[SqlMemoryStore]:
    store = SqlMemoryStore(SqlDatabase(create_store_engine(postgres.app_url, pool_size=2)))
    SPANS.clear()
    if request.param == "traced":
        store.db.trace_calls(_span)  # as telemetry does
    try:
        yield store
    finally:
        store.db.dispose()
    assert (SPANS != []) is (request.param == "traced")


def test_parameters_and_the_row_round_trip(store: SqlMemoryStore) -> None:
    for _ in range(3):  # the first call prepares the statement, the next ones reuse it
        assert store.db.call(ECHO, VALUES) == EXPECTED


def test_a_failing_statement_raises_the_servers_error_and_the_pool_goes_on(
    store: SqlMemoryStore,
) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        store.db.call("SELECT 1 / %s::int", (0,))
    with pytest.raises(psycopg.errors.UndefinedFunction):
        store.db.call("SELECT memoria_no_such_function(%s)", ("x",))
    assert store.db.call("SELECT 1 / %s::int", (1,)) == (1,)


def test_concurrent_calls_each_get_their_own_row(store: SqlMemoryStore) -> None:
    """More threads than pooled connections: every connection prepares the statement once."""
    results: dict[int, tuple[Any, ...]] = {}
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                results[n * 100 + i] = store.db.call("SELECT %s::int * 2", (n * 100 + i,))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert results == {k: (2 * k,) for k in results} and len(results) == 80


def test_a_connection_the_server_ended_is_dropped_and_the_next_call_prepares_again(
    store: SqlMemoryStore, postgres: PgDatabase
) -> None:
    assert store.db.call("SELECT %s::int + 1", (1,)) == (2,)
    (pid,) = store.db.call("SELECT pg_backend_pid()", ())
    # The service role may end its own sessions (each call reuses the one pooled connection).
    url = make_url(postgres.app_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    with pytest.raises(MemoriaError) as lost:
        store.db.call("SELECT %s::int + 1", (1,))
    assert lost.value.reason is ErrorReason.STORE_UNAVAILABLE
    assert store.db.call("SELECT %s::int + 1", (1,)) == (2,)  # a new connection, prepared anew


def test_a_statement_whose_plan_went_stale_is_prepared_again(
    store: SqlMemoryStore, postgres: PgDatabase
) -> None:
    """A migration that changes what a function returns fails the statements prepared before
    it once at most (PostgreSQL: "cached plan must not change result type"), not for good."""
    function = f"memoria_test_{uuid.uuid4().hex[:12]}"
    url = make_url(postgres.owner_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), autocommit=True) as owner:
        owner.execute(f"CREATE FUNCTION {function}(x int) RETURNS int LANGUAGE sql AS 'SELECT x'")
        try:
            assert store.db.call(f"SELECT {function}(%s)", (7,)) == (7,)
            owner.execute(f"DROP FUNCTION {function}(int)")
            owner.execute(
                f"CREATE FUNCTION {function}(x int) RETURNS text LANGUAGE sql AS 'SELECT x::text'"
            )
            with contextlib.suppress(psycopg.errors.FeatureNotSupported):
                store.db.call(f"SELECT {function}(%s)", (7,))  # the prepared path fails once
            assert store.db.call(f"SELECT {function}(%s)", (7,)) == ("7",)
        finally:
            owner.execute(f"DROP FUNCTION IF EXISTS {function}(int)")
