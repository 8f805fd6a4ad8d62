"""Cost as data grows (issue 15, item 5): search, render, memory and indexing at scale.

What it measures, each side by side in one run (interleaved rounds, so the machine's drift
cancels out of the ratios), on loopback only:

1. ``search``: ``SearchConversations`` p50 through the real ``memoria serve`` process on a real
   Qdrant server (tests/qdrant_server.py: ``../shared/qdrant/qdrant`` or
   ``MEMORIA_TEST_QDRANT_BIN``), with the same searched principals (200 chunks each) in three
   collections of the one Qdrant server: small (10,000 chunks), mid (100,000) and big
   (1,000,000). One ``memoria serve`` per collection (``MEMORIA_QDRANT_COLLECTION``, SQLite for
   the rest). Targets: big <= 1.5x small; service at mid <= 1.5x the bare ``qdrant-client``
   query on mid (the adapter's two ``query_points_groups`` calls with its filter, plus the
   query embedding and keyword encoding the service also does; the bare calls alone are
   shown too). Also: the Qdrant server's RSS after each collection was loaded, each
   collection's size on disk, and each serving process's RSS.
2. ``render``: ``RenderMemoryBlock`` p50 on PostgreSQL with 1,000,000 principals holding a
   block against 1,000, each in a fresh database migrated by ``memoria migrate`` and filled by
   ``COPY`` as the schema owner; the servers connect as the service role (RLS in force). Both
   with the read cache (default) and without (``MEMORIA_READ_CACHE_ENTRIES=0``): four servers.
   Target: big <= 1.2x small, for each.
   ``edge``: the same searches through ``memoria serve --data-dir`` on the embedded engine
   (qdrant-edge), a small store against a big one (``--edge-chunks``; the full scale's
   10,000 and 1,000,000), each serving process's RSS (the store is inside it) and disk use.
3. ``index``: indexing throughput (turns/s and chunks/s) with 1 and 2 ``memoria worker``
   processes on PostgreSQL and the real Qdrant server, with the machine's CPU use (/proc/stat)
   and the workers' own.

The stores are built by bulk insert, not through the API; what is measured goes through the
service. The searched principals are written through the adapter's own ``upsert_turn`` with
the model's real embeddings (cached like bench_search.py's). The other points reuse a pool of
real generated chunks (``search_corpus.py``: real text, real BM25 vector, the real number of
dense windows) with random unit dense windows, upserted with qdrant-client's gRPC stubs in the
adapter's point layout (ids, payload, vector names). The dense side only ever scores the
filtered principal's points, so random windows elsewhere cost a query what real ones would.

Vector indexing: the collections keep the configuration the adapter creates (no global HNSW
graph, links per large principal: server/adapters/qdrant/server.py, HNSW_CONFIG; the optimizer
builds immutable segments as a collection grows), the Qdrant server gets two optimizer threads
for the bulk load, and every measurement waits until the server has applied every update (its
update queue is empty and the exact point count is the one written) and its optimizers are
idle. ``--no-vector-index``
loads with ``indexing_threshold=0`` instead (Qdrant's bulk-load advice), for comparison only:
measured here, it keeps every point in large appendable segments, where ingestion slowed to
a few hundred points/s past ~300,000 points and filtered queries and counts grew with the
collection (a 200-point principal's grouped dense query ~0.5 s at 1,000,000 points, while
the update queue was still draining).

Usage (from the repository root)::

    .venv/bin/python bench/bench_growth.py --scale small       # a few minutes
    .venv/bin/python bench/bench_growth.py                     # full: 1,000,000 chunks/principals
    .venv/bin/python bench/bench_growth.py --only search render

Every process the script starts is stopped, and every database and directory it made removed,
before it exits (also on Ctrl-C, SIGTERM or an error).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import psycopg
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from qdrant_client import QdrantClient
from qdrant_client import grpc as qg
from qdrant_client import models as qm
from qdrant_client.conversions.conversion import payload_to_grpc
from qdrant_edge import Point as EdgePoint
from qdrant_edge import SparseVector as EdgeSparseVector
from qdrant_edge import UpdateOperation
from sqlalchemy.engine import make_url

# bench/ is this script's folder; the repository root holds tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import CACHE_DIR, WindowCounter, percentile, real_embeddings
from harness import APP_ROLE, DURABILITY_SETTINGS, bench_pg_urls, qdrant_process, seeded_block
from procs import (
    HOST,
    REPO,
    RUN_ENDED,
    BudgetExceeded,
    ServerProcess,
    failure_outcome,
    machine_line,
    process_cpu_seconds,
    raise_on_sigterm,
    software_line,
)
from search_corpus import CorpusGenerator, PrincipalCorpus, Turn, keyword_vectors

from memoria.v1 import conversation_search_service_pb2 as cs_pb
from memoria.v1 import conversation_search_service_pb2_grpc as cs_grpc
from memoria.v1 import memory_block_service_pb2 as mb_pb
from memoria.v1 import memory_block_service_pb2_grpc as mb_grpc
from server.adapters.embedding.minilm import DIMENSION, OnnxMiniLmEmbedder
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.qdrant.layout import (
    DENSE_VECTOR,
    KEYWORD_VECTOR,
    KEYWORD_VERSION_FIELD,
    PRINCIPAL_ID,
    TENANT_ID,
    TURN_KEY,
    chunk_payload,
    point_id,
)
from server.adapters.qdrant.server import QdrantServerChunkIndex
from server.domain.fusion import MIN_RETRIEVAL_TURNS
from server.domain.keywords import KEYWORD_VERSION, KeywordEncoder, keyword_document
from server.domain.model import IndexedChunk, TurnKey

SEARCH_SERVICE = "memoria.v1.ConversationSearchService"
BLOCK_SERVICE = "memoria.v1.MemoryBlockService"
SEED = 20261201
PAGE_SIZE = 10
DEPTH = max(PAGE_SIZE, MIN_RETRIEVAL_TURNS)  # turns per side the service asks the index for
MEASURED_TENANT = "t-measured"
MEASURED_CHUNKS = 200  # per measured principal, in every collection
CALL_TIMEOUT_S = 30.0
SERVER_START_TIMEOUT_S = 300.0
SERVER_STOP_TIMEOUT_S = 15.0
SEARCH_TARGET = 1.5
RENDER_TARGET = 1.2
UPSERT_BATCH = 256
WAIT_EVERY = 8  # every 8th upsert batch waits until applied
POOL_DATE = datetime(2026, 1, 1, tzinfo=UTC)
MIN_AVAILABLE_MIB = 4096  # stop a bulk load before the shared machine runs short


@dataclass(frozen=True)
class Scale:
    """Sizes of one run."""

    collections: tuple[int, int, int]  # chunks: small, mid (the bare-client one), big
    measured_principals: int
    search_rounds: int
    queries_per_block: int
    render_principals: tuple[int, int]
    render_rounds: int
    renders_per_block: int
    index_turns: int
    index_rounds: int
    time_budget_s: float


SCALES = {
    "full": Scale(
        (10_000, 100_000, 1_000_000), 2, 4, 150, (1_000, 1_000_000), 6, 1_000, 96, 2, 5400
    ),
    "small": Scale((2_000, 10_000, 40_000), 2, 2, 60, (1_000, 20_000), 2, 300, 24, 1, 900),
}


def log(message: str) -> None:
    """Progress goes to stderr; the report goes to stdout."""
    print(message, file=sys.stderr, flush=True)


def rss_mib(pid: int) -> float:
    """Resident set size of `pid` in MiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def tree_rss_mib(pid: int) -> float:
    """RSS of `pid` and its direct children (a `memoria serve` is one process; kept general)."""
    total = rss_mib(pid)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()
                if int(stat[1]) == pid:
                    total += rss_mib(int(entry.name))
    return total


