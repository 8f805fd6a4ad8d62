"""The chunk index on the embedded Qdrant engine (qdrant-edge-py 0.9.0), the default.

One EdgeShard under the data directory holds every tenant's chunks (layout: layout.py).
Facts about the engine this adapter is built on, measured on 0.9.0 (DESIGN 4 and below):

- Durability. `EdgeShard.update` appends the operation to the shard's write-ahead log before
  applying it, and returns once it is applied, so a returned upsert is searchable at once and
  survives a crash of the process (the contract test kills one). The log is written through
  memory-mapped files without fsync (observed with strace); `flush()` syncs the log and the
  segments. A flush costs 7-200 ms on this machine, far more than indexing a turn, so the
  adapter does not flush per update: like SQLite with synchronous=NORMAL (the embedded
  default's other store), the embedded store is durable across process crashes, and an
  operating-system crash may lose the last updates. `close()` flushes; `flush()` is public for
  a caller that wants a sync point.
- Optimization. The engine never optimizes by itself, and `EdgeShard.optimize()` holds the
  GIL, stalling every Python thread (134 s for 100,000 chunks of 384 dimensions here). It is
  not needed for speed: with the principal filter, a hybrid query (both sides, 100 candidates
  each, one batch) took 3.1 ms p50 at 100,000 chunks unoptimized and 5.0 ms after
  optimizing, because a principal's chunks are few and the payload index finds them. What it
  does buy is vacuuming deleted and replaced points. So the serving path never calls it;
  `optimize()` is exposed for a maintenance command run while nothing is served.
- Threads. Queries, counts and updates release the GIL and the shard synchronizes itself
  (two threads querying ran in parallel; concurrent updates, deletes and queries from three
  threads raised nothing), so gRPC handler threads search while a worker thread writes, with
  no lock here. The only lock guards `close()` against a second close.
- Grouping. The engine has no group-by. Each side fetches CANDIDATES_PER_TURN times the turns
  wanted (a turn has at most 10 chunks, so that always covers `turns` turns when they exist),
  without payload, and keeps the best chunk per turn by the turn part of the point id; the
  kept points' payloads are then read in one `retrieve`. Reading payload costs about 5 us a
  point: at 10,000 chunks of 384 dimensions, a search for 30 turns took 0.95 ms p50 this way
  against 2.4 ms with payload on every candidate (10 turns: 0.60 against 1.12 ms).
- One process per store. A second open of the same shard fails on the log's file lock; that
  becomes a ChunkIndexLockedError naming the data directory.
- Errors. The engine raises a plain `Exception` whose text starts with the kind of its
  operation error ("Service runtime error: Shard is not initialized" once closed, "...: IO
  Error: No space left on device (os error 28)", "Vector dimension error: ..."). The kinds
  that mean the engine cannot serve now (ENGINE_UNAVAILABLE_KINDS: I/O, a closed or
  inconsistent shard, out of memory, a timeout) become STORE_UNAVAILABLE, a full disk
  STORAGE_FULL, in one place (`_engine_errors`) around every operation, as the SQL and
  Qdrant server adapters map theirs; the other kinds (a request this adapter built wrong: a
  bug) propagate and answer INTERNAL.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from qdrant_edge import (
    CountRequest,
    Direction,
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Modifier,
    MultiVectorComparator,
    MultiVectorConfig,
    OrderBy,
    PayloadSchemaType,
    PayloadSelector,
    Point,
    PointVectors,
    Query,
    QueryBatchRequest,
    QueryRequest,
    RangeFloat,
    ScrollRequest,
    SparseVector,
    UpdateOperation,
)

from server.adapters.qdrant.layout import (
    CHUNK_INDEX,
    DENSE_VECTOR,
    KEYWORD_VECTOR,
    KEYWORD_VERSION_FIELD,
    PAYLOAD_INDEXES,
    PLACE_FIELDS,
    PLACES_PAGE,
    TURN_TIME,
    WINDOWS,
    ChunkIndexError,
    ChunkIndexLockedError,
    FilterSpec,
    IndexKind,
    ModelRecord,
    before_filter,
    check_chunks,
    chunk_hit,
    chunk_payload,
    chunk_place,
    chunks_by_turn,
    context_multivector,
    first_per_turn,
    near_filter,
    own_windows,
    owner_filter,
    place_point_ids,
    point_id,
    scope_filter,
    stale_chunks_filter,
    stale_keywords_filter,
    stored_chunk,
    turn_point_ids,
    windows_counts,
)
from server.domain.errors import ErrorReason, MemoriaError, StorageFull
from server.domain.model import (
    EVERYONE,
    ChunkHit,
    ChunkPlace,
    ChunkWindows,
    DenseContextUpdate,
    EncodedQuery,
    IndexedChunk,
    Owner,
    RetrievalResult,
    SearchScope,
    StoredChunk,
    TurnKey,
)
from server.domain.model import SparseVector as DomainSparseVector

log = logging.getLogger(__name__)

SHARD_DIR = "shard"
"""The engine's own directory inside the index directory (the engine owns every file in it)."""

