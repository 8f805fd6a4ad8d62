"""What both Qdrant chunk indexes share: point ids, the payload, filters, the model record.

`QdrantEdgeChunkIndex` (embedded engine) and `QdrantServerChunkIndex` (qdrant-client) speak
different client libraries, but store the same points and apply the same scoping rules. The
rules live here once, engine-neutral, so the two adapters cannot drift apart on what a point
looks like or on which filters make a search safe.

Layout of the one collection (one for all tenants, DESIGN 4):
- Point id: a UUID derived from the turn (uuid5 over a fixed namespace and a length-prefixed
  encoding of tenant, principal, conversation and turn) whose last two bytes carry the chunk
  index. Writing a turn again therefore writes the same ids (idempotent re-indexing), and the
  turn of a hit can be read off its id without loading its payload (the embedded engine groups
  hits by turn on the client; see edge.py).
- Payload: tenant_id, principal_id, conversation_id, turn_id, chunk_index (int), turn_time
  (int, microseconds since the Unix epoch, UTC: exact, ordered and engine-neutral), text,
  turn_key (the turn's UUID as a string: one keyword to group by and to delete by), and
  keyword_version (int: the keyword representation of the sparse vector, KEYWORD_VERSION in
  server/domain/keywords.py; absent on points written before it, which are version 1) and
  turn_order (int: the order the turn was accepted in, which orders a conversation's turns
  of equal time; absent on points written before it, read as 0).
  windows (int: how many of the dense multivector's vectors are the chunk's own windows,
  written with a context vector after them, server/domain/context.py DenseContext; absent
  when the multivector is the windows alone).
  No booleans anywhere: the embedded engine's boolean filters silently never match.
- Vectors: "dense", a MAX_SIM multivector of unit vectors compared by cosine (one vector per
  window of the chunk, then for some models its context vector); "keyword", a sparse BM25
  term-frequency vector with the engine's IDF modifier.
- Payload indexes: keyword on tenant_id (marked is_tenant), principal_id, conversation_id
  (deleted conversations and a search bounded to one conversation) and turn_key; integer on
  chunk_index, keyword_version and turn_time (a search's time bounds, and a turn's neighbours
  found in time order).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from server.domain.chunking import MAX_CHUNKS
from server.domain.model import (
    EVERYONE,
    ChunkHit,
    ChunkPlace,
    IndexedChunk,
    Owner,
    SearchScope,
    StoredChunk,
    TurnKey,
)

DENSE_VECTOR = "dense"
"""Name of the semantic (multi)vector."""

KEYWORD_VECTOR = "keyword"
"""Name of the sparse BM25 vector."""

TENANT_ID = "tenant_id"
PRINCIPAL_ID = "principal_id"
CONVERSATION_ID = "conversation_id"
TURN_ID = "turn_id"
TURN_KEY = "turn_key"
CHUNK_INDEX = "chunk_index"
TURN_TIME = "turn_time"
TEXT = "text"
KEYWORD_VERSION_FIELD = "keyword_version"
TURN_ORDER = "turn_order"
WINDOWS = "windows"

PLACE_FIELDS = (TURN_ID, CHUNK_INDEX, TURN_TIME, TURN_ORDER)
"""The payload fields a conversation's order is read from (the text is left on the server)."""

PLACES_PAGE = 1000
"""Points per scroll page when a conversation's places are read."""

SCHEMA_VERSION = 1
"""Version of the point layout above; recorded with the collection, checked on open."""

MAX_CHUNK_INDEX = 0xFFFF
"""Chunk indexes live in the last two bytes of a point id."""