def available_mib() -> float:
    """MemAvailable of the machine in MiB (the machine is shared: a bulk load stops early)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def du_mib(path: Path) -> float:
    """Bytes allocated on disk under `path` (as du counts them), in MiB."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total / (1 << 20)


class MachineCpu:
    """Busy share of all cores between two readings of /proc/stat (whoever used them)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def busy(self) -> float:
        busy0, total0 = self._start
        busy1, total1 = self._read()
        return (busy1 - busy0) / max(1, total1 - total0)


def timed_calls(call: Callable[[Any], object], args: Sequence[Any]) -> list[float]:
    """Latencies (s) of `call(a)` for each a, one at a time."""
    out = []
    for a in args:
        begin = time.perf_counter()
        call(a)
        out.append(time.perf_counter() - begin)
    return out


def p50_ms(values: Sequence[float]) -> float:
    return percentile(values, 50) * 1e3


def interleave(
    paths: dict[str, Callable[[Any], object]],
    work: Callable[[int], Sequence[Any]],
    rounds: int,
    deadline: float,
) -> dict[str, list[list[float]]]:
    """Each round, every path runs `work(round)` once, in an order rotated every round."""
    names = list(paths)
    result: dict[str, list[list[float]]] = {name: [] for name in names}
    for rnd in range(rounds):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            if time.monotonic() > deadline:
                raise BudgetExceeded(f"round {rnd + 1} of {name}")
            lat = timed_calls(paths[name], work(rnd))
            result[name].append(lat)
            log(f"  round {rnd + 1} {name:<14} p50 {p50_ms(lat):7.2f} ms")
    return result


def per_round_ratios(blocks: dict[str, list[list[float]]], top: str, bottom: str) -> list[float]:
    return [p50_ms(a) / p50_ms(b) for a, b in zip(blocks[top], blocks[bottom], strict=False)]


def verdict(label: str, ratios: Sequence[float], target: float) -> tuple[str, bool]:
    """A target line: the median of the per-round ratios against `target`, and the range."""
    if not ratios:
        return f"  {label}: not measured", False
    median = statistics.median(ratios)
    ok = median <= target
    spread = " ".join(f"{r:.2f}" for r in ratios)
    line = f"  {label} <= {target}x: {'PASS' if ok else 'FAIL'} (x{median:.2f}; per round {spread})"
    return line, ok


def print_table(blocks: dict[str, list[list[float]]]) -> None:
    print(f"{'path':<16} {'p50 ms':>8} {'p99 ms':>8} {'samples':>8}  p50 per round (ms)")
    for name, rounds in blocks.items():
        flat = [x for r in rounds for x in r]
        if not flat:
            continue
        per = " ".join(f"{p50_ms(r):.2f}" for r in rounds)
        print(
            f"{name:<16} {p50_ms(flat):>8.2f} {percentile(flat, 99) * 1e3:>8.2f} "
            f"{len(flat):>8}  {per}"
        )


# --------------------------------------------------------------------------------------------
# Search on a real Qdrant server
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolChunk:
    """A real generated chunk: its text, BM25 vector and how many dense windows it makes."""

    text: str
    indices: list[int]
    values: list[float]
    windows: int


def chunk_pool(generator: CorpusGenerator, keywords: KeywordEncoder, size: int) -> list[PoolChunk]:
    """`size` real chunks of generated conversations, to fill the stores with."""
    counter = WindowCounter()
    texts: list[str] = []
    number = 0
    while len(texts) < size:
        corpus = generator.principal("pool", f"pool-{number}", 200, tag="pool")
        texts += [c for t in corpus.turns for c in t.chunks]
        number += 1
    texts = texts[:size]
    windows = counter.windows(texts)
    pool = []
    for at, (text, count) in enumerate(zip(texts, windows, strict=True)):
        # The current keyword representation (the turn's date, the text, and the chunks
        # before and after it, here its neighbours in the pool: generated conversations in
        # order); the pool's one date stands for every filler point's: three terms of ~85.
        context = texts[max(at - 1, 0) : at] + texts[at + 1 : at + 2]
        sparse = keywords.encode_in_context(keyword_document(text, POOL_DATE), context)
        pool.append(PoolChunk(text, list(sparse.indices), list(sparse.values), count))
    return pool


def _random_windows(rng: np.random.Generator, count: int) -> list[list[float]]:
    flat = rng.standard_normal((count, DIMENSION)).astype(np.float32)
    flat /= np.linalg.norm(flat, axis=1, keepdims=True)
    rows: list[list[float]] = flat.tolist()
    return rows


@dataclass(frozen=True)
class FillerPoint:
    """One filler chunk in the adapter's layout, engine-neutral."""

    id: str
    windows: list[list[float]]
    indices: list[int]
    values: list[float]
    payload: dict[str, Any]


