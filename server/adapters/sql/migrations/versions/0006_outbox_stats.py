"""The outbox gauges' read: how many turns wait, and since when, across all tenants.

`memoria_outbox_stats()` returns one row: the number of pending turns and the accept time of
the oldest. Row-level security would limit the service role to one tenant, so the function is
the schema owner's (SECURITY DEFINER), like the claim functions of 0005; it returns two
aggregates and nothing of any turn. It reads only pending rows, through the partial index of
0005, and the server calls it at most every 15 seconds (server/telemetry.py), and only while
metrics are exported.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

FUNCTION = "memoria_outbox_stats()"


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    quote = bind.dialect.identifier_preparer.quote
    op.execute(
        f"""
        CREATE FUNCTION memoria_outbox_stats()
        RETURNS TABLE (pending bigint, oldest_accept_time timestamptz)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, {quote(schema)} AS $$
            SELECT count(*), min(t.accept_time) FROM conversation_turns t
             WHERE t.status = 'pending'
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {FUNCTION} FROM PUBLIC")
    if app_role:
        op.execute(f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {quote(app_role)}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {FUNCTION}")