RECORD_FILE = "memoria-index.json"
"""The model record, next to the shard: which embedding model made the vectors."""

CANDIDATES_PER_TURN = 10
"""Points fetched per wanted turn on each side; a turn has at most 10 chunks (DESIGN 3)."""

MAX_FETCH_ROUNDS = 3
"""If a side's candidates cover too few turns while more points exist (turns with more chunks
than CANDIDATES_PER_TURN), fetch again with four times the limit, at most this many times."""


ENGINE_UNAVAILABLE_KINDS = (
    "Service runtime error",
    "Service error",
    "IO Error",
    "Gridstore IO error",
    "Unexpected IO error",
    "Inconsistent storage",
    "Out of memory",
    "Timeout error",
    "Operation cancelled",
)
"""Prefixes of the engine's error texts (qdrant's OperationError kinds, as qdrant-edge-py
0.9.0 words them) that mean the store cannot serve now, not that the request was wrong."""

_DISK_FULL = "(os error 28)"  # ENOSPC, as the engine's I/O errors quote it


@contextmanager
def _engine_errors() -> Iterator[None]:
    """The one place this adapter turns an engine failure into the caller's error (see the
    module on errors): nothing was changed that a retry would not redo."""
    try:
        yield
    except MemoriaError:
        raise
    except Exception as error:
        text = str(error)
        if type(error) is not Exception or not text.startswith(ENGINE_UNAVAILABLE_KINDS):
            raise
        if _DISK_FULL in text:
            log.warning("chunk index refused a write: its disk is full")
            raise MemoriaError(
                ErrorReason.STORAGE_FULL,
                "the conversation index's disk is full; nothing was changed, retry with backoff",
                details=StorageFull(),
            ) from error
        log.warning("chunk index unavailable: %s", text.split(":", 1)[0])
        raise MemoriaError(
            ErrorReason.STORE_UNAVAILABLE,
            "the conversation index is unavailable; nothing was changed, retry with backoff",
        ) from error


def _config(dimension: int) -> EdgeConfig:
    return EdgeConfig(
        vectors={
            DENSE_VECTOR: EdgeVectorParams(
                size=dimension,
                distance=Distance.Cosine,
                multivector_config=MultiVectorConfig(MultiVectorComparator.MaxSim),
            )
        },
        sparse_vectors={KEYWORD_VECTOR: EdgeSparseVectorParams(modifier=Modifier.Idf)},
    )


def _filter(spec: FilterSpec) -> Filter:
    must: list[Any] = [FieldCondition(key, match=MatchValue(value)) for key, value in spec.must]
    if spec.min_chunk_index is not None:
        must.append(FieldCondition(CHUNK_INDEX, range=RangeFloat(gte=spec.min_chunk_index)))
    if spec.min_turn_time is not None or spec.max_turn_time is not None:
        # Microseconds since 1970 are below 2**53: exact as the engine's float bounds.
        bounds = RangeFloat(gte=spec.min_turn_time, lte=spec.max_turn_time)
        must.append(FieldCondition(TURN_TIME, range=bounds))
    must_not: list[Any] = [
        FieldCondition(key, match=MatchAny(list(values))) for key, values in spec.must_not_in
    ]
    must_not += [FieldCondition(key, match=MatchValue(n)) for key, n in spec.must_not_number]
    return Filter(must=must or None, must_not=must_not or None)


def _open_error(error: Exception, data_dir: Path) -> ChunkIndexError:
    message = str(error)
    if "WAL" in message:  # "failed to open WAL ...: Can't init WAL: Kind(WouldBlock)"
        return ChunkIndexLockedError(
            f"the chunk index in {data_dir} is already open in another process (or another "
            "index object in this one); one process owns an embedded data directory at a "
            f"time. Stop the other process or use another data directory. ({message})"
        )
    return ChunkIndexError(f"cannot open the chunk index in {data_dir}: {message}")


