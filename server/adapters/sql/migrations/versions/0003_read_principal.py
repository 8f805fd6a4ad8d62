"""One-statement read of a principal's block and settings, for the render hot path.

`memoria_read_principal(tenant, principal)` sets `app.tenant_id` for its own (implicit,
autocommit) transaction and then reads, so a read is one round trip instead of four (BEGIN,
set_config, SELECT, COMMIT). It runs with the caller's rights (SECURITY INVOKER): row-level
security applies to the service role exactly as for any other query.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION memoria_read_principal(p_tenant text, p_principal text)
        RETURNS TABLE (
            block_text text,
            block_etag varchar,
            block_update_time timestamptz,
            settings_memory_enabled boolean,
            settings_update_time timestamptz
        )
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        BEGIN
            -- Local to the statement's transaction: it ends with this call.
            PERFORM set_config('app.tenant_id', p_tenant, true);
            RETURN QUERY
                SELECT b.text, b.etag, b.update_time, s.memory_enabled, s.update_time
                  FROM (SELECT 1) AS one
                  LEFT JOIN memory_blocks AS b
                         ON b.tenant_id = p_tenant AND b.principal_id = p_principal
                  LEFT JOIN memory_settings AS s
                         ON s.tenant_id = p_tenant AND s.principal_id = p_principal;
        END
        $$
        """
    )
    op.execute("REVOKE ALL ON FUNCTION memoria_read_principal(text, text) FROM PUBLIC")
    if app_role:
        role = op.get_bind().dialect.identifier_preparer.quote(app_role)
        op.execute(f"GRANT EXECUTE ON FUNCTION memoria_read_principal(text, text) TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION memoria_read_principal(text, text)")
