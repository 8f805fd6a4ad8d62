"""Conversation search speed on the embedded engine: the service against the engine alone.

What it measures
----------------
Two ratios from the issue (item 9), each measured side by side in one run against one real
``memoria serve`` process, so that the machine's drift cancels out:

1. **Search latency at 100,000 chunks.** ``SearchConversations`` through the service (gRPC on
   loopback, one call in flight) against *the same hybrid query made directly on the engine
   plus the query embedding*, in this process: ``embed_query`` and the keyword encoder's
   ``encode_query``, then one qdrant-edge query with a dense and a sparse prefetch as deep as
   the service's (``depth x CANDIDATES_PER_TURN`` points each, where depth is the number of
   turns a search asks the index for at the default page of 10, read from the domain
   code by `depth_turns`), the engine's distribution-based score fusion (the nearest engine
   fusion to the service's weighted normalized score fusion), the same tenant and
   principal filter, and the payload of ``2 x depth`` fused points (the most the service
   loads: its best chunk of ``depth`` turns on each side). Target: service p50 (and p99) at
   most 1.5x the direct figure. A third path, ``adapter``, runs what the service
   runs minus gRPC and SQL (``QdrantEdgeChunkIndex.search`` and ``fuse`` in this process), to
   show where a gap comes from.
2. **End-to-end indexing throughput.** ``IndexTurn`` (without ``wait``) for a batch of real
   turns, at the worker's natural pace, timed from the first call until the server's SQL
   turn table says every turn is ``indexed`` (the worker marks a turn indexed only after the
   engine's upsert returned, when its chunks are searchable), against the embedding model
   alone on exactly the same chunks in this process (``embed_documents`` on the same batches
   of ``index_batch_size`` turns as the worker claims, same ``intra_op_threads`` as the
   server). Target: at least 0.8 of the model's chunks/s.

The store
---------
Populated offline, before the server starts, through ``QdrantEdgeChunkIndex.upsert_turn`` (the
server's own write path and point layout) and a consistent SQL side (every turn in the turn
table as ``indexed``, without text, as the worker leaves it). 100,000 chunks of synthetic
conversations (``search_corpus.py``) spread log-normally over 200 principals in 4 tenants
(20 to about 5,000 chunks each; ``chunk_counts``). Every chunk has its real text, its real BM25
sparse vector from ``KeywordEncoder`` and as many dense windows as the model would make for
it (counted with the model's own tokenizer and ``window_spans``).

Dense vectors: the searched principal (``p-search``, 500 chunks: the mean per principal) gets
the model's real embeddings, and every query is real text embedded by the real model. The
other principals' windows are random unit vectors drawn from a Gaussian fitted to the real
windows (per-dimension mean and spread, then normalized), because embedding 100,000 chunks
would take about three hours here. That does not change what a query costs: the dense side
only ever scores the searched principal's points (the tenant and principal filter selects them
through the payload indexes before any vector is compared), and comparing a MAX_SIM multivector
costs ``windows x dimension`` multiply-adds whatever the values, so what matters is the
dimension (384) and the distribution of window counts, which are the real ones. The keyword
side's cost depends on the posting lists of the query's terms, which are real for every
principal. The other principals make the store, its segments, payload indexes and posting
lists the size of a 100,000-chunk deployment.

Optimization: the server never calls ``optimize()`` (it stalls every Python thread for
minutes, DESIGN 4), so a real store that grew to 100,000 chunks is unoptimized, and that is
what is measured by default. ``--optimize`` optimizes the store offline before serving, for
comparison.

Two copies: one process owns an embedded store (a second open fails on its lock), so after
populating, the store is copied; the server opens one copy and this process the other, for
the direct and adapter paths. Both hold identical data while searches are measured (the
indexing phase, which writes, comes after).

Usage (from the repository root)::

    .venv/bin/python bench/bench_search.py            # 100,000 chunks, about 4 minutes
    .venv/bin/python bench/bench_search.py --quick    # 20,000 chunks, under a minute
    .venv/bin/python bench/bench_search.py --optimize # optimize the store offline first

The searched principal's real embeddings are cached in ``~/.cache/memoria-bench`` (keyed by
the model id and the texts, so a stale entry cannot be used); the first run computes them.
Everything binds and targets 127.0.0.1 only. The server is stopped and the temporary data
directories removed before the script exits, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from qdrant_edge import (
    FieldCondition,
    Filter,
    Fusion,
    MatchValue,
    Prefetch,
    Query,
    QueryRequest,
    SparseVector,
)
from sqlalchemy import insert
from tokenizers import Tokenizer

from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import conversation_search_service_pb2_grpc as pb_grpc
from server.adapters.embedding.minilm import (
    DIMENSION,
    Multivector,
    OnnxMiniLmEmbedder,
    packaged_model_dir,
    window_spans,
)
from server.adapters.qdrant.edge import CANDIDATES_PER_TURN, QdrantEdgeChunkIndex
from server.adapters.qdrant.layout import DENSE_VECTOR, KEYWORD_VECTOR, PRINCIPAL_ID, TENANT_ID
from server.adapters.sql import migrate
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.tables import conversation_turns
from server.domain.fusion import fuse, keyword_weight, retrieval_depth
from server.domain.keywords import KEYWORD_VERSION, KeywordEncoder
from server.domain.model import (
    EncodedQuery,
    IndexedChunk,
    SearchScope,
    TurnKey,
)
from server.domain.relevance import Relevance, semantic_floor
from server.runtime.settings import Settings

# search_corpus.py and procs.py sit beside this script.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import (
    HOST,
    RUN_ENDED,
    BudgetExceeded,
    ServerProcess,
    failure_outcome,
    machine_line,
    raise_on_sigterm,
    software_line,
)
from search_corpus import (
    CorpusGenerator,
    LengthStats,
    PrincipalCorpus,
    Turn,
    chunk_counts,
    describe,
    keyword_vectors,
)

SERVICE = "memoria.v1.ConversationSearchService"

SEARCH_TENANT = "t0"
SEARCH_PRINCIPAL = "p-search"
INDEX_PRINCIPAL = "p-index"  # the indexing phase writes here, never into the searched data
PAGE_SIZE = 10  # the service's default page
SEED = 20250611

SERVER_START_TIMEOUT_S = 180.0
SERVER_STOP_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 30.0
POLL_S = 0.05  # how often the indexing phase reads the turn table
ENDED: tuple[type[BaseException], ...] = (*RUN_ENDED, grpc.RpcError)
"""What ends the measuring early and still leaves a report (`failure_outcome`)."""

SEARCH_TARGET = 1.5  # service latency at most this times the direct query's
INDEX_TARGET = 0.8  # service chunks/s at least this times the model's alone

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "memoria-bench"


@dataclass(frozen=True)
class Plan:
    """Sizes of one run (full or --quick)."""

    chunks: int
    principals: int
    tenants: int
    searched_chunks: int
    rounds: int
    queries_per_block: int
    warmup_queries: int
    index_turns: int
    index_rounds: int
    time_budget_s: float


FULL = Plan(
    chunks=100_000,
    principals=200,
    tenants=4,
    searched_chunks=500,
    rounds=6,
    queries_per_block=300,
    warmup_queries=50,
    index_turns=160,
    index_rounds=2,
    time_budget_s=900,
)
QUICK = Plan(
    chunks=20_000,
    principals=40,
    tenants=2,
    searched_chunks=200,
    rounds=2,
    queries_per_block=40,
    warmup_queries=20,
    index_turns=32,
    index_rounds=1,
    time_budget_s=240,
)


def log(message: str) -> None:
    """Progress goes to stderr; the report goes to stdout."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Dense vectors: real for the searched principal, fitted random for everyone else
