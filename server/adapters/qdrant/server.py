"""The chunk index on a Qdrant server or cluster, through qdrant-client (production).

One collection holds every tenant's chunks (layout: layout.py), with a keyword payload
index on tenant_id marked `is_tenant`, so the server stores each tenant's points together.
Production builds its client with `server_client` (gRPC preferred, on a port of its own); the
contract tests run on a real Qdrant server the suite starts (tests/qdrant_server.py) and on
`QdrantClient(location=":memory:")` (qdrant-client's local mode), which accepts the same calls.

Server versions: Memoria is tested on Qdrant 1.18.x (TESTED_SERVER). Any other 1.x from 1.16
on (MIN_SERVER: collection metadata, which keeps the model record, exists since 1.16) is
accepted with a warning at open; an older server or another major version is refused at open
with a ChunkIndexError that says which versions work. qdrant-client's own check (a warning
whenever client and server minor versions differ by more than one, from a thread at every
client creation) is turned off: this check replaces it, once per open, in the log.

Decisions:
- The embedding model is recorded in the collection's metadata (collection metadata exists
  since Qdrant 1.16 and qdrant-client 1.16); every open compares it, and the vector
  configuration, with this server's model. A server that drops the metadata (older than 1.16)
  is refused at creation rather than left to mix models later.
- A turn is written with one `batch_update_points` request: the upsert of its chunks, then the
  delete of its chunks beyond the new count, both with `wait=True`, so the turn is stored and
  searchable when the call returns. The server applies the two in order; a search between them
  may still see a stale chunk, never a missing turn.
- No global HNSW graph (HNSW_CONFIG: `m=0`, `payload_m=16`), links only per principal
  (`enable_hnsw` on the principal_id index alone): every search filters on one tenant and
  principal, so a graph over the collection is never searched, and a graph per value of the
  other indexed fields (a conversation id such as "c0" is shared by every principal; one
  keyword version covers every point) would each cost as much to build. A principal smaller
  than the full-scan threshold (~3,500 chunks of two windows) is scanned exactly through its
  payload index; a larger one is searched on its own links. Set at creation only: a collection
  created by an earlier release keeps its global graph and keeps working (measured in
  tests/contract/test_qdrant_server_collection.py); to move it, recreate it and re-index.
  `enable_hnsw` is newer than Qdrant 1.16 (qdrant/qdrant#7887): untested on a 1.16 server,
  where every indexed field would get links (correct, but the optimizer's time again).
- Search groups on the server: `query_points_groups` by turn_key with `group_size=1` returns
  the best chunk of each turn. qdrant-client has no batch form of the groups query, so the two
  sides are two calls; an error on either propagates (no one-sided results).
- An unreachable server (connection refused, deadline exceeded, HTTP transport error) becomes
  MemoriaError(STORE_UNAVAILABLE), like the SQL store's connection errors: nothing is changed
  and the caller may retry. Other errors propagate as they are.
- Ports: the URL's port is the REST port; gRPC has a port of its own (qdrant-client's
  `grpc_port`), which the settings derive or take as given (server/runtime/settings/groups.py). With
  `prefer_grpc=False` every call goes over REST to the URL's port.

Differences in local mode (tests only), none of which changes the calls made:
- Payload indexes have no effect and are not reported back (`payload_schema` is empty), so
  they are created again on each open; local mode warns once per process that they do
  nothing, and the tests silence that one warning.
- Local mode is pure Python and not thread-safe, so calls on a local-mode client take a lock;
  on a real server the client is thread-safe and no lock is taken.
- The IDF modifier and MAX_SIM multivectors are supported by local mode and score like the
  server (the contract tests check ranking, not exact scores).

What the real server (1.18.3, tests/qdrant_server.py) showed beyond local mode:
- The payload indexes and `is_tenant` are kept and read back (`payload_schema`), so they are
  created once; server-side grouping, IDF and MAX_SIM give the rankings the contract suite
  expects, the same as local mode and the embedded engine.
- Points with equal scores may come back in another order from one run to the next; nothing
  here depends on the order of ties (nor do the tests).
- A server that went away and came back stayed unreachable for as long as gRPC's reconnect
  backoff (up to 120 s by default): capped here (RECONNECT_BACKOFF_MS).
- With `m=0` and no principal links, a principal above the full-scan threshold got no hits
  at all from a graph search (its segment had no links for it); with its links, the same
  turns as an exact search. After 100,000 chunks were written (two optimizer threads, 2
  cores), the optimizer was idle 15-17 s after the last upsert with this configuration,
  465 s with the server's default (a global graph plus per-value links of large blocks of
  every indexed field); at 1,000,000 chunks, 42 s (bench/README.md, "Cost as data grows").
- On a three-node cluster with replication factor 2, writes with `wait=True` and searches
  through a surviving node kept succeeding while another node was down, and the node caught
  up after its restart (tests/api/test_qdrant_cluster.py).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import grpc
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException
from qdrant_client.local.qdrant_local import QdrantLocal

from server.adapters.qdrant.layout import (
    CHUNK_INDEX,
    DENSE_VECTOR,
    KEYWORD_VECTOR,
    KEYWORD_VERSION_FIELD,
    PAYLOAD_INDEXES,
    PLACE_FIELDS,
    PLACES_PAGE,
    PRINCIPAL_ID,
    TURN_KEY,
    TURN_TIME,
    WINDOWS,
    ChunkIndexError,
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
from server.domain.errors import ErrorReason, MemoriaError
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

_UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

MIN_SERVER = (1, 16)
"""The oldest Qdrant server that works: collection metadata (the model record) is 1.16's."""
TESTED_SERVER = (1, 18)
"""The Qdrant server minor version the test suite runs against (../shared/qdrant, 1.18.3)."""
RECONNECT_BACKOFF_MS = 2000
"""The longest a gRPC channel waits between attempts to reach a server that went away."""
HNSW_CONFIG = qm.HnswConfigDiff(m=0, payload_m=16)
"""No global HNSW graph, only one per large principal (Qdrant's multitenancy advice, with the
principal as the tenant unit): every search filters on one tenant and principal, so a graph
over the whole collection is never used, and building it was most of the optimizer's time.
Applies when a collection is created; an existing one keeps its own (it keeps working)."""
_VERSION = re.compile(r"(\d+)\.(\d+)")