_NAMESPACE = uuid.UUID("6f0c1c52-5c1e-4d0e-9a43-7d2d0b6e3a11")
"""Fixed forever: changing it changes every point id, and re-indexing would duplicate."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


class IndexKind(enum.Enum):
    """Which payload index a field gets."""

    TENANT_KEYWORD = "tenant_keyword"
    KEYWORD = "keyword"
    INTEGER = "integer"


PAYLOAD_INDEXES: tuple[tuple[str, IndexKind], ...] = (
    (TENANT_ID, IndexKind.TENANT_KEYWORD),
    (PRINCIPAL_ID, IndexKind.KEYWORD),
    (CONVERSATION_ID, IndexKind.KEYWORD),
    (TURN_KEY, IndexKind.KEYWORD),
    (CHUNK_INDEX, IndexKind.INTEGER),
    (TURN_TIME, IndexKind.INTEGER),
    (KEYWORD_VERSION_FIELD, IndexKind.INTEGER),
)
"""Every filtered or grouped field is indexed; tenant_id co-locates each tenant's points."""


class ChunkIndexError(RuntimeError):
    """The chunk index cannot be opened or used as configured (a deployment problem)."""


class EmbeddingMismatchError(ChunkIndexError):
    """The stored vectors were made by another embedding model or with another dimension.

    Mixing two models' vectors in one collection silently ruins semantic search, so opening
    such a collection fails instead; re-index into a new collection or data directory.
    """


class ChunkIndexLockedError(ChunkIndexError):
    """Another process (or another index object in this one) already has the store open."""


# --- Ids and payload -----------------------------------------------------------------------


def _encode(*parts: str) -> bytes:
    # Length-prefixed, so no id can contain a separator that makes two tuples encode alike.
    return b"".join(f"{len(p.encode())}:".encode() + p.encode() for p in parts)


def turn_uuid(key: TurnKey) -> uuid.UUID:
    """The turn's UUID: uuid5 of the turn with its last two bytes zero (room for chunks)."""
    digest = uuid.uuid5(
        _NAMESPACE,
        _encode(key.tenant_id, key.principal_id, key.conversation_id, key.turn_id).decode(),
    ).bytes
    return uuid.UUID(bytes=digest[:14] + b"\x00\x00")


def turn_key(key: TurnKey) -> str:
    """The turn_key payload value: unique per (tenant, principal, conversation, turn)."""
    return str(turn_uuid(key))


def point_id(key: TurnKey, chunk_index: int) -> str:
    """The id of one chunk's point: the turn's UUID with the chunk index in its last bytes."""
    if not 0 <= chunk_index <= MAX_CHUNK_INDEX:
        raise ValueError(f"chunk_index {chunk_index} is outside 0..{MAX_CHUNK_INDEX}")
    return str(uuid.UUID(bytes=turn_uuid(key).bytes[:14] + chunk_index.to_bytes(2, "big")))


def turn_of_point(point: uuid.UUID | str | int) -> bytes:
    """Identifies the turn of a point id (its first 14 bytes); equal for chunks of one turn."""
    if isinstance(point, int):  # never written by us; keep it distinct from every turn
        return b"int:" + str(point).encode()
    value = point if isinstance(point, uuid.UUID) else uuid.UUID(point)
    return value.bytes[:14]