def filler_points(
    chunks: int, pool: Sequence[PoolChunk], seed: int, label: str, deadline: float
) -> Iterator[FillerPoint]:
    """`chunks` filler points, 200 chunks per principal on average (log-normal, at least 20),
    1-3 chunks per turn, 10,000 principals per tenant at most. Stops the run (BudgetExceeded)
    past the deadline or when the shared machine runs low on memory."""
    rng = random.Random(seed)
    vectors = np.random.default_rng(seed)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    written = 0
    principal = 0
    started = time.monotonic()
    while written < chunks:
        size = min(chunks - written, max(20, round(200 * rng.lognormvariate(-0.5, 1.0))))
        tenant, name = f"t{principal // 10_000}", f"p{principal}"
        principal += 1
        turn = 0
        left = size
        while left > 0:
            count = min(left, rng.randint(1, 3))
            key = TurnKey(tenant, name, f"c{turn // 8}", f"turn-{turn}")
            when = now + timedelta(minutes=turn)
            for index in range(count):
                source = pool[rng.randrange(len(pool))]
                chunk = IndexedChunk(
                    index, source.text, (), _NO_SPARSE, keyword_version=KEYWORD_VERSION
                )
                yield FillerPoint(
                    point_id(key, index),
                    _random_windows(vectors, source.windows),
                    source.indices,
                    source.values,
                    chunk_payload(key, when, chunk),
                )
            left -= count
            written += count
            turn += 1
        if principal % 500 == 0:
            log(f"    {label}: {written:,} points ({time.monotonic() - started:.0f}s)")
            if time.monotonic() > deadline:
                raise BudgetExceeded(f"filling {label}")
            if available_mib() < MIN_AVAILABLE_MIB:
                raise BudgetExceeded(f"filling {label}: the machine is low on memory")


def fill_server(
    client: QdrantClient,
    collection: str,
    chunks: int,
    pool: Sequence[PoolChunk],
    seed: int,
    deadline: float,
) -> None:
    """Upsert the filler points with qdrant-client's gRPC stubs (its pydantic models would
    take most of the run converting a million multivectors)."""
    batch: list[qg.PointStruct] = []
    sent = 0

    def flush(wait: bool = False) -> None:
        if batch:
            # The last batch waits: the server applies a collection's updates in order.
            client.grpc_points.Upsert(
                qg.UpsertPoints(collection_name=collection, wait=wait, points=batch),
                timeout=120,
            )
            batch.clear()

    for point in filler_points(chunks, pool, seed, collection, deadline):
        dense = qg.Vector(
            multi_dense=qg.MultiDenseVector(vectors=[qg.DenseVector(data=w) for w in point.windows])
        )
        sparse = qg.Vector(sparse=qg.SparseVector(indices=point.indices, values=point.values))
        batch.append(
            qg.PointStruct(
                id=qg.PointId(uuid=point.id),
                vectors=qg.Vectors(
                    vectors=qg.NamedVectors(vectors={DENSE_VECTOR: dense, KEYWORD_VECTOR: sparse})
                ),
                payload=payload_to_grpc(point.payload),
            )
        )
        if len(batch) >= UPSERT_BATCH:
            sent += 1
            flush(wait=sent % WAIT_EVERY == 0)  # backpressure: the queue stays short
    flush(wait=True)


def fill_edge(
    index: QdrantEdgeChunkIndex,
    chunks: int,
    pool: Sequence[PoolChunk],
    seed: int,
    label: str,
    deadline: float,
) -> None:
    """Upsert the filler points into the embedded engine's shard (the adapter's own)."""
    shard = index._shard  # the shard the adapter wraps: one process may open a store once
    batch: list[EdgePoint] = []
    for point in filler_points(chunks, pool, seed, label, deadline):
        vectors: dict[str, list[list[float]] | EdgeSparseVector | list[float]] = {
            DENSE_VECTOR: point.windows,
            KEYWORD_VECTOR: EdgeSparseVector(point.indices, point.values),
        }
        batch.append(EdgePoint(point.id, vectors, point.payload))
        if len(batch) >= UPSERT_BATCH:
            shard.update(UpdateOperation.upsert_points(batch))
            batch = []
    if batch:
        shard.update(UpdateOperation.upsert_points(batch))


_NO_SPARSE: Any = None  # chunk_payload reads only the text and the chunk index


def wait_applied(url: str, collection: str, points: int, deadline: float) -> float:
    """Wait until the server has applied every update it accepted (REST: the update queue is
    empty and the collection holds exactly `points`); returns the seconds. Upserts sent with
    wait=false are queued, and a query meanwhile would measure a collection being written."""
    started = time.monotonic()
    while True:
        info = httpx.get(f"{url}/collections/{collection}", timeout=30).json()["result"]
        queued = int((info.get("update_queue") or {}).get("length", 0))
        if not queued and info.get("points_count") == points:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise BudgetExceeded(
                f"waiting for {collection}'s updates ({queued} queued, "
                f"{info.get('points_count')} of {points} points)"
            )
        time.sleep(1.0)  # polling the server's own status, bounded by the deadline


def wait_green(client: QdrantClient, collection: str, deadline: float) -> float:
    """Wait until the collection's optimizers are idle (status green); returns the seconds."""
    started = time.monotonic()
    while client.get_collection(collection).status != qm.CollectionStatus.GREEN:
        if time.monotonic() > deadline:
            raise BudgetExceeded(f"waiting for {collection} to be optimized")
        time.sleep(1.0)  # polling the server's own status, bounded by the deadline
    return time.monotonic() - started


def measured_corpora(generator: CorpusGenerator, count: int) -> list[PrincipalCorpus]:
    return [
        generator.principal(MEASURED_TENANT, f"m{i}", MEASURED_CHUNKS, tag="m")
        for i in range(count)
    ]


def write_measured(
    index: QdrantServerChunkIndex | QdrantEdgeChunkIndex,
    corpora: Sequence[PrincipalCorpus],
    embeddings: Sequence[Sequence[Any]],
    keywords: KeywordEncoder,
) -> None:
    """The searched principals, through the adapter's own write path with real vectors."""
    for corpus, vectors in zip(corpora, embeddings, strict=True):
        position = 0
        for turn, sparse in zip(corpus.turns, keyword_vectors(corpus, keywords), strict=True):
            chunks = []
            for i, text in enumerate(turn.chunks):
                chunks.append(IndexedChunk(i, text, vectors[position], sparse[i], KEYWORD_VERSION))
                position += 1
            key = TurnKey(corpus.tenant_id, corpus.principal_id, turn.conversation_id, turn.turn_id)
            index.upsert_turn(key, turn.turn_time, chunks)


