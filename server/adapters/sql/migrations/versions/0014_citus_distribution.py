"""Citus: every table distributed by `tenant_id`, co-located; the cross-tenant functions made
routable (issue 22 item 3, DESIGN 4).

A no-op on SQLite and on plain PostgreSQL. On a database with the citus extension (detected:
`pg_extension`, so the same `memoria migrate` serves both; docs/decisions.md, "Citus, sharded
by tenant"):

- The primary keys that did not name the tenant (audit_events, conversation_turns,
  turn_inspections: a bigint identity alone) become (tenant_id, id): Citus requires the
  distribution column in every primary key and unique constraint. The ids stay unique (one
  sequence each, drawn on the coordinator).
- Every table is distributed by `tenant_id` and co-located with memory_blocks: one tenant's
  blocks, settings, audit events, turns, tombstones and inspection records live in shards of
  the same number, on one node, so a call's statements (each with an explicit tenant
  predicate) route to one shard. None is a reference table: every table holds tenant rows, and
  a reference table is copied to every node. `alembic_version` stays a local table of the
  coordinator (the schema's revision, read only there). The row-level security policies,
  ENABLE and FORCE, are carried to every shard by Citus.
- The claims and the inspection purge crossed tenants with FOR UPDATE SKIP LOCKED, which
  Citus refuses on a distributed table ("could not run distributed query with FOR UPDATE/SHARE
  commands"); the same claim for one tenant routes to its shard and works. Their Citus bodies
  first find the tenants with due work (no lock, oldest first), then claim per tenant, each
  statement with the tenant predicate. They return what 0005 and 0008's return. (The server's
  own worker claims through the functions of the next point instead; these keep 0005's
  functions working for any other caller.)
- Citus cannot plan a LANGUAGE sql function's statement that uses the function's parameters
  ("could not create distributed plan"): the Citus bodies are PL/pgSQL (0013's
  `memoria_expired_principals` too, with the same query).
- A claim ran as the owner (the definer functions of 0005) and the worker then updated the
  claimed rows as the service, in one transaction: on Citus the two roles use two connections
  to the shard, and the service's update waits for the owner's row locks for good (measured:
  "canceling the transaction since it was involved in a distributed deadlock"). So on Citus the
  owner's new `memoria_due_tenants(limit, now)` and `memoria_purging_tenants(limit)` only name
  the tenants with due work (oldest first, no lock, nothing of any turn), and the service then
  claims each tenant's rows itself, under that tenant's scope (server/adapters/sql/turns.py).
- `memoria_write()` (0009) inserted the audit event as `INSERT ... SELECT (p_event).*`, which
  Citus runs as a COPY into the shard, and COPY refuses a table with row-level security: the
  Citus body inserts `VALUES ((p_event).*)`, a plain router INSERT; nothing else changes.
- `memoria_redact_audit_lines()` (0002) was the owner's (SECURITY DEFINER), so the service role
  needed no UPDATE on the audit log. Citus refuses a transaction in which two roles modify
  placements of one co-located shard group ("cannot perform query on placements that were
  modified in this transaction by a different user"), and a deletion modifies the block (as
  the service) and blanks the lines (as the owner). On Citus the function runs as the caller,
  who is granted UPDATE on the two line columns only: still no UPDATE of any other column and
  no DELETE, and the tenant policy (FORCEd) bounds it to the transaction's tenant. Its
  predicate was `tenant_id = current_setting(...)`, which Citus does not route (it ran on
  every shard, found by the routing test): the body reads the setting into a variable first.
- `citus.propagate_set_commands = 'local'` on the database when the migrating role owns it:
  without it Citus forwards no SET LOCAL to the workers, and the shards' policies would see no
  tenant. The server refuses to start on a Citus database where it is not in force
  (server/runtime/builders/stores.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# (table, its id column when the primary key must gain the tenant); memory_blocks first, the
# group every other table is co-located with.
TABLES = (
    ("memory_blocks", None),
    ("memory_settings", None),
    ("audit_events", "event_id"),
    ("conversation_turns", "turn_row_id"),
    ("conversation_tombstones", None),
    ("turn_inspections", "record_id"),
)

TENANT_FUNCTIONS = ("memoria_due_tenants(integer, timestamptz)", "memoria_purging_tenants(integer)")


def has_citus(bind: sa.Connection) -> bool:
    """Whether the database has the citus extension (it is a Citus coordinator)."""
    if bind.dialect.name != "postgresql":
        return False
    found = bind.execute(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'citus'"))
    return found.scalar() is not None


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    if not has_citus(bind):
        return
    for table, id_column in TABLES:
        if id_column is not None:
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey")
            op.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (tenant_id, {id_column})")
    for table, _ in TABLES:
        colocate = "none" if table == "memory_blocks" else "memory_blocks"
        op.execute(
            f"SELECT create_distributed_table('{table}', 'tenant_id', "
            f"colocate_with => '{colocate}')"
        )
    schema = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    path = f"pg_catalog, {bind.dialect.identifier_preparer.quote(schema)}"
    for body in _FUNCTIONS:
        op.execute(body.replace("{path}", path))
    for function in TENANT_FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
    if app_role:
        role = bind.dialect.identifier_preparer.quote(app_role)
        op.execute(f"GRANT UPDATE (removed_lines, added_lines) ON audit_events TO {role}")
        for function in TENANT_FUNCTIONS:
            op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {role}")
    owns_database = bind.execute(
        sa.text(
            "SELECT pg_get_userbyid(datdba) = current_user FROM pg_database "
            "WHERE datname = current_database()"
        )
    ).scalar_one()
    if owns_database:
        database = bind.dialect.identifier_preparer.quote(
            bind.execute(sa.text("SELECT current_database()")).scalar_one()
        )
        op.execute(f"ALTER DATABASE {database} SET citus.propagate_set_commands = 'local'")


# CREATE OR REPLACE keeps 0005/0008/0009's grants. The tenants with due work come first, without a
# lock (a multi-shard read), then each tenant's rows are claimed on its shard.
_FUNCTIONS = (
    """
    CREATE OR REPLACE FUNCTION memoria_redact_audit_lines(p_principal text) RETURNS void
    LANGUAGE plpgsql SECURITY INVOKER SET search_path = {path} AS $$
    DECLARE
        v_tenant text := current_setting('app.tenant_id', true);
    BEGIN
        UPDATE audit_events
           SET removed_lines = '[]'::json, added_lines = '[]'::json
         WHERE tenant_id = v_tenant
           AND principal_id = p_principal
           AND (json_array_length(removed_lines) > 0 OR json_array_length(added_lines) > 0);
    END
    $$
    """,
    """
    CREATE FUNCTION memoria_due_tenants(p_limit integer, p_now timestamptz)
    RETURNS TABLE (tenant_id text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = {path} AS $$
    BEGIN
        RETURN QUERY
            SELECT t.tenant_id::text FROM conversation_turns t
             WHERE t.status = 'pending' AND t.due_time <= p_now
             GROUP BY t.tenant_id ORDER BY min(t.due_time) LIMIT p_limit;
    END
    $$
    """,
    """
    CREATE FUNCTION memoria_purging_tenants(p_limit integer)
    RETURNS TABLE (tenant_id text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = {path} AS $$
    BEGIN
        RETURN QUERY
            SELECT t.tenant_id::text FROM conversation_tombstones t
             WHERE t.purge_time IS NULL
             GROUP BY t.tenant_id ORDER BY min(t.delete_time) LIMIT p_limit;
    END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION memoria_expired_principals(
        p_latest timestamptz, p_default timestamptz, p_tenants text[],
        p_cutoffs timestamptz[], p_limit integer)
    RETURNS TABLE (tenant_id text, principal_id text)
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = {path} AS $$
    BEGIN
        RETURN QUERY
            SELECT DISTINCT t.tenant_id::text, t.principal_id::text
              FROM conversation_turns t
              LEFT JOIN unnest(p_tenants, p_cutoffs) AS o(tenant_id, cutoff)
                ON o.tenant_id = t.tenant_id
             WHERE t.turn_time < p_latest
               AND t.turn_time < CASE WHEN o.tenant_id IS NULL THEN p_default
                                      ELSE o.cutoff END
             LIMIT p_limit;
    END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION memoria_write(
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
            INSERT INTO memory_blocks AS b VALUES ((p_block).*)
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
            INSERT INTO memory_settings AS s VALUES ((p_settings).*)
            ON CONFLICT (tenant_id, principal_id) DO UPDATE
               SET memory_enabled = excluded.memory_enabled,
                   update_time = excluded.update_time;
        END IF;
        p_event.event_id := nextval('audit_events_event_id_seq');
        INSERT INTO audit_events VALUES ((p_event).*);
        PERFORM memoria_announce(p_origin, v_key);
        RETURN true;
    END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION memoria_claim_turns(p_limit integer, p_now timestamptz)
    RETURNS TABLE (turn_row_id bigint, tenant_id text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
    DECLARE
        v_tenant text;
        v_left integer := p_limit;
        v_got integer;
    BEGIN
        FOR v_tenant IN
            SELECT t.tenant_id::text FROM conversation_turns t
             WHERE t.status = 'pending' AND t.due_time <= p_now
             GROUP BY t.tenant_id ORDER BY min(t.due_time) LIMIT p_limit
        LOOP
            RETURN QUERY
                SELECT t.turn_row_id, t.tenant_id::text FROM conversation_turns t
                 WHERE t.tenant_id = v_tenant
                   AND t.status = 'pending' AND t.due_time <= p_now
                 ORDER BY t.due_time
                 LIMIT v_left
                 FOR UPDATE SKIP LOCKED;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
            EXIT WHEN v_left <= 0;
        END LOOP;
    END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION memoria_claim_purges(p_limit integer)
    RETURNS TABLE (tenant_id text, principal_id text, conversation_id text)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
    DECLARE
        v_tenant text;
        v_left integer := p_limit;
        v_got integer;
    BEGIN
        FOR v_tenant IN
            SELECT t.tenant_id::text FROM conversation_tombstones t
             WHERE t.purge_time IS NULL
             GROUP BY t.tenant_id ORDER BY min(t.delete_time) LIMIT p_limit
        LOOP
            RETURN QUERY
                SELECT t.tenant_id::text, t.principal_id::text, t.conversation_id::text
                  FROM conversation_tombstones t
                 WHERE t.tenant_id = v_tenant AND t.purge_time IS NULL
                 ORDER BY t.delete_time
                 LIMIT v_left
                 FOR UPDATE SKIP LOCKED;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
            EXIT WHEN v_left <= 0;
        END LOOP;
    END
    $$
    """,
    """
    CREATE OR REPLACE FUNCTION memoria_purge_inspections(p_before timestamptz, p_limit integer)
    RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
    DECLARE
        v_tenant text;
        v_removed integer := 0;
        v_got integer;
    BEGIN
        FOR v_tenant IN
            SELECT DISTINCT i.tenant_id::text FROM turn_inspections i
             WHERE i.record_time < p_before
        LOOP
            DELETE FROM turn_inspections WHERE tenant_id = v_tenant AND record_id IN (
                SELECT i.record_id FROM turn_inspections i
                 WHERE i.tenant_id = v_tenant AND i.record_time < p_before
                 ORDER BY i.record_time
                 LIMIT p_limit - v_removed
                 FOR UPDATE SKIP LOCKED);
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_removed := v_removed + v_got;
            EXIT WHEN v_removed >= p_limit;
        END LOOP;
        RETURN v_removed;
    END
    $$
    """,
)


def downgrade(app_role: str | None = None) -> None:
    """Citus cannot be undone in place (undistribute_table copies every shard back to the
    coordinator): a Citus database goes back by restoring a dump. A no-op elsewhere."""
    if has_citus(op.get_bind()):
        raise NotImplementedError("0014 is not reversible on Citus: restore a dump instead")
