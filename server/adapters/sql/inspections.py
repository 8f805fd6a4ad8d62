"""The inspector's records in SQLite or PostgreSQL (`InspectionStore`, server/domain/ports.py).

A record is one row of `turn_inspections` (migration 0008), in the same database as the turn
queue, so a conversation's delete and a principal's erasure remove its records in their own
transactions (server/adapters/sql/turns.py). A record is written in one statement that also checks
the conversation's tombstone, so nothing is recorded for a deleted conversation. On
PostgreSQL the write takes no principal lock (it changes nothing a writer decides on); on
SQLite it queues on the store's one writer lock like every write.

`BufferedInspectionStore` takes the write off the render path: a render or search that names
its turn only appends the record to an in-process queue, and one background thread writes
what has queued, in one transaction per tenant. Measured with bench/bench_inspector.py on
SQLite: writing each record in the call made a render with a turn reference serve about
0.35-0.4 of a plain render's requests/s (bench/README.md has the buffered figure).
Reading a turn's records, deleting a conversation and erasing first wait until everything
recorded before has been written (`flush`), so this process never shows a stale inspection
nor leaves a record behind an erasure. Records still queued when the process dies are lost:
they are a diagnostic, not the person's data, and the calls they describe were answered.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, bindparam, delete, func, select, text

from server.adapters.qdrant.layout import from_epoch_micros, to_epoch_micros
from server.adapters.sql.database import SqlDatabase, as_utc
from server.adapters.sql.tables import turn_inspections
from server.domain.model import (
    InspectedHit,
    RenderRecord,
    SearchRecord,
    TurnKey,
    TurnRecords,
)

log = logging.getLogger(__name__)

_i = turn_inspections
RENDER, SEARCH, FAILED_WRITE = "render", "search", "failed"
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


@dataclass(frozen=True)
class FailedWrite:
    """A memory write made for a turn that failed: a row of kind "failed", so the per-turn cap
    of failed writes (server/domain/tool_calls.py) is counted where every replica reads it,
    and goes with the turn's other records (conversation delete, erasure, retention)."""

    record_time: datetime


Record = RenderRecord | SearchRecord | FailedWrite


class SqlInspectionStore:
    """`InspectionStore` on the memory store's database; each record written in the call."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db
        self._postgres = db.postgres
        self._insert = _insert(self._postgres)

    def record_render(self, key: TurnKey, record: RenderRecord) -> None:
        """See `InspectionStore.record_render`."""
        self.write([(key, record)])

    def record_search(self, key: TurnKey, record: SearchRecord) -> None:
        """See `InspectionStore.record_search`."""
        self.write([(key, record)])

    def record_failed_write(self, key: TurnKey, record_time: datetime) -> int:
        """See `InspectionStore.record_failed_write`."""
        self.write([(key, FailedWrite(record_time))])
        return self.failed_writes(key)

    def failed_writes(self, key: TurnKey) -> int:
        """See `InspectionStore.failed_writes`."""
        stmt = select(func.count()).where(*_turn_is(key), _i.c.kind == FAILED_WRITE)
        with self._db.transaction(key.tenant_id) as tx:
            return int(tx.connection.execute(stmt).scalar_one())

    def flush(self) -> None:
        """Nothing is buffered here."""

    def write(self, records: Sequence[tuple[TurnKey, Record]]) -> None:
        """Write records (skipping those of deleted conversations), one transaction per
        tenant among them."""
        by_tenant: dict[str, list[dict[str, Any]]] = {}
        for key, record in records:
            by_tenant.setdefault(key.tenant_id, []).append(_params(key, record))
        for tenant, params in by_tenant.items():
            # SQLite: any principal name takes the store's one writer lock.
            lock = None if self._postgres else "-"
            with self._db.transaction(tenant, lock_principal=lock) as tx:
                tx.connection.execute(self._insert, params)

    def read(self, key: TurnKey) -> TurnRecords:
        """See `InspectionStore.read`."""
        stmt = (
            select(_i.c.kind, _i.c.record_time, _i.c.etag, _i.c.char_count, _i.c.query, _i.c.hits)
            .where(*_turn_is(key))
            .order_by(_i.c.record_id)
        )
        renders: list[RenderRecord] = []
        searches: list[SearchRecord] = []
        failed = 0
        with self._db.transaction(key.tenant_id) as tx:
            rows = tx.connection.execute(stmt).all()
        for kind, when, etag, char_count, query, hits in rows:
            if kind == RENDER:
                renders.append(RenderRecord(etag, char_count, as_utc(when)))
            elif kind == FAILED_WRITE:
                failed += 1
            else:
                parsed = tuple(_hit_of(h) for h in hits or ())
                searches.append(SearchRecord(query or "", as_utc(when), parsed))
        return TurnRecords(tuple(renders), tuple(searches), failed)

    def purge(self, before: datetime, limit: int) -> int:
        """See `InspectionStore.purge` (PostgreSQL: `memoria_purge_inspections`, which may
        cross tenants; the service role cannot)."""
        if self._postgres:
            (removed,) = self._db.call(_PURGE_PG, (before, limit))
            return int(removed)
        expired = (
            select(_i.c.record_id)
            .where(_i.c.record_time < before)
            .order_by(_i.c.record_time)
            .limit(limit)
        )
        with self._db.transaction("", lock_principal="") as tx:
            return int(
                tx.connection.execute(delete(_i).where(_i.c.record_id.in_(expired))).rowcount
            )


_PG_TYPES = {
    "kind": "text",
    "record_time": "timestamptz",
    "char_count": "integer",
    "hits": "json",
}
"""PostgreSQL cannot infer a parameter's type in a SELECT list without a table: cast each."""