# --------------------------------------------------------------------------------------------


class WindowCounter:
    """How many windows the embedder makes of a text, from the model's own tokenizer."""

    def __init__(self) -> None:
        tokenizer = Tokenizer.from_file(str(packaged_model_dir() / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def windows(self, texts: Sequence[str]) -> list[int]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(window_spans(len(e.ids))) for e in encodings]


def real_embeddings(
    embedder: OnnxMiniLmEmbedder, texts: Sequence[str], cache_dir: Path | None
) -> list[Multivector]:
    """The model's multivectors of `texts`, from the cache when the same model embedded the
    same texts before (the key hashes both), else computed now and stored."""
    digest = hashlib.sha256(embedder.model_id.encode())
    for text in texts:
        digest.update(hashlib.sha256(text.encode()).digest())
    path = cache_dir / f"{digest.hexdigest()[:32]}.npz" if cache_dir else None
    if path is not None and path.exists():
        with np.load(path) as saved:
            flat, counts = saved["vectors"], saved["windows"]
        if len(counts) == len(texts):
            return _split_windows(flat, [int(c) for c in counts])
    started = time.monotonic()
    vectors: list[Multivector] = []
    for begin in range(0, len(texts), 32):
        vectors += embedder.embed_documents(texts[begin : begin + 32])
        log(f"  embedded {len(vectors)}/{len(texts)} chunks ({time.monotonic() - started:.0f}s)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        flat = np.array([w for mv in vectors for w in mv], dtype=np.float32)
        temporary = path.with_suffix(".tmp.npz")
        np.savez(temporary, vectors=flat, windows=np.array([len(mv) for mv in vectors]))
        temporary.replace(path)
    return vectors


def _split_windows(flat: npt.NDArray[np.float32], counts: Sequence[int]) -> list[Multivector]:
    rows = flat.tolist()
    out: list[Multivector] = []
    begin = 0
    for count in counts:
        out.append(tuple(tuple(r) for r in rows[begin : begin + count]))
        begin += count
    return out


@dataclass(frozen=True)
class WindowModel:
    """A diagonal Gaussian fitted to real windows; samples are normalized to unit length."""

    mean: npt.NDArray[np.float64]
    std: npt.NDArray[np.float64]

    @classmethod
    def fit(cls, multivectors: Sequence[Multivector]) -> WindowModel:
        windows = np.array([w for mv in multivectors for w in mv], dtype=np.float64)
        return cls(windows.mean(axis=0), windows.std(axis=0))

    def sample(self, rng: np.random.Generator, windows: Sequence[int]) -> list[Multivector]:
        flat = self.mean + self.std * rng.standard_normal((sum(windows), len(self.mean)))
        flat /= np.linalg.norm(flat, axis=1, keepdims=True)
        return _split_windows(flat.astype(np.float32), windows)


# --------------------------------------------------------------------------------------------
# The store, populated offline
# --------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """What the store holds and what the measurements need of it."""

    searched: PrincipalCorpus
    queries: list[str]
    index_turns: list[Turn]  # for the indexing phase (not in the store)
    counts: list[int]  # chunks per principal, the searched one included
    chunks: int = 0
    turns: int = 0
    windows: int = 0
    facts: list[str] = field(default_factory=list)


def _indexed(
    corpus: PrincipalCorpus, vectors: Sequence[Multivector], keywords: KeywordEncoder
) -> Iterator[tuple[TurnKey, datetime, list[IndexedChunk]]]:
    """Each turn of `corpus` as `upsert_turn` takes it, with `vectors` for its chunks and the
    service's current keyword representation (search_corpus.keyword_vectors)."""
    position = 0
    for turn, sparse in zip(corpus.turns, keyword_vectors(corpus, keywords), strict=True):
        chunks = []
        for i, text in enumerate(turn.chunks):
            chunks.append(IndexedChunk(i, text, vectors[position], sparse[i], KEYWORD_VERSION))
            position += 1
        key = TurnKey(corpus.tenant_id, corpus.principal_id, turn.conversation_id, turn.turn_id)
        yield key, turn.turn_time, chunks


def populate(
    data_dir: Path,
    plan: Plan,
    embedder: OnnxMiniLmEmbedder,
    cache_dir: Path | None,
    optimize: bool,
    deadline: float,
) -> Corpus:
    """Write the whole store (chunks and SQL) under `data_dir`; see the module docstring."""
    started = time.monotonic()
    generator = CorpusGenerator(SEED)
    keywords = KeywordEncoder()
    counter = WindowCounter()
    rng = random.Random(SEED)
    counts = chunk_counts(plan.chunks - plan.searched_chunks, plan.principals - 1, rng)
    searched = generator.principal(SEARCH_TENANT, SEARCH_PRINCIPAL, plan.searched_chunks)
    queries = generator.queries(searched, max(400, plan.queries_per_block * 2))
    index_turns = generator.principal(
        SEARCH_TENANT, INDEX_PRINCIPAL, plan.index_turns * 2, tag="ix"
    ).turns[: plan.index_turns]
    corpus = Corpus(searched, queries, index_turns, [searched.chunk_count, *counts])

    log(f"embedding the searched principal's {searched.chunk_count} chunks with the model")
    texts = [c for t in searched.turns for c in t.chunks]
    real = real_embeddings(embedder, texts, cache_dir)
    model = WindowModel.fit(real)
    vector_rng = np.random.default_rng(SEED)

    index = QdrantEdgeChunkIndex(data_dir / "chunks", DIMENSION, embedder.model_id)
    sql_rows: list[dict[str, Any]] = []
    now = datetime.now(UTC)
    try:
        lengths = LengthStats()
        for number in range(len(counts) + 1):
            if time.monotonic() > deadline:
                raise BudgetExceeded("populating the store")
            if number == 0:
                principal, vectors = searched, real
            else:
                tenant = f"t{number % plan.tenants}"
                principal = generator.principal(tenant, f"p{number:04d}", counts[number - 1])
                chunk_texts = [c for t in principal.turns for c in t.chunks]
                vectors = model.sample(vector_rng, counter.windows(chunk_texts))
            corpus.windows += sum(len(v) for v in vectors)
            for key, when, chunks in _indexed(principal, vectors, keywords):
                index.upsert_turn(key, when, chunks)
                sql_rows.append(_turn_row(key, when, now))
            corpus.chunks += principal.chunk_count
            corpus.turns += len(principal.turns)
            lengths.add(principal.turns)
            if number % 20 == 0:
                log(
                    f"  populated {corpus.chunks} chunks of {number + 1} principals "
                    f"({time.monotonic() - started:.0f}s)"
                )
        corpus.facts.append(f"corpus: {lengths}")
        if optimize:
            log("optimizing the store (offline; holds every Python thread)")
            optimize_started = time.monotonic()
            changed = index.optimize()
            took = time.monotonic() - optimize_started
            corpus.facts.append(f"store optimized offline in {took:.0f}s (changed: {changed})")
        info = index._shard.info()  # the engine's own view, for the report
        corpus.facts.append(
            f"store: {info.points_count} points in {info.segments_count} segment(s), "
            f"{'optimized offline' if optimize else 'never optimized (as the server leaves it)'}"
        )
    finally:
        index.close()

    engine = create_store_engine(sqlite_url(data_dir), pool_size=1)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(insert(conversation_turns), sql_rows)
    finally:
        engine.dispose()
    corpus.facts.append(
        f"populated in {time.monotonic() - started:.0f}s: {corpus.chunks} chunks "
        f"({corpus.windows} dense windows) in {corpus.turns} turns of {len(corpus.counts)} "
        f"principals in {plan.tenants} tenants; chunks per principal min {min(corpus.counts)}, "
        f"median {sorted(corpus.counts)[len(corpus.counts) // 2]}, max {max(corpus.counts)}"
    )
    return corpus


def _turn_row(key: TurnKey, when: datetime, now: datetime) -> dict[str, Any]:
    """The turn table row the worker leaves behind: indexed, text dropped."""
    return {
        "tenant_id": key.tenant_id,
        "principal_id": key.principal_id,
        "conversation_id": key.conversation_id,
        "turn_id": key.turn_id,
        "version": 1,
        "status": "indexed",
        "text": None,
        "turn_time": when,
        "accept_time": now,
        "due_time": now,
        "attempts": 0,
        "last_error": None,
    }


# --------------------------------------------------------------------------------------------
# The server under test
# --------------------------------------------------------------------------------------------


def identity(principal: str) -> tuple[tuple[str, str], ...]:
    """Trusted-headers metadata (the server listens on loopback only)."""
    return (("x-memoria-tenant", SEARCH_TENANT), ("x-memoria-principal", principal))


# --------------------------------------------------------------------------------------------
# Search: three paths to the same answer
# --------------------------------------------------------------------------------------------

SearchFn = Callable[[str], list[str]]
"""Runs one search; returns "conversation/turn" of each hit, best first (for the checks)."""


def depth_turns(page_size: int) -> int:
    """The turns each side ranks for a page of `page_size`, straight from the domain code
    (server/domain/fusion.py) rather than from a copy of its formula here."""
    return retrieval_depth(page_size)


class DirectSearch:
    """The hybrid query made directly on the engine, plus the query embedding (see module)."""

    def __init__(
        self, index: QdrantEdgeChunkIndex, embedder: OnnxMiniLmEmbedder, keywords: KeywordEncoder
    ) -> None:
        # The very shard object the adapter wraps: one process may open a store only once.
        self._shard = index._shard
        self._embedder = embedder
        self._keywords = keywords
        self._filter = Filter(
            must=[
                FieldCondition(TENANT_ID, match=MatchValue(SEARCH_TENANT)),
                FieldCondition(PRINCIPAL_ID, match=MatchValue(SEARCH_PRINCIPAL)),
            ]
        )
        self._depth = depth_turns(PAGE_SIZE)

    def __call__(self, text: str) -> list[str]:
        dense = self._embedder.embed_query(text)
        sparse = self._keywords.encode_query(text)
        candidates = self._depth * CANDIDATES_PER_TURN
        prefetches = [Prefetch(candidates, Query.Nearest([list(dense)], using=DENSE_VECTOR))]
        if sparse.indices:  # as the service: no keyword side for a query without terms
            keyword = SparseVector(list(sparse.indices), list(sparse.values))
            prefetches.append(Prefetch(candidates, Query.Nearest(keyword, using=KEYWORD_VECTOR)))
        points = self._shard.query(
            QueryRequest(
                limit=2 * self._depth,
                # qdrant-edge's stub declares Fusion's variants as nested classes, not
                # subclasses of Fusion, so a variant does not match the parameter's type.
                query=Fusion.Dbsf(),  # type: ignore[arg-type]
                prefetches=prefetches,
                filter=self._filter,
                with_payload=True,
            )
        )
        return [
            f"{p.payload['conversation_id']}/{p.payload['turn_id']}" for p in points if p.payload
        ]


class AdapterSearch:
    """What the service runs for a search minus gRPC, auth and SQL: the adapter, fusion and
    the relevance gate (server/domain/search.py's order)."""

    def __init__(
        self, index: QdrantEdgeChunkIndex, embedder: OnnxMiniLmEmbedder, keywords: KeywordEncoder
    ) -> None:
        self._index = index
        self._embedder = embedder
        self._keywords = keywords
        self._scope = SearchScope(SEARCH_TENANT, SEARCH_PRINCIPAL, frozenset())
        self._relevance = Relevance(keywords, semantic_floor(embedder.model_id))

    def __call__(self, text: str) -> list[str]:
        encoded = EncodedQuery(
            dense=self._embedder.embed_query(text), sparse=self._keywords.encode_query(text)
        )
        depth = depth_turns(PAGE_SIZE)
        found = self._index.search(self._scope, encoded, depth)
        fused = fuse(found, 2 * depth, keyword_weight(self._embedder.model_id))
        hits = self._relevance.page(text, fused, PAGE_SIZE)
        return [f"{h.conversation_id}/{h.turn_id}" for h in hits]


class ServiceSearch:
    """SearchConversations through the running server, one call at a time."""

    def __init__(self, channel: grpc.Channel, principal: str = SEARCH_PRINCIPAL) -> None:
        self._stub = pb_grpc.ConversationSearchServiceStub(channel)
        self._metadata = identity(principal)

    def __call__(self, text: str) -> list[str]:
        reply: pb.SearchConversationsResponse = self._stub.SearchConversations(
            pb.SearchConversationsRequest(query=text, page_size=PAGE_SIZE),
            metadata=self._metadata,
            timeout=CALL_TIMEOUT_S,
        )
        return [f"{h.conversation_id}/{h.turn_id}" for h in reply.hits]


class NoOp:
    """grpc.health.v1 Health/Check on the same channel: the floor of one round trip through
    this client, the server's gRPC stack and thread pool, for reading the service's gap."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)

    def __call__(self, _text: str) -> list[str]:
        self._stub.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S)
        return []


@dataclass
class Block:
    """One path's run of consecutive searches in one round."""

    path: str
    round: int
    latencies_s: list[float]
    wall_s: float
    cpu_s: float  # CPU of the process doing the work (the server's for the service path)


def run_block(
    path: str, rnd: int, search: SearchFn, queries: Sequence[str], cpu: Callable[[], float]
) -> Block:
    latencies = []
    cpu_before = cpu()
    started = time.perf_counter()
    for text in queries:
        begin = time.perf_counter()
        search(text)
        latencies.append(time.perf_counter() - begin)
    wall = time.perf_counter() - started
    return Block(path, rnd, latencies, wall, cpu() - cpu_before)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation), of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered) + 0.5 - 1e-9))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class SearchSummary:
    """One path over all rounds."""

    path: str
    p50_ms: float
    p99_ms: float
    rps: float
    cpu_ms: float
    samples: int


