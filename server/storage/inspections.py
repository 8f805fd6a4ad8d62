"""The inspector's records in SQLite or PostgreSQL (`InspectionStore`, server/domain/ports.py).

A record is one row of `turn_inspections` (migration 0008), in the same database as the turn
queue, so a conversation's delete and a principal's erasure remove its records in their own
transactions (server/storage/turns.py). A record is written in one statement that also checks
the conversation's tombstone, so nothing is recorded for a deleted conversation. On
PostgreSQL the write takes no principal lock (it changes nothing a writer decides on); on
SQLite it queues on the store's one writer lock like every write.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Integer, String, Text, delete, exists, literal, select

from server.domain.model import (
    InspectedHit,
    RenderRecord,
    SearchRecord,
    TurnKey,
    TurnRecords,
)
from server.storage.chunk_index import from_epoch_micros, to_epoch_micros
from server.storage.sql import SqlMemoryStore, as_utc
from server.storage.tables import ID, conversation_tombstones, turn_inspections

_i, _z = turn_inspections, conversation_tombstones
RENDER, SEARCH = "render", "search"
_PURGE_PG = "SELECT memoria_purge_inspections(%s, %s)"
_COLUMNS = (
    "tenant_id",
    "principal_id",
    "conversation_id",
    "turn_id",
    "kind",
    "record_time",
    "etag",
    "char_count",
    "query",
    "hits",
)


class SqlInspectionStore:
    """`InspectionStore` over the memory store's engine."""

    def __init__(self, memory: SqlMemoryStore) -> None:
        self._memory = memory
        self._postgres = memory.engine.dialect.name == "postgresql"

    def record_render(self, key: TurnKey, record: RenderRecord) -> None:
        """See `InspectionStore.record_render`."""
        self._insert(key, RENDER, record.record_time, record.etag, record.char_count, None, None)

    def record_search(self, key: TurnKey, record: SearchRecord) -> None:
        """See `InspectionStore.record_search`."""
        hits = [_hit_json(h) for h in record.hits]
        self._insert(key, SEARCH, record.record_time, "", 0, record.query, hits)

    def _insert(
        self,
        key: TurnKey,
        kind: str,
        when: datetime,
        etag: str,
        char_count: int,
        query: str | None,
        hits: list[dict[str, Any]] | None,
    ) -> None:
        values = (
            literal(key.tenant_id, ID),
            literal(key.principal_id, ID),
            literal(key.conversation_id, ID),
            literal(key.turn_id, ID),
            literal(kind, String(8)),
            literal(when, DateTime(timezone=True)),
            literal(etag, String(64)),
            literal(char_count, Integer()),
            literal(query, Text()),
            literal(hits, JSON()),
        )
        deleted = exists().where(
            _z.c.tenant_id == key.tenant_id,
            _z.c.principal_id == key.principal_id,
            _z.c.conversation_id == key.conversation_id,
        )
        stmt = _i.insert().from_select(list(_COLUMNS), select(*values).where(~deleted))
        lock = None if self._postgres else key.principal_id
        with self._memory.transaction(key.tenant_id, lock_principal=lock, announce=False) as tx:
            tx.connection.execute(stmt)

    def read(self, key: TurnKey) -> TurnRecords:
        """See `InspectionStore.read`."""
        stmt = (
            select(_i.c.kind, _i.c.record_time, _i.c.etag, _i.c.char_count, _i.c.query, _i.c.hits)
            .where(
                _i.c.tenant_id == key.tenant_id,
                _i.c.principal_id == key.principal_id,
                _i.c.conversation_id == key.conversation_id,
                _i.c.turn_id == key.turn_id,
            )
            .order_by(_i.c.record_id)
        )
        renders: list[RenderRecord] = []
        searches: list[SearchRecord] = []
        with self._memory.transaction(key.tenant_id) as tx:
            rows = tx.connection.execute(stmt).all()
        for kind, when, etag, char_count, query, hits in rows:
            if kind == RENDER:
                renders.append(RenderRecord(etag, char_count, as_utc(when)))
            else:
                parsed = tuple(_hit_of(h) for h in hits or ())
                searches.append(SearchRecord(query or "", as_utc(when), parsed))
        return TurnRecords(tuple(renders), tuple(searches))

    def purge(self, before: datetime, limit: int) -> int:
        """See `InspectionStore.purge` (PostgreSQL: `memoria_purge_inspections`, which may
        cross tenants; the service role cannot)."""
        if self._postgres:
            (removed,) = self._memory.call(_PURGE_PG, (before, limit))
            return int(removed)
        expired = (
            select(_i.c.record_id)
            .where(_i.c.record_time < before)
            .order_by(_i.c.record_time)
            .limit(limit)
        )
        with self._memory.transaction("", lock_principal="", announce=False) as tx:
            return int(
                tx.connection.execute(delete(_i).where(_i.c.record_id.in_(expired))).rowcount
            )


def _hit_json(hit: InspectedHit) -> dict[str, Any]:
    """A hit as stored: ids, ranks, score and turn time (microseconds), no text."""
    return {
        "c": hit.conversation_id,
        "t": hit.turn_id,
        "i": hit.chunk_index,
        "w": to_epoch_micros(hit.turn_time),
        "s": hit.score,
        "k": hit.keyword_rank,
        "m": hit.semantic_rank,
    }


def _hit_of(data: dict[str, Any]) -> InspectedHit:
    return InspectedHit(
        conversation_id=data["c"],
        turn_id=data["t"],
        chunk_index=int(data["i"]),
        turn_time=from_epoch_micros(int(data["w"])),
        score=float(data["s"]),
        keyword_rank=int(data["k"]),
        semantic_rank=int(data["m"]),
    )
