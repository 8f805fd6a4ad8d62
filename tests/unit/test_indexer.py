"""The indexer's retry policy: a failing index costs attempts with growing delays, a turn
that keeps failing is recorded as failed (an unreachable index never makes it give up), and a
recovered index takes the turn once.

Runs the domain's `Indexer` over the real SQLite turn queue and the real embedded chunk index;
only the embedder is a small deterministic stand-in (the model itself is tested in
test_embedding.py), and the index is wrapped to fail on demand.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select

from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.tables import conversation_turns
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.indexing import MAX_INDEX_ATTEMPTS, OUTAGE_RETRY_DELAY, Indexer
from server.domain.keywords import KEYWORD_VERSION, TWO_NEIGHBOURS, KeywordEncoder
from server.domain.model import (
    EncodedQuery,
    IndexedChunk,
    NewTurn,
    SearchScope,
    SparseVector,
    StoredChunk,
    TurnKey,
)
from server.domain.reindex import KeywordReindexer
from tests.turn_operations import TurnOperations

DIM = 8
T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
KEY = TurnKey("t", "ana", "c1", "turn-1")


class HashEmbedder:
    """Deterministic unit vectors from a hash of the text: one window per text."""

    model_id = "hash-embedder-8"
    dimension = DIM

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        return [(self.embed_query(t),) for t in texts]

    def embed_query(self, text: str) -> tuple[float, ...]:
        raw = [b - 127.5 for b in hashlib.sha256(text.encode()).digest()[:DIM]]
        norm = sum(x * x for x in raw) ** 0.5
        return tuple(x / norm for x in raw)


class FlakyIndex(QdrantEdgeChunkIndex):
    """The real embedded index, failing its writes while `down` is set."""

    down = False
    unavailable = False

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        if self.down:
            raise ConnectionError("index unavailable")
        if self.unavailable:  # what a Qdrant server that cannot be reached raises
            raise MemoriaError(ErrorReason.STORE_UNAVAILABLE, "the index is unavailable")
        super().upsert_turn(key, turn_time, chunks)

    context_down = False

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, SparseVector]], version: int
    ) -> None:
        if self.context_down:
            raise ConnectionError("index unavailable")
        super().set_keyword_vectors(updates, version)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def parts(
    tmp_path: Path,
) -> Iterator[tuple[Indexer, TurnOperations, FlakyIndex, Clock, SqlMemoryStore]]:
    engine = create_store_engine(sqlite_url(tmp_path))
    migrate.upgrade(engine)
    store = SqlMemoryStore(SqlDatabase(engine))
    turns = TurnOperations(store.db)
    index = FlakyIndex(tmp_path / "chunks", DIM, HashEmbedder.model_id)
    clock = Clock()
    indexer = Indexer(turns, index, HashEmbedder(), KeywordEncoder(), clock)
    try:
        yield indexer, turns, index, clock, store
    finally:
        index.close()
        store.db.dispose()


def row(store: SqlMemoryStore) -> tuple[str, int, str | None, datetime]:
    t = conversation_turns
    with store.transaction("t") as tx:
        status, attempts, error, due = tx.connection.execute(
            select(t.c.status, t.c.attempts, t.c.last_error, t.c.due_time)
        ).one()
    return status, attempts, error, due.replace(tzinfo=UTC)


def test_a_failing_index_is_retried_with_growing_delays_then_recovers(parts) -> None:  # type: ignore[no-untyped-def]
    indexer, turns, index, clock, store = parts
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, T0))
    index.down = True
    delays = []
    for attempt in (1, 2, 3):
        assert indexer.run_once(10) == 1
        status, attempts, error, due = row(store)
        assert (status, attempts, error) == ("pending", attempt, "ConnectionError")
        delays.append(due - clock.now)
        assert indexer.run_once(10) == 0  # not due yet
        clock.now = due
    assert delays[0] >= timedelta(seconds=2) and delays[1] > delays[0] and delays[2] > delays[1]
    index.down = False
    assert indexer.run_once(10) == 1
    assert row(store)[:3] == ("indexed", 0, None)
    assert index.count("t", "ana", "c1") == 1


def test_a_turn_that_keeps_failing_is_recorded_as_failed(parts) -> None:  # type: ignore[no-untyped-def]
    indexer, turns, index, clock, store = parts
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, T0))
    index.down = True
    for _ in range(MAX_INDEX_ATTEMPTS):
        assert indexer.run_once(10) == 1
        clock.now = row(store)[3]
    status, attempts, error, _ = row(store)
    assert (status, attempts, error) == ("failed", MAX_INDEX_ATTEMPTS, "ConnectionError")
    clock.now += timedelta(days=30)
    assert indexer.run_once(10) == 0  # no longer retried by the worker ...
    # ... but a caller re-sending the turn queues it afresh.
    index.down = False
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, clock.now))
    assert indexer.index_now(KEY)
    assert row(store)[:2] == ("indexed", 0)


def test_an_unreachable_index_never_uses_up_a_turn(parts) -> None:  # type: ignore[no-untyped-def]
    """STORE_UNAVAILABLE is an outage, not the turn's fault: retried at most OUTAGE_RETRY_DELAY
    apart however long it lasts, and indexed once the index is back."""
    indexer, turns, index, clock, store = parts
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, T0))
    index.unavailable = True
    for _ in range(3 * MAX_INDEX_ATTEMPTS):
        assert indexer.run_once(10) == 1
        status, _, error, due = row(store)
        assert (status, error) == ("pending", "MemoriaError")
        assert due - clock.now <= OUTAGE_RETRY_DELAY * 1.25  # the cap and its jitter
        clock.now = due
    index.unavailable = False
    assert indexer.run_once(10) == 1
    assert row(store)[:3] == ("indexed", 0, None)
    assert index.count("t", "ana", "c1") == 1


def test_waiting_for_a_turn_the_index_refuses_reports_unavailable(parts) -> None:  # type: ignore[no-untyped-def]
    indexer, turns, index, _clock, store = parts
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, T0))
    index.down = True
    with pytest.raises(MemoriaError) as caught:
        indexer.index_now(KEY)
    assert caught.value.reason is ErrorReason.STORE_UNAVAILABLE
    assert row(store)[:3] == ("pending", 1, "ConnectionError")  # still queued for the worker
    index.down = False
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, T0))  # the caller sends it again
    assert indexer.index_now(KEY)
    assert row(store)[0] == "indexed"
    assert indexer.index_now(KEY)  # already indexed: nothing to do, still searchable


def test_a_turn_is_indexed_with_its_date_on_the_keyword_side(parts) -> None:  # type: ignore[no-untyped-def]
    """The keyword vector encodes the turn's date and the text (current representation);
    the stored and shown text is the turn's own."""
    indexer, turns, index, _clock, _store = parts
    may = datetime(2023, 5, 8, 22, 30, tzinfo=timezone(timedelta(hours=-3)))  # 9 May UTC
    turns.accept_turn(NewTurn(KEY, "a turn about herons", may, T0))
    assert indexer.run_once(10) == 1
    assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 0
    encoder = KeywordEncoder()
    dated = EncodedQuery(dense=(1.0,) * DIM, sparse=encoder.encode_query("9 May 2023"))
    (hit,) = index.search(SearchScope("t", "ana", frozenset()), dated, 5).keyword
    assert hit.text == "a turn about herons"


