"""The turn queue (outbox) and conversation tombstones, in SQLite or PostgreSQL.

Claims differ by engine, behind one interface (`TurnStore` in server/domain/ports.py):

- PostgreSQL: a claim is a transaction that locks the claimed rows (`FOR UPDATE SKIP LOCKED`
  through `memoria_claim_turns`, migration 0005) until the processor has written the chunks
  and marked the turns indexed. Several processes share the queue without taking the same
  turn. A processor that dies mid-turn loses its connection, PostgreSQL rolls the claim back
  and the turn is claimed again (point ids are deterministic, so no chunk is duplicated). A
  re-send, a conversation delete or an erasure that touches a claimed turn waits for the
  claim, so the index can never end up holding a stale or deleted turn.
- SQLite (the embedded default, one process): processors take turns on one lock
  (`SqlDatabase.processing`); a re-send
  bumps the turn's version, and a processor that finishes an old version leaves the new one
  queued. A deleted conversation's purge runs on the same lock, after any processing of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, case, func, literal, null, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from server.adapters.sql.cache import ExactCache
from server.adapters.sql.database import SqlDatabase, as_utc, scope_to_tenant, store_errors
from server.adapters.sql.engine import WRITE_OPTION
from server.adapters.sql.tables import conversation_tombstones, conversation_turns
from server.domain.model import (
    ClaimedTurn,
    ConversationPurge,
    ConversationSummary,
    ExpiryCutoffs,
    ListCursor,
    StoredTurn,
    Tombstone,
    TurnKey,
)

_t, _z = conversation_turns, conversation_tombstones
PENDING, INDEXED, FAILED = "pending", "indexed", "failed"

_TURN_COLUMNS = (
    _t.c.turn_row_id,
    _t.c.version,
    _t.c.tenant_id,
    _t.c.principal_id,
    _t.c.conversation_id,
    _t.c.turn_id,
    _t.c.text,
    _t.c.turn_time,
    _t.c.attempts,
    _t.c.status,
)
_CLAIM_PG = text("SELECT turn_row_id, tenant_id FROM memoria_claim_turns(:limit, :now)")
_DELETED_CONVERSATIONS_PG = "SELECT memoria_deleted_conversations(%s, %s)"
# Citus (migration 0014): the owner's functions name the tenants with due work; the service
# claims each tenant's rows itself (a claim by the owner and an update by the service in one
# transaction deadlock there, on two connections to one shard).
_DUE_TENANTS_CITUS = text("SELECT tenant_id FROM memoria_due_tenants(:limit, :now)")
_PURGING_TENANTS_CITUS = text("SELECT tenant_id FROM memoria_purging_tenants(:limit)")
_CLAIM_PURGES_PG = text(
    "SELECT tenant_id, principal_id, conversation_id FROM memoria_claim_purges(:limit)"
)
_EXPIRED_PRINCIPALS_PG = text(
    "SELECT tenant_id, principal_id FROM memoria_expired_principals("
    "CAST(:latest AS timestamptz), CAST(:default AS timestamptz), CAST(:tenants AS text[]), "
    "CAST(:cutoffs AS timestamptz[]), CAST(:limit AS integer))"
)
_OUTBOX_STATS_PG = "SELECT pending, oldest_accept_time FROM memoria_outbox_stats()"
_OUTBOX_STATS = select(func.count(), func.min(_t.c.accept_time)).where(_t.c.status == PENDING)


@dataclass(frozen=True)
class OutboxStats:
    """Turns waiting in the outbox (`status = 'pending'`), and when the oldest was accepted."""

    pending: int
    oldest_accept_time: datetime | None


def _upsert_turn(dialect: Any) -> Any:
    stmt = dialect.insert(_t)
    return stmt.on_conflict_do_update(
        index_elements=["tenant_id", "principal_id", "conversation_id", "turn_id"],
        set_={
            "version": _t.c.version + 1,
            "status": PENDING,
            "text": stmt.excluded.text,
            "turn_time": stmt.excluded.turn_time,
            "accept_time": stmt.excluded.accept_time,
            "due_time": stmt.excluded.due_time,
            "attempts": 0,
            "last_error": None,
            "question_opening": stmt.excluded.question_opening,
        },
    )


_UPSERT_TURN = {"postgresql": _upsert_turn(postgresql), "sqlite": _upsert_turn(sqlite)}


def upsert_turn_statement(dialect_name: str) -> Any:
    """Insert a turn, or replace a queued or indexed one: new text, next version, queued
    (the unit of work's `turns.put`, server/adapters/sql/unit_of_work.py)."""
    return _UPSERT_TURN[dialect_name]


class SqlTurnStore:
    """`TurnStore` and `ConversationListing` on the database the memory blocks are in."""

    def __init__(self, db: SqlDatabase, *, deleted_cache_entries: int = 50_000) -> None:
        self._db = db
        self._engine = db.engine
        self._postgres = db.postgres
        # SQLite: this process is the only writer, so the search path's read of deleted
        # conversations is cached exactly (invalidated when a delete, purge or erasure
        # commits). PostgreSQL: one statement per search, never cached, because another
        # replica's delete must hide the conversation from this one's next search at once.
        self._deleted: ExactCache[tuple[str, str], frozenset[str]] | None = (
            None if self._postgres else ExactCache(max_entries=deleted_cache_entries)
        )
        db.on_deletion_change(self._changed_deletions)

    @contextmanager
    def claim(self, limit: int, now: datetime, only: TurnKey | None = None) -> Iterator[_Batch]:
        """See `TurnStore.claim`."""
        with store_errors(), self._db.processing or nullcontext(), self._engine.connect() as conn:
            if self._postgres:
                with conn.begin():
                    turns = self._claim_pg(conn, limit, now, only)
                    batch = _Batch(conn, turns, True, citus=self._db.citus)
                    yield batch
                return
            with conn.begin():
                turns = _claim_sqlite(conn, limit, now, only)
            batch = _Batch(conn, turns, False, citus=False)
            yield batch

    def _claim_pg(
        self, conn: Connection, limit: int, now: datetime, only: TurnKey | None
    ) -> list[ClaimedTurn]:
        if only is not None:
            scope_to_tenant(conn, only.tenant_id, citus=self._db.citus)
            return _rows(conn, _key_query(only).with_for_update())
        if self._db.citus:
            return self._claim_citus(conn, limit, now)
        by_tenant: dict[str, list[int]] = {}
        for row_id, tenant in conn.execute(_CLAIM_PG, {"limit": limit, "now": now}):
            by_tenant.setdefault(tenant, []).append(row_id)
        turns: list[ClaimedTurn] = []
        for tenant, row_ids in by_tenant.items():
            # Read each turn under its own tenant's scope: row-level security still applies.
            scope_to_tenant(conn, tenant, citus=self._db.citus)
            # The tenant predicate routes the read to the tenant's shard on Citus.
            stmt = select(*_TURN_COLUMNS).where(
                _t.c.tenant_id == tenant, _t.c.turn_row_id.in_(row_ids)
            )
            turns += _rows(conn, stmt)
        return turns

    def _claim_citus(self, conn: Connection, limit: int, now: datetime) -> list[ClaimedTurn]:
        """Citus: the tenants with due turns, then each one's oldest due turns claimed (FOR
        UPDATE SKIP LOCKED, on the tenant's shard) under its own scope, until `limit`."""
        tenants = conn.execute(_DUE_TENANTS_CITUS, {"limit": limit, "now": now}).scalars().all()
        turns: list[ClaimedTurn] = []
        for tenant in tenants:
            scope_to_tenant(conn, tenant, citus=True)
            stmt = (
                select(*_TURN_COLUMNS)
                .where(_t.c.tenant_id == tenant, _t.c.status == PENDING, _t.c.due_time <= now)
                .order_by(_t.c.due_time)
                .limit(limit - len(turns))
                .with_for_update(skip_locked=True)
            )
            turns += _rows(conn, stmt)
            if len(turns) >= limit:
                break
        return turns

    def _claim_purges_citus(self, conn: Connection, limit: int) -> list[ConversationPurge]:
        """Citus: the tenants with tombstones to purge, then each one's claimed under its
        own scope, oldest first, until `limit`."""
        tenants = conn.execute(_PURGING_TENANTS_CITUS, {"limit": limit}).scalars().all()
        purges: list[ConversationPurge] = []
        for tenant in tenants:
            scope_to_tenant(conn, tenant, citus=True)
            stmt = (
                select(_z.c.tenant_id, _z.c.principal_id, _z.c.conversation_id)
                .where(_z.c.tenant_id == tenant, _z.c.purge_time.is_(None))
                .order_by(_z.c.delete_time)
                .limit(limit - len(purges))
                .with_for_update(skip_locked=True)
            )
            purges += [ConversationPurge(*row) for row in conn.execute(stmt)]
            if len(purges) >= limit:
                break
        return purges

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        """See `TurnStore.deleted_conversations`."""
        if self._deleted is None:
            (names,) = self._db.call(
                _DELETED_CONVERSATIONS_PG, (tenant_id, principal_id), tenant=tenant_id
            )
            return frozenset(names)

        def load() -> frozenset[str]:
            stmt = select(_z.c.conversation_id).where(
                _z.c.tenant_id == tenant_id,
                _z.c.principal_id == principal_id,
                _z.c.purge_time.is_(None),
            )
            with self._db.transaction(tenant_id) as tx:
                return frozenset(tx.connection.execute(stmt).scalars())

        return self._deleted.get((tenant_id, principal_id), load)

    def outbox_stats(self) -> OutboxStats:
        """Pending turns of every tenant and the oldest one's accept time, for the outbox
        gauges (PostgreSQL: `memoria_outbox_stats()`, migration 0006, since row-level security
        confines the service role to one tenant). One aggregate over the pending turns' index."""
        if self._postgres:
            pending, oldest = self._db.call(_OUTBOX_STATS_PG, ())
        else:
            with store_errors(), self._engine.connect() as conn:
                pending, oldest = conn.execute(_OUTBOX_STATS).one()
        return OutboxStats(int(pending), None if oldest is None else as_utc(oldest))

    def _changed_deletions(self, tenant_id: str, principal_id: str) -> None:
        """After a commit that changed the principal's tombstones."""
        if self._deleted is not None:
            self._deleted.invalidate((tenant_id, principal_id))

    @contextmanager
    def claim_purges(self, limit: int) -> Iterator[list[ConversationPurge]]:
        """See `TurnStore.claim_purges`."""
        with store_errors(), self._db.processing or nullcontext(), self._engine.connect() as conn:
            if self._postgres:
                with conn.begin():
                    if self._db.citus:
                        purges = self._claim_purges_citus(conn, limit)
                    else:
                        rows = conn.execute(_CLAIM_PURGES_PG, {"limit": limit})
                        purges = [ConversationPurge(*row) for row in rows]
                    yield purges
                    _mark_purged(conn, purges, set_tenant=True, citus=self._db.citus)
                return
            with conn.begin():
                stmt = (
                    select(_z.c.tenant_id, _z.c.principal_id, _z.c.conversation_id)
                    .where(_z.c.purge_time.is_(None))
                    .order_by(_z.c.delete_time)
                    .limit(limit)
                )
                purges = [ConversationPurge(*row) for row in conn.execute(stmt)]
            yield purges
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                _mark_purged(conn, purges, set_tenant=False, citus=False)
            for purge in purges:
                self._db.deletions_changed(purge.tenant_id, purge.principal_id)

    def expired_principals(self, cutoffs: ExpiryCutoffs, limit: int) -> list[tuple[str, str]]:
        """See `TurnStore.expired_principals` (PostgreSQL: `memoria_expired_principals`,
        migration 0013, which may cross tenants; the service role cannot). Both engines first
        narrow to turns before the latest cutoff (an index range on turn_time), then compare
        each turn with its own tenant's cutoff."""
        latest = max(
            (c for c in (cutoffs.default, *(c for _, c in cutoffs.tenants)) if c is not None),
            default=None,
        )
        if latest is None:
            return []
        if self._postgres:
            params = {
                "latest": latest,
                "default": cutoffs.default,
                "tenants": [tenant for tenant, _ in cutoffs.tenants],
                "cutoffs": [cutoff for _, cutoff in cutoffs.tenants],
                "limit": limit,
            }
            with store_errors(), self._engine.connect() as conn, conn.begin():
                rows = conn.execute(_EXPIRED_PRINCIPALS_PG, params).all()
        else:
            default = null() if cutoffs.default is None else literal(cutoffs.default)
            own = (
                case(
                    *(
                        (_t.c.tenant_id == tenant, null() if cutoff is None else literal(cutoff))
                        for tenant, cutoff in cutoffs.tenants
                    ),
                    else_=default,
                )
                if cutoffs.tenants
                else default
            )
            stmt = (
                select(_t.c.tenant_id, _t.c.principal_id)
                .where(_t.c.turn_time < latest, _t.c.turn_time < own)
                .distinct()
                .limit(limit)
            )
            with store_errors(), self._engine.connect() as conn:
                rows = conn.execute(stmt).all()
        return [(str(tenant), str(principal)) for tenant, principal in rows]

    def list_turns(
        self,
        tenant_id: str,
        principal_id: str,
        after_row_id: int,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        """See `TurnStore.list_turns`."""
        stmt = (
            select(_t.c.turn_row_id, _t.c.conversation_id, _t.c.turn_id, _t.c.turn_time)
            .add_columns(_t.c.text, _t.c.status)
            .where(
                _t.c.tenant_id == tenant_id,
                _t.c.principal_id == principal_id,
                _t.c.turn_row_id > after_row_id,
            )
            .order_by(_t.c.turn_row_id)
            .limit(limit)
        )
        if since is not None:
            stmt = stmt.where(_t.c.turn_time >= since)
        with self._db.transaction(tenant_id) as tx:
            return _stored(tx.connection.execute(stmt).all())

    def list_conversations(
        self,
        tenant_id: str,
        principal_id: str,
        after: ListCursor | None,
        limit: int,
        since: datetime | None = None,
    ) -> list[ConversationSummary]:
        """See `ConversationListing.list_conversations`: one grouping of the principal's rows
        over conversation_turns_conversation_idx, the page's openings one index probe each."""
        last_time = func.max(_t.c.turn_time)
        last_row = func.max(_t.c.turn_row_id)
        grouped = (
            select(
                _t.c.conversation_id,
                func.min(_t.c.turn_time).label("first_time"),
                last_time.label("last_time"),
                func.count().label("turn_count"),
                last_row.label("last_row"),
            )
            .where(_t.c.tenant_id == tenant_id, _t.c.principal_id == principal_id)
            .group_by(_t.c.conversation_id)
        )
        if since is not None:  # expired turns count for nothing (one range of the index)
            grouped = grouped.where(_t.c.turn_time >= since)
        if after is not None:
            grouped = grouped.having(
                or_(
                    last_time < after.time,
                    and_(last_time == after.time, last_row < after.row_id),
                )
            )
        page = grouped.order_by(last_time.desc(), last_row.desc()).limit(limit).subquery("page")
        first = _t.alias("first")
        opening = (
            select(first.c.question_opening)
            .where(
                first.c.tenant_id == tenant_id,
                first.c.principal_id == principal_id,
                first.c.conversation_id == page.c.conversation_id,
                first.c.turn_time == page.c.first_time,
            )
            .order_by(first.c.turn_time, first.c.turn_row_id)
            .limit(1)
            .scalar_subquery()
        )
        stmt = select(page, opening).order_by(page.c.last_time.desc(), page.c.last_row.desc())
        with self._db.transaction(tenant_id) as tx:
            rows = tx.connection.execute(stmt).all()
        return [
            ConversationSummary(
                conversation_id=conversation,
                first_turn_time=as_utc(first_time),
                last_turn_time=as_utc(last),
                turn_count=int(count),
                first_question_opening=text_ or "",
                cursor=ListCursor(as_utc(last), int(row)),
            )
            for conversation, first_time, last, count, row, text_ in rows
        ]

    def list_conversation_turns(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        after: ListCursor | None,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        """See `ConversationListing.list_conversation_turns` (one range of the index)."""
        stmt = (
            select(_t.c.turn_row_id, _t.c.conversation_id, _t.c.turn_id, _t.c.turn_time)
            .add_columns(_t.c.text, _t.c.status)
            .where(
                _t.c.tenant_id == tenant_id,
                _t.c.principal_id == principal_id,
                _t.c.conversation_id == conversation_id,
            )
            .order_by(_t.c.turn_time, _t.c.turn_row_id)
            .limit(limit)
        )
        if after is not None:
            stmt = stmt.where(
                or_(
                    _t.c.turn_time > after.time,
                    and_(_t.c.turn_time == after.time, _t.c.turn_row_id > after.row_id),
                )
            )
        if since is not None:
            stmt = stmt.where(_t.c.turn_time >= since)
        with self._db.transaction(tenant_id) as tx:
            return _stored(tx.connection.execute(stmt).all())

    def list_tombstones(
        self, tenant_id: str, principal_id: str, offset: int, limit: int
    ) -> list[Tombstone]:
        """See `TurnStore.list_tombstones`."""
        stmt = (
            select(_z.c.conversation_id, _z.c.delete_time)
            .where(_z.c.tenant_id == tenant_id, _z.c.principal_id == principal_id)
            .order_by(_z.c.conversation_id)
            .offset(offset)
            .limit(limit)
        )
        with self._db.transaction(tenant_id) as tx:
            rows = tx.connection.execute(stmt).all()
        return [Tombstone(conversation, as_utc(when)) for conversation, when in rows]


class _Batch:
    """Claimed turns and how their processing ends (see `TurnBatch`)."""

    def __init__(
        self, conn: Connection, turns: Sequence[ClaimedTurn], postgres: bool, *, citus: bool
    ) -> None:
        self._conn = conn
        self._citus = citus
        self._turns = tuple(turns)
        self._postgres = postgres

    @property
    def turns(self) -> Sequence[ClaimedTurn]:
        return self._turns

    def indexed(self, turn: ClaimedTurn) -> None:
        self._finish(turn, status=INDEXED, text=None, attempts=0, last_error=None)

    def failed(self, turn: ClaimedTurn, error: str, retry_at: datetime | None) -> None:
        values: dict[str, Any] = {"attempts": turn.attempts + 1, "last_error": error[:200]}
        if retry_at is None:
            values["status"] = FAILED
        else:
            values["due_time"] = retry_at
        self._finish(turn, **values)

    def _finish(self, turn: ClaimedTurn, **values: Any) -> None:
        """Update the turn only if it is still the version processed (a re-sent turn stays
        queued with its new text)."""
        stmt = (
            update(_t)
            .where(
                _t.c.tenant_id == turn.key.tenant_id,
                _t.c.turn_row_id == turn.row_id,
                _t.c.version == turn.version,
            )
            .values(**values)
        )
        if self._postgres:  # inside the claim's transaction, under the turn's tenant
            scope_to_tenant(self._conn, turn.key.tenant_id, citus=self._citus)
            self._conn.execute(stmt)
            return
        self._conn.execution_options(**{WRITE_OPTION: True})  # BEGIN IMMEDIATE
        with self._conn.begin():
            self._conn.execute(stmt)


def _stored(rows: Sequence[Any]) -> list[StoredTurn]:
    """Rows of (row id, conversation, turn, time, text, status) as turns to read (the export,
    ListConversationTurns): an indexed turn's text is in the chunk index, not here."""
    return [
        StoredTurn(
            row_id=row_id,
            conversation_id=conversation,
            turn_id=turn,
            turn_time=as_utc(when),
            text=None if status == INDEXED else body,
            indexed=status == INDEXED,
        )
        for row_id, conversation, turn, when, body, status in rows
    ]


def _mark_purged(
    conn: Connection, purges: list[ConversationPurge], *, set_tenant: bool, citus: bool
) -> None:
    for purge in purges:
        if set_tenant:
            scope_to_tenant(conn, purge.tenant_id, citus=citus)
        conn.execute(
            update(_z)
            .where(
                _z.c.tenant_id == purge.tenant_id,
                _z.c.principal_id == purge.principal_id,
                _z.c.conversation_id == purge.conversation_id,
            )
            .values(purge_time=text("CURRENT_TIMESTAMP"))
        )


def _claim_sqlite(
    conn: Connection, limit: int, now: datetime, only: TurnKey | None
) -> list[ClaimedTurn]:
    if only is not None:
        return _rows(conn, _key_query(only))
    stmt = (
        select(*_TURN_COLUMNS)
        .where(_t.c.status == PENDING, _t.c.due_time <= now)
        .order_by(_t.c.due_time)
        .limit(limit)
    )
    return _rows(conn, stmt)


def _key_query(key: TurnKey) -> Any:
    return select(*_TURN_COLUMNS).where(
        _t.c.tenant_id == key.tenant_id,
        _t.c.principal_id == key.principal_id,
        _t.c.conversation_id == key.conversation_id,
        _t.c.turn_id == key.turn_id,
    )


def _rows(conn: Connection, stmt: Any) -> list[ClaimedTurn]:
    turns = []
    for row in conn.execute(stmt):
        (
            row_id,
            version,
            tenant,
            principal,
            conversation,
            turn_id,
            body,
            when,
            attempts,
            status,
        ) = row
        turns.append(
            ClaimedTurn(
                row_id=row_id,
                version=version,
                key=TurnKey(tenant, principal, conversation, turn_id),
                # An indexed turn keeps no text; a failed one is processed again when a
                # caller waits for it.
                text=None if status == INDEXED else body,
                turn_time=as_utc(when),
                attempts=attempts,
            )
        )
    return turns
