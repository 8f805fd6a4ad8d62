"""One-statement conditional write, for the rewrite, delete and settings paths.

`memoria_apply(...)` runs in the statement's own (autocommit) transaction: it scopes the
transaction to the tenant, takes the principal's advisory lock, and only if the block's etag
and the memory setting are still those the write was decided on, writes the block, deletes it
(blanking earlier audit lines) or writes the settings, appends the audit event and announces
the change to other replicas. The announcement's payload is origin, tenant and principal
joined by U+001F; the writing server skips its own, it has already updated its cache. It
returns whether it wrote. SECURITY INVOKER: row-level security and the service role's grants
(no UPDATE on the audit log) apply as to any query.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SIGNATURE = (
    "text, text, text, boolean, text, text, timestamptz, boolean, boolean, timestamptz, "
    "text, text, timestamptz, json, json, integer, integer, integer, boolean, text"
)


def upgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION memoria_apply(
            p_tenant text, p_principal text,
            p_expected_etag text, p_expected_enabled boolean,
            p_block_text text, p_block_etag text, p_block_time timestamptz,
            p_delete_block boolean,
            p_settings_enabled boolean, p_settings_time timestamptz,
            p_action text, p_writer text, p_create_time timestamptz,
            p_removed_lines json, p_added_lines json,
            p_removed_line_count integer, p_added_line_count integer,
            p_char_count integer, p_memory_enabled boolean,
            p_origin text
        ) RETURNS boolean
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_key text := p_tenant || chr(31) || p_principal;
            v_etag text;
            v_enabled boolean;
        BEGIN
            PERFORM set_config('app.tenant_id', p_tenant, true);
            PERFORM pg_advisory_xact_lock(hashtextextended(v_key, 0));
            SELECT b.etag INTO v_etag FROM memory_blocks AS b
             WHERE b.tenant_id = p_tenant AND b.principal_id = p_principal;
            SELECT s.memory_enabled INTO v_enabled FROM memory_settings AS s
             WHERE s.tenant_id = p_tenant AND s.principal_id = p_principal;
            IF coalesce(v_etag, '') <> p_expected_etag
               OR coalesce(v_enabled, true) <> p_expected_enabled THEN
                RETURN false;
            END IF;
            IF p_block_text IS NOT NULL THEN
                INSERT INTO memory_blocks AS b (tenant_id, principal_id, text, etag, update_time)
                VALUES (p_tenant, p_principal, p_block_text, p_block_etag, p_block_time)
                ON CONFLICT (tenant_id, principal_id) DO UPDATE
                   SET text = excluded.text, etag = excluded.etag,
                       update_time = excluded.update_time;
            END IF;
            IF p_delete_block THEN
                DELETE FROM memory_blocks AS b
                 WHERE b.tenant_id = p_tenant AND b.principal_id = p_principal;
                PERFORM memoria_redact_audit_lines(p_principal);
            END IF;
            IF p_settings_enabled IS NOT NULL THEN
                INSERT INTO memory_settings AS s
                       (tenant_id, principal_id, memory_enabled, update_time)
                VALUES (p_tenant, p_principal, p_settings_enabled, p_settings_time)
                ON CONFLICT (tenant_id, principal_id) DO UPDATE
                   SET memory_enabled = excluded.memory_enabled,
                       update_time = excluded.update_time;
            END IF;
            INSERT INTO audit_events (tenant_id, principal_id, action, writer, create_time,
                                      removed_lines, added_lines, removed_line_count,
                                      added_line_count, char_count, memory_enabled)
            VALUES (p_tenant, p_principal, p_action, p_writer, p_create_time,
                    p_removed_lines, p_added_lines, p_removed_line_count,
                    p_added_line_count, p_char_count, p_memory_enabled);
            PERFORM pg_notify('memoria_memory_changed', p_origin || chr(31) || v_key);
            RETURN true;
        END
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION memoria_apply({SIGNATURE}) FROM PUBLIC")
    if app_role:
        role = op.get_bind().dialect.identifier_preparer.quote(app_role)
        op.execute(f"GRANT EXECUTE ON FUNCTION memoria_apply({SIGNATURE}) TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION memoria_apply({SIGNATURE})")
