"""Conversation search: the turn queue (outbox), conversation tombstones, audit columns.

`conversation_turns` holds one row per accepted turn: its indexed text while it waits
(`status` 'pending'), NULL text once indexed ('indexed'), or its text and last error type when
it kept failing ('failed'). `conversation_tombstones` records deleted conversations (a search
filters on them until `purge_time` says the chunks are gone; a late turn is refused for good).

Row-level security as for every table, except that the turn queue and tombstones are not
FORCEd: the schema owner's two SECURITY DEFINER claim functions must find due work across
tenants. They return only ids (row id and tenant, or tombstone keys), lock the rows in the
caller's transaction with FOR UPDATE SKIP LOCKED, and the worker then reads each turn under
its own tenant's scope, so the service role still never reads another tenant's text.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ID = sa.String(256)
FUNCTIONS = (
    "memoria_claim_turns(integer, timestamptz)",
    "memoria_claim_purges(integer)",
    "memoria_deleted_conversations(text, text)",
)


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    postgres = bind.dialect.name == "postgresql"
    op.add_column(
        "audit_events",
        sa.Column("conversation_id", ID, nullable=False, server_default=""),
    )
    op.add_column(
        "audit_events",
        sa.Column("deleted_turn_count", sa.Integer, nullable=False, server_default="0"),
    )
    op.add_column(
        "audit_events",
        sa.Column("actor_principal_id", ID, nullable=False, server_default=""),
    )
    op.create_table(
        "conversation_turns",
        sa.Column(
            "turn_row_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("principal_id", ID, nullable=False),
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("turn_id", ID, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=True),
        sa.Column("turn_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("accept_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.String(200), nullable=True),
        sa.UniqueConstraint(
            "tenant_id", "principal_id", "conversation_id", "turn_id", name="conversation_turns_key"
        ),
    )
    op.create_index(
        "conversation_turns_due_idx",
        "conversation_turns",
        ["due_time"],
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "conversation_tombstones",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("principal_id", ID, nullable=False),
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("delete_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("purge_time", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint(
            "tenant_id", "principal_id", "conversation_id", name="conversation_tombstones_pkey"
        ),
    )
    op.create_index(
        "conversation_tombstones_unpurged_idx",
        "conversation_tombstones",
        ["delete_time"],
        postgresql_where=sa.text("purge_time IS NULL"),
        sqlite_where=sa.text("purge_time IS NULL"),
    )
    if not postgres:
        return
    schema = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    quote = bind.dialect.identifier_preparer.quote
    for table in ("conversation_turns", "conversation_tombstones"):
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} "
            "USING (tenant_id = current_setting('app.tenant_id', true)) "
            "WITH CHECK (tenant_id = current_setting('app.tenant_id', true))"
        )
    op.execute(
        f"""
        CREATE FUNCTION memoria_claim_turns(p_limit integer, p_now timestamptz)
        RETURNS TABLE (turn_row_id bigint, tenant_id text)
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, {quote(schema)} AS $$
            SELECT t.turn_row_id, t.tenant_id::text FROM conversation_turns t
             WHERE t.status = 'pending' AND t.due_time <= p_now
             ORDER BY t.due_time
             LIMIT p_limit
             FOR UPDATE SKIP LOCKED
        $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION memoria_claim_purges(p_limit integer)
        RETURNS TABLE (tenant_id text, principal_id text, conversation_id text)
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, {quote(schema)} AS $$
            SELECT t.tenant_id::text, t.principal_id::text, t.conversation_id::text
              FROM conversation_tombstones t
             WHERE t.purge_time IS NULL
             ORDER BY t.delete_time
             LIMIT p_limit
             FOR UPDATE SKIP LOCKED
        $$
        """
    )
    # The search path's read of a principal's deleted conversations, in one statement (its own
    # transaction, scoped to the tenant): SECURITY INVOKER, so row-level security applies.
    op.execute(
        """
        CREATE FUNCTION memoria_deleted_conversations(p_tenant text, p_principal text)
        RETURNS text[]
        LANGUAGE plpgsql SECURITY INVOKER AS $$
        BEGIN
            PERFORM set_config('app.tenant_id', p_tenant, true);
            RETURN ARRAY(
                SELECT z.conversation_id::text FROM conversation_tombstones z
                 WHERE z.tenant_id = p_tenant AND z.principal_id = p_principal
                   AND z.purge_time IS NULL);
        END
        $$
        """
    )
    for function in FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
    if app_role:
        role = quote(app_role)
        op.execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON conversation_turns, conversation_tombstones "
            f"TO {role}"
        )
        op.execute(f"GRANT USAGE ON SEQUENCE conversation_turns_turn_row_id_seq TO {role}")
        op.execute(f"GRANT DELETE ON memory_settings TO {role}")
        for function in FUNCTIONS:
            op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        for function in FUNCTIONS:
            op.execute(f"DROP FUNCTION {function}")
    op.drop_table("conversation_tombstones")
    op.drop_table("conversation_turns")
    op.drop_column("audit_events", "actor_principal_id")
    op.drop_column("audit_events", "deleted_turn_count")
    op.drop_column("audit_events", "conversation_id")
