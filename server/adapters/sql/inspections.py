"""The inspector's records in SQLite or PostgreSQL (`InspectionStore`, server/domain/ports.py).

A record is one row of `turn_inspections` (migration 0008), in the same database as the turn
queue, so a conversation's delete and a principal's erasure remove its records in their own
transactions (server/adapters/sql/turns.py). Records are inserted by a statement that also
checks each one's conversation tombstone, so nothing is recorded for a deleted conversation.
On PostgreSQL the write takes no principal lock (it changes nothing a writer decides on); on
SQLite it queues on the store's one writer lock like every write.

`BufferedInspectionStore` takes the write off the render path: a render or search that names
its turn only appends the record to an in-process deque, and one background thread writes
what has queued, one statement per tenant and batch. Measured with bench/bench_inspector.py
(bench/README.md, docs/decisions.md): writing each record in the call made a render with a
turn reference serve about 0.35-0.4 of a plain render's requests/s on SQLite; queued
behind a lock that woke the writer on every record, 0.53-0.9.
Reading a turn's records, deleting a conversation and erasing first wait until everything
recorded before has been written (`flush`), so this process never shows a stale inspection
nor leaves a record behind an erasure. Records still queued when the process dies are lost:
they are a diagnostic, not the person's data, and the calls they describe were answered.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, select

from server.adapters.qdrant.layout import from_epoch_micros, to_epoch_micros
from server.adapters.sql.database import SqlDatabase, as_utc
from server.adapters.sql.tables import turn_inspections
from server.adapters.thread_names import name_os_thread
from server.domain.model import (
    InspectedHit,
    RenderRecord,
    SearchBounds,
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
    "bounds",
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
        """Write records (skipping those of deleted conversations), one transaction and one
        statement per tenant among them."""
        self.write_rows([_row(key, record) for key, record in records])

    def write_rows(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """`write` of records already made rows (`_row`; the tenant first)."""
        by_tenant: dict[str, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_tenant.setdefault(row[0], []).append(row)
        for tenant, tenant_rows in by_tenant.items():
            # SQLite: any principal name takes the store's one writer lock.
            lock = None if self._postgres else "-"
            with self._db.transaction(tenant, lock_principal=lock) as tx:
                if self._postgres and self._db.citus:
                    _insert_citus(tx.connection, tenant, tenant_rows)
                else:
                    self._insert(tx.connection, tenant_rows)

    def read(self, key: TurnKey) -> TurnRecords:
        """See `InspectionStore.read`."""
        stmt = (
            select(
                _i.c.kind,
                _i.c.record_time,
                _i.c.etag,
                _i.c.char_count,
                _i.c.query,
                _i.c.hits,
                _i.c.bounds,
            )
            .where(*_turn_is(key))
            .order_by(_i.c.record_id)
        )
        renders: list[RenderRecord] = []
        searches: list[SearchRecord] = []
        failed = 0
        with self._db.transaction(key.tenant_id) as tx:
            rows = tx.connection.execute(stmt).all()
        for kind, when, etag, char_count, query, hits, bounds in rows:
            if kind == RENDER:
                renders.append(RenderRecord(etag, char_count, as_utc(when)))
            elif kind == FAILED_WRITE:
                failed += 1
            else:
                parsed = tuple(_hit_of(h) for h in hits or ())
                searches.append(SearchRecord(query or "", as_utc(when), parsed, _bounds_of(bounds)))
        return TurnRecords(tuple(renders), tuple(searches), failed)

    def purge(self, before: datetime, limit: int) -> int:
        """See `InspectionStore.purge` (PostgreSQL: `memoria_purge_inspections`, which may
        cross tenants; the service role cannot)."""
        if self._postgres:
            (removed,) = self._db.call(_PURGE_PG, (before, limit))  # crosses tenants
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


_SQLITE_ROWS = 1024
"""Most rows in one SQLite INSERT (11 parameters each; SQLite allows 32,766)."""


def _insert(postgres: bool) -> Callable[[Connection, list[tuple[Any, ...]]], None]:
    """How a batch of rows (`_row`) is inserted: each record only when its conversation has
    no tombstone, checked in the inserting statement itself, so no deleted conversation gets
    a record, even one racing its deletion.

    A batch is one statement (SQLite: statements of a power of two rows, at most
    `_SQLITE_ROWS`), sent to the driver as it is (`exec_driver_sql`). Measured on the writer
    thread (docs/decisions.md): SQLAlchemy's per-row parameter processing cost more than the
    database did; psycopg's executemany sends a statement per row; sqlite3's executemany steps
    once per row and releases the GIL around every step, each release a hand-off to a waiting
    request thread and a wait to get it back. PostgreSQL gets the batch as ONE parameter, a JSON
    array of rows (one `json.dumps`, in C) that jsonb unpacks once; SQLite as the rows of one
    VALUES list (bound in C; its JSON functions parse the text again for every field read)."""
    columns = ", ".join(_COLUMNS)
    if postgres:
        casts = {5: "timestamptz", 7: "integer", 9: "json", 10: "json"}
        picked = ", ".join(
            f"CAST(r.v ->> {i} AS {casts[i]})" if i in casts else f"r.v ->> {i}"
            for i in range(len(_COLUMNS))
        )
        pg_sql = f"""
            INSERT INTO turn_inspections ({columns})
            SELECT {picked} FROM jsonb_array_elements(CAST(%s AS jsonb)) AS r(v)
             WHERE NOT EXISTS (
                SELECT 1 FROM conversation_tombstones z
                 WHERE z.tenant_id = r.v ->> 0 AND z.principal_id = r.v ->> 1
                   AND z.conversation_id = r.v ->> 2)
            """

        time_text = TimeText(with_offset=True)

        def insert_pg(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
            values = _flat(rows, time_text)
            width = len(_COLUMNS)
            batch = [values[i : i + width] for i in range(0, len(values), width)]
            conn.exec_driver_sql(pg_sql, (json.dumps(batch),))

        return insert_pg

    # SQLite keeps a time as text in SQLAlchemy's format (TimeText writes the same), so rows
    # read back (and compare in `purge`) as every other writer's.
    time_text = TimeText(with_offset=False)
    values = "(" + ", ".join("?" for _ in _COLUMNS) + ")"

    @functools.cache
    def sqlite_sql(count: int) -> str:
        return f"""
            INSERT INTO turn_inspections ({columns})
            SELECT * FROM (VALUES {", ".join(values for _ in range(count))}) AS r
             WHERE NOT EXISTS (
                SELECT 1 FROM conversation_tombstones z
                 WHERE z.tenant_id = r.column1 AND z.principal_id = r.column2
                   AND z.conversation_id = r.column3)
            """

    def insert_sqlite(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
        params = _flat(rows, time_text)
        width = len(_COLUMNS)
        start = 0
        while start < len(rows):
            # Statements of a power of two rows, so few distinct ones are ever prepared
            # (the driver caches them by text) however the batches fall.
            count = min(_SQLITE_ROWS, 1 << ((len(rows) - start).bit_length() - 1))
            chunk = params[start * width : (start + count) * width]
            start += count
            conn.exec_driver_sql(sqlite_sql(count), tuple(chunk))

    return insert_sqlite


_TIME_COLUMN = _COLUMNS.index("record_time")


def _flat(rows: Sequence[tuple[Any, ...]], time_text: TimeText) -> list[Any]:
    """The rows' values in one list, row after row, each record time as its text.

    This runs on the writer thread holding the GIL, which the request threads wait for: a
    flattening and a slice assignment run in C, where a comprehension rebuilding each row
    cost about 0.8 us a record and SQLAlchemy's time conversion 1.5 (measured in process;
    docs/decisions.md)."""
    values = list(itertools.chain.from_iterable(rows))
    width = len(_COLUMNS)
    values[_TIME_COLUMN::width] = map(time_text, values[_TIME_COLUMN::width])
    return values


class TimeText:
    """A record time as the text a batch sends: SQLAlchemy's SQLite format
    (``YYYY-MM-DD HH:MM:SS.ffffff`` of the fields as given, the zone ignored, as SQLAlchemy
    does), and for PostgreSQL the same followed by the time's UTC offset (``+0000``).

    The text up to the second is kept for the last second seen: the records of one batch
    fall within a second or so, so most records only format their microseconds (0.36 us
    against SQLAlchemy's 1.5 and `isoformat`'s 1.0, measured). Key and text are kept as one
    tuple, replaced whole, so a record written in a request thread (a full queue) while the
    writer formats another can never pair one second's key with another's text."""

    __slots__ = ("_last", "_with_offset")

    def __init__(self, *, with_offset: bool) -> None:
        self._with_offset = with_offset
        self._last: tuple[tuple[Any, ...], str, str] = ((), "", "")

    def __call__(self, moment: datetime) -> str:
        """`moment` as text (see the class)."""
        key = (
            moment.year,
            moment.month,
            moment.day,
            moment.hour,
            moment.minute,
            moment.second,
            moment.tzinfo,
            moment.fold,  # the same wall time twice in a zone's autumn: two offsets
        )
        last = self._last
        if last[0] != key:
            year, month, day, hour, minute, second = key[:6]
            prefix = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}."
            offset = moment.strftime("%z") if self._with_offset else ""
            last = self._last = (key, prefix, offset)
        return f"{last[1]}{moment.microsecond:06d}{last[2]}"


def _turn_is(key: TurnKey) -> tuple[Any, ...]:
    """The conditions selecting one turn's records."""
    return (
        _i.c.tenant_id == key.tenant_id,
        _i.c.principal_id == key.principal_id,
        _i.c.conversation_id == key.conversation_id,
        _i.c.turn_id == key.turn_id,
    )