class ServiceSearch:
    """SearchConversations through a running server, one call at a time."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = cs_grpc.ConversationSearchServiceStub(channel)

    def __call__(self, job: tuple[str, str]) -> int:
        principal, query = job
        reply = self._stub.SearchConversations(
            cs_pb.SearchConversationsRequest(query=query, page_size=PAGE_SIZE),
            metadata=(("x-memoria-tenant", MEASURED_TENANT), ("x-memoria-principal", principal)),
            timeout=CALL_TIMEOUT_S,
        )
        return len(reply.hits)


class BareSearch:
    """The adapter's query made with qdrant-client directly: both sides grouped by turn with
    the tenant and principal filter (QdrantServerChunkIndex.search), plus (unless `encode`
    is off, when the encodings are precomputed) the query embedding and keyword encoding."""

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        embedder: OnnxMiniLmEmbedder,
        keywords: KeywordEncoder,
        encode: bool,
    ) -> None:
        self._client = client
        self._collection = collection
        self._embedder = embedder
        self._keywords = keywords
        self._encode = encode
        self._cache: dict[str, tuple[list[list[float]], qm.SparseVector]] = {}

    def encoded(self, query: str) -> tuple[list[list[float]], qm.SparseVector]:
        dense = [list(self._embedder.embed_query(query))]
        sparse = self._keywords.encode_query(query)
        return dense, qm.SparseVector(indices=list(sparse.indices), values=list(sparse.values))

    def precompute(self, queries: Sequence[str]) -> None:
        for query in queries:
            self._cache[query] = self.encoded(query)

    def __call__(self, job: tuple[str, str]) -> int:
        principal, query = job
        dense, sparse = self.encoded(query) if self._encode else self._cache[query]
        where = qm.Filter(
            must=[
                qm.FieldCondition(key=TENANT_ID, match=qm.MatchValue(value=MEASURED_TENANT)),
                qm.FieldCondition(key=PRINCIPAL_ID, match=qm.MatchValue(value=principal)),
            ]
        )
        found = 0
        for vector, using in ((dense, DENSE_VECTOR), (sparse, KEYWORD_VECTOR)):
            if using == KEYWORD_VECTOR and not sparse.indices:
                continue
            result = self._client.query_points_groups(
                self._collection,
                group_by=TURN_KEY,
                query=vector,
                using=using,
                query_filter=where,
                limit=DEPTH,
                group_size=1,
                with_payload=True,
            )
            found += len(result.groups)
        return found


class NoOp:
    """Health/Check on the same channel: the floor of one round trip."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)

    def __call__(self, _job: object) -> int:
        self._stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        return 0


@dataclass
class SearchData:
    """What both engines' search phases load and query: the filler pool, the measured
    principals with their real embeddings, and the queries about their own turns."""

    generator: CorpusGenerator
    keywords: KeywordEncoder
    embedder: OnnxMiniLmEmbedder
    pool: list[PoolChunk]
    corpora: list[PrincipalCorpus]
    embeddings: list[list[Any]]
    queries: list[tuple[str, str]]
    pool_fact: str

    @classmethod
    def make(cls, scale: Scale, args: argparse.Namespace) -> SearchData:
        generator = CorpusGenerator(SEED)
        keywords = KeywordEncoder()
        embedder = OnnxMiniLmEmbedder(intra_op_threads=1)
        log("search: generating the chunk pool and the measured principals")
        pool = chunk_pool(generator, keywords, 4_000)
        corpora = measured_corpora(generator, scale.measured_principals)
        cache = None if args.no_cache else CACHE_DIR
        embeddings = [
            list(real_embeddings(embedder, [c for t in corpus.turns for c in t.chunks], cache))
            for corpus in corpora
        ]
        queries: list[tuple[str, str]] = []
        for corpus in corpora:
            queries += [(corpus.principal_id, q) for q in generator.queries(corpus, 200)]
        random.Random(SEED).shuffle(queries)
        fact = (
            f"filler pool: {len(pool)} real chunks, mean "
            f"{statistics.mean(len(p.text) for p in pool):.0f} characters, "
            f"{statistics.mean(p.windows for p in pool):.2f} dense windows, "
            f"{statistics.mean(len(p.indices) for p in pool):.0f} keyword terms"
        )
        return cls(generator, keywords, embedder, pool, corpora, embeddings, queries, fact)


