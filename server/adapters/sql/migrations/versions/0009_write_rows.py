"""One declaration of what a write carries: `memoria_write(...)` takes the rows themselves.

0004's `memoria_apply()` took a write as 20 positional arguments that storage/sql.py had to
keep in step with the function by hand, and its audit insert named the columns of 0001: the
columns added since (conversation_id, deleted_turn_count, actor_principal_id) were stored by
SQLite's path and silently dropped by this one. `memoria_write()` takes the rows the Python
side builds once for both dialects (`write_rows` in storage/sql.py) as arguments of the
tables' own row types (`memory_blocks`, `memory_settings`, `audit_events`), plus whether to
delete the block and to blank the principal's audit lines (the domain decides both). The
event is inserted whole (`SELECT (p_event).*`): a column added to `audit_events` extends its
row type, so both dialects store it with no change here; a contract test
(tests/contract/test_write_rows.py) proves it column by column. Row-typed arguments rather
than one JSON document: measured per write on one connection, the JSON form cost PostgreSQL
~40 us more CPU than 0004's positional arguments (parsing, key lookups), the row types
about the same as 0004.

It does what `memoria_apply()` did, in the statement's own transaction: scope to the tenant,
take the principal's advisory lock, check that the block's etag and the memory setting are
still the ones the write was decided on, write, append the event, announce the change to
other replicas' read caches (0007), and return whether it wrote. SECURITY INVOKER, as before.

`memoria_apply()` stays installed for servers of the previous version during a rolling
upgrade; nothing of this version calls it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

FUNCTION = (
    "memoria_write(text, text, text, boolean, memory_blocks, boolean, boolean, memory_settings, "
    "audit_events, text)"
)


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION memoria_write(
            p_tenant text, p_principal text,
            p_expected_etag text, p_expected_enabled boolean,
            p_block memory_blocks, p_delete_block boolean, p_blank_audit_lines boolean,
            p_settings memory_settings, p_event audit_events, p_origin text
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
            IF (p_block).tenant_id IS NOT NULL THEN
                INSERT INTO memory_blocks AS b SELECT (p_block).*
                ON CONFLICT (tenant_id, principal_id) DO UPDATE
                   SET text = excluded.text, etag = excluded.etag,
                       update_time = excluded.update_time;
            END IF;
            IF p_delete_block THEN
                DELETE FROM memory_blocks AS b
                 WHERE b.tenant_id = p_tenant AND b.principal_id = p_principal;
            END IF;
            IF p_blank_audit_lines THEN
                PERFORM memoria_redact_audit_lines(p_principal);
            END IF;
            IF (p_settings).tenant_id IS NOT NULL THEN
                INSERT INTO memory_settings AS s SELECT (p_settings).*
                ON CONFLICT (tenant_id, principal_id) DO UPDATE
                   SET memory_enabled = excluded.memory_enabled,
                       update_time = excluded.update_time;
            END IF;
            p_event.event_id := nextval('audit_events_event_id_seq');
            INSERT INTO audit_events SELECT (p_event).*;
            PERFORM memoria_announce(p_origin, v_key);
            RETURN true;
        END
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {FUNCTION} FROM PUBLIC")
    if app_role:
        role = bind.dialect.identifier_preparer.quote(app_role)
        op.execute(f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP FUNCTION {FUNCTION}")