def summarize_search(blocks: Sequence[Block], path: str) -> SearchSummary:
    mine = [b for b in blocks if b.path == path]
    latencies = [x for b in mine for x in b.latencies_s]
    calls = len(latencies)
    return SearchSummary(
        path,
        percentile(latencies, 50) * 1e3,
        percentile(latencies, 99) * 1e3,
        calls / sum(b.wall_s for b in mine),
        sum(b.cpu_s for b in mine) / calls * 1e3,
        calls,
    )


def check_search(corpus: Corpus, paths: dict[str, SearchFn]) -> list[str]:
    """Before measuring: every path finds the searched principal's turns, and only theirs;
    and how much the direct query's top turns agree with the service's (the same work, not
    quite the same ranking: the service fuses per turn, the engine per chunk)."""
    own = {f"{t.conversation_id}/{t.turn_id}" for t in corpus.searched.turns}
    overlaps = []
    empty = 0
    for text in corpus.queries[:50]:
        answers = {name: search(text) for name, search in paths.items()}
        for name, turns in answers.items():
            if not set(turns) <= own:
                raise RuntimeError(f"{name} returned a turn that is not {SEARCH_PRINCIPAL}'s")
        service = answers["service"]
        empty += not service
        direct = list(dict.fromkeys(answers["direct"]))[:PAGE_SIZE]  # first chunk per turn
        if service:
            overlaps.append(len(set(direct) & set(service)) / len(service))
    if empty > 5:
        raise RuntimeError(f"the service found nothing for {empty} of 50 queries")
    return [
        f"check: over 50 queries every path returned only {SEARCH_PRINCIPAL}'s turns; "
        f"{statistics.mean(overlaps):.0%} of the service's top-{PAGE_SIZE} turns are in the "
        f"direct query's top {PAGE_SIZE}"
    ]


