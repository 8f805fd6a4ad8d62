"""The turn a write was made in: `audit_events.turn_conversation_id` and `turn_id`.

A rewrite may name the turn it is made in (RewriteMemoryBlockRequest.turn, and every write of
ModelToolService.ExecuteToolCall); its audit event records the turn's conversation and turn
ids, so GetTurnInspection shows what the turn wrote, read from the audit log: deleting the
block blanks those lines there, so no second copy of deleted content exists. Empty for events
that name no turn (every event written before this revision). The index serves that read,
one turn of one principal.

The columns extend `audit_events`' row type, which `memoria_write()` (0009) takes whole, so
PostgreSQL's write path stores them with no change to the function.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

ID = sa.String(256)


def upgrade(app_role: str | None = None) -> None:
    op.add_column(
        "audit_events",
        sa.Column("turn_conversation_id", ID, nullable=False, server_default=""),
    )
    op.add_column(
        "audit_events",
        sa.Column("turn_id", ID, nullable=False, server_default=""),
    )
    op.create_index(
        "audit_events_turn_idx",
        "audit_events",
        ["tenant_id", "principal_id", "turn_conversation_id", "turn_id", "event_id"],
    )


def downgrade(app_role: str | None = None) -> None:
    op.drop_index("audit_events_turn_idx", table_name="audit_events")
    op.drop_column("audit_events", "turn_id")
    op.drop_column("audit_events", "turn_conversation_id")