_TOMBSTONED = (
    "SELECT principal_id, conversation_id FROM conversation_tombstones "
    "WHERE tenant_id = %s AND principal_id = ANY(%s) AND conversation_id = ANY(%s)"
)


def _insert_citus(conn: Connection, tenant: str, rows: list[tuple[Any, ...]]) -> None:
    """Citus: the batch of one tenant's rows as one multi-row INSERT ... VALUES, after one read
    of the batch's tombstones, both routed to the tenant's shard by the tenant predicate.

    PostgreSQL's one statement (`_insert`) cannot run there: Citus cannot plan its NOT EXISTS,
    correlated with rows from a function, against a distributed table, and it runs an
    INSERT ... SELECT from a function as a COPY, which a table with row-level security refuses.
    The check and the insert are two statements here, so a deletion committed between them
    leaves the few records of that batch: the inspector never shows a deleted conversation's
    turn (`TurnInspector.inspect`), and retention removes them."""
    principals = sorted({row[1] for row in rows})
    conversations = sorted({row[2] for row in rows})
    gone = set(
        (row[0], row[1])
        for row in conn.exec_driver_sql(_TOMBSTONED, (tenant, principals, conversations))
    )
    kept = [row for row in rows if (row[1], row[2]) not in gone]
    if not kept:
        return
    values = ", ".join(["(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"] * len(kept))
    sql = f"INSERT INTO turn_inspections ({', '.join(_COLUMNS)}) VALUES {values}"
    conn.exec_driver_sql(sql, tuple(value for row in kept for value in row))


