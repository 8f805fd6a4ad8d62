"""The Alembic migrations build exactly the schema the code's tables describe."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from server.adapters.sql import migrate
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.tables import metadata
from tests.conftest import PgDatabase


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


def test_fresh_sqlite_database_is_not_current(tmp_path: Path) -> None:
    engine = create_store_engine(sqlite_url(tmp_path))
    assert not migrate.is_current(engine)
    engine.dispose()
