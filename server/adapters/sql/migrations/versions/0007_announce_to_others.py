"""Announce a write only when another server's read cache listens.

Every committed write used to NOTIFY, and every server's change listener woke for each one,
its own included, only to skip it. A NOTIFY is not free either: PostgreSQL serializes the
commits of notifying transactions on one lock, and the listening backend sends each
notification on. With one server (the common case, and every `memoria serve` on its own
database) nobody needs them. Measured (bench/README.md): a server that did not listen served
about 8% more rewrites (bench/bench_ab.py), and with 8 concurrent writers the NOTIFY cost
about 30 us of database CPU per write.

`memoria_cache_listeners` (a sequence, so a writer reads it without touching a table) holds
who listens: 0 nobody, n > 0 exactly one server, whose origin id is n - 1, and -1 several or
unknown (the initial value, so servers of an older version, which listen without
registering, keep being told). A server's listener registers each time it (re)connects,
after LISTEN and before it turns its cache on: `memoria_register_listener()` takes the
exclusive registration lock, which waits for every write that may have decided not to
announce, and counts the listeners connected to this database from their application names
(`memoria-listener <origin>`). `memoria_announce(origin, key)`, which replaces the
unconditional pg_notify() of 0004's memoria_apply() and of the SQLAlchemy write transactions,
takes the same lock shared and notifies unless nobody, or only the writer's own server,
listens. So a server that starts listening is told of every write that commits after its
cache turns on, and a write either sees the new listener or finished before it registered.
A listener that goes away leaves its registration until the next one recounts: writers then
notify for nothing, never the reverse.

Origins are 16 hex digits of a 62-bit random number (storage/sql.py); anything else is never
taken for a registered server's.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SEQUENCE = "memoria_cache_listeners"
# The registration lock: the two-key form of advisory locks, so it can never be taken for a
# principal's lock (those use the one-bigint form).
LOCK = "1296387407, 1"  # 'MEMO', 1
# In parentheses: a PL/pgSQL IF condition ends at the first THEN, a CASE's included.
ORIGIN_ID = "(CASE WHEN {o} ~ '^[0-3][0-9a-f]{{15}}$' THEN ('x' || {o})::bit(64)::bigint END)"
FUNCTIONS = ("memoria_announce(text, text)", "memoria_register_listener()")


def _apply_function(announce: str) -> str:
    """0004's memoria_apply() with `announce` as its last step. The body is restated, not
    imported: a migration is a frozen record of what it did, so a later edit of 0004 (never
    made) could not change what this one installs."""
    return f"""
        CREATE OR REPLACE FUNCTION memoria_apply(
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
            {announce};
            RETURN true;
        END
        $$
        """


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(f"CREATE SEQUENCE {SEQUENCE} AS bigint MINVALUE -1 START WITH -1")
    op.execute(
        f"""
        CREATE FUNCTION memoria_announce(p_origin text, p_key text) RETURNS void
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_listeners bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock_shared({LOCK});
            SELECT last_value INTO v_listeners FROM {SEQUENCE};
            IF v_listeners <> 0
               AND v_listeners IS DISTINCT FROM {ORIGIN_ID.format(o="p_origin")} + 1 THEN
                PERFORM pg_notify('memoria_memory_changed', p_origin || chr(31) || p_key);
            END IF;
        END
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION memoria_register_listener() RETURNS bigint
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        DECLARE
            v_origins text[];
            v_listeners bigint;
        BEGIN
            PERFORM pg_advisory_xact_lock({LOCK});
            SELECT array_agg(DISTINCT substr(a.application_name, 18)) INTO v_origins
              FROM pg_stat_activity AS a
             WHERE a.datname = current_database()
               AND a.application_name LIKE 'memoria-listener%';
            IF coalesce(cardinality(v_origins), 0) = 0 THEN
                v_listeners := 0;
            ELSIF cardinality(v_origins) = 1 THEN
                v_listeners := coalesce({ORIGIN_ID.format(o="v_origins[1]")} + 1, -1);
            ELSE
                v_listeners := -1;
            END IF;
            PERFORM setval('{SEQUENCE}', v_listeners);
            RETURN v_listeners;
        END
        $$
        """
    )
    op.execute(_apply_function("PERFORM memoria_announce(p_origin, v_key)"))
    for function in FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
    if app_role:
        role = bind.dialect.identifier_preparer.quote(app_role)
        op.execute(f"GRANT SELECT, UPDATE ON SEQUENCE {SEQUENCE} TO {role}")
        for function in FUNCTIONS:
            op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        _apply_function("PERFORM pg_notify('memoria_memory_changed', p_origin || chr(31) || v_key)")
    )
    for function in FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
    op.execute(f"DROP SEQUENCE {SEQUENCE}")