def measure_search(
    corpus: Corpus,
    paths: dict[str, SearchFn],
    cpu: dict[str, Callable[[], float]],
    plan: Plan,
    deadline: float,
) -> list[Block]:
    """Warm every path, then interleaved rounds: each round, every path runs the same slice of
    queries, in an order rotated every round so that none is always first."""
    names = list(paths)
    warm = corpus.queries[-plan.warmup_queries :]
    for name in names:
        run_block(name, 0, paths[name], warm, cpu[name])
    blocks: list[Block] = []
    queries = corpus.queries
    for rnd in range(1, plan.rounds + 1):
        begin = (rnd - 1) * plan.queries_per_block % len(queries)
        chunk = (queries + queries)[begin : begin + plan.queries_per_block]
        shift = (rnd - 1) % len(names)
        for name in names[shift:] + names[:shift]:
            if time.monotonic() > deadline:
                raise BudgetExceeded(f"search round {rnd} {name}")
            block = run_block(name, rnd, paths[name], chunk, cpu[name])
            blocks.append(block)
            log(
                f"  round {rnd} {name:<8} p50={percentile(block.latencies_s, 50) * 1e3:6.2f}ms "
                f"p99={percentile(block.latencies_s, 99) * 1e3:6.2f}ms "
                f"cpu={block.cpu_s / len(chunk) * 1e3:5.2f}ms/search"
            )
    return blocks


