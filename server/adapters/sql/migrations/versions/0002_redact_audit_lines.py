"""Deleting a block blanks its lines in the audit log (PostgreSQL: a narrow definer function).

The service role has no UPDATE on audit_events (append-only); this function, owned by the
schema owner, can change nothing but the two line arrays, only for the tenant set in the
transaction (and row-level security still applies to it).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(text("SELECT current_schema()")).scalar_one()
    quote = bind.dialect.identifier_preparer.quote
    op.execute(
        f"""
        CREATE FUNCTION memoria_redact_audit_lines(p_principal text) RETURNS void
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, {quote(schema)} AS $$
            UPDATE audit_events
               SET removed_lines = '[]'::json, added_lines = '[]'::json
             WHERE tenant_id = current_setting('app.tenant_id', true)
               AND principal_id = p_principal
               AND (json_array_length(removed_lines) > 0 OR json_array_length(added_lines) > 0)
        $$
        """
    )
    op.execute("REVOKE ALL ON FUNCTION memoria_redact_audit_lines(text) FROM PUBLIC")
    if app_role:
        role = quote(app_role)
        op.execute(f"GRANT EXECUTE ON FUNCTION memoria_redact_audit_lines(text) TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION memoria_redact_audit_lines(text)")
