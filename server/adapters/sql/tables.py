"""The relational schema: blocks, settings, audit events, the turn queue and tombstones.

Every table carries `tenant_id` first: on PostgreSQL row-level security restricts each
transaction to one tenant, and Citus can shard by it. The Alembic migrations create exactly
these tables; a test compares the two.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

metadata = MetaData()

ID = String(256)
"""Tenant and principal ids: opaque strings from the caller's identity."""

memory_blocks = Table(
    "memory_blocks",
    metadata,
    Column("tenant_id", ID, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("text", Text, nullable=False),
    Column("etag", String(64), nullable=False),
    Column("update_time", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("tenant_id", "principal_id", name="memory_blocks_pkey"),
)

memory_settings = Table(
    "memory_settings",
    metadata,
    Column("tenant_id", ID, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("memory_enabled", Boolean, nullable=False),
    Column("update_time", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("tenant_id", "principal_id", name="memory_settings_pkey"),
)

# SQLite gives INTEGER PRIMARY KEY columns their increasing rowid; PostgreSQL a bigint identity.
EVENT_ID = BigInteger().with_variant(Integer(), "sqlite")

audit_events = Table(
    "audit_events",
    metadata,
    Column("event_id", EVENT_ID, primary_key=True, autoincrement=True),
    Column("tenant_id", ID, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("action", String(32), nullable=False),
    Column("writer", String(16), nullable=False),
    Column("create_time", DateTime(timezone=True), nullable=False),
    Column("removed_lines", JSON, nullable=False),
    Column("added_lines", JSON, nullable=False),
    Column("removed_line_count", Integer, nullable=False),
    Column("added_line_count", Integer, nullable=False),
    Column("char_count", Integer, nullable=False),
    Column("memory_enabled", Boolean, nullable=True),
    Column("conversation_id", ID, nullable=False, server_default=""),
    Column("deleted_turn_count", Integer, nullable=False, server_default="0"),
    Column("actor_principal_id", ID, nullable=False, server_default=""),
    # The turn a rewrite was made in (empty when it named none), for GetTurnInspection.
    Column("turn_conversation_id", ID, nullable=False, server_default=""),
    Column("turn_id", ID, nullable=False, server_default=""),
    Index("audit_events_principal_idx", "tenant_id", "principal_id", "event_id"),
    Index("audit_events_tenant_idx", "tenant_id", "event_id"),
    Index(
        "audit_events_turn_idx",
        "tenant_id",
        "principal_id",
        "turn_conversation_id",
        "turn_id",
        "event_id",
    ),
)

conversation_turns = Table(
    "conversation_turns",
    metadata,
    Column("turn_row_id", EVENT_ID, primary_key=True, autoincrement=True),
    Column("tenant_id", ID, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("conversation_id", ID, nullable=False),
    Column("turn_id", ID, nullable=False),
    Column("version", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("text", Text, nullable=True),
    Column("turn_time", DateTime(timezone=True), nullable=False),
    Column("accept_time", DateTime(timezone=True), nullable=False),
    Column("due_time", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("last_error", String(200), nullable=True),
    # The opening of the question, kept after indexing: ListConversations' titles (0012).
    Column("question_opening", Text, nullable=False, server_default=""),
    UniqueConstraint(
        "tenant_id", "principal_id", "conversation_id", "turn_id", name="conversation_turns_key"
    ),
    # ListConversations and ListConversationTurns read a principal's turns from this index
    # alone: grouped by conversation, and one conversation's in time order (0012).
    Index(
        "conversation_turns_conversation_idx",
        "tenant_id",
        "principal_id",
        "conversation_id",
        "turn_time",
        "turn_row_id",
    ),
    # The retention purge finds expired turns of every tenant by time (0013).
    Index("conversation_turns_time_idx", "turn_time"),
    Index(
        "conversation_turns_due_idx",
        "due_time",
        postgresql_where=text("status = 'pending'"),
        sqlite_where=text("status = 'pending'"),
    ),
)
"""The turn queue (outbox): a turn's text waits here until it is indexed, then is dropped;
the row (its ids, time and question's opening) stays until the conversation is deleted."""

conversation_tombstones = Table(
    "conversation_tombstones",
    metadata,
    Column("tenant_id", ID, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("conversation_id", ID, nullable=False),
    Column("delete_time", DateTime(timezone=True), nullable=False),
    Column("purge_time", DateTime(timezone=True), nullable=True),
    PrimaryKeyConstraint(
        "tenant_id", "principal_id", "conversation_id", name="conversation_tombstones_pkey"
    ),
    Index(
        "conversation_tombstones_unpurged_idx",
        "delete_time",
        postgresql_where=text("purge_time IS NULL"),
        sqlite_where=text("purge_time IS NULL"),
    ),
)
"""Deleted conversations: filtered out of every search, and refused for new turns."""

turn_inspections = Table(
    "turn_inspections",
    metadata,
    Column("record_id", EVENT_ID, primary_key=True, autoincrement=True),
    Column("tenant_id", ID, nullable=False),
    Column("principal_id", ID, nullable=False),
    Column("conversation_id", ID, nullable=False),
    Column("turn_id", ID, nullable=False),
    Column("kind", String(8), nullable=False),
    Column("record_time", DateTime(timezone=True), nullable=False),
    Column("etag", String(64), nullable=False, server_default=""),
    Column("char_count", Integer, nullable=False, server_default="0"),
    Column("query", Text, nullable=True),
    Column("hits", JSON, nullable=True),
    Column("bounds", JSON, nullable=True),  # a search's, as given; NULL: none (0015)
    Index(
        "turn_inspections_turn_idx",
        "tenant_id",
        "principal_id",
        "conversation_id",
        "turn_id",
        "record_id",
    ),
    Index("turn_inspections_time_idx", "record_time"),
)
"""The inspector's records: per referenced turn, each render (etag, count) and each search
(query, hits as ids, ranks and scores; never their text). Removed with the conversation, with
erasure, and after the retention."""