def keyword_hits(index: FlakyIndex, words: str) -> list[str]:
    encoded = EncodedQuery(dense=(1.0,) * DIM, sparse=KeywordEncoder().encode_query(words))
    found = index.search(SearchScope("t", "ana", frozenset()), encoded, 10).keyword
    return [h.turn_id for h in found]


def test_a_turn_and_its_neighbours_are_encoded_with_their_context(parts) -> None:  # type: ignore[no-untyped-def]
    """Keyword representation 3: each chunk also holds its neighbours' words (at a lower
    weight), and indexing a turn updates the turns beside it, whatever order they arrive in."""
    indexer, turns, index, _clock, _store = parts
    for turn_id, text in (("a", "we saw a heron"), ("b", "it stood so still")):
        turns.accept_turn(NewTurn(TurnKey("t", "ana", "c1", turn_id), text, T0, T0))
    assert indexer.run_once(10) == 2
    assert keyword_hits(index, "heron") == ["a", "b"]
    assert keyword_hits(index, "otter") == []
    # Turns of equal time are in the order they arrived; a later turn updates the one before.
    turns.accept_turn(NewTurn(TurnKey("t", "ana", "c1", "c"), "an otter swam by", T0, T0))
    assert indexer.run_once(10) == 1
    assert keyword_hits(index, "otter") == ["c", "b"]
    assert keyword_hits(index, "heron") == ["a", "b"]
    # A turn that arrives late but happened earlier is placed by its time, before "a".
    early = T0 - timedelta(hours=1)
    turns.accept_turn(NewTurn(TurnKey("t", "ana", "c1", "z"), "a kingfisher dived", early, T0))
    assert indexer.run_once(10) == 1
    assert keyword_hits(index, "kingfisher") == ["z", "a"]
    assert keyword_hits(index, "heron")[0] == "a"
    assert set(keyword_hits(index, "heron")) == {"a", "b", "z"}  # z's next turn is a now
    # Another conversation's turn is nobody's neighbour here.
    turns.accept_turn(NewTurn(TurnKey("t", "ana", "c2", "y"), "a heron elsewhere", T0, T0))
    assert indexer.run_once(10) == 1
    assert set(keyword_hits(index, "elsewhere")) == {"y"}
    assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 0