def run_search(scale: Scale, args: argparse.Namespace, deadline: float, stack: ExitStack) -> bool:
    """Phase 1 (see the module docstring); prints its report, returns whether targets held."""
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-growth-")))
    # Both cores for the optimizer: the load is bulk, and nothing is measured until it is idle.
    qdrant = stack.enter_context(qdrant_process(work / "qdrant", optimizer_threads=2))
    endpoint = qdrant.endpoint
    client = endpoint.client()
    stack.callback(client.close)
    facts: list[str] = [f"Qdrant server {client.info().version} pid {qdrant.process.pid}"]  # type: ignore[union-attr]

    data = SearchData.make(scale, args)
    keywords, embedder = data.keywords, data.embedder
    pool, corpora, embeddings, queries = data.pool, data.corpora, data.embeddings, data.queries
    facts.append(data.pool_fact)

    names = {size: f"growth_{size}" for size in scale.collections}
    qdrant_pid = qdrant.process.pid  # type: ignore[union-attr]
    memory_rows = [("empty", 0, rss_mib(qdrant_pid), 0.0)]
    for size, name in names.items():
        started = time.monotonic()
        index = QdrantServerChunkIndex(client, name, DIMENSION, embedder.model_id)
        if args.no_vector_index:
            client.update_collection(
                name, optimizers_config=qm.OptimizersConfigDiff(indexing_threshold=0)
            )
        write_measured(index, corpora, embeddings, keywords)
        fillers = size - sum(c.chunk_count for c in corpora)
        log(f"search: filling {name} with {fillers:,} points")
        fill_server(client, name, fillers, pool, SEED + size, deadline)
        applied = wait_applied(endpoint.url, name, size, deadline)
        optimized = wait_green(client, name, deadline)
        count = client.count(name, exact=True).count
        stale = qm.Filter(
            must_not=[
                qm.FieldCondition(
                    key=KEYWORD_VERSION_FIELD, match=qm.MatchValue(value=KEYWORD_VERSION)
                )
            ]
        )
        if client.count(name, count_filter=stale, exact=True).count:
            raise RuntimeError(f"{name} holds points of an older keyword representation")
        took = time.monotonic() - started
        facts.append(
            f"{name}: {count:,} points loaded in {took:.0f}s (all applied {applied:.0f}s and the "
            f"optimizer idle {optimized:.0f}s after"
            f" the last upsert), {len(corpora)} measured principals of {MEASURED_CHUNKS} chunks"
        )
        memory_rows.append(
            (
                name,
                count,
                rss_mib(qdrant_pid),
                du_mib(work / "qdrant" / "storage" / "collections" / name),
            )
        )

    servers: dict[str, ServerProcess] = {}
    for size, name in names.items():
        directory = work / f"serve-{size}"
        directory.mkdir()
        server = ServerProcess(
            ["--data-dir", str(directory)],
            directory,
            service=SEARCH_SERVICE,
            stop_timeout_s=SERVER_STOP_TIMEOUT_S,
            # No indexing threads: these servers only search (and no background work, such
            # as re-encoding keyword vectors, may run while they are measured).
            env=endpoint.env()
            | {"MEMORIA_QDRANT_COLLECTION": name, "MEMORIA_INDEX_WORKER_THREADS": "0"},
        )
        stack.callback(server.stop)
        servers[name] = server
    for server in servers.values():
        server.wait_serving(SERVER_START_TIMEOUT_S)

    mid = names[scale.collections[1]]
    paths: dict[str, Callable[[Any], object]] = {}
    for size, name in names.items():
        channel = stack.enter_context(grpc.insecure_channel(f"{HOST}:{servers[name].port}"))
        paths[f"service {size:,}"] = ServiceSearch(channel)
        if name == mid:
            paths["no-op (mid)"] = NoOp(channel)
    paths[f"bare {scale.collections[1]:,}"] = BareSearch(client, mid, embedder, keywords, True)
    calls_only = BareSearch(client, mid, embedder, keywords, False)
    calls_only.precompute([q for _, q in queries])
    paths[f"bare calls {scale.collections[1]:,}"] = calls_only

    # Every path answers from the measured principals' own turns before anything is timed.
    for name, path in paths.items():
        if not name.startswith("no-op") and not all(path(job) for job in queries[:20]):
            raise RuntimeError(f"{name} found nothing for a measured principal's query")
    log("search: warm-up and measuring")
    for path in paths.values():
        timed_calls(path, queries[-40:])
    per_block = scale.queries_per_block

    def slice_for(rnd: int) -> Sequence[tuple[str, str]]:
        begin = rnd * per_block % len(queries)
        return (queries + queries)[begin : begin + per_block]

    cpu = MachineCpu()
    blocks = interleave(paths, slice_for, scale.search_rounds, deadline)
    busy = cpu.busy()

    small, mid_size, big = scale.collections
    print()
    print(
        f"Search through the service on a real Qdrant server: {len(corpora)} measured principals "
        f"of {MEASURED_CHUNKS} chunks in every collection, page {PAGE_SIZE}, one call in flight, "
        f"{scale.search_rounds} interleaved rounds x {per_block} queries per path "
        f"(machine {busy:.0%} busy meanwhile)"
    )
    for fact in facts:
        print(fact)
    print_table(blocks)
    lines = [
        verdict(
            f"service at {big:,} / at {small:,}",
            per_round_ratios(blocks, f"service {big:,}", f"service {small:,}"),
            SEARCH_TARGET,
        ),
        verdict(
            f"service at {mid_size:,} / bare qdrant-client at {mid_size:,} (+ query encoding)",
            per_round_ratios(blocks, f"service {mid_size:,}", f"bare {mid_size:,}"),
            SEARCH_TARGET,
        ),
    ]
    print("Targets (median of per-round p50 ratios):")
    for line, _ok in lines:
        print(line)
    extra = per_round_ratios(blocks, f"service {mid_size:,}", f"bare calls {mid_size:,}")
    print(
        f"  (service at {mid_size:,} / the bare calls alone, encodings precomputed: x"
        f"{statistics.median(extra):.2f})"
    )

    print()
    print(
        "Memory and disk (Qdrant server RSS after each collection was loaded; each "
        "collection's size on disk):"
    )
    print(f"{'after loading':<22} {'points':>10} {'qdrant RSS MiB':>15} {'disk MiB':>10}")
    for label, points, rss, disk in memory_rows:
        print(f"{label:<22} {points:>10,} {rss:>15.0f} {disk:>10.0f}")
    (_, _, r1, _), (_, n2, r2, d2) = memory_rows[-2], memory_rows[-1]
    per = 100_000 / max(1, n2)
    print(
        f"per 100,000 chunks (largest collection): disk {d2 * per:.0f} MiB, Qdrant RSS growth "
        f"{(r2 - r1) / max(1, n2) * 100_000:.0f} MiB (from the RSS before and after loading it)"
    )
    serve_rss = {name: tree_rss_mib(s.proc.pid) for name, s in servers.items()}
    print(
        "serving processes' RSS after the run (MiB): "
        + ", ".join(f"{n} {v:.0f}" for n, v in serve_rss.items())
    )
    return all(ok for _line, ok in lines)