def _row(key: TurnKey, record: Record) -> tuple[Any, ...]:
    """One record's values in the order of `_COLUMNS`; a search's hits and bounds as JSON text
    (no text of the turns, see `_hit_json` and `_bounds_json`), None for a record that has
    none."""
    bounds = None
    if isinstance(record, RenderRecord):
        kind, etag, count, query, hits = RENDER, record.etag, record.char_count, None, None
    elif isinstance(record, FailedWrite):
        kind, etag, count, query, hits = FAILED_WRITE, "", 0, None, None
    else:
        kind, etag, count = SEARCH, "", 0
        query, hits = record.query, json.dumps([_hit_json(h) for h in record.hits])
        bounds = _bounds_json(record.bounds)
    return (
        key.tenant_id,
        key.principal_id,
        key.conversation_id,
        key.turn_id,
        kind,
        record.record_time,
        etag,
        count,
        query,
        hits,
        bounds,
    )


class _Flushed:
    """A flush's place in the queue: set once every record queued before it is written."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = threading.Event()


class BufferedInspectionStore:
    """`InspectionStore` that writes records from one background thread, in batches.

    `record_*` only append the record's row to a deque: no lock, no notification, and nothing
    else runs on the caller's thread. The row is a tuple of plain values, which the garbage
    collector stops tracking at its first pass; queued as the domain's objects, the records of a
    quarter second (the linger) were traversed by every collection until written (measured in
    process: 10.6% of the calling thread in the collector, 4.4% as rows). The writer sleeps
    until the first record after an idle spell wakes it (one `Event.set` per batch, not per
    record), lets a batch gather for `linger_s` and writes everything queued. Before, every
    record took the queue's lock and notified the writer, which woke on every call to find its
    batch not yet full: at 1 in flight that hand-off cost a render more than the write itself
    (docs/decisions.md). `flush` queues a marker and waits until the writer has written
    everything before it; `read` flushes first. With `max_pending` records queued (the store is
    slow or down), a record is written in the call instead, so memory stays bounded and nothing
    is dropped silently. A batch that fails is logged and dropped (its calls were answered long
    ago; the store's outage is reported by health).
    """

    def __init__(
        self,
        inner: SqlInspectionStore,
        *,
        batch_size: int = 4096,
        max_pending: int = 20_000,
        linger_s: float = 0.25,
    ) -> None:
        """`linger_s`: how long the writer lets records gather before writing (unless the
        batch is full or someone flushes), so a busy server writes many per commit. A
        commit writes out every page of the turn index it touched, and the records of
        concurrent turns land on different pages, so a record costs less the more share a
        commit: measured on SQLite (bench/README.md), 18 us a record in batches of 64, 7.4
        in batches of 1,500. A quarter of a second gathers hundreds at the rates where it
        matters; reads flush first, so nobody waits for it, and a crash loses at most that
        much of a diagnostic whose calls were answered."""
        self._inner = inner
        self._batch_size = batch_size
        self._linger_s = linger_s
        self._max_pending = max_pending
        # deque.append and popleft are atomic under the GIL: the callers and the writer
        # share it without a lock.
        self._queue: deque[tuple[Any, ...] | _Flushed] = deque()
        self._wake = threading.Event()  # something was queued while the writer slept
        self._hurry = threading.Event()  # a flush, a full batch or close: stop lingering
        self._sleeping = False  # the writer waits on _wake (only then do callers set it)
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
        queued = len(self._queue)
        if queued >= self._max_pending or self._stopping:
            self._inner.write([(key, record)])
            return
        self._queue.append(_row(key, record))
        if self._sleeping:
            self._sleeping = False  # one wake-up for the callers racing here, not one each
            self._wake.set()
        elif queued + 1 == self._batch_size:
            self._hurry.set()

    def flush(self) -> None:
        """Return once every record queued before this call is written."""
        if not self._thread.is_alive():  # closed: write what is left here
            self._drain()
            return
        marker = _Flushed()
        self._queue.append(marker)
        self._wake.set()
        self._hurry.set()
        # Bounded waits, so a writer that died (it never should) cannot hang the caller.
        while not marker.event.wait(1.0):
            if not self._thread.is_alive():
                return

    def read(self, key: TurnKey) -> TurnRecords:
        """See `InspectionStore.read` (after a flush)."""
        self.flush()
        return self._inner.read(key)

    def purge(self, before: datetime, limit: int) -> int:
        """See `InspectionStore.purge`."""
        return self._inner.purge(before, limit)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._stopping = True
        self._wake.set()
        self._hurry.set()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._drain()  # a record queued while the writer was stopping

    def _run(self) -> None:
        name_os_thread("inspect-writer")  # the OS keeps 15 bytes of "inspection-writer"
        while True:
            # Sleep until something is queued. The flag is raised before the queue is
            # looked at, so a record appended after the look finds it and wakes us.
            self._wake.clear()
            self._sleeping = True
            if not self._queue and not self._stopping:
                self._wake.wait()
            self._sleeping = False
            if not self._queue and self._stopping:
                return  # everything is written
            # Let a batch gather. A flush sets _hurry after queuing its marker, so a
            # marker queued before this clear is in the queue the drain below empties.
            self._hurry.wait(self._linger_s)
            self._hurry.clear()
            self._drain()

    def _drain(self) -> None:
        """Write what is queued now, `batch_size` at a time, then release the flushes
        queued among it."""
        batch: list[tuple[Any, ...]] = []
        flushed: list[_Flushed] = []
        for _ in range(len(self._queue)):
            item = self._queue.popleft()
            if isinstance(item, _Flushed):
                flushed.append(item)
                continue
            batch.append(item)
            if len(batch) >= self._batch_size:
                self._write(batch)
                batch = []
        if batch:
            self._write(batch)
        for marker in flushed:
            marker.event.set()

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        try:
            self._inner.write_rows(batch)
        except Exception as error:
            log.warning(
                "dropped %d inspector records: the store failed (%s)",
                len(batch),
                type(error).__name__,
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


def _bounds_json(bounds: SearchBounds) -> str | None:
    """A search's bounds as stored (migration 0015): the conversation id and the times in
    microseconds, each key only when set; None for a search without bounds."""
    data: dict[str, Any] = {}
    if bounds.conversation_id is not None:
        data["c"] = bounds.conversation_id
    if bounds.start_time is not None:
        data["s"] = to_epoch_micros(bounds.start_time)
    if bounds.end_time is not None:
        data["e"] = to_epoch_micros(bounds.end_time)
    return json.dumps(data) if data else None


def _bounds_of(data: dict[str, Any] | None) -> SearchBounds:
    if not data:
        return SearchBounds()
    start, end = data.get("s"), data.get("e")
    return SearchBounds(
        conversation_id=data.get("c"),
        start_time=None if start is None else from_epoch_micros(int(start)),
        end_time=None if end is None else from_epoch_micros(int(end)),
    )


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
