"""In-memory fakes of the storage ports, for unit tests of the domain.

The memory store, the inspection store, the chunk index (every role), the turn queue and its
units of work. The contract suites (tests/contract) run the same assertions over each fake
and over every real adapter, so a fake cannot drift from what the real stores do.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime

from server.adapters.qdrant.layout import ModelRecord, check_chunks, to_epoch_micros
from server.domain.model import (
    EVERYONE,
    AuditEvent,
    AuditQuery,
    Change,
    ChunkHit,
    ChunkPlace,
    ChunkWindows,
    ClaimedTurn,
    ConversationPurge,
    ConversationSummary,
    DenseContextUpdate,
    EncodedQuery,
    ExpiryCutoffs,
    IndexedChunk,
    ListCursor,
    NewAuditEvent,
    NewTurn,
    Owner,
    PrincipalMemory,
    RenderRecord,
    RetrievalResult,
    SearchBounds,
    SearchRecord,
    SearchScope,
    SparseVector,
    StoredBlock,
    StoredChunk,
    StoredSettings,
    StoredTurn,
    Tombstone,
    TurnKey,
    TurnRecords,
)

Key = tuple[str, str]


class InMemoryMemoryStore:
    """`MemoryStore` in process memory; `apply` is atomic under one lock."""

    def __init__(self) -> None:
        self.blocks: dict[Key, StoredBlock] = {}
        self.settings: dict[Key, StoredSettings] = {}
        self.audit: list[tuple[str, AuditEvent]] = []
        self.reads = 0
        self.applies = 0
        self._lock = threading.Lock()

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        with self._lock:
            self.reads += 1
            key = (tenant_id, principal_id)
            return PrincipalMemory(self.blocks.get(key), self.settings.get(key))

    def apply(self, tenant_id: str, change: Change) -> bool:
        with self._lock:
            self.applies += 1
            key = (tenant_id, change.principal_id)
            block = self.blocks.get(key)
            settings = self.settings.get(key)
            etag = block.etag if block is not None else ""
            enabled = settings is None or settings.memory_enabled
            if (etag, enabled) != (change.expected_etag, change.expected_enabled):
                return False
            if change.block is not None:
                self.blocks[key] = change.block
            if change.delete_block:
                self.blocks.pop(key, None)
            if change.blank_audit_lines:
                self._redact(tenant_id, change.principal_id)
            if change.settings is not None:
                self.settings[key] = change.settings
            self.append(tenant_id, change.event)
            return True

    def confirm(self, tenant_id: str, principal_id: str, memory: PrincipalMemory) -> bool:
        now = self.read(tenant_id, principal_id)
        etag = now.block.etag if now.block is not None else ""
        then = memory.block.etag if memory.block is not None else ""
        return (etag, now.memory_enabled) == (then, memory.memory_enabled)

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        with self._lock:
            found = [
                e
                for tenant, e in reversed(self.audit)
                if tenant == tenant_id
                and (query.principal_id is None or e.principal_id == query.principal_id)
                and (not query.actions or e.action in query.actions)
                and (query.start_time is None or e.create_time >= query.start_time)
                and (query.end_time is None or e.create_time < query.end_time)
                and (query.before_event_id is None or e.event_id < query.before_event_id)
                and (
                    query.turn is None
                    or (e.turn_conversation_id, e.turn_id)
                    == (query.turn.conversation_id, query.turn.turn_id)
                )
            ]
        return found[: query.limit]

    def append(self, tenant_id: str, event: NewAuditEvent) -> None:
        """Append an event as the store would (tests use it to prepare audit data)."""
        values = {f.name: getattr(event, f.name) for f in fields(NewAuditEvent)}
        self.audit.append((tenant_id, AuditEvent(**values, event_id=len(self.audit) + 1)))

    def _redact(self, tenant_id: str, principal_id: str) -> None:
        for i, (tenant, event) in enumerate(self.audit):
            if tenant == tenant_id and event.principal_id == principal_id:
                self.audit[i] = (tenant, replace(event, removed_lines=(), added_lines=()))


class InMemoryInspectionStore:
    """`InspectionStore` in process memory. `deleted` holds tombstoned conversations
    ((tenant, principal, conversation)): records for them are not kept, as the SQL statement
    does; `delete_conversation` and `erase` mirror what the turn store's transactions do."""

    def __init__(self) -> None:
        self.records: list[tuple[int, TurnKey, RenderRecord | SearchRecord | datetime]] = []
        self.deleted: set[tuple[str, str, str]] = set()
        self.flushes = 0
        self._next = 0
        self._lock = threading.Lock()

    def _add(self, key: TurnKey, record: RenderRecord | SearchRecord | datetime) -> None:
        with self._lock:
            if (key.tenant_id, key.principal_id, key.conversation_id) in self.deleted:
                return
            self._next += 1
            self.records.append((self._next, key, record))

    def record_render(self, key: TurnKey, record: RenderRecord) -> None:
        self._add(key, record)

    def record_search(self, key: TurnKey, record: SearchRecord) -> None:
        self._add(key, record)

    def record_failed_write(self, key: TurnKey, record_time: datetime) -> int:
        """A failed write is kept as its bare time (the SQL store's row of kind "failed")."""
        self._add(key, record_time)
        return self.failed_writes(key)

    def failed_writes(self, key: TurnKey) -> int:
        with self._lock:
            return sum(1 for _, k, r in self.records if k == key and isinstance(r, datetime))

    def flush(self) -> None:
        self.flushes += 1

    def read(self, key: TurnKey) -> TurnRecords:
        with self._lock:
            mine = [r for _, k, r in self.records if k == key]
        return TurnRecords(
            tuple(r for r in mine if isinstance(r, RenderRecord)),
            tuple(r for r in mine if isinstance(r, SearchRecord)),
            sum(1 for r in mine if isinstance(r, datetime)),
        )

    def purge(self, before: datetime, limit: int) -> int:
        with self._lock:
            expired = sorted(
                (t, n)
                for n, _, r in self.records
                if (t := r if isinstance(r, datetime) else r.record_time) < before
            )[:limit]
            gone = {n for _, n in expired}
            self.records = [entry for entry in self.records if entry[0] not in gone]
            return len(gone)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> int:
        with self._lock:
            self.deleted.add((tenant_id, principal_id, conversation_id))
            keep = [
                e
                for e in self.records
                if (e[1].tenant_id, e[1].principal_id, e[1].conversation_id)
                != (tenant_id, principal_id, conversation_id)
            ]
            removed, self.records = len(self.records) - len(keep), keep
            return removed

    def erase(self, tenant_id: str, principal_id: str) -> int:
        with self._lock:
            keep = [
                e
                for e in self.records
                if (e[1].tenant_id, e[1].principal_id) != (tenant_id, principal_id)
            ]
            removed, self.records = len(self.records) - len(keep), keep
            return removed