# --------------------------------------------------------------------------------------------
# Indexing: the service's worker against the model alone
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexRun:
    """One measured pass over the indexing turns."""

    path: str
    round: int
    seconds: float
    chunks: int
    cpu_s: float


def _timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def model_alone(
    embedder: OnnxMiniLmEmbedder, turns: Sequence[Turn], batch_turns: int, rnd: int
) -> IndexRun:
    """embed_documents over the same chunks in the worker's batches (index_batch_size turns)."""
    chunks = 0
    cpu_before = time.process_time()
    started = time.perf_counter()
    for begin in range(0, len(turns), batch_turns):
        texts = [c for t in turns[begin : begin + batch_turns] for c in t.chunks]
        embedder.embed_documents(texts)
        chunks += len(texts)
    seconds = time.perf_counter() - started
    return IndexRun("model", rnd, seconds, chunks, time.process_time() - cpu_before)


def through_service(
    channel: grpc.Channel,
    server: ServerProcess,
    database: Path,
    turns: Sequence[Turn],
    rnd: int,
    timeout_s: float,
) -> IndexRun:
    """IndexTurn for every turn (no wait), as fast as the server accepts them, then wait for
    the turn table to show all of them indexed. New conversation ids per round, so every
    round indexes new turns."""
    stub = pb_grpc.ConversationSearchServiceStub(channel)
    prefix = f"r{rnd}-"
    metadata = identity(INDEX_PRINCIPAL)
    chunks = 0
    watch = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
    try:
        query = (
            "SELECT status, count(*) FROM conversation_turns WHERE tenant_id = ? AND "
            "principal_id = ? AND conversation_id LIKE ? GROUP BY status"
        )
        args = (SEARCH_TENANT, INDEX_PRINCIPAL, prefix + "%")
        cpu_before = server.cpu_seconds()
        started = time.perf_counter()
        for turn in turns:
            reply: pb.IndexTurnResponse = stub.IndexTurn(
                pb.IndexTurnRequest(
                    conversation_id=prefix + turn.conversation_id,
                    turn_id=turn.turn_id,
                    question=turn.question,
                    answer=turn.answer,
                    turn_time=_timestamp(turn.turn_time),
                ),
                metadata=metadata,
                timeout=CALL_TIMEOUT_S,
            )
            if reply.outcome != pb.INDEX_TURN_OUTCOME_ACCEPTED:
                raise RuntimeError(f"IndexTurn answered {reply.outcome}")
            chunks += reply.chunk_count
        accepted = time.perf_counter() - started
        while True:
            statuses = dict(watch.execute(query, args).fetchall())
            if statuses.get("failed"):
                raise RuntimeError(f"{statuses['failed']} turns failed to index")
            if statuses.get("indexed", 0) == len(turns):
                break
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"not all turns indexed after {timeout_s:.0f}s: {statuses}")
            time.sleep(POLL_S)
        seconds = time.perf_counter() - started
        cpu = server.cpu_seconds() - cpu_before
    finally:
        watch.close()
    log(f"  round {rnd} service: all {len(turns)} turns accepted after {accepted:.2f}s")
    expected = sum(len(t.chunks) for t in turns)
    if chunks != expected:
        raise RuntimeError(f"the service chunked {chunks} chunks, this script {expected}")
    return IndexRun("service", rnd, seconds, chunks, cpu)