def run_edge(scale: Scale, args: argparse.Namespace, deadline: float, stack: ExitStack) -> bool:
    """Phase 1b: the same search on the embedded engine (qdrant-edge, `memoria serve
    --data-dir`), small against big (args.edge_chunks). Each store is filled offline through
    the adapter's shard; a fill cut short by the deadline or by the machine's memory is
    measured at the size it reached, and said so."""
    data = SearchData.make(scale, args)
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-growth-edge-")))
    facts = [data.pool_fact]
    small, big = args.edge_chunks or (scale.collections[0], scale.collections[2])
    sizes: dict[int, int] = {}
    fill_deadline = min(deadline - 300, time.monotonic() + args.edge_fill_seconds)
    for size in (small, big):
        directory = work / f"edge-{size}"
        started = time.monotonic()
        index = QdrantEdgeChunkIndex(directory / "chunks", DIMENSION, data.embedder.model_id)
        try:
            write_measured(index, data.corpora, data.embeddings, data.keywords)
            fillers = size - sum(c.chunk_count for c in data.corpora)
            log(f"edge: filling {directory.name} with {fillers:,} points")
            try:
                fill_edge(index, fillers, data.pool, SEED + size, directory.name, fill_deadline)
            except BudgetExceeded as error:
                facts.append(f"{directory.name}: fill stopped early ({error})")
            sizes[size] = index._shard.info().points_count
        finally:
            index.close()
        facts.append(
            f"{directory.name}: {sizes[size]:,} points written in "
            f"{time.monotonic() - started:.0f}s, never optimized (as the server leaves it), "
            f"{du_mib(directory):.0f} MiB on disk"
        )
    servers = {}
    for size in (small, big):
        directory = work / f"edge-{size}"
        server = ServerProcess(
            ["--data-dir", str(directory)],
            directory,
            service=SEARCH_SERVICE,
            stop_timeout_s=SERVER_STOP_TIMEOUT_S,
        )
        stack.callback(server.stop)
        servers[size] = server
    paths: dict[str, Callable[[Any], object]] = {}
    for size, server in servers.items():
        server.wait_serving(SERVER_START_TIMEOUT_S)
        channel = stack.enter_context(grpc.insecure_channel(f"{HOST}:{server.port}"))
        paths[f"edge {sizes[size]:,}"] = ServiceSearch(channel)
    queries = data.queries
    for name, path in paths.items():
        if not all(path(job) for job in queries[:20]):
            raise RuntimeError(f"{name} found nothing for a measured principal's query")
    for path in paths.values():
        timed_calls(path, queries[-40:])
    per_block = scale.queries_per_block

    def slice_for(rnd: int) -> Sequence[tuple[str, str]]:
        begin = rnd * per_block % len(queries)
        return (queries + queries)[begin : begin + per_block]

    cpu = MachineCpu()
    blocks = interleave(paths, slice_for, scale.search_rounds, deadline)
    busy = cpu.busy()
    print()
    print(
        f"Search through the service on the embedded engine (qdrant-edge): the same "
        f"{len(data.corpora)} measured principals, {scale.search_rounds} interleaved rounds x "
        f"{per_block} queries (machine {busy:.0%} busy meanwhile)"
    )
    for fact in facts:
        print(fact)
    print_table(blocks)
    line, ok = verdict(
        f"edge at {sizes[big]:,} / at {sizes[small]:,}",
        per_round_ratios(blocks, f"edge {sizes[big]:,}", f"edge {sizes[small]:,}"),
        SEARCH_TARGET,
    )
    print(line)
    print(
        "serving processes' RSS (the store is inside them), MiB: "
        + ", ".join(
            f"{sizes[n]:,} chunks {tree_rss_mib(s.proc.pid):.0f}" for n, s in servers.items()
        )
    )
    return ok


# --------------------------------------------------------------------------------------------
# Render on PostgreSQL
# --------------------------------------------------------------------------------------------