# --- The chunk index ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Point:
    """One stored chunk, as a Qdrant point holds it (payload and both vectors)."""

    key: TurnKey
    chunk_index: int
    text: str
    turn_time: datetime
    dense: tuple[tuple[float, ...], ...]
    sparse: SparseVector
    keyword_version: int
    turn_order: int
    windows: int | None = None  # the own windows of `dense`, a context vector after them

    def hit(self, score: float) -> ChunkHit:
        k = self.key
        return ChunkHit(
            k.conversation_id, k.turn_id, self.chunk_index, self.text, self.turn_time, score
        )

    def place(self) -> ChunkPlace:
        return ChunkPlace(self.key.turn_id, self.chunk_index, self.turn_time, self.turn_order)


@dataclass
class InMemoryChunkStorage:
    """What an in-memory chunk index keeps: opening another index on it is reopening the
    same store (the model record is checked as the real adapters check it)."""

    points: dict[tuple[TurnKey, int], _Point] = field(default_factory=dict)
    record: ModelRecord | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class InMemoryChunkIndex:
    """Every `ChunkIndex` role in process memory, ranking as the Qdrant collection does:
    keyword scores are the dot product of the query's terms with the chunk's term weights,
    each term weighted by Qdrant's IDF over the whole collection; semantic scores are the
    MAX_SIM of the query vector over the chunk's windows, by cosine. Each side keeps the best
    chunk per turn. Writes made through `upsert_turn` count in `upserts`."""

    def __init__(
        self,
        storage: InMemoryChunkStorage | None = None,
        dimension: int = 4,
        model_id: str = "fake-model",
    ) -> None:
        self._storage = storage or InMemoryChunkStorage()
        self._dimension = dimension
        record = ModelRecord(model_id, dimension)
        with self._storage.lock:
            if self._storage.record is None:
                self._storage.record = record
            record.check_matches(self._storage.record, "memory")
        self.closed = False
        self.upserts: list[TurnKey] = []

    @property
    def _points(self) -> dict[tuple[TurnKey, int], _Point]:
        return self._storage.points

    # ChunkWriter

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        to_epoch_micros(turn_time)  # refuses a naive time, as the adapters do
        check_chunks(chunks, self._dimension)
        when = turn_time.astimezone(UTC)
        with self._storage.lock:
            for stale in [k for k in self._points if k[0] == key and k[1] >= len(chunks)]:
                del self._points[stale]
            for c in chunks:
                self._points[key, c.chunk_index] = _Point(
                    key,
                    c.chunk_index,
                    c.text,
                    when,
                    c.dense,
                    c.sparse,
                    c.keyword_version,
                    c.turn_order,
                )
            self.upserts.append(key)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        self._delete(lambda k: k[:3] == (tenant_id, principal_id, conversation_id))

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        self._delete(lambda k: k[:2] == (tenant_id, principal_id))

    def delete_before(self, tenant_id: str, principal_id: str, before: datetime) -> None:
        with self._storage.lock:
            for k in [
                k
                for k, p in self._points.items()
                if _owner(k[0])[:2] == (tenant_id, principal_id) and p.turn_time < before
            ]:
                del self._points[k]

    def _delete(self, doomed: Callable[[tuple[str, str, str]], bool]) -> None:
        with self._storage.lock:
            for k in [k for k in self._points if doomed(_owner(k[0]))]:
                del self._points[k]

    # ChunkSearch

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        with self._storage.lock:
            everything = list(self._points.values())
        mine = [
            p
            for p in everything
            if (p.key.tenant_id, p.key.principal_id) == (scope.tenant_id, scope.principal_id)
            and p.key.conversation_id not in scope.deleted_conversations
            and _within(p, scope.bounds)
        ]
        keyword: list[tuple[_Point, float]] = []
        if query.sparse.indices:
            idf = _idf(everything, set(query.sparse.indices))
            for p in mine:
                weights = dict(zip(p.sparse.indices, p.sparse.values, strict=True))
                shared = [i for i in query.sparse.indices if i in weights]
                if shared:
                    q = dict(zip(query.sparse.indices, query.sparse.values, strict=True))
                    keyword.append((p, sum(q[i] * weights[i] * idf[i] for i in shared)))
        semantic = [(p, max(_cosine(query.dense, w) for w in p.dense)) for p in mine]
        return RetrievalResult(_best_per_turn(keyword, turns), _best_per_turn(semantic, turns))

    # KeywordVectors

    def stale_keyword_chunks(
        self, version: int, limit: int, owner: Owner = EVERYONE
    ) -> Sequence[StoredChunk]:
        stale = self._stale(version, owner)[:limit]
        return [StoredChunk(p.key, p.chunk_index, p.text, p.turn_time) for p in stale]

    def count_stale_keyword_chunks(self, version: int, owner: Owner = EVERYONE) -> int:
        return len(self._stale(version, owner))

    def _stale(self, version: int, owner: Owner) -> list[_Point]:
        with self._storage.lock:
            points = list(self._points.values())
        return [
            p
            for p in points
            if p.keyword_version != version
            and owner.tenant_id in (None, p.key.tenant_id)
            and owner.principal_id in (None, p.key.principal_id)
        ]

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, SparseVector]], version: int
    ) -> None:
        with self._storage.lock:
            for chunk, sparse in updates:
                point = self._points.get((chunk.key, chunk.chunk_index))
                if point is not None:  # a chunk deleted meanwhile stays deleted
                    self._points[chunk.key, chunk.chunk_index] = replace(
                        point, sparse=sparse, keyword_version=version
                    )

    # DenseVectors

    def chunk_windows(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        places: Sequence[tuple[str, int]],
    ) -> ChunkWindows:
        found = {}
        with self._storage.lock:
            for turn, chunk in places:
                key = TurnKey(tenant_id, principal_id, conversation_id, turn)
                point = self._points.get((key, chunk))
                if point is not None:
                    count = point.windows if point.windows is not None else len(point.dense)
                    found[turn, chunk] = point.dense[:count]
        return found

    def set_dense_context(
        self,
        updates: Sequence[DenseContextUpdate],
    ) -> None:
        with self._storage.lock:
            for key, chunk, windows, context in updates:
                point = self._points.get((key, chunk))
                if point is not None:  # a chunk deleted meanwhile stays deleted
                    self._points[key, chunk] = replace(
                        point, dense=(*windows, context), windows=len(windows)
                    )

    # ChunkPlaces and ChunkTexts

    def _conversation(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> list[_Point]:
        with self._storage.lock:
            return [
                p
                for p in self._points.values()
                if _owner(p.key) == (tenant_id, principal_id, conversation_id)
            ]

    def conversation_places(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> Sequence[ChunkPlace]:
        return [p.place() for p in self._conversation(tenant_id, principal_id, conversation_id)]

    def places_near(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        turn_time: datetime,
        limit: int,
    ) -> tuple[Sequence[ChunkPlace], Sequence[ChunkPlace]]:
        points = self._conversation(tenant_id, principal_id, conversation_id)
        before = sorted((p for p in points if p.turn_time <= turn_time), key=lambda p: p.turn_time)
        after = sorted((p for p in points if p.turn_time >= turn_time), key=lambda p: p.turn_time)
        return [p.place() for p in before[::-1][:limit]], [p.place() for p in after[:limit]]

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        wanted = set(turns)
        with self._storage.lock:
            found = sorted(
                ((p.key.conversation_id, p.key.turn_id), p.chunk_index, p.text)
                for p in self._points.values()
                if (p.key.tenant_id, p.key.principal_id) == (tenant_id, principal_id)
                and (p.key.conversation_id, p.key.turn_id) in wanted
            )
        texts: dict[tuple[str, str], tuple[str, ...]] = {}
        for turn, _, text in found:
            texts[turn] = (*texts.get(turn, ()), text)
        return texts

    # ChunkCount and ChunkEngine

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        with self._storage.lock:
            keys = [_owner(k) for k, _ in self._points]
        return sum(
            1
            for k in keys
            if k[:2] == (tenant_id, principal_id) and conversation_id in (None, k[2])
        )

    def check(self) -> None:
        if self.closed:
            raise RuntimeError("the chunk index is closed")

    def close(self) -> None:
        self.closed = True


def _within(point: _Point, bounds: SearchBounds) -> bool:
    """Whether a point lies within a search's bounds (start inclusive, end exclusive)."""
    if bounds.conversation_id is not None and point.key.conversation_id != bounds.conversation_id:
        return False
    if bounds.start_time is not None and point.turn_time < bounds.start_time:
        return False
    return bounds.end_time is None or point.turn_time < bounds.end_time


def _owner(key: TurnKey) -> tuple[str, str, str]:
    return (key.tenant_id, key.principal_id, key.conversation_id)


def _idf(points: Sequence[_Point], terms: set[int]) -> dict[int, float]:
    """Qdrant's IDF modifier: ln(1 + (N - n + 0.5) / (n + 0.5)) over every stored point."""
    having = Counter(i for p in points for i in set(p.sparse.indices) if i in terms)
    total = len(points)
    return {t: math.log(1 + (total - having[t] + 0.5) / (having[t] + 0.5)) for t in terms}


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def _best_per_turn(scored: list[tuple[_Point, float]], turns: int) -> tuple[ChunkHit, ...]:
    """Best chunk of each turn, best turns first, at most `turns`."""
    best: dict[TurnKey, tuple[_Point, float]] = {}
    for point, score in scored:
        if point.key not in best or score > best[point.key][1]:
            best[point.key] = (point, score)
    ranked = sorted(
        best.values(), key=lambda e: (-e[1], e[0].key.conversation_id, e[0].key.turn_id)
    )
    return tuple(point.hit(score) for point, score in ranked[: max(turns, 0)])


# --- The turn queue and its units of work --------------------------------------------------

PENDING, INDEXED, FAILED = "pending", "indexed", "failed"


@dataclass(frozen=True)
class _QueuedTurn:
    """One row of the turn queue (the outbox), as the SQL table holds it."""

    row_id: int
    version: int
    key: TurnKey
    text: str | None
    turn_time: datetime
    accept_time: datetime
    due_time: datetime
    attempts: int = 0
    status: str = PENDING
    last_error: str | None = None
    question_opening: str = ""

    def claimed(self) -> ClaimedTurn:
        text = None if self.status == INDEXED else self.text
        return ClaimedTurn(self.row_id, self.version, self.key, text, self.turn_time, self.attempts)


@dataclass(frozen=True)
class _Tombstone:
    delete_time: datetime
    purged: bool = False


class InMemoryTurnStore:
    """`TurnStore` in process memory, with its `UnitsOfWork` (`units`) on the same rows.

    Blocks, settings and audit events are the `memory` fake's; inspector records the
    `inspections` fake's (when given). Claims behave as on SQLite, the embedded default:
    processors take turns on one lock, a re-send bumps the turn's version, and a processor
    that finishes an old version leaves the new one queued. An exclusive unit of work
    (erasure) waits for that lock too, so no indexing of the principal runs meanwhile.
    """

    def __init__(
        self,
        memory: InMemoryMemoryStore | None = None,
        inspections: InMemoryInspectionStore | None = None,
    ) -> None:
        self.memory = memory or InMemoryMemoryStore()
        self.inspections = inspections
        self.rows: dict[TurnKey, _QueuedTurn] = {}
        self.tombstones: dict[tuple[str, str, str], _Tombstone] = {}
        self.lock = threading.RLock()  # one writer at a time: the unit of work's transaction
        self.processing = threading.RLock()  # claims and purges, as SQLite's processing lock
        self._next_row = 0
        self.units = InMemoryUnitsOfWork(self)

    def next_row_id(self) -> int:
        self._next_row += 1
        return self._next_row

    def status(self, key: TurnKey) -> tuple[str, str | None]:
        """A queued turn's status and stored text (tests read what the SQL row holds)."""
        with self.lock:
            row = self.rows[key]
        return row.status, row.text

    @contextmanager
    def claim(self, limit: int, now: datetime, only: TurnKey | None = None) -> Iterator[_Batch]:
        with self.processing:
            with self.lock:
                if only is not None:
                    rows = [self.rows[only]] if only in self.rows else []
                else:
                    due = [
                        r for r in self.rows.values() if r.status == PENDING and r.due_time <= now
                    ]
                    rows = sorted(due, key=lambda r: r.due_time)[:limit]
            yield _Batch(self, tuple(r.claimed() for r in rows))

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        with self.lock:
            return frozenset(
                c
                for (t, p, c), tomb in self.tombstones.items()
                if (t, p) == (tenant_id, principal_id) and not tomb.purged
            )

    @contextmanager
    def claim_purges(self, limit: int) -> Iterator[list[ConversationPurge]]:
        with self.processing:
            with self.lock:
                waiting = sorted(
                    (tomb.delete_time, owner)
                    for owner, tomb in self.tombstones.items()
                    if not tomb.purged
                )[:limit]
            purges = [ConversationPurge(*owner) for _, owner in waiting]
            yield purges
            with self.lock:
                for purge in purges:
                    owner = (purge.tenant_id, purge.principal_id, purge.conversation_id)
                    if owner in self.tombstones:
                        self.tombstones[owner] = replace(self.tombstones[owner], purged=True)

    def expired_principals(self, cutoffs: ExpiryCutoffs, limit: int) -> list[tuple[str, str]]:
        own = dict(cutoffs.tenants)
        with self.lock:
            found: list[tuple[str, str]] = []
            for r in sorted(self.rows.values(), key=lambda r: r.row_id):
                cutoff = own.get(r.key.tenant_id, cutoffs.default)
                pair = (r.key.tenant_id, r.key.principal_id)
                if cutoff is not None and r.turn_time < cutoff and pair not in found:
                    found.append(pair)
        return found[:limit]

    def list_turns(
        self,
        tenant_id: str,
        principal_id: str,
        after_row_id: int,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        with self.lock:
            rows = sorted(
                (
                    r
                    for r in self.rows.values()
                    if (r.key.tenant_id, r.key.principal_id) == (tenant_id, principal_id)
                    and r.row_id > after_row_id
                    and (since is None or r.turn_time >= since)
                ),
                key=lambda r: r.row_id,
            )[:limit]
        return [_stored(r) for r in rows]

    def list_conversations(
        self,
        tenant_id: str,
        principal_id: str,
        after: ListCursor | None,
        limit: int,
        since: datetime | None = None,
    ) -> list[ConversationSummary]:
        with self.lock:
            mine = [
                r
                for r in self.rows.values()
                if (r.key.tenant_id, r.key.principal_id) == (tenant_id, principal_id)
                and (since is None or r.turn_time >= since)
            ]
        by_conversation: dict[str, list[_QueuedTurn]] = {}
        for r in mine:
            by_conversation.setdefault(r.key.conversation_id, []).append(r)
        listed = []
        for conversation, turns in by_conversation.items():
            first = min(turns, key=lambda r: (r.turn_time, r.row_id))
            cursor = ListCursor(max(r.turn_time for r in turns), max(r.row_id for r in turns))
            if after is not None and (cursor.time, cursor.row_id) >= (after.time, after.row_id):
                continue
            listed.append(
                ConversationSummary(
                    conversation_id=conversation,
                    first_turn_time=first.turn_time,
                    last_turn_time=cursor.time,
                    turn_count=len(turns),
                    first_question_opening=first.question_opening,
                    cursor=cursor,
                )
            )
        listed.sort(key=lambda c: (c.cursor.time, c.cursor.row_id), reverse=True)
        return listed[:limit]

    def list_conversation_turns(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        after: ListCursor | None,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        with self.lock:
            rows = sorted(
                (
                    r
                    for r in self.rows.values()
                    if (r.key.tenant_id, r.key.principal_id, r.key.conversation_id)
                    == (tenant_id, principal_id, conversation_id)
                    and (after is None or (r.turn_time, r.row_id) > (after.time, after.row_id))
                    and (since is None or r.turn_time >= since)
                ),
                key=lambda r: (r.turn_time, r.row_id),
            )[:limit]
        return [_stored(r) for r in rows]

    def list_tombstones(
        self, tenant_id: str, principal_id: str, offset: int, limit: int
    ) -> list[Tombstone]:
        with self.lock:
            mine = sorted(
                (c, tomb.delete_time)
                for (t, p, c), tomb in self.tombstones.items()
                if (t, p) == (tenant_id, principal_id)
            )
        return [Tombstone(c, when) for c, when in mine[offset : offset + limit]]


class _Batch:
    """Claimed turns; finishing one updates it only if it is still the version claimed."""

    def __init__(self, store: InMemoryTurnStore, turns: tuple[ClaimedTurn, ...]) -> None:
        self._store = store
        self._turns = turns

    @property
    def turns(self) -> Sequence[ClaimedTurn]:
        return self._turns

    def indexed(self, turn: ClaimedTurn) -> None:
        self._finish(turn, status=INDEXED, text=None, attempts=0, last_error=None)

    def failed(self, turn: ClaimedTurn, error: str, retry_at: datetime | None) -> None:
        if retry_at is None:
            self._finish(turn, attempts=turn.attempts + 1, last_error=error[:200], status=FAILED)
        else:
            self._finish(
                turn, attempts=turn.attempts + 1, last_error=error[:200], due_time=retry_at
            )

    def _finish(self, turn: ClaimedTurn, **values: object) -> None:
        with self._store.lock:
            row = self._store.rows.get(turn.key)
            if row is not None and (row.row_id, row.version) == (turn.row_id, turn.version):
                self._store.rows[turn.key] = replace(row, **values)  # type: ignore[arg-type]


class InMemoryUnitsOfWork:
    """`UnitsOfWork` on an `InMemoryTurnStore`: a unit of work holds the store's lock (one
    writer at a time, as the principal's row lock does) and, unless committed, puts every
    row back as it found it when it ends."""

    def __init__(self, store: InMemoryTurnStore) -> None:
        self._store = store
        self.opened = 0

    @contextmanager
    def __call__(
        self, tenant_id: str, principal_id: str, *, exclusive: bool = False
    ) -> Iterator[InMemoryUnitOfWork]:
        store = self._store
        with store.processing if exclusive else _no_lock(), store.lock, store.memory._lock:
            self.opened += 1
            saved = _snapshot(store)
            uow = InMemoryUnitOfWork(store, tenant_id, principal_id)
            try:
                yield uow
            finally:
                if not uow.committed:
                    _restore(store, saved)


@contextmanager
def _no_lock() -> Iterator[None]:
    yield


def _snapshot(store: InMemoryTurnStore) -> tuple[object, ...]:
    memory = store.memory
    records: tuple[object, ...] = ()
    if store.inspections is not None:
        with store.inspections._lock:
            records = (list(store.inspections.records), set(store.inspections.deleted))
    return (
        dict(store.rows),
        dict(store.tombstones),
        dict(memory.blocks),
        dict(memory.settings),
        list(memory.audit),
        records,
    )


def _restore(store: InMemoryTurnStore, saved: tuple[object, ...]) -> None:
    rows, tombstones, blocks, settings, audit, records = saved
    store.rows = rows  # type: ignore[assignment]
    store.tombstones = tombstones  # type: ignore[assignment]
    store.memory.blocks = blocks  # type: ignore[assignment]
    store.memory.settings = settings  # type: ignore[assignment]
    store.memory.audit = audit  # type: ignore[assignment]
    if store.inspections is not None and records:
        with store.inspections._lock:
            store.inspections.records, store.inspections.deleted = records  # type: ignore[misc]


class InMemoryUnitOfWork:
    """`UnitOfWork`: one principal's rows of the fakes, changed in place (see the units)."""

    def __init__(self, store: InMemoryTurnStore, tenant_id: str, principal_id: str) -> None:
        self.committed = False
        self.memory = _PrincipalRows(store.memory, tenant_id, principal_id)
        self.audit = _AuditRows(store.memory, tenant_id, principal_id)
        self.turns = _TurnRows(store, tenant_id, principal_id)
        self.tombstones = _TombstoneRows(store, tenant_id, principal_id)
        self.inspections = _InspectionRows(store.inspections, tenant_id, principal_id)

    def commit(self) -> None:
        self.committed = True


class _PrincipalRows:
    def __init__(self, memory: InMemoryMemoryStore, tenant_id: str, principal_id: str) -> None:
        self._memory = memory
        self._key = (tenant_id, principal_id)

    def load(self) -> PrincipalMemory:
        return PrincipalMemory(
            self._memory.blocks.get(self._key), self._memory.settings.get(self._key)
        )

    def delete(self) -> None:
        self._memory.blocks.pop(self._key, None)
        self._memory.settings.pop(self._key, None)


class _AuditRows:
    def __init__(self, memory: InMemoryMemoryStore, tenant_id: str, principal_id: str) -> None:
        self._memory = memory
        self._tenant = tenant_id
        self._principal = principal_id

    def append(self, event: NewAuditEvent) -> None:
        self._memory.append(self._tenant, event)

    def blank_lines(self) -> None:
        self._memory._redact(self._tenant, self._principal)


class _TurnRows:
    def __init__(self, store: InMemoryTurnStore, tenant_id: str, principal_id: str) -> None:
        self._store = store
        self._owner = (tenant_id, principal_id)

    def put(self, turn: NewTurn) -> None:
        old = self._store.rows.get(turn.key)
        self._store.rows[turn.key] = _QueuedTurn(
            row_id=old.row_id if old is not None else self._store.next_row_id(),
            version=old.version + 1 if old is not None else 1,
            key=turn.key,
            text=turn.text,
            turn_time=turn.turn_time,
            accept_time=turn.accept_time,
            due_time=turn.accept_time,
            question_opening=turn.question_opening,
        )

    def delete_conversation(self, conversation_id: str) -> int:
        return self._delete(lambda k: k.conversation_id == conversation_id)

    def delete_all(self) -> int:
        return self._delete(lambda k: True)

    def delete_before(self, before: datetime, limit: int) -> int:
        expired = sorted(
            (
                r
                for r in self._store.rows.values()
                if (r.key.tenant_id, r.key.principal_id) == self._owner and r.turn_time < before
            ),
            key=lambda r: r.turn_time,
        )[:limit]
        doomed = {r.key for r in expired}
        return self._delete(lambda k: k in doomed)

    def _delete(self, which: Callable[[TurnKey], bool]) -> int:
        doomed = [
            k for k in self._store.rows if (k.tenant_id, k.principal_id) == self._owner and which(k)
        ]
        for k in doomed:
            del self._store.rows[k]
        return len(doomed)


class _TombstoneRows:
    def __init__(self, store: InMemoryTurnStore, tenant_id: str, principal_id: str) -> None:
        self._store = store
        self._owner = (tenant_id, principal_id)

    def exists(self, conversation_id: str) -> bool:
        return (*self._owner, conversation_id) in self._store.tombstones

    def add(self, conversation_id: str, delete_time: datetime) -> None:
        self._store.tombstones[(*self._owner, conversation_id)] = _Tombstone(delete_time)

    def delete_all(self) -> int:
        doomed = [o for o in self._store.tombstones if o[:2] == self._owner]
        for owner in doomed:
            del self._store.tombstones[owner]
        return len(doomed)


class _InspectionRows:
    def __init__(
        self, inspections: InMemoryInspectionStore | None, tenant_id: str, principal_id: str
    ) -> None:
        self._inspections = inspections
        self._owner = (tenant_id, principal_id)

    def delete_conversation(self, conversation_id: str) -> int:
        if self._inspections is None:
            return 0
        return self._inspections.delete_conversation(*self._owner, conversation_id)

    def delete_all(self) -> int:
        if self._inspections is None:
            return 0
        with self._inspections._lock:  # the erased principal's tombstones are gone too
            self._inspections.deleted = {
                d for d in self._inspections.deleted if d[:2] != self._owner
            }
        return self._inspections.erase(*self._owner)


# --- The embedder and the clock ------------------------------------------------------------


class HashEmbedder:
    """`Embedder` with deterministic unit vectors from a hash of the text, one window per
    text: equal texts get equal vectors, so a query for a turn's exact words finds it first on
    the semantic side (the model itself is tested in test_embedding.py)."""

    model_id = "hash-embedder-8"
    dimension = 8

    def __init__(self) -> None:
        self.fail: Exception | None = None

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        if self.fail is not None:
            raise self.fail
        return [(self.embed_query(t),) for t in texts]

    def embed_query(self, text: str) -> tuple[float, ...]:
        raw = [b - 127.5 for b in hashlib.sha256(text.encode()).digest()[: self.dimension]]
        norm = math.sqrt(sum(x * x for x in raw))
        return tuple(x / norm for x in raw)


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _stored(r: _QueuedTurn) -> StoredTurn:
    """A queued turn as the turn lists return it (its text only while not yet indexed)."""
    return StoredTurn(
        row_id=r.row_id,
        conversation_id=r.key.conversation_id,
        turn_id=r.key.turn_id,
        turn_time=r.turn_time,
        text=None if r.status == INDEXED else r.text,
        indexed=r.status == INDEXED,
    )