def _insert(postgres: bool) -> Any:
    """One record, inserted only when its conversation has no tombstone: one statement, so no
    deleted conversation gets a record, even one racing its deletion. Executed for a whole
    batch at once (executemany)."""

    def value(column: str) -> str:
        return f"CAST(:{column} AS {_PG_TYPES.get(column, 'text')})" if postgres else f":{column}"

    return text(
        f"""
        INSERT INTO turn_inspections ({", ".join(_COLUMNS)})
        SELECT {", ".join(value(c) for c in _COLUMNS)}
         WHERE NOT EXISTS (
            SELECT 1 FROM conversation_tombstones z
             WHERE z.tenant_id = {value("tenant_id")} AND z.principal_id = {value("principal_id")}
               AND z.conversation_id = {value("conversation_id")})
        """
    ).bindparams(
        bindparam("record_time", type_=DateTime(timezone=True)),
        bindparam("hits", type_=JSON()),
    )


def _turn_is(key: TurnKey) -> tuple[Any, ...]:
    """The conditions selecting one turn's records."""
    return (
        _i.c.tenant_id == key.tenant_id,
        _i.c.principal_id == key.principal_id,
        _i.c.conversation_id == key.conversation_id,
        _i.c.turn_id == key.turn_id,
    )


def _params(key: TurnKey, record: Record) -> dict[str, Any]:
    """The statement's parameters for one record."""
    if isinstance(record, RenderRecord):
        kind, etag, count, query, hits = RENDER, record.etag, record.char_count, None, None
    elif isinstance(record, FailedWrite):
        kind, etag, count, query, hits = FAILED_WRITE, "", 0, None, None
    else:
        kind, etag, count = SEARCH, "", 0
        query, hits = record.query, [_hit_json(h) for h in record.hits]
    return {
        "tenant_id": key.tenant_id,
        "principal_id": key.principal_id,
        "conversation_id": key.conversation_id,
        "turn_id": key.turn_id,
        "kind": kind,
        "record_time": record.record_time,
        "etag": etag,
        "char_count": count,
        "query": query,
        "hits": hits,
    }


class BufferedInspectionStore:
    """`InspectionStore` that writes records from one background thread, in batches.

    `record_*` only queue (a lock and an append); `flush` waits until every record queued
    before it is written; `read` flushes first. With more than `max_pending` records queued
    (the store is slow or down), a record is written in the call instead, so memory stays
    bounded and nothing is dropped silently. A batch that fails is logged and dropped (its
    calls were answered long ago; the store's outage is reported by health).
    """

    def __init__(
        self,
        inner: SqlInspectionStore,
        *,
        batch_size: int = 256,
        max_pending: int = 10_000,
        linger_s: float = 0.05,
    ) -> None:
        """`linger_s`: how long the writer lets records gather before writing a batch (unless
        the batch is full or someone flushes), so a busy server writes many per commit."""
        self._inner = inner
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._flushing = 0  # callers waiting in flush: write at once
        self._max_pending = max_pending
        self._queue: deque[tuple[TurnKey, Record]] = deque()
        self._cond = threading.Condition()
        self._queued = 0  # records ever queued
        self._done = 0  # records ever taken from the queue and written (or dropped)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="inspection-writer", daemon=True)
        self._thread.start()

    def record_render(self, key: TurnKey, record: RenderRecord) -> None:
        """See `InspectionStore.record_render`."""
        self._put(key, record)

    def record_search(self, key: TurnKey, record: SearchRecord) -> None:
        """See `InspectionStore.record_search`."""
        self._put(key, record)

    def record_failed_write(self, key: TurnKey, record_time: datetime) -> int:
        """See `InspectionStore.record_failed_write`: written in the call, never queued (the
        count must be there for the turn's next call, on whichever replica serves it)."""
        return self._inner.record_failed_write(key, record_time)

    def failed_writes(self, key: TurnKey) -> int:
        """See `InspectionStore.failed_writes` (failed writes are never queued: no flush)."""
        return self._inner.failed_writes(key)

    def _put(self, key: TurnKey, record: Record) -> None:
        with self._cond:
            if len(self._queue) < self._max_pending and not self._stopping:
                self._queue.append((key, record))
                self._queued += 1
                self._cond.notify_all()
                return
        self._inner.write([(key, record)])

    def flush(self) -> None:
        """Return once every record queued before this call is written."""
        with self._cond:
            target = self._queued
            self._flushing += 1
            self._cond.notify_all()
            try:
                self._cond.wait_for(lambda: self._done >= target or not self._thread.is_alive())
            finally:
                self._flushing -= 1

    def read(self, key: TurnKey) -> TurnRecords:
        """See `InspectionStore.read` (after a flush)."""
        self.flush()
        return self._inner.read(key)

    def purge(self, before: datetime, limit: int) -> int:
        """See `InspectionStore.purge`."""
        return self._inner.purge(before, limit)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stopping)
                if not self._queue:
                    return  # stopping, and everything is written
                # Let a batch gather (bounded by linger_s), unless it is full or awaited.
                self._cond.wait_for(
                    lambda: (
                        len(self._queue) >= self._batch_size or self._flushing > 0 or self._stopping
                    ),
                    timeout=self._linger_s,
                )
                batch = [
                    self._queue.popleft() for _ in range(min(len(self._queue), self._batch_size))
                ]
            try:
                self._inner.write(batch)
            except Exception as error:
                log.warning(
                    "dropped %d inspector records: the store failed (%s)",
                    len(batch),
                    type(error).__name__,
                )
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()


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
