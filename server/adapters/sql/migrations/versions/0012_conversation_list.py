"""Listing conversations: `conversation_turns.question_opening` and an index by conversation.

ListConversations lists a principal's conversations, newest first, each with its first and
last turn time, turn count and the opening of its first question; ListConversationTurns reads
one conversation's turns in time order (server/domain/listing.py). A turn's text leaves the
queue once it is indexed, so the opening of its question (at most 100 characters, sanitized
and with credentials replaced) is a column of its own, kept with the row until the
conversation is deleted or the principal erased. Turns accepted before this revision have an
empty opening (their question is no longer held apart from the answer).

The index makes both reads index scans of the principal's own rows: the grouping by
conversation reads (conversation, time, row id) in order without the table, and a
conversation's turns are one range of it. Row-level security applies to both as to every read
of the table (the policy of 0005 covers the new column).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade(app_role: str | None = None) -> None:
    op.add_column(
        "conversation_turns",
        sa.Column("question_opening", sa.Text(), nullable=False, server_default=""),
    )
    op.create_index(
        "conversation_turns_conversation_idx",
        "conversation_turns",
        ["tenant_id", "principal_id", "conversation_id", "turn_time", "turn_row_id"],
    )


def downgrade(app_role: str | None = None) -> None:
    op.drop_index("conversation_turns_conversation_idx", table_name="conversation_turns")
    op.drop_column("conversation_turns", "question_opening")
