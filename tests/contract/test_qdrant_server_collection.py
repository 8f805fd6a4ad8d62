"""The collection configuration QdrantServerChunkIndex creates on a real Qdrant server, and
that a collection of an earlier release's configuration keeps working.

The adapter creates collections without a global HNSW graph (`m=0`) and with per-principal
links (`payload_m`), and builds HNSW links only for the principal_id payload index (see
server/adapters/qdrant/server.py, HNSW_CONFIG). What could go wrong with that, checked here on
the real engine (the session's server, tests/qdrant_server.py; a collection per test):
- the server does not keep the configuration (read back from the collection's info);
- a principal too large for a full scan is searched on a graph that has no links for it, and
  misses its own best turns: with a lowered full-scan threshold and indexing threshold, the
  optimizer builds the principal's graph, and the adapter's grouped search must find the same
  turns as an exact search;
- a collection created with the server's default HNSW configuration (as before) is refused
  or changed at open.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from server.adapters.qdrant.layout import (
    DENSE_VECTOR,
    KEYWORD_VECTOR,
    PAYLOAD_INDEXES,
    PRINCIPAL_ID,
    TENANT_ID,
    TURN_KEY,
    ModelRecord,
)
from server.adapters.qdrant.server import HNSW_CONFIG, QdrantServerChunkIndex
from server.domain.model import EncodedQuery, IndexedChunk, SearchScope, SparseVector, TurnKey
from tests.qdrant_server import QdrantEndpoint

pytestmark = pytest.mark.qdrant

DIM = 16
MODEL = "test-model-v1"
T0 = datetime(2026, 3, 1, tzinfo=UTC)
GREEN_BOUND_S = 60.0
"""How long the optimizer may take on a few hundred points."""


@pytest.fixture
def client(qdrant: QdrantEndpoint) -> Iterator[QdrantClient]:
    made = qdrant.client()
    yield made
    made.close()


def _vector(rng: random.Random) -> tuple[float, ...]:
    raw = [rng.gauss(0.0, 1.0) for _ in range(DIM)]
    norm = sum(x * x for x in raw) ** 0.5
    return tuple(x / norm for x in raw)


def _write(index: QdrantServerChunkIndex, principal: str, turns: int, rng: random.Random) -> None:
    for n in range(turns):
        chunk = IndexedChunk(
            chunk_index=0,
            text=f"turn {n} of {principal}",
            dense=(_vector(rng),),
            sparse=SparseVector((1 + n,), (1.0,)),
        )
        index.upsert_turn(TurnKey("t1", principal, "c1", f"u{n}"), T0, [chunk])


def _wait_green(client: QdrantClient, collection: str) -> None:
    deadline = time.monotonic() + GREEN_BOUND_S
    while client.get_collection(collection).status != qm.CollectionStatus.GREEN:
        assert time.monotonic() < deadline, f"{collection} still optimizing"
        time.sleep(0.2)  # polling the server's own status, bounded by the deadline


def test_created_collection_has_no_global_graph_and_links_only_principals(
    client: QdrantClient, qdrant_collection: str
) -> None:
    QdrantServerChunkIndex(client, qdrant_collection, DIM, MODEL)
    info = client.get_collection(qdrant_collection)
    assert (info.config.hnsw_config.m, info.config.hnsw_config.payload_m) == (
        HNSW_CONFIG.m,
        HNSW_CONFIG.payload_m,
    )
    assert HNSW_CONFIG.m == 0 and (HNSW_CONFIG.payload_m or 0) > 0
    assert set(info.payload_schema) == {field for field, _ in PAYLOAD_INDEXES}
    for field, schema in info.payload_schema.items():
        params = schema.params
        assert params is not None, field
        graph = getattr(params, "enable_hnsw", None)
        if field == PRINCIPAL_ID:
            assert graph is not False, "the principal's links are what a large principal needs"
        else:
            assert graph is False, f"{field} would get a graph per value it takes"
    tenant = info.payload_schema[TENANT_ID].params
    assert isinstance(tenant, qm.KeywordIndexParams) and tenant.is_tenant is True


def test_a_principal_too_large_for_a_full_scan_is_searched_on_its_own_graph(
    client: QdrantClient, qdrant_collection: str
) -> None:
    index = QdrantServerChunkIndex(client, qdrant_collection, DIM, MODEL)
    # 4 KiB of vectors (64 of 16 floats) is the full-scan threshold: the large principal's
    # 300 points take a graph; its small neighbour's 20 are scanned.
    client.update_collection(
        qdrant_collection,
        hnsw_config=qm.HnswConfigDiff(full_scan_threshold=4),
        optimizers_config=qm.OptimizersConfigDiff(indexing_threshold=1, default_segment_number=1),
    )
    rng = random.Random(7)
    _write(index, "big", 300, rng)
    _write(index, "small", 20, rng)
    _wait_green(client, qdrant_collection)
    info = client.get_collection(qdrant_collection)
    assert info.indexed_vectors_count, "the optimizer built no vector index"
    for principal, turns in (("big", 300), ("small", 20)):
        for _ in range(5):
            dense = _vector(rng)
            found = index.search(
                SearchScope("t1", principal, frozenset()),
                EncodedQuery(dense=dense, sparse=SparseVector((), ())),
                10,
            ).semantic
            exact = client.query_points_groups(
                qdrant_collection,
                group_by=TURN_KEY,
                query=[list(dense)],
                using=DENSE_VECTOR,
                query_filter=qm.Filter(
                    must=[
                        qm.FieldCondition(key=TENANT_ID, match=qm.MatchValue(value="t1")),
                        qm.FieldCondition(key=PRINCIPAL_ID, match=qm.MatchValue(value=principal)),
                    ]
                ),
                limit=10,
                group_size=1,
                search_params=qm.SearchParams(exact=True),
            )
            expected = [str((g.hits[0].payload or {})["turn_id"]) for g in exact.groups]
            assert len(expected) == min(10, turns)
            assert [hit.turn_id for hit in found] == expected


def test_a_collection_with_the_default_graph_keeps_working(
    client: QdrantClient, qdrant: QdrantEndpoint, qdrant_collection: str
) -> None:
    """As an earlier release created it: the server's default HNSW (a global graph), no
    payload indexes yet (the adapter adds missing ones at open)."""
    client.create_collection(
        qdrant_collection,
        vectors_config={
            DENSE_VECTOR: qm.VectorParams(
                size=DIM,
                distance=qm.Distance.COSINE,
                multivector_config=qm.MultiVectorConfig(
                    comparator=qm.MultiVectorComparator.MAX_SIM
                ),
            )
        },
        sparse_vectors_config={KEYWORD_VECTOR: qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
        metadata=ModelRecord(model_id=MODEL, dimension=DIM).to_json(),
    )
    default_m = client.get_collection(qdrant_collection).config.hnsw_config.m
    assert default_m > 0
    index = QdrantServerChunkIndex(qdrant.client(), qdrant_collection, DIM, MODEL)
    try:
        _write(index, "ana", 3, random.Random(1))
        info = client.get_collection(qdrant_collection)
        assert info.config.hnsw_config.m == default_m, "an existing collection keeps its graph"
        assert set(info.payload_schema) == {field for field, _ in PAYLOAD_INDEXES}
        hits = index.search(
            SearchScope("t1", "ana", frozenset()),
            EncodedQuery(dense=_vector(random.Random(2)), sparse=SparseVector((1,), (1.0,))),
            10,
        )
        assert len(hits.semantic) == 3 and [h.turn_id for h in hits.keyword] == ["u0"]
    finally:
        index.close()