def server_client(
    url: str,
    *,
    grpc_port: int,
    prefer_grpc: bool = True,
    api_key: str | None = None,
    timeout: int | None = None,
) -> QdrantClient:
    """A client of the Qdrant server at `url` (its REST port) with gRPC on `grpc_port`.

    qdrant-client's version check is off (see the module docstring: `check_server_version`
    does it once per open instead of warning from a thread on every client). gRPC's reconnect
    backoff is capped (RECONNECT_BACKOFF_MS): by default it grows to 120 s, and a channel in
    backoff fails every call at once without trying the server, so search stayed unavailable
    long after the server was back (measured on a real server after a 45 s outage: 23 s
    until the first call succeeded; with the cap, 1.6 s)."""
    return QdrantClient(
        url=url,
        grpc_port=grpc_port,
        prefer_grpc=prefer_grpc,
        api_key=api_key,
        timeout=timeout,
        check_compatibility=False,
        grpc_options={"grpc.max_reconnect_backoff_ms": RECONNECT_BACKOFF_MS},
    )


def version_verdict(version: str) -> tuple[bool, str | None]:
    """(usable, what to log) for a Qdrant server of `version`: tested (nothing to say),
    untested but within 1.x from MIN_SERVER (a warning), or refused (the reason)."""
    tested = f"tested on {TESTED_SERVER[0]}.{TESTED_SERVER[1]}.x"
    found = _VERSION.match(version)
    if found is None:
        return True, f"Qdrant server version {version!r} is not a version number ({tested})"
    major_minor = (int(found[1]), int(found[2]))
    if major_minor[:1] == TESTED_SERVER[:1] and major_minor >= MIN_SERVER:
        if major_minor[1] == TESTED_SERVER[1]:
            return True, None
        return True, f"Qdrant server {version} is untested with Memoria ({tested}); it should work"
    return False, (
        f"Qdrant server {version} is not supported: Memoria needs {MIN_SERVER[0]}."
        f"{MIN_SERVER[1]} or newer within {MIN_SERVER[0]}.x ({tested})"
    )


