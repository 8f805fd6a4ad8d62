"""Turn retention: finding expired turns across tenants (issue 24, item 4).

A tenant's turns older than its retention (server/domain/retention.py) are purged by the index
worker. The worker first asks which principals have expired turns, of any tenant: on
PostgreSQL the service role cannot see across tenants (row-level security), so
`memoria_expired_principals` is the schema owner's SECURITY DEFINER function, like the claims
of 0005. It returns only (tenant, principal) pairs, never a turn's ids or text; the worker
then deletes each principal's expired rows under that tenant's scope, where row-level security
applies as to every write.

Its arguments: `p_latest`, the latest of all cutoffs (every expired turn is before it, so the
new `conversation_turns_time_idx` narrows the scan to a range), the default cutoff, and each
tenant with its own cutoff (NULL: that tenant's turns are kept).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

FUNCTION = "memoria_expired_principals(timestamptz, timestamptz, text[], timestamptz[], integer)"


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    op.create_index("conversation_turns_time_idx", "conversation_turns", ["turn_time"])
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    quote = bind.dialect.identifier_preparer.quote
    op.execute(
        f"""
        CREATE FUNCTION memoria_expired_principals(
            p_latest timestamptz, p_default timestamptz, p_tenants text[],
            p_cutoffs timestamptz[], p_limit integer)
        RETURNS TABLE (tenant_id text, principal_id text)
        LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, {quote(schema)} AS $$
            SELECT DISTINCT t.tenant_id::text, t.principal_id::text
              FROM conversation_turns t
              LEFT JOIN unnest(p_tenants, p_cutoffs) AS o(tenant_id, cutoff)
                ON o.tenant_id = t.tenant_id
             WHERE t.turn_time < p_latest
               AND t.turn_time < CASE WHEN o.tenant_id IS NULL THEN p_default
                                      ELSE o.cutoff END
             LIMIT p_limit
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {FUNCTION} FROM PUBLIC")
    if app_role:
        op.execute(f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {quote(app_role)}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {FUNCTION}")
    op.drop_index("conversation_turns_time_idx", table_name="conversation_turns")
