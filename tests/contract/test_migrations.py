"""The Alembic migrations build exactly the schema the code's tables describe."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from server.adapters.sql import migrate
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.tables import metadata
from tests.conftest import APP_ROLE, PgDatabase


def test_sqlite_schema_matches_tables(tmp_path: Path) -> None:
    engine = create_store_engine(sqlite_url(tmp_path))
    migrate.upgrade(engine)
    assert migrate.is_current(engine)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_is_idempotent(tmp_path: Path) -> None:
    engine = create_store_engine(sqlite_url(tmp_path))
    migrate.upgrade(engine)
    migrate.upgrade(engine)
    assert migrate.is_current(engine)
    engine.dispose()


@pytest.mark.postgres
def test_postgres_schema_matches_tables(postgres: PgDatabase) -> None:
    engine = create_store_engine(postgres.owner_url, pool_size=1)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def _app_may_call_apply(app_url: str) -> bool:
    """Whether `memoria_apply()` (0004's write function) exists and the service role may run
    it (has_function_privilege errors on a function that does not exist: to_regprocedure
    first)."""
    function = f"memoria_apply({APPLY_SIGNATURE})"
    engine = create_store_engine(app_url, pool_size=1)
    with engine.connect() as conn:
        found = conn.execute(text(f"SELECT to_regprocedure('{function}') IS NOT NULL"))
        allowed = (
            found.scalar_one()
            and conn.execute(
                text(f"SELECT has_function_privilege('{function}', 'EXECUTE')")
            ).scalar_one()
        )
    engine.dispose()
    return bool(allowed)


APPLY_SIGNATURE = (
    "text, text, text, boolean, text, text, timestamptz, boolean, boolean, timestamptz, "
    "text, text, timestamptz, json, json, integer, integer, integer, boolean, text"
)


@pytest.mark.postgres
def test_the_unused_write_function_is_dropped_and_a_downgrade_restores_it(
    private_postgres: PgDatabase,
) -> None:
    """0010 drops memoria_apply(), which nothing calls since 0009; going back to 0009 (the
    release before) installs it again with the service role's grant, and 0010 drops it again."""
    assert not _app_may_call_apply(private_postgres.app_url)
    owner = create_store_engine(private_postgres.owner_url, pool_size=1)
    migrate.downgrade(owner, "0009", app_role=APP_ROLE)
    assert not migrate.is_current(owner)
    assert _app_may_call_apply(private_postgres.app_url)
    migrate.upgrade(owner, app_role=APP_ROLE)
    assert migrate.is_current(owner)
    owner.dispose()
    assert not _app_may_call_apply(private_postgres.app_url)


def test_fresh_sqlite_database_is_not_current(tmp_path: Path) -> None:
    engine = create_store_engine(sqlite_url(tmp_path))
    assert not migrate.is_current(engine)
    engine.dispose()
