"""The inspector's records: what each referenced turn rendered and searched.

`turn_inspections` holds one row per render or search made with a turn reference. A row keeps
ids, counts, the query and the hits' ids, ranks and scores, never a chunk's text. Rows are
removed with their conversation (DeleteConversation), with the principal (erasure) and after
the retention by `memoria_purge_inspections(before, limit)`.

Row-level security as for the turn queue (migration 0005): enabled with the tenant policy, not
FORCEd, because the schema owner's SECURITY DEFINER purge must find expired rows across
tenants. It only deletes by time and returns a count, so the service role still never reads
another tenant's rows.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ID = sa.String(256)
FUNCTION = "memoria_purge_inspections(timestamptz, integer)"


def upgrade(app_role: str | None = None) -> None:
    bind = op.get_bind()
    op.create_table(
        "turn_inspections",
        sa.Column(
            "record_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("principal_id", ID, nullable=False),
        sa.Column("conversation_id", ID, nullable=False),
        sa.Column("turn_id", ID, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("record_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("etag", sa.String(64), nullable=False, server_default=""),
        sa.Column("char_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("query", sa.Text, nullable=True),
        sa.Column("hits", sa.JSON, nullable=True),
    )
    op.create_index(
        "turn_inspections_turn_idx",
        "turn_inspections",
        ["tenant_id", "principal_id", "conversation_id", "turn_id", "record_id"],
    )
    op.create_index("turn_inspections_time_idx", "turn_inspections", ["record_time"])
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    quote = bind.dialect.identifier_preparer.quote
    op.execute("ALTER TABLE turn_inspections ENABLE ROW LEVEL SECURITY")
    op.execute(
        "CREATE POLICY tenant_isolation ON turn_inspections "
        "USING (tenant_id = current_setting('app.tenant_id', true)) "
        "WITH CHECK (tenant_id = current_setting('app.tenant_id', true))"
    )
    op.execute(
        f"""
        CREATE FUNCTION memoria_purge_inspections(p_before timestamptz, p_limit integer)
        RETURNS integer
        LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {quote(schema)} AS $$
        DECLARE
            removed integer;
        BEGIN
            DELETE FROM turn_inspections WHERE record_id IN (
                SELECT i.record_id FROM turn_inspections i
                 WHERE i.record_time < p_before
                 ORDER BY i.record_time
                 LIMIT p_limit
                 FOR UPDATE SKIP LOCKED);
            GET DIAGNOSTICS removed = ROW_COUNT;
            RETURN removed;
        END
        $$
        """
    )
    op.execute(f"REVOKE ALL ON FUNCTION {FUNCTION} FROM PUBLIC")
    if app_role:
        role = quote(app_role)
        op.execute(f"GRANT SELECT, INSERT, DELETE ON turn_inspections TO {role}")
        op.execute(f"GRANT USAGE ON SEQUENCE turn_inspections_record_id_seq TO {role}")
        op.execute(f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {role}")


def downgrade(app_role: str | None = None) -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {FUNCTION}")
    op.drop_table("turn_inspections")
