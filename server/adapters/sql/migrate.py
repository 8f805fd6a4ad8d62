"""Versioned schema migrations (Alembic), run by `memoria migrate` and, on the embedded
default, automatically at start.

On PostgreSQL the migrations run as the schema owner and grant the service role only what it
needs: read and write on blocks and settings, read and append (no update, no delete) on audit
events. The service role must not own the tables, so row-level security applies to it.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).with_name("migrations")


def _config(engine: Engine, app_role: str | None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["engine"] = engine
    config.attributes["app_role"] = app_role
    return config


def upgrade(engine: Engine, app_role: str | None = None) -> None:
    """Bring the schema to the newest revision. `app_role`: the PostgreSQL service role."""
    command.upgrade(_config(engine, app_role), "head")


def downgrade(engine: Engine, revision: str, app_role: str | None = None) -> None:
    """Bring the schema back to `revision`, to run the release before it (each migration's
    downgrade restores what it changed, grants to `app_role` included)."""
    command.downgrade(_config(engine, app_role), revision)


def is_current(engine: Engine) -> bool:
    """Whether the database is at the newest revision (checked before serving)."""
    script = ScriptDirectory.from_config(_config(engine, None))
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_heads()
    return set(current) == set(script.get_heads())
