"""Alembic environment: runs migrations on the engine handed over by server.adapters.sql.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from server.adapters.sql.tables import metadata

engine: Engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=engine.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations(app_role=context.config.attributes.get("app_role"))
    connection.commit()