def _db_url(url: str, database: str, driver: bool) -> str:
    parsed = make_url(url).set(database=database)
    if not driver:
        parsed = parsed.set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def _psql_admin(owner_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        _db_url(owner_url, make_url(owner_url).database or "memoria", False), autocommit=True
    )


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone()
        if not row or not row[0]:
            break
        time.sleep(0.2)  # a stopped server's backends take a moment to exit (bounded)
    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def block_database(
    owner_url: str, name: str, principals: int
) -> Iterator[tuple[str, list[tuple[str, str]], str]]:
    """A fresh database `name` migrated by `memoria migrate`, with `principals` blocks copied
    in as the owner; yields (name, the (tenant, principal) pairs, what it is). Dropped at the
    end."""
    admin = _psql_admin(owner_url)
    try:
        _drop(admin, name)
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f'GRANT CONNECT ON DATABASE "{name}" TO {APP_ROLE}')
        subprocess.run(
            [
                str(Path(sys.executable).parent / "memoria"),
                "migrate",
                "--database-url",
                _db_url(owner_url, name, True),
                "--app-role",
                APP_ROLE,
            ],
            cwd=REPO,
            check=True,
            timeout=300,
            capture_output=True,
        )
        rng = random.Random(SEED)
        texts = [seeded_block(rng) for _ in range(2_000)]
        tenants = max(1, principals // 10_000)
        pairs = [(f"t{i % tenants}", f"p{i}") for i in range(principals)]
        started = time.monotonic()
        with psycopg.connect(_db_url(owner_url, name, False)) as conn:
            # FORCEd row-level security binds the owner, and COPY FROM refuses a table whose
            # policies apply to the copying role: lifted and restored inside the transaction.
            conn.execute("ALTER TABLE memory_blocks NO FORCE ROW LEVEL SECURITY")
            now = datetime.now(UTC)
            with conn.cursor().copy(
                "COPY memory_blocks (tenant_id, principal_id, text, etag, update_time) FROM STDIN"
            ) as copy:
                for i, (tenant, principal) in enumerate(pairs):
                    copy.write_row(
                        (tenant, principal, texts[i % len(texts)], secrets.token_hex(8), now)
                    )
            conn.execute("ALTER TABLE memory_blocks FORCE ROW LEVEL SECURITY")
            conn.commit()
        with psycopg.connect(_db_url(owner_url, name, False), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE memory_blocks")
            size = conn.execute("SELECT pg_total_relation_size('memory_blocks')").fetchone()
            settings = [
                f"{setting}={conn.execute(f'SHOW {setting}').fetchone()[0]}"  # type: ignore[index]
                for setting in DURABILITY_SETTINGS
            ]
        durable = all(x.endswith("=on") for x in settings)
        description = (
            f"database {name}: {principals:,} blocks in {tenants} tenant(s), "
            f"{(size[0] if size else 0) / (1 << 20):.0f} MiB, copied in "
            f"{time.monotonic() - started:.0f}s; {', '.join(settings)} "
            f"({'durable' if durable else 'NOT durable'})"
        )
        log(description)
        yield name, pairs, description
    finally:
        with contextlib.suppress(Exception):
            _drop(admin, name)
        admin.close()


class Render:
    """RenderMemoryBlock through a running server, one call at a time."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = mb_grpc.MemoryBlockServiceStub(channel)

    def __call__(self, who: tuple[str, str]) -> int:
        reply = self._stub.RenderMemoryBlock(
            mb_pb.RenderMemoryBlockRequest(),
            metadata=(("x-memoria-tenant", who[0]), ("x-memoria-principal", who[1])),
            timeout=CALL_TIMEOUT_S,
        )
        if not reply.prompt_section:
            raise RuntimeError(f"{who} rendered an empty section")
        return reply.char_count


def run_render(scale: Scale, deadline: float, stack: ExitStack) -> bool:
    """Phase 2 (see the module docstring)."""
    owner_url, app_url = bench_pg_urls()
    small, big = scale.render_principals
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-growth-render-")))
    sampled: dict[int, list[tuple[str, str]]] = {}
    servers: dict[str, ServerProcess] = {}
    databases: list[str] = []
    for count in (small, big):
        name, pairs, description = stack.enter_context(
            block_database(owner_url, f"memoria_growth_{count}", count)
        )
        databases.append(description)
        sampled[count] = random.Random(SEED).sample(pairs, min(1_000, len(pairs)))
        for cache in ("cache", "no cache"):
            label = f"{count:,} {cache}"
            directory = work / label.replace(" ", "-").replace(",", "")
            directory.mkdir()
            env = {"MEMORIA_READ_CACHE_ENTRIES": "0"} if cache == "no cache" else {}
            server = ServerProcess(
                ["--database-url", _db_url(app_url, name, True), "--data-dir", str(directory)],
                directory,
                service=BLOCK_SERVICE,
                stop_timeout_s=SERVER_STOP_TIMEOUT_S,
                env=env,
            )
            stack.callback(server.stop)
            servers[label] = server
    paths: dict[str, Callable[[Any], object]] = {}
    samples: dict[str, list[tuple[str, str]]] = {}
    for label, server in servers.items():
        server.wait_serving(SERVER_START_TIMEOUT_S)
        channel = stack.enter_context(grpc.insecure_channel(f"{HOST}:{server.port}"))
        paths[label] = Render(channel)
        samples[label] = sampled[int(label.split()[0].replace(",", ""))]
    log("render: warm-up (every sampled principal once per server) and measuring")
    for label, path in paths.items():
        timed_calls(path, samples[label])
    per_block = scale.renders_per_block

    def runner(label: str) -> Callable[[int], Sequence[tuple[str, str]]]:
        def work_for(rnd: int) -> Sequence[tuple[str, str]]:
            sample = samples[label]
            begin = rnd * per_block % len(sample)
            return (sample + sample)[begin : begin + per_block]

        return work_for

    # Each path renders its own database's sample: run them through one interleaving.
    blocks: dict[str, list[list[float]]] = {label: [] for label in paths}
    names = list(paths)
    for rnd in range(scale.render_rounds):
        shift = rnd % len(names)
        for label in names[shift:] + names[:shift]:
            if time.monotonic() > deadline:
                raise BudgetExceeded(f"render round {rnd + 1} {label}")
            lat = timed_calls(paths[label], runner(label)(rnd))
            blocks[label].append(lat)
            log(f"  round {rnd + 1} {label:<20} p50 {p50_ms(lat):6.3f} ms")
    print()
    print(
        f"Render through the service on PostgreSQL (service role, RLS in force): {small:,} against "
        f"{big:,} principals with a block, {len(sampled[small])} sampled principals per database "
        f"rendered in turn, one call in flight, {scale.render_rounds} interleaved rounds x "
        f"{per_block} calls per server; read cache on (default: `cache`) and off "
        "(MEMORIA_READ_CACHE_ENTRIES=0)"
    )
    for description in databases:
        print(description)
    print_table(blocks)
    print("Targets (median of per-round p50 ratios):")
    oks = []
    for cache in ("cache", "no cache"):
        line, ok = verdict(
            f"render {cache}, {big:,} / {small:,}",
            per_round_ratios(blocks, f"{big:,} {cache}", f"{small:,} {cache}"),
            RENDER_TARGET,
        )
        print(line)
        oks.append(ok)
    return all(oks)


# --------------------------------------------------------------------------------------------
# Indexing with 1 and 2 worker processes
# --------------------------------------------------------------------------------------------


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


@dataclass
class IndexPass:
    workers: int
    turns: int
    chunks: int
    seconds: float
    machine_busy: float
    worker_cpu_s: float
    extra: dict[str, float] = field(default_factory=dict)


def run_index(scale: Scale, deadline: float, stack: ExitStack) -> bool:
    """Phase 3 (see the module docstring)."""
    owner_url, app_url = bench_pg_urls()
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-growth-index-")))
    endpoint = stack.enter_context(qdrant_process(work / "qdrant")).endpoint
    name, _pairs, database = stack.enter_context(
        block_database(owner_url, "memoria_growth_index", 1)
    )
    app_db = _db_url(app_url, name, True)
    env = endpoint.env() | {"MEMORIA_INDEX_WORKER_THREADS": "0"}
    server = ServerProcess(
        ["--database-url", app_db, "--data-dir", str(work / "serve")],
        work,
        service=SEARCH_SERVICE,
        stop_timeout_s=SERVER_STOP_TIMEOUT_S,
        env=env,
    )
    stack.callback(server.stop)
    server.wait_serving(SERVER_START_TIMEOUT_S)
    channel = stack.enter_context(grpc.insecure_channel(f"{HOST}:{server.port}"))
    stub = cs_grpc.ConversationSearchServiceStub(channel)
    generator = CorpusGenerator(SEED)
    turns: list[Turn] = generator.principal(
        "t-index", "p-index", scale.index_turns * 4, tag="ix"
    ).turns[: scale.index_turns]
    status_conn = psycopg.connect(_db_url(owner_url, name, False), autocommit=True)
    stack.callback(status_conn.close)

    def statuses(prefix: str) -> dict[str, int]:
        with status_conn.transaction():
            status_conn.execute("SELECT set_config('app.tenant_id', 't-index', true)")
            rows = status_conn.execute(
                "SELECT status, count(*) FROM conversation_turns WHERE conversation_id LIKE %s "
                "GROUP BY status",
                (prefix + "%",),
            ).fetchall()
        return {str(s): int(n) for s, n in rows}

    passes: list[IndexPass] = []
    plan = [w for rnd in range(scale.index_rounds) for w in ((1, 2) if rnd % 2 == 0 else (2, 1))]
    for number, workers in enumerate(plan):
        if time.monotonic() > deadline:
            raise BudgetExceeded(f"indexing pass {number + 1}")
        procs: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        try:
            for w in range(workers):
                logs.append(work / f"worker-{number}-{w}.log")
                with logs[-1].open("wb") as out:
                    procs.append(
                        subprocess.Popen(
                            [
                                str(Path(sys.executable).parent / "memoria"),
                                "worker",
                                "--database-url",
                                app_db,
                            ],
                            cwd=REPO,
                            env=os.environ | env | {"MEMORIA_INDEX_WORKER_THREADS": "1"},
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            ready_by = time.monotonic() + SERVER_START_TIMEOUT_S
            while not all("indexing worker running" in p.read_text(errors="replace") for p in logs):
                if time.monotonic() > ready_by or any(p.poll() is not None for p in procs):
                    raise RuntimeError(
                        "a worker did not start:\n" + logs[-1].read_text(errors="replace")[-2000:]
                    )
                time.sleep(0.1)  # waiting for the workers' start line, bounded
            prefix = f"pass{number}-"
            cpu_before = sum(process_cpu_seconds(p.pid) for p in procs)
            cpu = MachineCpu()
            started = time.perf_counter()
            chunks = 0
            for turn in turns:
                reply = stub.IndexTurn(
                    cs_pb.IndexTurnRequest(
                        conversation_id=prefix + turn.conversation_id,
                        turn_id=turn.turn_id,
                        question=turn.question,
                        answer=turn.answer,
                        turn_time=_timestamp(turn.turn_time),
                    ),
                    metadata=(("x-memoria-tenant", "t-index"), ("x-memoria-principal", "p-index")),
                    timeout=CALL_TIMEOUT_S,
                )
                if reply.outcome != cs_pb.INDEX_TURN_OUTCOME_ACCEPTED:
                    raise RuntimeError(f"IndexTurn answered {reply.outcome}")
                chunks += reply.chunk_count
            while True:
                seen = statuses(prefix)
                if seen.get("failed"):
                    raise RuntimeError(f"{seen['failed']} turns failed to index")
                if seen.get("indexed", 0) == len(turns):
                    break
                if time.monotonic() > deadline:
                    raise BudgetExceeded(f"indexing pass {number + 1}: {seen}")
                time.sleep(0.05)  # polling the turn table, bounded by the deadline
            seconds = time.perf_counter() - started
            busy = cpu.busy()
            worker_cpu = sum(process_cpu_seconds(p.pid) for p in procs) - cpu_before
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=SERVER_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        passes.append(IndexPass(workers, len(turns), chunks, seconds, busy, worker_cpu))
        log(
            f"  pass {number + 1}: {workers} worker(s) {len(turns)} turns in {seconds:.1f}s, "
            f"machine {busy:.0%}"
        )
    print()
    print(
        f"Indexing through IndexTurn with `memoria worker` processes (1 thread each) on PostgreSQL "
        f"and the real Qdrant server: {len(turns)} turns per pass, {passes[0].chunks} chunks"
    )
    print(database)
    print(
        f"{'workers':>7} {'seconds':>8} {'turns/s':>8} {'chunks/s':>9} {'machine busy':>13} "
        f"{'workers cpu':>12}"
    )
    for done in passes:
        print(
            f"{done.workers:>7} {done.seconds:>8.2f} {done.turns / done.seconds:>8.2f} "
            f"{done.chunks / done.seconds:>9.2f} "
            f"{done.machine_busy:>13.0%} {done.worker_cpu_s / done.seconds:>11.2f}c"
        )
    one = [done.seconds for done in passes if done.workers == 1]
    two = [done.seconds for done in passes if done.workers == 2]
    if one and two:
        print(
            "2 workers / 1 worker throughput: "
            f"x{statistics.median(one) / statistics.median(two):.2f}"
        )
    print("(workers cpu: CPU seconds the worker processes used per second of the pass, in cores)")
    return True


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


ENDED: tuple[type[BaseException], ...] = (
    *RUN_ENDED,
    grpc.RpcError,
    psycopg.Error,
    subprocess.CalledProcessError,
)
"""What ends a phase early and still leaves a report of the phases before it."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--scale", choices=sorted(SCALES), default="full")
    p.add_argument("--only", nargs="+", choices=("search", "edge", "render", "index"))
    p.add_argument(
        "--edge-chunks", nargs=2, type=int, metavar=("SMALL", "BIG"), help="embedded stores' sizes"
    )
    p.add_argument(
        "--edge-fill-seconds",
        type=float,
        default=1500,
        help="stop filling the embedded stores after this long and measure what is there",
    )
    p.add_argument(
        "--no-vector-index",
        action="store_true",
        help="load with indexing_threshold=0 (see the docstring; for comparison only)",
    )
    p.add_argument(
        "--collections",
        nargs=3,
        type=int,
        metavar=("SMALL", "MID", "BIG"),
        help="chunks in the three collections (default: the scale's)",
    )
    p.add_argument("--time-budget", type=float, help="seconds (default: the scale's)")
    p.add_argument("--no-cache", action="store_true", help=f"do not use {CACHE_DIR}")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scale = SCALES[args.scale]
    if args.collections:
        small, mid, big = args.collections
        scale = dataclasses.replace(scale, collections=(small, mid, big))
    raise_on_sigterm()
    started = time.monotonic()
    deadline = started + (args.time_budget or scale.time_budget_s)
    phases: dict[str, Callable[[ExitStack], bool]] = {
        "search": lambda stack: run_search(scale, args, deadline, stack),
        "render": lambda stack: run_render(scale, deadline, stack),
        "index": lambda stack: run_index(scale, deadline, stack),
        "edge": lambda stack: run_edge(scale, args, deadline, stack),
    }
    outcome = ""
    missed: list[str] = []
    for phase in args.only or ["search", "render", "index", "edge"]:
        with ExitStack() as stack:
            try:
                if not phases[phase](stack):
                    missed.append(phase)
            except ENDED as error:
                outcome = f"{phase} {failure_outcome(error)}"
                log(outcome)
        sys.stdout.flush()
        if outcome:
            break
    print()
    print(machine_line())
    print(
        software_line(
            f"qdrant-client {metadata.version('qdrant-client')}",
            f"onnxruntime {metadata.version('onnxruntime')}",
        )
    )
    print(
        f"scale {args.scale}; wall time {time.monotonic() - started:.0f}s"
        + (f"; PARTIAL ({outcome})" if outcome else "")
    )
    if missed:
        print("targets missed in: " + ", ".join(missed))
    return 1 if outcome else 0


if __name__ == "__main__":
    sys.exit(main())