def to_epoch_micros(moment: datetime) -> int:
    """A timezone-aware time as integer microseconds since the Unix epoch (exact)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("turn_time must be timezone-aware")
    return (moment - _EPOCH) // _MICROSECOND


def from_epoch_micros(micros: int) -> datetime:
    """The inverse of to_epoch_micros, as a UTC datetime."""
    return _EPOCH + timedelta(microseconds=micros)


def check_chunks(chunks: Sequence[IndexedChunk], dimension: int) -> None:
    """Reject chunks the index cannot store correctly, before anything is written.

    Chunk indexes must be exactly 0..n-1 (the stale-chunk cleanup deletes indexes >= n), and
    every chunk needs at least one dense window of the index's dimension and a well-formed
    sparse vector. The engines would reject some of these too, but with less clear messages
    and possibly after part of a turn was written.
    """
    indexes = sorted(c.chunk_index for c in chunks)
    if indexes != list(range(len(chunks))):
        raise ValueError(f"chunk indexes must be 0..{len(chunks) - 1}, got {indexes}")
    if len(chunks) > MAX_CHUNK_INDEX + 1:
        raise ValueError(f"at most {MAX_CHUNK_INDEX + 1} chunks per turn")
    for chunk in chunks:
        if not chunk.dense:
            raise ValueError(f"chunk {chunk.chunk_index} has no dense vector")
        for window in chunk.dense:
            if len(window) != dimension:
                raise ValueError(
                    f"chunk {chunk.chunk_index} has a dense vector of dimension "
                    f"{len(window)}; the index stores {dimension}"
                )
        if len(chunk.sparse.indices) != len(chunk.sparse.values):
            raise ValueError(f"chunk {chunk.chunk_index} has a malformed sparse vector")


def chunk_payload(key: TurnKey, turn_time: datetime, chunk: IndexedChunk) -> dict[str, Any]:
    """The payload stored with one chunk's point."""
    return {
        TENANT_ID: key.tenant_id,
        PRINCIPAL_ID: key.principal_id,
        CONVERSATION_ID: key.conversation_id,
        TURN_ID: key.turn_id,
        TURN_KEY: turn_key(key),
        CHUNK_INDEX: chunk.chunk_index,
        TURN_TIME: to_epoch_micros(turn_time),
        TEXT: chunk.text,
        KEYWORD_VERSION_FIELD: chunk.keyword_version,
        TURN_ORDER: chunk.turn_order,
    }


def chunk_place(payload: Mapping[str, Any]) -> ChunkPlace:
    """Where a stored point's chunk sits in its conversation (from the PLACE_FIELDS)."""
    return ChunkPlace(
        turn_id=str(payload[TURN_ID]),
        chunk_index=int(payload[CHUNK_INDEX]),
        turn_time=from_epoch_micros(int(payload[TURN_TIME])),
        turn_order=int(payload.get(TURN_ORDER, 0)),
    )


def stored_chunk(payload: Mapping[str, Any]) -> StoredChunk:
    """The chunk a stored point's payload describes (for encoding its keyword vector again)."""
    return StoredChunk(
        key=TurnKey(
            str(payload[TENANT_ID]),
            str(payload[PRINCIPAL_ID]),
            str(payload[CONVERSATION_ID]),
            str(payload[TURN_ID]),
        ),
        chunk_index=int(payload[CHUNK_INDEX]),
        text=str(payload[TEXT]),
        turn_time=from_epoch_micros(int(payload[TURN_TIME])),
    )


def chunk_hit(payload: Mapping[str, Any], score: float) -> ChunkHit:
    """A search hit from a stored point's payload and the side's raw score."""
    return ChunkHit(
        conversation_id=str(payload[CONVERSATION_ID]),
        turn_id=str(payload[TURN_ID]),
        chunk_index=int(payload[CHUNK_INDEX]),
        text=str(payload[TEXT]),
        turn_time=from_epoch_micros(int(payload[TURN_TIME])),
        score=float(score),
    )


def first_per_turn(
    ranked: Iterable[tuple[uuid.UUID | str | int, float]], turns: int
) -> list[tuple[uuid.UUID | str | int, float]]:
    """Keep the first (best) point of each turn from a best-first list, at most `turns`.

    Used where the engine cannot group (the embedded engine): one long turn must not fill a
    page with its chunks (DESIGN 3).
    """
    seen: set[bytes] = set()
    kept: list[tuple[uuid.UUID | str | int, float]] = []
    for point, score in ranked:
        turn = turn_of_point(point)
        if turn in seen:
            continue
        seen.add(turn)
        kept.append((point, score))
        if len(kept) == turns:
            break
    return kept