def check_server_version(client: QdrantClient) -> str:
    """Ask the server its version; refuse an unsupported one (ChunkIndexError), warn for an
    untested one. Returns the version."""
    version = client.info().version
    usable, message = version_verdict(version)
    if not usable:
        raise ChunkIndexError(message or version)
    if message is not None:
        log.warning("%s", message)
    else:
        log.info("Qdrant server %s", version)
    return version


def _filter(spec: FilterSpec) -> qm.Filter:
    must: list[qm.Condition] = [
        qm.FieldCondition(key=key, match=qm.MatchValue(value=value)) for key, value in spec.must
    ]
    if spec.min_chunk_index is not None:
        must.append(qm.FieldCondition(key=CHUNK_INDEX, range=qm.Range(gte=spec.min_chunk_index)))
    if spec.min_turn_time is not None or spec.max_turn_time is not None:
        bounds = qm.Range(gte=spec.min_turn_time, lte=spec.max_turn_time)
        must.append(qm.FieldCondition(key=TURN_TIME, range=bounds))
    must_not: list[qm.Condition] = [
        qm.FieldCondition(key=key, match=qm.MatchAny(any=list(values)))
        for key, values in spec.must_not_in
    ]
    must_not += [
        qm.FieldCondition(key=key, match=qm.MatchValue(value=n)) for key, n in spec.must_not_number
    ]
    return qm.Filter(must=must or None, must_not=must_not or None)


def _index_schema(field: str, kind: IndexKind) -> qm.KeywordIndexParams | qm.IntegerIndexParams:
    """A field's payload index: only PRINCIPAL_ID (the unit every search filters on) gets
    per-value HNSW links (HNSW_CONFIG); every other field is used inside a principal's filter,
    for grouping or for deletes, so a graph per value of it would only cost optimizer time."""
    graph = None if field == PRINCIPAL_ID else False
    if kind is IndexKind.TENANT_KEYWORD:
        return qm.KeywordIndexParams(
            type=qm.KeywordIndexType.KEYWORD, is_tenant=True, enable_hnsw=graph
        )
    if kind is IndexKind.KEYWORD:
        return qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, enable_hnsw=graph)
    return qm.IntegerIndexParams(
        type=qm.IntegerIndexType.INTEGER, lookup=True, range=True, enable_hnsw=graph
    )


@contextlib.contextmanager
def _unavailable_as_domain_error() -> Iterator[None]:
    try:
        yield
    except ResponseHandlingException as error:  # REST transport: refused, reset, timed out
        raise _unavailable(error) from error
    except grpc.RpcError as error:
        if isinstance(error, grpc.Call) and error.code() in _UNAVAILABLE_CODES:
            raise _unavailable(error) from error
        raise


def _unavailable(error: Exception) -> MemoriaError:
    log.warning("chunk index unavailable: %s", type(error).__name__)
    return MemoriaError(
        ErrorReason.STORE_UNAVAILABLE,
        "the conversation index is unavailable; nothing was changed, retry with backoff",
    )