def check_indexed(channel: grpc.Channel, turns: Sequence[Turn], rnd: int) -> None:
    """The last turn of the round is searchable (its status said so; prove it once)."""
    last = turns[-1]
    words = last.answer.split()[:12]
    hits = ServiceSearch(channel, INDEX_PRINCIPAL)(" ".join(words))
    if f"r{rnd}-{last.conversation_id}/{last.turn_id}" not in hits:
        raise RuntimeError("an indexed turn was not found by a search for its own words")


def measure_indexing(
    corpus: Corpus,
    embedder: OnnxMiniLmEmbedder,
    channel: grpc.Channel,
    server: ServerProcess,
    database: Path,
    plan: Plan,
    settings: Settings,
    deadline: float,
) -> list[IndexRun]:
    """Interleaved rounds of the model alone and the service on the same turns, the order
    alternating between rounds."""
    runs: list[IndexRun] = []
    turns = corpus.index_turns
    for rnd in range(1, plan.index_rounds + 1):
        order = ["model", "service"] if rnd % 2 else ["service", "model"]
        for path in order:
            estimate = 3 * runs[0].seconds if runs else 120.0
            if time.monotonic() + estimate > deadline:
                raise BudgetExceeded(f"indexing round {rnd} {path}")
            if path == "model":
                run = model_alone(embedder, turns, settings.indexing.batch_size, rnd)
            else:
                run = through_service(
                    channel, server, database, turns, rnd, max(600.0, estimate * 4)
                )
                check_indexed(channel, turns, rnd)
            runs.append(run)
            log(
                f"  round {rnd} {path:<8} {run.chunks} chunks in {run.seconds:6.2f}s = "
                f"{run.chunks / run.seconds:6.2f} chunks/s"
            )
    return runs


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def print_search(blocks: Sequence[Block], plan: Plan, corpus: Corpus) -> list[str]:
    """The search table and its verdicts; returns the failed targets."""
    measured = {b.path for b in blocks}
    if not {"direct", "service"} <= measured:
        return []  # cut short before both were measured: nothing to compare
    summaries = {
        p: summarize_search(blocks, p) for p in ("direct", "adapter", "service") if p in measured
    }
    direct = summaries["direct"]
    print()
    print(
        f"Search at {corpus.chunks:,} chunks: {SEARCH_PRINCIPAL} ({corpus.searched.chunk_count} "
        f"chunks), page size {PAGE_SIZE} (depth {depth_turns(PAGE_SIZE)} turns), one call in "
        f"flight,\n{plan.rounds} interleaved rounds x {plan.queries_per_block} queries per path "
        f"({len(corpus.queries)} distinct real queries)"
    )
    print(
        f"{'path':<8} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'cpu ms':>7} "
        f"{'x direct p50':>13} {'x direct p99':>13} {'samples':>8}"
    )
    for s in summaries.values():
        print(
            f"{s.path:<8} {s.p50_ms:>8.2f} {s.p99_ms:>8.2f} {s.rps:>8.1f} {s.cpu_ms:>7.2f} "
            f"{s.p50_ms / direct.p50_ms:>13.2f} {s.p99_ms / direct.p99_ms:>13.2f} "
            f"{s.samples:>8}"
        )
    if "no-op" in measured:
        noop = summarize_search(blocks, "no-op")
        print(
            f"(gRPC no-op round trip on the same channel, Health/Check: p50 {noop.p50_ms:.2f} ms,"
            f" p99 {noop.p99_ms:.2f} ms, server cpu {noop.cpu_ms:.2f} ms)"
        )
    per_round = []
    for rnd in range(1, plan.rounds + 1):
        mine = {b.path: b for b in blocks if b.round == rnd}
        if "direct" in mine and "service" in mine:
            per_round.append(
                percentile(mine["service"].latencies_s, 50)
                / percentile(mine["direct"].latencies_s, 50)
            )
    print("service/direct p50 per round: " + " ".join(f"{r:.2f}" for r in per_round))
    failed = []
    service = summaries["service"]
    print(f"Target: service latency at most {SEARCH_TARGET}x the direct query's:")
    for label, ratio in (
        ("p50", service.p50_ms / direct.p50_ms),
        ("p99", service.p99_ms / direct.p99_ms),
    ):
        verdict = "PASS" if ratio <= SEARCH_TARGET else "FAIL"
        if verdict == "FAIL":
            failed.append(f"search {label}")
        print(f"  {label}: {verdict} (x{ratio:.2f})")
    return failed