# --- Filters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterSpec:
    """An engine-neutral filter: each adapter translates it to its client's Filter type.

    A point matches when every `must` field equals its value, no `must_not_in` field has
    one of the listed values, no `must_not_number` field equals its integer (a point without
    the field matches), (when set) its chunk_index is at least `min_chunk_index`, and its
    turn_time (microseconds) is at least `min_turn_time` and at most `max_turn_time`.
    """

    must: tuple[tuple[str, str], ...]
    must_not_in: tuple[tuple[str, tuple[str, ...]], ...] = ()
    min_chunk_index: int | None = None
    must_not_number: tuple[tuple[str, int], ...] = ()
    min_turn_time: int | None = None
    max_turn_time: int | None = None


def scope_filter(scope: SearchScope) -> FilterSpec:
    """What a search may see: the scope's tenant and principal, minus deleted conversations,
    within the caller's bounds (one conversation; turn times from `start_time` inclusive to
    `end_time` exclusive).

    Applied inside the engine to both sides' queries, so another principal's chunk is never
    even scored and a side's top list holds only turns within the bounds (each bound uses a
    payload index: conversation_id keyword, turn_time integer). turn_time is stored in whole
    microseconds, so "before end" is "at most end minus one microsecond".
    """
    deleted = tuple(sorted(scope.deleted_conversations))
    bounds = scope.bounds
    must = [(TENANT_ID, scope.tenant_id), (PRINCIPAL_ID, scope.principal_id)]
    if bounds.conversation_id is not None:
        must.append((CONVERSATION_ID, bounds.conversation_id))
    start, end = bounds.start_time, bounds.end_time
    return FilterSpec(
        must=tuple(must),
        must_not_in=((CONVERSATION_ID, deleted),) if deleted else (),
        min_turn_time=None if start is None else to_epoch_micros(start),
        max_turn_time=None if end is None else to_epoch_micros(end) - 1,
    )


def owner_filter(
    tenant_id: str, principal_id: str, conversation_id: str | None = None
) -> FilterSpec:
    """Every chunk of a principal, or of one of its conversations."""
    must = [(TENANT_ID, tenant_id), (PRINCIPAL_ID, principal_id)]
    if conversation_id is not None:
        must.append((CONVERSATION_ID, conversation_id))
    return FilterSpec(must=tuple(must))


def before_filter(tenant_id: str, principal_id: str, before: datetime) -> FilterSpec:
    """Every chunk of a principal whose turn time is before `before` (the retention purge)."""
    return replace(owner_filter(tenant_id, principal_id), max_turn_time=to_epoch_micros(before) - 1)


def near_filter(
    tenant_id: str, principal_id: str, conversation_id: str, turn_time: datetime, side: str
) -> FilterSpec:
    """The conversation's chunks of a time at most (side "before") or at least ("after")
    `turn_time`: what `places_near` orders by time from it."""
    micros = to_epoch_micros(turn_time)
    spec = owner_filter(tenant_id, principal_id, conversation_id)
    if side == "before":
        return FilterSpec(must=spec.must, max_turn_time=micros)
    return FilterSpec(must=spec.must, min_turn_time=micros)


def stale_keywords_filter(version: int, owner: Owner = EVERYONE) -> FilterSpec:
    """Every chunk of the owner (any tenant by default) whose keyword vector is not of
    representation `version` (chunks written before versions were recorded have no version
    field: they match)."""
    must = [(TENANT_ID, owner.tenant_id)] if owner.tenant_id is not None else []
    if owner.principal_id is not None:
        must.append((PRINCIPAL_ID, owner.principal_id))
    return FilterSpec(must=tuple(must), must_not_number=((KEYWORD_VERSION_FIELD, version),))


def stale_chunks_filter(key: TurnKey, chunk_count: int) -> FilterSpec:
    """The turn's chunks at index `chunk_count` and beyond: left over from a longer version."""
    return FilterSpec(
        must=(
            (TENANT_ID, key.tenant_id),
            (PRINCIPAL_ID, key.principal_id),
            (TURN_KEY, turn_key(key)),
        ),
        min_chunk_index=chunk_count,
    )