class QdrantServerChunkIndex:
    """Every role of the chunk index (`ChunkIndex`, server/domain/ports.py) on one collection
    of a Qdrant server (created if missing).

    Opening a collection whose vectors came from another model or dimension raises
    EmbeddingMismatchError; one that Memoria did not create raises ChunkIndexError.
    """

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        dimension: int,
        model_id: str,
        *,
        shard_number: int | None = None,
        replication_factor: int | None = None,
    ) -> None:
        """`shard_number` and `replication_factor` apply when this creates the collection
        (None: the server's defaults); an existing collection keeps its own."""
        self._client = client
        self._collection = collection
        self._shard_number = shard_number
        self._replication_factor = replication_factor
        self._dimension = dimension
        self._record = ModelRecord(model_id=model_id, dimension=dimension)
        # Local mode (tests) is not thread-safe; a server client is, and must not be serialized.
        is_local = isinstance(getattr(client, "_client", None), QdrantLocal)
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if is_local else contextlib.nullcontext()
        )
        with self._lock, _unavailable_as_domain_error():
            if not is_local:  # local mode reports the client's version: nothing to check
                check_server_version(client)
            if not client.collection_exists(collection):
                self._create()
            self._validate()

    def _create(self) -> None:
        try:
            self._client.create_collection(
                self._collection,
                vectors_config={
                    DENSE_VECTOR: qm.VectorParams(
                        size=self._dimension,
                        distance=qm.Distance.COSINE,
                        multivector_config=qm.MultiVectorConfig(
                            comparator=qm.MultiVectorComparator.MAX_SIM
                        ),
                    )
                },
                sparse_vectors_config={
                    KEYWORD_VECTOR: qm.SparseVectorParams(modifier=qm.Modifier.IDF)
                },
                hnsw_config=HNSW_CONFIG,
                shard_number=self._shard_number,
                replication_factor=self._replication_factor,
                metadata=self._record.to_json(),
            )
        except Exception:
            # Another replica may have created it at the same moment; then validate theirs.
            if not self._client.collection_exists(self._collection):
                raise

    def _validate(self) -> None:
        info = self._client.get_collection(self._collection)
        where = f"collection {self._collection!r}"
        stored = ModelRecord.from_json(info.config.metadata)
        if stored is None:
            raise ChunkIndexError(
                f"{where} has no Memoria model record in its metadata: it was created by "
                "another tool, or the Qdrant server is older than 1.16 and does not keep "
                "collection metadata. Use another collection name or upgrade the server."
            )
        self._record.check_matches(stored, where)
        vectors = info.config.params.vectors
        dense = vectors.get(DENSE_VECTOR) if isinstance(vectors, dict) else None
        sparse = (info.config.params.sparse_vectors or {}).get(KEYWORD_VECTOR)
        if (
            dense is None
            or dense.size != self._dimension
            or dense.distance != qm.Distance.COSINE
            or dense.multivector_config is None
            or dense.multivector_config.comparator != qm.MultiVectorComparator.MAX_SIM
            or sparse is None
            or sparse.modifier != qm.Modifier.IDF
        ):
            raise ChunkIndexError(
                f"{where} does not have the vectors Memoria needs: {DENSE_VECTOR!r} (cosine "
                f"MAX_SIM multivector of dimension {self._dimension}) and {KEYWORD_VECTOR!r} "
                "(sparse, IDF modifier)"
            )
        for field, kind in PAYLOAD_INDEXES:  # idempotent; also adds indexes new in a release
            if field not in info.payload_schema:
                self._client.create_payload_index(
                    self._collection, field, field_schema=_index_schema(field, kind), wait=True
                )

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        """Write the turn's chunks and delete its chunks beyond the new count, in one request."""
        check_chunks(chunks, self._dimension)
        operations: list[qm.UpdateOperation] = []
        if chunks:
            points = [
                qm.PointStruct(
                    id=point_id(key, chunk.chunk_index),
                    vector={
                        DENSE_VECTOR: [list(window) for window in chunk.dense],
                        KEYWORD_VECTOR: qm.SparseVector(
                            indices=list(chunk.sparse.indices), values=list(chunk.sparse.values)
                        ),
                    },
                    payload=chunk_payload(key, turn_time, chunk),
                )
                for chunk in chunks
            ]
            operations.append(qm.UpsertOperation(upsert=qm.PointsList(points=points)))
        stale = qm.FilterSelector(filter=_filter(stale_chunks_filter(key, len(chunks))))
        operations.append(qm.DeleteOperation(delete=stale))
        with self._lock, _unavailable_as_domain_error():
            self._client.batch_update_points(self._collection, operations, wait=True)

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        """Both retrievals, each grouped by turn on the server (best chunk per turn)."""
        if turns <= 0:
            return RetrievalResult(keyword=(), semantic=())
        where = _filter(scope_filter(scope))
        semantic = self._grouped([list(query.dense)], DENSE_VECTOR, where, turns)
        keyword: tuple[ChunkHit, ...] = ()
        if query.sparse.indices:  # a query of stop words only has no keyword side
            sparse = qm.SparseVector(
                indices=list(query.sparse.indices), values=list(query.sparse.values)
            )
            keyword = self._grouped(sparse, KEYWORD_VECTOR, where, turns)
        return RetrievalResult(keyword=keyword, semantic=semantic)

    def _grouped(
        self, query: list[list[float]] | qm.SparseVector, using: str, where: qm.Filter, turns: int
    ) -> tuple[ChunkHit, ...]:
        with self._lock, _unavailable_as_domain_error():
            result = self._client.query_points_groups(
                self._collection,
                group_by=TURN_KEY,
                query=query,
                using=using,
                query_filter=where,
                limit=turns,
                group_size=1,
                with_payload=True,
            )
        return tuple(
            chunk_hit(group.hits[0].payload or {}, group.hits[0].score)
            for group in result.groups
            if group.hits
        )

    def stale_keyword_chunks(
        self, version: int, limit: int, owner: Owner = EVERYONE
    ) -> list[StoredChunk]:
        """Up to `limit` chunks whose keyword vector is not of `version` (one scroll)."""
        with self._lock, _unavailable_as_domain_error():
            records, _next = self._client.scroll(
                self._collection,
                scroll_filter=_filter(stale_keywords_filter(version, owner)),
                limit=limit,
                with_payload=True,
                with_vectors=False,
            )
        return [stored_chunk(r.payload or {}) for r in records]

    def count_stale_keyword_chunks(self, version: int, owner: Owner = EVERYONE) -> int:
        """Exact number of chunks whose keyword vector is not of `version`."""
        where = _filter(stale_keywords_filter(version, owner))
        with self._lock, _unavailable_as_domain_error():
            return self._client.count(self._collection, count_filter=where, exact=True).count

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, DomainSparseVector]], version: int
    ) -> None:
        """Replace the keyword vectors of the chunks that still exist and record `version`,
        in one request (the server refuses a vector update of a missing point, so chunks
        deleted since they were read are left out first)."""
        if not updates:
            return
        ids = {point_id(chunk.key, chunk.chunk_index): sparse for chunk, sparse in updates}
        with self._lock, _unavailable_as_domain_error():
            found = self._client.retrieve(
                self._collection, list(ids), with_payload=False, with_vectors=False
            )
            existing: list[qm.ExtendedPointId] = [str(r.id) for r in found]
            if not existing:
                return
            vectors = [
                qm.PointVectors(
                    id=point,
                    vector={
                        KEYWORD_VECTOR: qm.SparseVector(
                            indices=list(ids[str(point)].indices),
                            values=list(ids[str(point)].values),
                        )
                    },
                )
                for point in existing
            ]
            self._client.batch_update_points(
                self._collection,
                [
                    qm.UpdateVectorsOperation(update_vectors=qm.UpdateVectors(points=vectors)),
                    qm.SetPayloadOperation(
                        set_payload=qm.SetPayload(
                            payload={KEYWORD_VERSION_FIELD: version}, points=existing
                        )
                    ),
                ],
                wait=True,
            )

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
        with self._lock, _unavailable_as_domain_error():
            records = self._client.retrieve(
                self._collection,
                list(ids),
                with_payload=qm.PayloadSelectorInclude(include=[WINDOWS]),
                with_vectors=[DENSE_VECTOR],
            )
        found = {}
        for r in records:
            vectors = r.vector if isinstance(r.vector, dict) else {}
            dense = vectors.get(DENSE_VECTOR) or []
            found[ids[str(r.id)]] = own_windows(dense, r.payload or {})  # type: ignore[arg-type]
        return found

    def set_dense_context(
        self,
        updates: Sequence[DenseContextUpdate],
    ) -> None:
        """See `DenseVectors.set_dense_context`: the chunks still stored get their windows and
        context as their dense vector and their window count in the payload, in one request."""
        if not updates:
            return
        by_id = {
            point_id(key, chunk): (windows, context) for key, chunk, windows, context in updates
        }
        with self._lock, _unavailable_as_domain_error():
            found = self._client.retrieve(
                self._collection, list(by_id), with_payload=False, with_vectors=False
            )
            existing = [str(r.id) for r in found]
            if not existing:
                return
            windows = {point: by_id[point][0] for point in existing}
            vectors = [
                qm.PointVectors(id=point, vector={DENSE_VECTOR: context_multivector(*by_id[point])})
                for point in existing
            ]
            operations: list[qm.UpdateOperation] = [
                qm.UpdateVectorsOperation(update_vectors=qm.UpdateVectors(points=vectors)),
                *(
                    qm.SetPayloadOperation(
                        set_payload=qm.SetPayload(payload={WINDOWS: count}, points=list(points))
                    )
                    for count, points in windows_counts(existing, windows).items()
                ),
            ]
            self._client.batch_update_points(self._collection, operations, wait=True)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        """Delete every chunk of the conversation, however many, in one filtered delete."""
        self._delete(owner_filter(tenant_id, principal_id, conversation_id))

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        """Delete every chunk of the principal, however many, in one filtered delete."""
        self._delete(owner_filter(tenant_id, principal_id))

    def delete_before(self, tenant_id: str, principal_id: str, before: datetime) -> None:
        """Delete every chunk of the principal with a turn time before `before`, in one
        filtered delete."""
        self._delete(before_filter(tenant_id, principal_id, before))

    def _delete(self, spec: FilterSpec) -> None:
        selector = qm.FilterSelector(filter=_filter(spec))
        with self._lock, _unavailable_as_domain_error():
            self._client.delete(self._collection, points_selector=selector, wait=True)

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        """Exact number of chunks of the principal, or of one of its conversations."""
        spec = owner_filter(tenant_id, principal_id, conversation_id)
        with self._lock, _unavailable_as_domain_error():
            return self._client.count(
                self._collection, count_filter=_filter(spec), exact=True
            ).count

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        """The turns' chunk texts, read by point id in one retrieve."""
        ids = turn_point_ids(tenant_id, principal_id, turns)
        if not ids:
            return {}
        with self._lock, _unavailable_as_domain_error():
            records = self._client.retrieve(
                self._collection, ids=list(ids), with_payload=True, with_vectors=False
            )
        return chunks_by_turn(tenant_id, principal_id, (dict(r.payload or {}) for r in records))

    def places_near(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        turn_time: datetime,
        limit: int,
    ) -> tuple[list[ChunkPlace], list[ChunkPlace]]:
        """Two scrolls ordered by turn_time (its range index): down from `turn_time`, and up
        from it."""
        sides = []
        with self._lock, _unavailable_as_domain_error():
            for side, direction in (("before", qm.Direction.DESC), ("after", qm.Direction.ASC)):
                spec = near_filter(tenant_id, principal_id, conversation_id, turn_time, side)
                records, _next = self._client.scroll(
                    self._collection,
                    scroll_filter=_filter(spec),
                    limit=limit,
                    order_by=qm.OrderBy(key=TURN_TIME, direction=direction),
                    with_payload=list(PLACE_FIELDS),
                    with_vectors=False,
                )
                sides.append([chunk_place(r.payload or {}) for r in records])
        return sides[0], sides[1]

    def conversation_places(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> list[ChunkPlace]:
        """The conversation's chunk places: a scroll of their PLACE_FIELDS, page by page."""
        where = _filter(owner_filter(tenant_id, principal_id, conversation_id))
        places: list[ChunkPlace] = []
        offset: Any = None  # the client's next-page offset, handed back as it came
        with self._lock, _unavailable_as_domain_error():
            while True:
                records, offset = self._client.scroll(
                    self._collection,
                    scroll_filter=where,
                    limit=PLACES_PAGE,
                    offset=offset,
                    with_payload=list(PLACE_FIELDS),
                    with_vectors=False,
                )
                places += (chunk_place(r.payload or {}) for r in records)
                if offset is None:
                    return places

    def check(self) -> None:
        """Return if the server answers and still has the collection, else raise (for the
        health monitor, which logs the failure once: the driver's error propagates as it is,
        without the per-call warning of STORE_UNAVAILABLE)."""
        with self._lock:
            exists = self._client.collection_exists(self._collection)
        if not exists:
            raise ChunkIndexError(f"collection {self._collection!r} does not exist")

    def close(self) -> None:
        """Close the client: the index owns the client it was given."""
        with self._lock:
            self._client.close()


def stored_model_record(client: QdrantClient, collection: str) -> ModelRecord | None:
    """The model record of `collection` on the server, None when the collection does not exist
    yet (or holds no record, which opening it refuses); read without opening the index, so the
    embedder can be chosen before it. Raises the domain's STORE_UNAVAILABLE when the server
    cannot be reached."""
    with _unavailable_as_domain_error():
        if not client.collection_exists(collection):
            return None
        return ModelRecord.from_json(client.get_collection(collection).config.metadata)
