"""Memory blocks, memory settings and the audit log, with tenant row-level security.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(256)


def upgrade(app_role: str | None = None) -> None:
    op.create_table(
        "memory_blocks",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("principal_id", ID, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("etag", sa.String(64), nullable=False),
        sa.Column("update_time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "principal_id", name="memory_blocks_pkey"),
    )
    op.create_table(
        "memory_settings",
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("principal_id", ID, nullable=False),
        sa.Column("memory_enabled", sa.Boolean, nullable=False),
        sa.Column("update_time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "principal_id", name="memory_settings_pkey"),
    )
    op.create_table(
        "audit_events",
        sa.Column(
            "event_id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("tenant_id", ID, nullable=False),
        sa.Column("principal_id", ID, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("writer", sa.String(16), nullable=False),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("removed_lines", sa.JSON, nullable=False),
        sa.Column("added_lines", sa.JSON, nullable=False),
        sa.Column("removed_line_count", sa.Integer, nullable=False),
        sa.Column("added_line_count", sa.Integer, nullable=False),
        sa.Column("char_count", sa.Integer, nullable=False),
        sa.Column("memory_enabled", sa.Boolean, nullable=True),
    )
    op.create_index(
        "audit_events_principal_idx", "audit_events", ["tenant_id", "principal_id", "event_id"]
    )
    op.create_index("audit_events_tenant_idx", "audit_events", ["tenant_id", "event_id"])

    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ("memory_blocks", "memory_settings", "audit_events"):
        # FORCE: the policy binds the table owner too, so only a superuser or a BYPASSRLS role
        # (never the service) can see across tenants.
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} "
            "USING (tenant_id = current_setting('app.tenant_id', true)) "
            "WITH CHECK (tenant_id = current_setting('app.tenant_id', true))"
        )
    if app_role:
        role = op.get_bind().dialect.identifier_preparer.quote(app_role)
        op.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON memory_blocks, memory_settings TO {role}"
        )
        # Append-only for the service: no UPDATE, no DELETE on the audit log.
        op.execute(f"GRANT SELECT, INSERT ON audit_events TO {role}")
        op.execute(f"GRANT USAGE ON SEQUENCE audit_events_event_id_seq TO {role}")
        # The server checks at start that the schema is current.
        op.execute(f"GRANT SELECT ON alembic_version TO {role}")


def downgrade(app_role: str | None = None) -> None:
    op.drop_table("audit_events")
    op.drop_table("memory_settings")
    op.drop_table("memory_blocks")