# --- The model record ----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRecord:
    """Which embedding model made a collection's dense vectors, and the point layout.

    Stored when the collection is created (collection metadata on a server, a JSON file next
    to the embedded shard) and compared on every open.
    """

    model_id: str
    dimension: int
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-able metadata (flat keys, so server metadata merges cleanly)."""
        return {
            "memoria_embedding_model": self.model_id,
            "memoria_embedding_dimension": self.dimension,
            "memoria_schema_version": self.schema_version,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ModelRecord | None:
        """The record in `data`, or None when `data` holds no Memoria record."""
        if not data or "memoria_embedding_model" not in data:
            return None
        return cls(
            model_id=str(data["memoria_embedding_model"]),
            dimension=int(data["memoria_embedding_dimension"]),
            schema_version=int(data.get("memoria_schema_version", 0)),
        )

    def check_matches(self, stored: ModelRecord, where: str) -> None:
        """Raise EmbeddingMismatchError unless `stored` (found at `where`) equals this one."""
        if stored == self:
            return
        raise EmbeddingMismatchError(
            f"the chunk index at {where} holds vectors of embedding model "
            f"{stored.model_id!r} (dimension {stored.dimension}, schema "
            f"{stored.schema_version}), but this server embeds with {self.model_id!r} "
            f"(dimension {self.dimension}, schema {self.schema_version}). Mixing two models' "
            "vectors would silently ruin search: configure the same model, or index into a new "
            "collection or data directory."
        )


def place_point_ids(
    tenant_id: str, principal_id: str, conversation_id: str, places: Iterable[tuple[str, int]]
) -> dict[str, tuple[str, int]]:
    """The point id of each (turn id, chunk index) place of one conversation, to its place."""
    return {
        point_id(TurnKey(tenant_id, principal_id, conversation_id, turn), chunk): (turn, chunk)
        for turn, chunk in places
    }


def windows_counts(
    points: Iterable[str], windows: Mapping[str, Sequence[object]]
) -> dict[int, list[str]]:
    """The points grouped by their window count (one payload write per count)."""
    counts: dict[int, list[str]] = {}
    for point in points:
        counts.setdefault(len(windows[point]), []).append(point)
    return counts


def own_windows(
    vectors: Sequence[Sequence[float]], payload: Mapping[str, Any]
) -> tuple[tuple[float, ...], ...]:
    """A point's window vectors: its dense multivector without the context vector that
    follows them when the payload counts its windows."""
    count = payload.get(WINDOWS)
    kept = vectors[:count] if isinstance(count, int) else vectors
    return tuple(tuple(float(x) for x in v) for v in kept)


def context_multivector(
    windows: Sequence[Sequence[float]], context: Sequence[float]
) -> list[list[float]]:
    """The dense multivector of a chunk with a context vector: its windows, then the context."""
    return [list(w) for w in windows] + [list(context)]


def turn_point_ids(
    tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
) -> list[str]:
    """Every point id the chunks of these turns can have (chunk indexes 0..MAX_CHUNKS-1), so
    a turn's chunks are read by id, without a scroll over the principal."""
    return [
        point_id(TurnKey(tenant_id, principal_id, conversation, turn), i)
        for conversation, turn in turns
        for i in range(MAX_CHUNKS)
    ]


def chunks_by_turn(
    tenant_id: str, principal_id: str, payloads: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, str], tuple[str, ...]]:
    """The retrieved chunks' texts grouped by (conversation, turn), in chunk order. Payloads of
    another owner are ignored (ids derive from the owner, so there are none; kept as a guard)."""
    found: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for payload in payloads:
        if payload.get(TENANT_ID) != tenant_id or payload.get(PRINCIPAL_ID) != principal_id:
            continue
        turn = (str(payload[CONVERSATION_ID]), str(payload[TURN_ID]))
        found.setdefault(turn, []).append((int(payload[CHUNK_INDEX]), str(payload[TEXT])))
    return {turn: tuple(text for _, text in sorted(chunks)) for turn, chunks in found.items()}