def test_a_turn_whose_context_cannot_be_written_stays_queued(parts) -> None:  # type: ignore[no-untyped-def]
    indexer, turns, index, clock, store = parts
    turns.accept_turn(NewTurn(KEY, "a turn about herons", T0, T0))
    index.context_down = True
    assert indexer.run_once(10) == 1
    assert row(store)[:3] == ("pending", 1, "ConnectionError")
    assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 1  # own words only, so far
    assert keyword_hits(index, "herons") == ["turn-1"]  # and searchable meanwhile
    index.context_down = False
    clock.now = row(store)[3]
    assert indexer.run_once(10) == 1
    assert row(store)[:3] == ("indexed", 0, None)
    assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 0


class E5NamedEmbedder(HashEmbedder):
    """The hash vectors under e5-small-v2's model name: its keyword representation is 4."""

    model_id = "e5-small-v2-int8:sha256-test"


def test_a_model_with_two_neighbours_a_side_indexes_and_reindexes_in_representation_4(
    tmp_path: Path,
) -> None:
    """Representation 4 (keywords.TWO_NEIGHBOURS): a chunk holds the words of two chunks each
    side, a new turn updates the two before it, and the reindexer moves chunks of
    representation 3 to 4."""
    engine = create_store_engine(sqlite_url(tmp_path))
    migrate.upgrade(engine)
    store = SqlMemoryStore(SqlDatabase(engine))
    turns = TurnOperations(store.db)
    index = FlakyIndex(tmp_path / "chunks", DIM, E5NamedEmbedder.model_id)
    indexer = Indexer(turns, index, E5NamedEmbedder(), KeywordEncoder(), Clock())
    try:
        words = ["heron", "otter", "kingfisher", "badger", "swift"]
        for n, word in enumerate(words):
            key = TurnKey("t", "ana", "c1", f"u{n}")
            turns.accept_turn(NewTurn(key, f"we saw a {word}", T0 + timedelta(minutes=n), T0))
            assert indexer.run_once(10) == 1

        def found(word: str) -> tuple[str, set[str]]:
            first, *rest = keyword_hits(index, word)
            return first, {first, *rest}

        assert found("kingfisher") == ("u2", {"u0", "u1", "u2", "u3", "u4"})
        assert found("heron") == ("u0", {"u0", "u1", "u2"})  # u3 is three away
        assert found("swift") == ("u4", {"u2", "u3", "u4"})  # the last turn reached u2
        # The model's semantic context (context.DENSE_CONTEXT_WEIGHTS): u2's context vector is
        # its own and its neighbours' at 0.2, searched beside its window.
        own = index.chunk_windows("t", "ana", "c1", [(f"u{n}", 0) for n in range(5)])
        assert all(len(windows) == 1 for windows in own.values())
        mixed = [
            a + 0.2 * (b + c)
            for a, b, c in zip(own["u2", 0][0], own["u1", 0][0], own["u3", 0][0], strict=True)
        ]
        norm = sum(x * x for x in mixed) ** 0.5
        context = EncodedQuery(dense=tuple(x / norm for x in mixed), sparse=SparseVector((), ()))
        best = index.search(SearchScope("t", "ana", frozenset()), context, 5).semantic[0]
        assert (best.turn_id, round(best.score, 4)) == ("u2", 1.0)
        assert index.count_stale_keyword_chunks(TWO_NEIGHBOURS.version) == 0
        assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 5
        # Written in representation 3 (one neighbour), then moved on by the reindexer.
        KeywordReindexer(index, KeywordEncoder()).run(10)
        assert found("heron") == ("u0", {"u0", "u1"})
        assert index.count_stale_keyword_chunks(TWO_NEIGHBOURS.version) == 5
        reindexer = KeywordReindexer(index, KeywordEncoder(), representation=TWO_NEIGHBOURS)
        assert reindexer.run(2) == 5
        assert found("heron") == ("u0", {"u0", "u1", "u2"})
        assert index.count_stale_keyword_chunks(TWO_NEIGHBOURS.version) == 0
    finally:
        index.close()
        store.db.dispose()