def print_indexing(runs: Sequence[IndexRun], corpus: Corpus, settings: Settings) -> list[str]:
    """The indexing table and its verdict; returns the failed targets."""
    turns = corpus.index_turns
    print()
    print(
        f"Indexing {describe(turns)},\n"
        f"worker batches of {settings.indexing.batch_size} turns, embedding threads "
        f"{settings.embedding.threads} (server and model alone)"
    )
    print(f"{'path':<8} {'round':>5} {'seconds':>8} {'chunks/s':>9} {'cpu s/chunk':>12}")
    for run in runs:
        print(
            f"{run.path:<8} {run.round:>5} {run.seconds:>8.2f} {run.chunks / run.seconds:>9.2f} "
            f"{run.cpu_s / run.chunks:>12.3f}"
        )
    ratios = []
    for rnd in sorted({r.round for r in runs}):
        mine = {r.path: r for r in runs if r.round == rnd}
        if "model" in mine and "service" in mine:
            ratios.append(mine["model"].seconds / mine["service"].seconds)
    if not ratios:
        return []
    ratio = statistics.median(ratios)
    verdict = "PASS" if ratio >= INDEX_TARGET else "FAIL"
    print(f"service chunks/s / model chunks/s per round: {' '.join(f'{r:.2f}' for r in ratios)}")
    print(f"Target: service at least {INDEX_TARGET}x the model alone: {verdict} (x{ratio:.2f})")
    return [] if verdict == "PASS" else ["indexing"]


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20,000 chunks, fewer rounds (~2 min)")
    p.add_argument("--optimize", action="store_true", help="optimize the store offline first")
    p.add_argument("--chunks", type=int, help="chunks in the store (default 100,000)")
    p.add_argument("--rounds", type=int, help="interleaved search rounds (default 6)")
    p.add_argument("--queries", type=int, help="searches per path per round (default 300)")
    p.add_argument("--index-turns", type=int, help="turns per indexing pass (default 160)")
    p.add_argument("--index-rounds", type=int, help="indexing rounds (default 2)")
    p.add_argument("--time-budget", type=float, help="seconds (default 900; quick 240)")
    p.add_argument("--no-cache", action="store_true", help=f"do not use {CACHE_DIR}")
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    base = QUICK if args.quick else FULL
    plan = Plan(
        chunks=args.chunks or base.chunks,
        principals=base.principals,
        tenants=base.tenants,
        searched_chunks=base.searched_chunks,
        rounds=args.rounds or base.rounds,
        queries_per_block=args.queries or base.queries_per_block,
        warmup_queries=base.warmup_queries,
        index_turns=args.index_turns or base.index_turns,
        index_rounds=args.index_rounds or base.index_rounds,
        time_budget_s=args.time_budget or base.time_budget_s,
    )
    if plan.chunks < plan.searched_chunks + 20 * (plan.principals - 1):
        raise SystemExit(f"--chunks must be at least {plan.searched_chunks + 20 * plan.principals}")
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    raise_on_sigterm()
    started = time.monotonic()
    deadline = started + plan.time_budget_s
    # What the server derives from this environment: its thread settings are mirrored here.
    overrides: dict[str, Any] = {"listen": f"{HOST}:0"}
    settings = Settings(**overrides)
    facts: list[str] = []
    failed: list[str] = []
    outcome = ""
    blocks: list[Block] = []
    runs: list[IndexRun] = []
    corpus: Corpus | None = None
    with ExitStack() as stack:
        try:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-search-")))
            server_dir, direct_dir = tmp / "server", tmp / "direct"
            embedder = OnnxMiniLmEmbedder(intra_op_threads=settings.embedding.threads)
            corpus = populate(
                server_dir,
                plan,
                embedder,
                None if args.no_cache else CACHE_DIR,
                args.optimize,
                deadline,
            )
            facts += corpus.facts
            copy_started = time.monotonic()
            shutil.copytree(server_dir / "chunks", direct_dir / "chunks")
            facts.append(f"store copied for this process in {time.monotonic() - copy_started:.0f}s")

            server = ServerProcess(
                ["--data-dir", str(server_dir)],
                tmp,
                service=SERVICE,
                stop_timeout_s=SERVER_STOP_TIMEOUT_S,
            )
            stack.callback(server.stop)
            index = QdrantEdgeChunkIndex(direct_dir / "chunks", DIMENSION, embedder.model_id)
            stack.callback(index.close)
            startup = server.wait_serving(SERVER_START_TIMEOUT_S)
            facts.append(f"server pid {server.proc.pid} SERVING {startup:.1f}s after start")
            channel = stack.enter_context(grpc.insecure_channel(f"{HOST}:{server.port}"))
            keywords = KeywordEncoder()
            paths: dict[str, SearchFn] = {
                "direct": DirectSearch(index, embedder, keywords),
                "adapter": AdapterSearch(index, embedder, keywords),
                "service": ServiceSearch(channel),
                "no-op": NoOp(channel),
            }
            own_cpu, server_cpu = time.process_time, server.cpu_seconds
            cpu = {
                "direct": own_cpu,
                "adapter": own_cpu,
                "service": server_cpu,
                "no-op": server_cpu,
            }
            facts += check_search(corpus, paths)
            log("measuring search")
            blocks = measure_search(corpus, paths, cpu, plan, deadline)
            log("measuring indexing")
            runs = measure_indexing(
                corpus,
                embedder,
                channel,
                server,
                server_dir / "memoria.sqlite3",
                plan,
                settings,
                deadline,
            )
        except ENDED as error:
            outcome = failure_outcome(error)

    print()
    print(machine_line())
    print(
        software_line(
            f"qdrant-edge-py {metadata.version('qdrant-edge-py')}",
            f"onnxruntime {metadata.version('onnxruntime')}",
        )
    )
    print(
        "server: memoria serve --data-dir (SQLite + embedded Qdrant), "
        f"{settings.serve.threads} gRPC threads, "
        f"{settings.indexing.worker_threads} index worker thread(s), embedding threads "
        f"{settings.embedding.threads}; this process uses the same embedding threads"
    )
    for fact in facts:
        print(fact)
    if corpus is not None and blocks:
        failed += print_search(blocks, plan, corpus)
    if corpus is not None and runs:
        failed += print_indexing(runs, corpus, settings)
    print()
    elapsed = time.monotonic() - started
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({outcome})" if outcome else ""))
    if failed:
        print("targets missed: " + ", ".join(failed))
    sys.stdout.flush()
    return 0 if blocks and runs and not outcome else 1


if __name__ == "__main__":
    sys.exit(main())
