"""The bounds a recorded search was made with: `turn_inspections.bounds`.

A search may be bounded to one conversation and a span of turn times (SearchConversations'
`conversation_id`, `start_time`, `end_time`). The inspector showed a turn's searches without
them, so a person reading "searched for X: 0 found" could not tell that the model had looked
in one conversation or one week only. The bounds are kept with the search's record as JSON
(`{"c": conversation id, "s": start, "e": end}`, times in microseconds since the epoch, each
key only when set), NULL for a search without bounds and for every record written before this
revision. Ids and times only: no text of any turn. The column is nullable and has no default,
so adding it rewrites nothing (PostgreSQL; on Citus the ALTER is carried to every shard).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade(app_role: str | None = None) -> None:
    op.add_column("turn_inspections", sa.Column("bounds", sa.JSON(), nullable=True))


def downgrade(app_role: str | None = None) -> None:
    op.drop_column("turn_inspections", "bounds")