class QdrantEdgeChunkIndex:
    """Every role of the chunk index (`ChunkIndex`, server/domain/ports.py) on an embedded
    EdgeShard under `path` (created on first use).

    `path` is this index's own directory (for example `<data-dir>/chunks`): the shard lives in
    `path/shard`, the model record in `path/memoria-index.json`. Opening a directory whose
    vectors came from another model or dimension raises EmbeddingMismatchError; opening one
    another process holds raises ChunkIndexLockedError.
    """

    def __init__(self, path: Path, dimension: int, model_id: str) -> None:
        self._path = path
        self._dimension = dimension
        self._record = ModelRecord(model_id=model_id, dimension=dimension)
        self._close_lock = threading.Lock()
        self._closed = False
        path.mkdir(parents=True, exist_ok=True)
        shard_dir = path / SHARD_DIR
        shard_exists = (shard_dir / "edge_config.json").exists()
        stored = self._read_record()
        if stored is None and shard_exists:
            raise ChunkIndexError(
                f"the chunk index in {path} has no {RECORD_FILE}, so the embedding model of "
                "its vectors is unknown; move the directory away and re-index"
            )
        if stored is None:
            # The record goes first: a crash before the shard exists leaves a record and no
            # shard, which the next open completes; never a shard of unknown origin.
            self._write_record()
        else:
            self._record.check_matches(stored, str(path))
        config = _config(dimension)
        try:
            if shard_exists:
                # Passing the config makes the engine check it against the stored segments.
                self._shard = EdgeShard.load(str(shard_dir), config)
            else:
                self._shard = EdgeShard.create(str(shard_dir), config)
        except Exception as error:
            raise _open_error(error, path) from error
        try:
            self._create_payload_indexes()
        except BaseException:
            self._shard.close()  # release the directory's lock for the next attempt
            raise

    def _create_payload_indexes(self) -> None:
        existing = self._shard.info().payload_schema
        for field, kind in PAYLOAD_INDEXES:  # also adds indexes new in a later release
            if field in existing:
                continue
            if kind is IndexKind.TENANT_KEYWORD:
                schema: Any = KeywordIndexParams(is_tenant=True)
            elif kind is IndexKind.KEYWORD:
                schema = PayloadSchemaType.Keyword
            else:
                schema = PayloadSchemaType.Integer
            self._shard.update(UpdateOperation.create_field_index(field, schema))

    def _read_record(self) -> ModelRecord | None:
        return read_model_record(self._path)

    def _write_record(self) -> None:
        # Written whole or not at all: temporary file, fsync, rename, fsync the directory.
        target = self._path / RECORD_FILE
        temporary = target.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as file:
            json.dump(self._record.to_json(), file, indent=2)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(target)
        directory = os.open(self._path, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    @_engine_errors()
    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        """Write the turn's chunks, then delete its chunks beyond the new count.

        Upsert first, so the turn never vanishes from search while it is replaced. Each
        update is in the shard's log when it returns (see the module on durability).
        """
        check_chunks(chunks, self._dimension)
        if chunks:
            points = [
                Point(
                    point_id(key, chunk.chunk_index),
                    {
                        DENSE_VECTOR: [list(window) for window in chunk.dense],
                        KEYWORD_VECTOR: SparseVector(
                            list(chunk.sparse.indices), list(chunk.sparse.values)
                        ),
                    },
                    chunk_payload(key, turn_time, chunk),
                )
                for chunk in chunks
            ]
            self._shard.update(UpdateOperation.upsert_points(points))
        self._shard.update(
            UpdateOperation.delete_points_by_filter(_filter(stale_chunks_filter(key, len(chunks))))
        )

    @_engine_errors()
    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        """Both retrievals in one engine batch, each reduced to its best chunk per turn.

        A query without keyword terms (all stop words, say) has an empty keyword side. Any
        engine error propagates: a search never returns one side alone.
        """
        if turns <= 0:
            return RetrievalResult(keyword=(), semantic=())
        where = _filter(scope_filter(scope))
        queries: dict[str, Any] = {
            "semantic": Query.Nearest([list(query.dense)], using=DENSE_VECTOR)
        }
        if query.sparse.indices:
            queries["keyword"] = Query.Nearest(
                SparseVector(list(query.sparse.indices), list(query.sparse.values)),
                using=KEYWORD_VECTOR,
            )
        limit = turns * CANDIDATES_PER_TURN
        kept: dict[str, list[tuple[uuid.UUID | str | int, float]]] = {}
        pending = dict(queries)
        for round_ in range(MAX_FETCH_ROUNDS + 1):
            names = list(pending)
            results = self._shard.query_batch(
                QueryBatchRequest(
                    [
                        QueryRequest(
                            limit=limit, query=pending[n], filter=where, with_payload=False
                        )
                        for n in names
                    ]
                )
            )
            pending = {}
            for name, points in zip(names, results, strict=True):
                kept[name] = first_per_turn(((p.id, p.score) for p in points), turns)
                if len(kept[name]) < turns and len(points) == limit and round_ < MAX_FETCH_ROUNDS:
                    pending[name] = queries[name]
            if not pending:
                break
            limit *= 4
        hits = self._load_hits({point for side in kept.values() for point, _ in side})
        return RetrievalResult(
            keyword=self._side(kept.get("keyword", []), hits),
            semantic=self._side(kept.get("semantic", []), hits),
        )

    def _load_hits(self, points: set[uuid.UUID | str | int]) -> dict[str, dict[str, Any]]:
        if not points:
            return {}
        records = self._shard.retrieve(list(points), True, False)
        return {str(r.id): dict(r.payload or {}) for r in records}

    @staticmethod
    def _side(
        ranked: list[tuple[uuid.UUID | str | int, float]], payloads: dict[str, dict[str, Any]]
    ) -> tuple[ChunkHit, ...]:
        # A point deleted between the query and the retrieve (its conversation was just
        # deleted or its turn shortened) is left out, as a search a moment later would.
        return tuple(
            chunk_hit(payloads[str(point)], score)
            for point, score in ranked
            if str(point) in payloads
        )

    @_engine_errors()
    def stale_keyword_chunks(
        self, version: int, limit: int, owner: Owner = EVERYONE
    ) -> list[StoredChunk]:
        """Up to `limit` chunks whose keyword vector is not of `version` (one scroll)."""
        records, _next = self._shard.scroll(
            ScrollRequest(
                limit=limit,
                filter=_filter(stale_keywords_filter(version, owner)),
                with_payload=True,
                with_vector=False,
            )
        )
        return [stored_chunk(r.payload or {}) for r in records]

    @_engine_errors()
    def count_stale_keyword_chunks(self, version: int, owner: Owner = EVERYONE) -> int:
        """Exact number of chunks whose keyword vector is not of `version`."""
        return self._shard.count(
            CountRequest(exact=True, filter=_filter(stale_keywords_filter(version, owner)))
        )

    @_engine_errors()
    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, DomainSparseVector]], version: int
    ) -> None:
        """Replace the keyword vectors of the chunks that still exist, then record `version`.

        The engine refuses a vector update of a missing point, so the chunks deleted since
        they were read are left out first. A crash between the two updates leaves a new
        vector under the old version, which the next run writes again (idempotent)."""
        if not updates:
            return
        ids = {point_id(chunk.key, chunk.chunk_index): sparse for chunk, sparse in updates}
        existing: list[uuid.UUID | str | int] = [
            str(r.id) for r in self._shard.retrieve(list(ids), False, False)
        ]
        if not existing:
            return
        self._shard.update(
            UpdateOperation.update_vectors(
                [
                    PointVectors(
                        point,
                        {
                            KEYWORD_VECTOR: SparseVector(
                                list(ids[str(point)].indices), list(ids[str(point)].values)
                            )
                        },
                    )
                    for point in existing
                ]
            )
        )
        self._shard.update(UpdateOperation.set_payload(existing, {KEYWORD_VERSION_FIELD: version}))

    @_engine_errors()
    def chunk_windows(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        places: Sequence[tuple[str, int]],
    ) -> ChunkWindows:
        """See `DenseVectors.chunk_windows`: the points by id, their dense vectors and the
        payload's window count."""
        ids = place_point_ids(tenant_id, principal_id, conversation_id, places)
        if not ids:
            return {}
        records = self._shard.retrieve(list(ids), True, [DENSE_VECTOR])
        return {ids[str(r.id)]: own_windows(_dense_of(r.vector), r.payload or {}) for r in records}

    @_engine_errors()
    def set_dense_context(
        self,
        updates: Sequence[DenseContextUpdate],
    ) -> None:
        """See `DenseVectors.set_dense_context`: the chunks still stored get their windows and
        context as their dense vector, and their window count in the payload."""
        if not updates:
            return
        by_id = {
            point_id(key, chunk): (windows, context) for key, chunk, windows, context in updates
        }
        existing = [str(r.id) for r in self._shard.retrieve(list(by_id), False, False)]
        if not existing:
            return
        self._shard.update(
            UpdateOperation.update_vectors(
                [
                    PointVectors(point, {DENSE_VECTOR: context_multivector(*by_id[point])})
                    for point in existing
                ]
            )
        )
        windows = {point: by_id[point][0] for point in existing}
        for count, points in windows_counts(existing, windows).items():
            self._shard.update(UpdateOperation.set_payload(list(points), {WINDOWS: count}))

    @_engine_errors()
    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        """Delete every chunk of the conversation, however many, in one filtered delete."""
        spec = owner_filter(tenant_id, principal_id, conversation_id)
        self._shard.update(UpdateOperation.delete_points_by_filter(_filter(spec)))

    @_engine_errors()
    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        """Delete every chunk of the principal, however many, in one filtered delete."""
        spec = owner_filter(tenant_id, principal_id)
        self._shard.update(UpdateOperation.delete_points_by_filter(_filter(spec)))

    @_engine_errors()
    def delete_before(self, tenant_id: str, principal_id: str, before: datetime) -> None:
        """Delete every chunk of the principal with a turn time before `before`, in one
        filtered delete."""
        spec = before_filter(tenant_id, principal_id, before)
        self._shard.update(UpdateOperation.delete_points_by_filter(_filter(spec)))

    @_engine_errors()
    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        """Exact number of chunks of the principal, or of one of its conversations."""
        spec = owner_filter(tenant_id, principal_id, conversation_id)
        return self._shard.count(CountRequest(exact=True, filter=_filter(spec)))

    @_engine_errors()
    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        """The turns' chunk texts, read by point id in one retrieve."""
        ids: list[uuid.UUID | str | int] = list(turn_point_ids(tenant_id, principal_id, turns))
        if not ids:
            return {}
        records = self._shard.retrieve(ids, True, False)
        return chunks_by_turn(tenant_id, principal_id, (dict(r.payload or {}) for r in records))

    @_engine_errors()
    def places_near(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        turn_time: datetime,
        limit: int,
    ) -> tuple[list[ChunkPlace], list[ChunkPlace]]:
        """Two scrolls ordered by turn_time (its payload index): down from `turn_time`, and up
        from it."""
        sides = []
        for side, direction in (("before", Direction.Desc), ("after", Direction.Asc)):
            spec = near_filter(tenant_id, principal_id, conversation_id, turn_time, side)
            records, _next = self._shard.scroll(
                ScrollRequest(
                    limit=limit,
                    filter=_filter(spec),
                    with_payload=PayloadSelector.Include(list(PLACE_FIELDS)),
                    with_vector=False,
                    order_by=OrderBy(TURN_TIME, direction),
                )
            )
            sides.append([chunk_place(r.payload or {}) for r in records])
        return sides[0], sides[1]

    @_engine_errors()
    def conversation_places(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> list[ChunkPlace]:
        """The conversation's chunk places: a scroll of their PLACE_FIELDS, page by page."""
        places: list[ChunkPlace] = []
        offset: uuid.UUID | str | int | None = None
        while True:
            records, offset = self._shard.scroll(
                ScrollRequest(
                    offset=offset,
                    limit=PLACES_PAGE,
                    filter=_filter(owner_filter(tenant_id, principal_id, conversation_id)),
                    with_payload=PayloadSelector.Include(list(PLACE_FIELDS)),
                    with_vector=False,
                )
            )
            places += (chunk_place(r.payload or {}) for r in records)
            if offset is None:
                return places

    @_engine_errors()
    def check(self) -> None:
        """Return if the shard answers (a metadata read of a few microseconds), else raise:
        in-process, it fails only once closed or broken."""
        self._shard.info()

    @_engine_errors()
    def flush(self) -> None:
        """Sync the log and segments to disk (a sync point across operating-system crashes)."""
        self._shard.flush()

    @_engine_errors()
    def optimize(self) -> bool:
        """Merge segments, build indexes and vacuum deleted points; True if anything changed.

        Blocks every Python thread of the process until it finishes (minutes at 100,000
        chunks), so call it only from a maintenance command, never while serving.
        """
        return self._shard.optimize()

    @_engine_errors()
    def close(self) -> None:
        """Flush and release the shard (and its lock on the directory), released even when
        the flush fails. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._shard.flush()  # close flushes too (documented); explicit, as it is the point
            finally:
                self._shard.close()


def read_model_record(path: Path) -> ModelRecord | None:
    """The model record of the chunk index in `path`, None when there is none yet (a new
    index); read without opening the index, so the embedder can be chosen before it."""
    try:
        text = (path / RECORD_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        record = ModelRecord.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError) as error:
        raise ChunkIndexError(f"{path / RECORD_FILE} is unreadable: {error}") from error
    if record is None:
        raise ChunkIndexError(f"{path / RECORD_FILE} is not a Memoria model record")
    return record


def _dense_of(vector: Any) -> list[list[float]]:
    """The dense multivector of a retrieved record's vectors (a mapping by name)."""
    dense: list[list[float]] = (vector or {}).get(DENSE_VECTOR) or []
    return dense
