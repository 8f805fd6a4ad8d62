"""One contract over every ChunkIndex: the embedded Qdrant engine, a Qdrant server and the
unit tests' in-memory fake (tests/fakes.py), which is held to what the engines do here.

The server adapter runs on a real Qdrant server (the session's, tests/qdrant_server.py: each
test on a collection of its own) and on qdrant-client's local mode, which takes the same calls.
Where the two differ (local mode ignores payload indexes and `is_tenant`; equal scores may come
back in any order from the server), the tests assert only what both must do, and the server's
own facts are checked on the server.
Vectors are hand-made in 8 dimensions and keyword vectors are term counts under a stable hash,
so each ranking asserted here follows from the data by hand.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from qdrant_client import QdrantClient
from qdrant_client import models as qm

from server.adapters.qdrant import edge as qdrant_edge
from server.adapters.qdrant import server as qdrant_server
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.qdrant.layout import (
    ChunkIndexError,
    ChunkIndexLockedError,
    EmbeddingMismatchError,
    point_id,
    turn_key,
    turn_of_point,
)
from server.adapters.qdrant.server import (
    QdrantServerChunkIndex,
    check_server_version,
    version_verdict,
)
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.keywords import KEYWORD_VERSION, KeywordEncoder
from server.domain.model import (
    EncodedQuery,
    IndexedChunk,
    Owner,
    SearchBounds,
    SearchScope,
    SparseVector,
    TurnKey,
)
from server.domain.ports import ChunkIndex
from server.domain.reindex import KeywordReindexer
from tests.fakes import InMemoryChunkIndex, InMemoryChunkStorage
from tests.qdrant_server import QdrantEndpoint

ROOT = Path(__file__).resolve().parents[2]
DIM = 8
MODEL = "test-model-v1"
T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


# --- Hand-made vectors ---------------------------------------------------------------------


def unit(*components: float) -> tuple[float, ...]:
    """A unit vector from the leading components (the rest zero)."""
    padded = list(components) + [0.0] * (DIM - len(components))
    norm = math.sqrt(sum(c * c for c in padded))
    return tuple(c / norm for c in padded)


E0, E1, E2, E3 = unit(1), unit(0, 1), unit(0, 0, 1), unit(0, 0, 0, 1)


def term(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=4).digest(), "big")


def doc_sparse(text: str) -> SparseVector:
    """Raw term counts: a token said three times outweighs one said once."""
    counts = sorted(Counter(term(t) for t in text.lower().split()).items())
    return SparseVector(tuple(i for i, _ in counts), tuple(float(n) for _, n in counts))


def query(text: str, dense: tuple[float, ...] = E0) -> EncodedQuery:
    indices = tuple(sorted({term(t) for t in text.lower().split()}))
    return EncodedQuery(dense=dense, sparse=SparseVector(indices, tuple(1.0 for _ in indices)))


def chunk(i: int, text: str, *dense: tuple[float, ...]) -> IndexedChunk:
    return IndexedChunk(chunk_index=i, text=text, dense=dense or (E3,), sparse=doc_sparse(text))


def key(tenant: str = "t1", principal: str = "ana", conv: str = "c1", turn: str = "u1") -> TurnKey:
    return TurnKey(tenant, principal, conv, turn)


def scope(
    tenant: str = "t1", principal: str = "ana", deleted: frozenset[str] = frozenset()
) -> SearchScope:
    return SearchScope(tenant, principal, deleted)


# --- Fixtures ------------------------------------------------------------------------------


@dataclass
class Opener:
    """Opens indexes of one adapter kind on one store, and closes them all at the end.

    Kinds: `edge` (the embedded engine), `local` (the server adapter on qdrant-client's local
    mode, one shared client), `server` (the server adapter on the session's real Qdrant
    server, a client per index on this test's own collection) and `fake` (the in-memory
    fake, every index on one storage)."""

    kind: str
    tmp_path: Path
    client: QdrantClient | None = None
    endpoint: QdrantEndpoint | None = None
    collection: str = "chunks"
    opened: list[ChunkIndex] = field(default_factory=list)
    storage: InMemoryChunkStorage = field(default_factory=InMemoryChunkStorage)

    def open(self, model_id: str = MODEL, dimension: int = DIM) -> ChunkIndex:
        index: ChunkIndex
        if self.kind == "edge":
            index = QdrantEdgeChunkIndex(self.tmp_path / "chunks", dimension, model_id)
        elif self.kind == "fake":
            index = InMemoryChunkIndex(self.storage, dimension, model_id)
        elif self.kind == "server":
            assert self.endpoint is not None
            client = self.endpoint.client()
            try:
                index = QdrantServerChunkIndex(client, self.collection, dimension, model_id)
            except Exception:
                client.close()
                raise
        else:
            assert self.client is not None
            with warnings.catch_warnings():
                # Local mode warns (once per process) that payload indexes do nothing there.
                warnings.filterwarnings("ignore", "Payload indexes have no effect", UserWarning)
                index = QdrantServerChunkIndex(self.client, self.collection, dimension, model_id)
        self.opened.append(index)
        return index

    def reopen(self, index: ChunkIndex, model_id: str = MODEL, dimension: int = DIM) -> ChunkIndex:
        """Open the same store again: the embedded store must be closed first (one owner);
        the local-mode index is left open, as its close would close the shared client."""
        if self.kind in ("edge", "server"):
            index.close()
        return self.open(model_id, dimension)


@pytest.fixture(params=["edge", "local", pytest.param("server", marks=pytest.mark.qdrant), "fake"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opener = Opener(request.param, tmp_path)
    if request.param == "local":
        opener.client = QdrantClient(location=":memory:")
    elif request.param == "server":
        opener.endpoint = request.getfixturevalue("qdrant")
        opener.collection = request.getfixturevalue("qdrant_collection")
    yield opener
    for index in opener.opened:
        index.close()  # idempotent on all; the local-mode index closes the shared client


@pytest.fixture
def index(opener: Opener) -> ChunkIndex:
    return opener.open()


# --- Round trip ----------------------------------------------------------------------------


def test_round_trip_keeps_payload_and_utc_time(index: ChunkIndex) -> None:
    index.upsert_turn(
        key(), T0, [chunk(0, "the invoice was paid", E0), chunk(1, "nothing else", E1)]
    )
    result = index.search(scope(), query("invoice", E0), 10)
    for hits in (result.keyword, result.semantic):
        hit = hits[0]
        assert (hit.conversation_id, hit.turn_id, hit.chunk_index) == ("c1", "u1", 0)
        assert hit.text == "the invoice was paid"
        assert hit.turn_time == T0 and hit.turn_time.utcoffset() == timedelta(0)
        assert hit.score > 0
    assert index.count("t1", "ana") == 2


def test_turn_time_in_another_zone_comes_back_as_the_same_instant(index: ChunkIndex) -> None:
    local = datetime(2026, 3, 1, 14, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    index.upsert_turn(key(), local, [chunk(0, "hello", E0)])
    (hit,) = index.search(scope(), query("hello"), 1).keyword
    assert hit.turn_time == local and hit.turn_time.tzinfo == UTC


def test_naive_turn_time_is_refused(index: ChunkIndex) -> None:
    with pytest.raises(ValueError, match="timezone"):
        index.upsert_turn(key(), datetime(2026, 3, 1), [chunk(0, "hello")])
    assert index.count("t1", "ana") == 0


def test_malformed_chunks_are_refused_before_writing(index: ChunkIndex) -> None:
    with pytest.raises(ValueError, match="chunk indexes"):
        index.upsert_turn(key(), T0, [chunk(0, "a"), chunk(2, "b")])
    with pytest.raises(ValueError, match="dimension"):
        index.upsert_turn(key(), T0, [IndexedChunk(0, "a", ((1.0, 0.0),), doc_sparse("a"))])
    with pytest.raises(ValueError, match="no dense"):
        index.upsert_turn(key(), T0, [IndexedChunk(0, "a", (), doc_sparse("a"))])
    assert index.count("t1", "ana") == 0


# --- Ranking -------------------------------------------------------------------------------


def test_best_chunk_per_turn_on_each_side(index: ChunkIndex) -> None:
    index.upsert_turn(
        key(turn="long"),
        T0,
        [
            chunk(0, "alpha beta", E0),  # the semantic best of the turn
            chunk(1, "alpha alpha alpha", unit(1, 1)),  # the keyword best of the turn
            chunk(2, "alpha gamma", unit(1, 0, 1)),
        ],
    )
    index.upsert_turn(key(turn="short"), T0, [chunk(0, "alpha delta", unit(1, 2))])
    result = index.search(scope(), query("alpha", E0), 10)
    assert [(h.turn_id, h.chunk_index) for h in result.keyword] == [("long", 1), ("short", 0)]
    assert [(h.turn_id, h.chunk_index) for h in result.semantic] == [("long", 0), ("short", 0)]
    assert result.keyword[0].score > result.keyword[1].score
    assert result.semantic[0].score == pytest.approx(1.0, abs=1e-5)


def test_turns_cuts_each_side_best_first(index: ChunkIndex) -> None:
    for n in range(1, 6):  # turn n says "zeta" n times and leans n steps towards E0
        index.upsert_turn(key(turn=f"u{n}"), T0, [chunk(0, "zeta " * n, unit(n, 6 - n))])
    result = index.search(scope(), query("zeta", E0), 3)
    assert [h.turn_id for h in result.keyword] == ["u5", "u4", "u3"]
    assert [h.turn_id for h in result.semantic] == ["u5", "u4", "u3"]


def test_a_turn_with_many_matching_chunks_does_not_hide_the_others(index: ChunkIndex) -> None:
    # 30 chunks of one turn outrank everything; the engine must still find the other turn.
    index.upsert_turn(key(turn="big"), T0, [chunk(i, "omega " * 5, E0) for i in range(30)])
    index.upsert_turn(key(turn="small"), T0, [chunk(0, "omega", unit(1, 3))])
    result = index.search(scope(), query("omega", E0), 2)
    assert [h.turn_id for h in result.keyword] == ["big", "small"]
    assert [h.turn_id for h in result.semantic] == ["big", "small"]


def test_exact_rare_token_ranks_first_on_the_keyword_side(index: ChunkIndex) -> None:
    for n in range(20):
        index.upsert_turn(
            key(turn=f"common{n}"),
            T0,
            [chunk(0, f"the invoice for account acct-{5000 + n} invoice invoice", E0)],
        )
    index.upsert_turn(key(turn="rare"), T0, [chunk(0, "account acct-4821 was closed", E1)])
    result = index.search(scope(), query("invoice acct-4821", E0), 5)
    assert result.keyword[0].turn_id == "rare"


def test_exact_id_ranks_first_with_the_real_keyword_encoder(index: ChunkIndex) -> None:
    encoder = KeywordEncoder()
    texts = [f"Your account acct-{4822 + n} has a new invoice for the account." for n in range(15)]
    texts.append("We moved the refund to acct-4821 yesterday.")
    for n, text in enumerate(texts):
        index.upsert_turn(
            key(turn=f"u{n}"), T0, [IndexedChunk(0, text, (E0,), encoder.encode_document(text))]
        )
    encoded = EncodedQuery(dense=E1, sparse=encoder.encode_query("which account is acct-4821?"))
    result = index.search(scope(), encoded, 5)
    assert result.keyword[0].turn_id == f"u{len(texts) - 1}"


def test_query_without_keyword_terms_has_an_empty_keyword_side(index: ChunkIndex) -> None:
    index.upsert_turn(key(), T0, [chunk(0, "hello", E0)])
    result = index.search(scope(), EncodedQuery(dense=E0, sparse=SparseVector((), ())), 5)
    assert result.keyword == () and [h.turn_id for h in result.semantic] == ["u1"]


def test_zero_turns_finds_nothing(index: ChunkIndex) -> None:
    index.upsert_turn(key(), T0, [chunk(0, "hello", E0)])
    result = index.search(scope(), query("hello"), 0)
    assert result.keyword == () and result.semantic == ()


# --- Re-indexing ---------------------------------------------------------------------------


def test_writing_a_turn_again_is_idempotent(index: ChunkIndex) -> None:
    chunks = [chunk(i, f"part {i} kappa", E0) for i in range(3)]
    index.upsert_turn(key(), T0, chunks)
    index.upsert_turn(key(), T0, chunks)
    assert index.count("t1", "ana") == 3
    assert len(index.search(scope(), query("kappa"), 10).keyword) == 1


def test_a_shorter_turn_leaves_no_stale_chunks(index: ChunkIndex) -> None:
    index.upsert_turn(key(), T0, [chunk(i, f"lambda marker{i}", E0) for i in range(5)])
    index.upsert_turn(key(), T0, [chunk(i, f"lambda new{i}", E0) for i in range(2)])
    assert index.count("t1", "ana") == 2
    for token in ("marker2", "marker3", "marker4"):
        result = index.search(scope(), query(token), 10)
        assert result.keyword == ()
        assert all(h.chunk_index < 2 for h in result.semantic)
    assert {h.text for h in index.search(scope(), query("lambda"), 10).keyword} <= {
        "lambda new0",
        "lambda new1",
    }


def test_a_turn_sent_with_no_chunks_is_removed(index: ChunkIndex) -> None:
    index.upsert_turn(key(), T0, [chunk(0, "mu", E0), chunk(1, "mu", E0)])
    index.upsert_turn(key(), T0, [])
    assert index.count("t1", "ana") == 0


# --- Isolation and deletion ----------------------------------------------------------------

OWNERS = [("t1", "ana"), ("t1", "bob"), ("t2", "ana"), ("t2", "bob")]


def test_a_search_only_sees_its_own_principal(index: ChunkIndex) -> None:
    # Identical conversation and turn ids, texts and vectors; only the turn time differs.
    for n, (tenant, principal) in enumerate(OWNERS):
        index.upsert_turn(
            key(tenant, principal), T0 + timedelta(days=n), [chunk(0, "shared secret", E0)]
        )
    for n, (tenant, principal) in enumerate(OWNERS):
        result = index.search(scope(tenant, principal), query("shared secret", E0), 10)
        for hits in (result.keyword, result.semantic):
            assert [h.turn_time for h in hits] == [T0 + timedelta(days=n)]
        assert index.count(tenant, principal) == 1
    assert index.search(scope("t3", "ana"), query("shared secret"), 10).keyword == ()


def test_deleted_conversations_are_excluded(index: ChunkIndex) -> None:
    for conv in ("c1", "c2", "c3"):
        index.upsert_turn(key(conv=conv), T0, [chunk(0, "nu", E0)])
    result = index.search(scope(deleted=frozenset({"c1", "c3"})), query("nu"), 10)
    assert [h.conversation_id for h in result.keyword] == ["c2"]
    assert [h.conversation_id for h in result.semantic] == ["c2"]
    assert index.count("t1", "ana") == 3  # excluded from search, not deleted


# --- Bounds: one conversation, a span of turn times (applied in the engine) ------------------


def hour(n: int) -> datetime:
    return T0 + timedelta(hours=n)


def fill_ranked(index: ChunkIndex, conv: str = "c1", first: int = 1, last: int = 6) -> None:
    """Turn `u{n}` at hour n says "zeta" n times and leans n steps towards E0: a later turn
    ranks higher on both sides, so the best turns are the ones a bound leaves out."""
    for n in range(first, last + 1):
        index.upsert_turn(
            key(conv=conv, turn=f"u{n}"), hour(n), [chunk(0, "zeta " * n, unit(n, 7 - n))]
        )


def bounded(
    conversation: str | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    deleted: frozenset[str] = frozenset(),
) -> SearchScope:
    return SearchScope("t1", "ana", deleted, SearchBounds(conversation, start, end))


def test_time_bounds_apply_before_each_side_is_cut(index: ChunkIndex) -> None:
    fill_ranked(index)
    # u5 and u6 rank first on both sides but lie outside: filtered after the cut at 2 turns,
    # nothing would be left; filtered in the engine, the best two inside come back.
    result = index.search(bounded(start=hour(2), end=hour(5)), query("zeta", E0), 2)
    assert [h.turn_id for h in result.keyword] == ["u4", "u3"]
    assert [h.turn_id for h in result.semantic] == ["u4", "u3"]


def test_start_is_inclusive_and_end_exclusive_to_the_microsecond(index: ChunkIndex) -> None:
    fill_ranked(index)
    micro = timedelta(microseconds=1)
    cases = [
        (bounded(start=hour(2), end=hour(4)), ["u3", "u2"]),
        (bounded(start=hour(2) + micro, end=hour(4) + micro), ["u4", "u3"]),
        (bounded(start=hour(5)), ["u6", "u5"]),
        (bounded(end=hour(2)), ["u1"]),
        (bounded(start=hour(7)), []),
    ]
    for where, expected in cases:
        result = index.search(where, query("zeta", E0), 10)
        assert [h.turn_id for h in result.keyword] == expected, where
        assert [h.turn_id for h in result.semantic] == expected, where


def test_bounds_in_another_zone_are_the_same_instants(index: ChunkIndex) -> None:
    fill_ranked(index)
    plus2 = timezone(timedelta(hours=2))
    where = bounded(start=hour(2).astimezone(plus2), end=hour(4).astimezone(plus2))
    assert [h.turn_id for h in index.search(where, query("zeta", E0), 10).keyword] == ["u3", "u2"]


def test_a_conversation_bound_sees_that_conversation_only(index: ChunkIndex) -> None:
    fill_ranked(index, conv="c1", first=1, last=3)
    fill_ranked(index, conv="c2", first=4, last=6)  # ranks above every turn of c1
    index.upsert_turn(key(principal="bob", conv="c1", turn="b"), T0, [chunk(0, "zeta " * 9, E0)])
    result = index.search(bounded(conversation="c1"), query("zeta", E0), 2)
    for hits in (result.keyword, result.semantic):
        assert [(h.conversation_id, h.turn_id) for h in hits] == [("c1", "u3"), ("c1", "u2")]
    assert index.search(bounded(conversation="nope"), query("zeta", E0), 10).semantic == ()


def test_conversation_time_and_deletion_combine(index: ChunkIndex) -> None:
    fill_ranked(index, conv="c1")
    fill_ranked(index, conv="c2")
    result = index.search(bounded("c2", hour(2), hour(4)), query("zeta", E0), 10)
    for hits in (result.keyword, result.semantic):
        assert [(h.conversation_id, h.turn_id) for h in hits] == [("c2", "u3"), ("c2", "u2")]
    gone = index.search(
        bounded("c2", hour(2), hour(4), deleted=frozenset({"c2"})), query("zeta", E0), 10
    )
    assert gone.keyword == () and gone.semantic == ()


def fill(index: ChunkIndex, k: TurnKey, turns: int, chunks_per_turn: int) -> None:
    for n in range(turns):
        turn = TurnKey(k.tenant_id, k.principal_id, k.conversation_id, f"{k.turn_id}-{n}")
        index.upsert_turn(turn, T0, [chunk(i, "xi", E0) for i in range(chunks_per_turn)])


def test_delete_conversation_removes_every_chunk_and_nothing_else(index: ChunkIndex) -> None:
    fill(index, key(conv="big"), 12, 100)  # 1,200 chunks
    fill(index, key(conv="other"), 1, 3)
    fill(index, key(principal="bob", conv="big"), 1, 2)
    fill(index, key(tenant="t2", conv="big"), 1, 4)
    assert index.count("t1", "ana", "big") == 1200
    index.delete_conversation("t1", "ana", "big")
    assert index.count("t1", "ana", "big") == 0
    assert index.count("t1", "ana") == 3
    assert index.count("t1", "bob", "big") == 2
    assert index.count("t2", "ana", "big") == 4
    assert [h.conversation_id for h in index.search(scope(), query("xi"), 10).keyword] == ["other"]


def test_delete_principal_removes_every_chunk_and_nothing_else(index: ChunkIndex) -> None:
    fill(index, key(conv="c1"), 6, 100)
    fill(index, key(conv="c2"), 6, 100)
    fill(index, key(principal="bob"), 1, 3)
    fill(index, key(tenant="t2"), 1, 5)
    assert index.count("t1", "ana") == 1200
    index.delete_principal("t1", "ana")
    assert index.count("t1", "ana") == 0
    assert index.search(scope(), query("xi"), 10).semantic == ()
    assert index.count("t1", "bob") == 3
    assert index.count("t2", "ana") == 5


# --- Threads -------------------------------------------------------------------------------


# --- Keyword representation versions (server/domain/reindex.py) ----------------------------


def test_stale_keyword_chunks_are_those_of_another_version(index: ChunkIndex) -> None:
    old = [chunk(0, "alpha beta", E0), chunk(1, "gamma", E1)]
    index.upsert_turn(key(turn="old"), T0, old)
    index.upsert_turn(key(tenant="t2", principal="bob", turn="other"), T0, [chunk(0, "delta")])
    current = IndexedChunk(0, "epsilon", (E2,), doc_sparse("epsilon"), keyword_version=2)
    index.upsert_turn(key(turn="new"), T0, [current])
    assert index.count_stale_keyword_chunks(2) == 3
    stale = {(c.key, c.chunk_index): c for c in index.stale_keyword_chunks(2, 10)}
    assert set(stale) == {
        (key(turn="old"), 0),
        (key(turn="old"), 1),
        (key(tenant="t2", principal="bob", turn="other"), 0),
    }
    assert stale[key(turn="old"), 1].text == "gamma"
    assert stale[key(turn="old"), 1].turn_time == T0
    assert len(index.stale_keyword_chunks(2, 2)) == 2
    assert index.count_stale_keyword_chunks(1) == 1  # only the version-2 chunk
    assert index.count_stale_keyword_chunks(2, Owner("t1")) == 2
    assert index.count_stale_keyword_chunks(2, Owner("t2", "bob")) == 1
    assert index.count_stale_keyword_chunks(2, Owner("t2", "ana")) == 0
    assert {c.key for c in index.stale_keyword_chunks(2, 10, Owner("t2", "bob"))} == {
        key(tenant="t2", principal="bob", turn="other")
    }


def test_new_keyword_vectors_replace_the_old_and_keep_the_rest(index: ChunkIndex) -> None:
    index.upsert_turn(key(turn="u1"), T0, [chunk(0, "alpha", E0), chunk(1, "beta", E1)])
    index.upsert_turn(key(turn="gone"), T0, [chunk(0, "alpha", E2)])
    stale = index.stale_keyword_chunks(2, 10)
    index.delete_conversation("t1", "ana", "c1")  # everything read is deleted meanwhile...
    index.upsert_turn(key(conv="c2", turn="u1"), T0, [chunk(0, "alpha", E0)])
    index.set_keyword_vectors([(c, doc_sparse("zeta " + c.text)) for c in stale], 2)
    assert index.count("t1", "ana", "c1") == 0  # ...and stays deleted
    (c2,) = index.stale_keyword_chunks(2, 10)
    index.set_keyword_vectors([(c2, doc_sparse("zeta alpha"))], 2)
    assert index.count_stale_keyword_chunks(2) == 0
    result = index.search(scope(), query("zeta", E0), 10)
    assert [(h.conversation_id, h.turn_id, h.chunk_index) for h in result.keyword] == [
        ("c2", "u1", 0)
    ]
    assert result.keyword[0].text == "alpha"  # the stored text is unchanged
    assert result.semantic[0].turn_id == "u1"  # and so is the dense vector


def test_the_reindexer_moves_every_chunk_to_the_current_representation(
    index: ChunkIndex,
) -> None:
    encoder = KeywordEncoder()
    may = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    texts = [f"we talked about topic {n}" for n in range(7)]
    for n, text in enumerate(texts):
        when = may if n == 3 else T0
        index.upsert_turn(
            key(turn=f"u{n}"), when, [IndexedChunk(0, text, (E0,), encoder.encode_document(text))]
        )
    dated = EncodedQuery(dense=E1, sparse=encoder.encode_query("8 May 2023"))
    assert index.search(scope(), dated, 3).keyword == ()
    reported: list[tuple[int, int]] = []
    assert KeywordReindexer(index, encoder).run(3, lambda d, t: reported.append((d, t))) == 7
    assert reported == [(0, 7), (3, 7), (6, 7), (7, 7)]
    assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 0
    assert index.search(scope(), dated, 3).keyword[0].turn_id == "u3"
    assert KeywordReindexer(index, encoder).run_once(3) == 0  # resumable: nothing left


def test_no_keyword_vectors_to_set_is_a_no_op(index: ChunkIndex) -> None:
    index.upsert_turn(key(), T0, [chunk(0, "alpha")])
    index.set_keyword_vectors([], 3)
    assert index.count_stale_keyword_chunks(3) == 1  # the chunk is untouched: still version 1


def test_a_context_vector_follows_the_windows_and_is_searched_with_them(
    index: ChunkIndex,
) -> None:
    """server/domain/context.py DenseContext: a chunk's dense multivector becomes its windows
    then its context vector; its windows read back alone; a search finds it by the context
    too; a chunk deleted meanwhile stays deleted; writing the turn again drops the context."""
    index.upsert_turn(key(turn="u1"), T0, [chunk(0, "alpha", E0, E1)])
    assert index.chunk_windows("t1", "ana", "c1", [("u1", 0), ("u9", 0)]) == {("u1", 0): (E0, E1)}
    assert index.chunk_windows("t1", "ana", "c1", []) == {}
    index.set_dense_context([(key(turn="u1"), 0, (E0, E1), E2), (key(turn="gone"), 0, (E0,), E3)])
    assert index.chunk_windows("t1", "ana", "c1", [("u1", 0)]) == {("u1", 0): (E0, E1)}
    assert index.chunk_windows("t1", "bob", "c1", [("u1", 0)]) == {}  # another owner's id
    assert index.count("t1", "ana") == 1  # the deleted chunk was not written back
    (hit,) = index.search(scope(), query("", E2), 10).semantic
    assert (hit.turn_id, round(hit.score, 5)) == ("u1", 1.0)
    index.set_dense_context([(key(turn="u1"), 0, (E0, E1), E3)])  # a new context replaces it
    assert index.chunk_windows("t1", "ana", "c1", [("u1", 0)]) == {("u1", 0): (E0, E1)}
    assert round(index.search(scope(), query("", E2), 10).semantic[0].score, 5) == 0.0
    assert round(index.search(scope(), query("", E3), 10).semantic[0].score, 5) == 1.0
    index.upsert_turn(key(turn="u1"), T0, [chunk(0, "alpha", E1)])  # the turn written again
    assert index.chunk_windows("t1", "ana", "c1", [("u1", 0)]) == {("u1", 0): (E1,)}
    assert round(index.search(scope(), query("", E3), 10).semantic[0].score, 5) == 0.0


def test_conversation_places_are_every_chunk_of_that_conversation_only(
    index: ChunkIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (qdrant_edge, qdrant_server):  # several scroll pages, on every engine
        monkeypatch.setattr(module, "PLACES_PAGE", 2)
    later = T0 + timedelta(minutes=5)
    index.upsert_turn(key(turn="u1"), T0, [replace(chunk(0, "a"), turn_order=4)])
    index.upsert_turn(
        key(turn="u2"), later, [replace(chunk(i, "b"), turn_order=9) for i in range(3)]
    )
    index.upsert_turn(key(conv="c2", turn="u3"), T0, [chunk(0, "c")])
    index.upsert_turn(key(principal="bob", turn="u4"), T0, [chunk(0, "d")])
    places = sorted(index.conversation_places("t1", "ana", "c1"), key=lambda p: p.turn_id)
    assert [(p.turn_id, p.chunk_index, p.turn_time, p.turn_order) for p in places] == [
        ("u1", 0, T0, 4),
        *sorted(("u2", i, later, 9) for i in range(3)),
    ]
    assert index.conversation_places("t1", "ana", "nothing") == []


def test_places_near_a_time_are_the_nearest_each_way_in_time_order(index: ChunkIndex) -> None:
    minute = timedelta(minutes=1)
    times = [T0 + minute * n for n in (0, 1, 1, 1, 2, 3, 5)]  # three turns share minute 1
    for n, when in enumerate(times):
        index.upsert_turn(key(turn=f"u{n}"), when, [replace(chunk(0, "a"), turn_order=n)])
    index.upsert_turn(key(conv="c2", turn="x"), T0 + minute, [chunk(0, "b")])  # not this one's
    before, after = index.places_near("t1", "ana", "c1", T0 + minute * 2, 3)
    assert [p.turn_time for p in before] == [T0 + 2 * minute, T0 + minute, T0 + minute]
    assert {p.turn_id for p in before[1:]} < {"u1", "u2", "u3"}  # equal times: any two
    assert [(p.turn_id, p.turn_order) for p in after] == [("u4", 4), ("u5", 5), ("u6", 6)]
    before, after = index.places_near("t1", "ana", "c1", T0 + minute, 10)
    assert sorted(p.turn_id for p in before) == ["u0", "u1", "u2", "u3"]
    assert before[-1].turn_id == "u0"
    assert sorted(p.turn_id for p in after[:3]) == ["u1", "u2", "u3"]
    assert [p.turn_id for p in after[3:]] == ["u4", "u5", "u6"]
    before, after = index.places_near("t1", "ana", "c1", T0 - minute, 5)
    assert before == []
    assert [p.turn_id for p in after][::4] == ["u0", "u4"]


def test_the_reindexer_encodes_each_chunk_with_its_neighbours(index: ChunkIndex) -> None:
    """Representation 3 from older chunks: a chunk's keyword vector also holds the words of
    the chunks before and after it in its conversation (not another conversation's)."""
    encoder = KeywordEncoder()
    texts = ["we saw a heron", "it stood so still", "then an otter swam by", "lunch after"]
    for n, text in enumerate(texts):
        one = IndexedChunk(0, text, (E0,), encoder.encode_document(text), turn_order=n + 1)
        index.upsert_turn(key(turn=f"u{n}"), T0, [one])
    index.upsert_turn(
        key(conv="c2", turn="x"), T0, [IndexedChunk(0, "otter", (E0,), doc_sparse("otter"))]
    )
    assert KeywordReindexer(index, encoder).run(10) == 5
    assert index.count_stale_keyword_chunks(KEYWORD_VERSION) == 0

    def found(words: str) -> list[tuple[str, str]]:
        encoded = EncodedQuery(dense=E1, sparse=encoder.encode_query(words))
        return [(h.conversation_id, h.turn_id) for h in index.search(scope(), encoded, 10).keyword]

    # u2 by its own word first, then its neighbours u1 and u3 (by their position, either way).
    hits = found("otter")
    assert hits[0] in {("c1", "u2"), ("c2", "x")}
    assert set(hits) == {("c1", "u1"), ("c1", "u2"), ("c1", "u3"), ("c2", "x")}
    assert found("heron") == [("c1", "u0"), ("c1", "u1")]  # u0 has no turn before it


def test_searches_run_while_a_writer_writes(index: ChunkIndex) -> None:
    index.upsert_turn(key(turn="fixed"), T0, [chunk(0, "pi", E0)])
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for n in range(30):
                index.upsert_turn(key(turn=f"w{n}"), T0, [chunk(0, "pi rho", E1)])
                index.delete_conversation("t1", "ana", "gone")
        except BaseException as error:
            errors.append(error)

    def reader() -> None:
        try:
            for _ in range(30):
                assert index.search(scope(), query("pi", E0), 5).semantic[0].turn_id == "fixed"
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    threads.append(threading.Thread(target=reader))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert index.count("t1", "ana") == 31


# --- The model record ----------------------------------------------------------------------


def test_another_model_or_dimension_is_refused(opener: Opener, index: ChunkIndex) -> None:
    index.upsert_turn(key(), T0, [chunk(0, "sigma", E0)])
    with pytest.raises(EmbeddingMismatchError, match="other-model"):
        opener.reopen(index, model_id="other-model")
    with pytest.raises(EmbeddingMismatchError, match="dimension 8"):
        opener.reopen(index, dimension=16)
    again = opener.open()
    assert again.count("t1", "ana") == 1


def test_check_passes_on_an_open_index(index: ChunkIndex) -> None:
    """The health monitor's probe (server/runtime/health.py): cheap, and no effect on the data."""
    index.upsert_turn(key(), T0, [chunk(0, "omega", E0)])
    index.check()
    assert index.count("t1", "ana") == 1


# --- The server only ------------------------------------------------------------------------


@pytest.mark.parametrize("prefer_grpc", [True, False])
def test_unreachable_server_is_store_unavailable(prefer_grpc: bool) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = QdrantClient(
        url=f"http://127.0.0.1:{port}", prefer_grpc=prefer_grpc, check_compatibility=False
    )
    try:
        with pytest.raises(MemoriaError) as raised:
            QdrantServerChunkIndex(client, "chunks", DIM, MODEL)
        assert raised.value.reason is ErrorReason.STORE_UNAVAILABLE
    finally:
        client.close()


@pytest.mark.qdrant
def test_the_real_server_keeps_the_tenant_index_and_the_idf_modifier(
    qdrant: QdrantEndpoint, qdrant_collection: str
) -> None:
    """What local mode drops (payload indexes, `is_tenant`), the real server keeps."""
    client = qdrant.client()
    try:
        QdrantServerChunkIndex(client, qdrant_collection, DIM, MODEL)
        info = client.get_collection(qdrant_collection)
        tenant = info.payload_schema["tenant_id"]
        assert tenant.data_type == qm.PayloadSchemaType.KEYWORD
        assert isinstance(tenant.params, qm.KeywordIndexParams)
        assert tenant.params.is_tenant is True
        assert {"principal_id", "conversation_id", "turn_key"} <= set(info.payload_schema)
        sparse = (info.config.params.sparse_vectors or {})["keyword"]
        assert sparse.modifier == qm.Modifier.IDF
        assert check_server_version(client).startswith("1.18.")
    finally:
        client.close()


@pytest.mark.parametrize(
    ("version", "usable", "says"),
    [
        ("1.18.3", True, None),
        ("1.18.0-rc1", True, None),
        ("1.19.0", True, "untested"),
        ("1.16.0", True, "untested"),
        ("1.15.4", False, "not supported"),
        ("2.0.0", False, "not supported"),
        ("dev", True, "not a version number"),
    ],
)
def test_server_versions_tested_untested_and_refused(
    version: str, usable: bool, says: str | None
) -> None:
    verdict, message = version_verdict(version)
    assert verdict is usable
    if says is None:
        assert message is None
    else:
        assert message is not None and says in message and "1.18.x" in message


# --- The embedded engine only --------------------------------------------------------------


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Callable[[], QdrantEdgeChunkIndex]]:
    opened: list[QdrantEdgeChunkIndex] = []

    def open_edge() -> QdrantEdgeChunkIndex:
        opened.append(QdrantEdgeChunkIndex(tmp_path / "chunks", DIM, MODEL))
        return opened[-1]

    yield open_edge
    for index in opened:
        index.close()


def test_edge_keeps_chunks_across_close_and_reopen(
    edge: Callable[[], QdrantEdgeChunkIndex],
) -> None:
    first = edge()
    first.upsert_turn(key(), T0, [chunk(0, "tau", E0), chunk(1, "upsilon", E1)])
    first.close()
    first.close()  # idempotent
    second = edge()
    assert second.count("t1", "ana") == 2
    (hit,) = second.search(scope(), query("upsilon", E1), 5).keyword
    assert (hit.chunk_index, hit.text, hit.turn_time) == (1, "upsilon", T0)


def test_edge_check_fails_once_the_index_is_closed(
    edge: Callable[[], QdrantEdgeChunkIndex],
) -> None:
    index = edge()
    index.check()
    index.close()
    with pytest.raises(MemoriaError) as raised:
        index.check()
    assert raised.value.reason is ErrorReason.STORE_UNAVAILABLE
    assert "not initialized" in str(raised.value.__cause__)  # the engine's own words, logged


def test_edge_second_open_names_the_data_dir(
    edge: Callable[[], QdrantEdgeChunkIndex], tmp_path: Path
) -> None:
    edge()
    with pytest.raises(ChunkIndexLockedError, match=re.escape(str(tmp_path / "chunks"))):
        edge()


def test_edge_refuses_a_shard_without_a_model_record(
    edge: Callable[[], QdrantEdgeChunkIndex], tmp_path: Path
) -> None:
    edge().close()
    (tmp_path / "chunks" / "memoria-index.json").unlink()
    with pytest.raises(ChunkIndexError, match=re.escape("memoria-index.json")):
        edge()


def test_edge_upsert_survives_a_killed_process(tmp_path: Path) -> None:
    # The child upserts without flushing or closing, then dies by SIGKILL.
    script = textwrap.dedent(
        f"""
        import os, signal
        from datetime import UTC, datetime
        from pathlib import Path
        from server.domain.model import IndexedChunk, SparseVector, TurnKey
        from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
        index = QdrantEdgeChunkIndex(Path({str(tmp_path / "chunks")!r}), {DIM}, {MODEL!r})
        vector = (1.0,) + (0.0,) * {DIM - 1}
        chunks = [IndexedChunk(i, "phi", (vector,), SparseVector((7,), (1.0,))) for i in range(3)]
        index.upsert_turn(TurnKey("t1", "ana", "c1", "u1"), datetime.now(UTC), chunks)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "generated/python")])}
    child = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60)
    assert child.returncode == -9, child.stderr.decode()
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", DIM, MODEL)
    try:
        assert index.count("t1", "ana") == 3
    finally:
        index.close()


# --- Shared helpers ------------------------------------------------------------------------


def test_point_ids_are_deterministic_and_unambiguous() -> None:
    assert point_id(key(), 0) == point_id(key(), 0)
    assert point_id(key(), 0) != point_id(key(), 1)
    # The same characters split differently across the parts must not collide.
    assert point_id(TurnKey("a", "b:c", "d", "e"), 0) != point_id(TurnKey("a:b", "c", "d", "e"), 0)
    assert point_id(TurnKey("a", "b", "cd", "e"), 0) != point_id(TurnKey("a", "bc", "d", "e"), 0)
    assert turn_key(TurnKey("a", "b", "cd", "e")) != turn_key(TurnKey("a", "bc", "d", "e"))


def test_the_turn_of_a_point_is_read_off_its_id() -> None:
    assert turn_of_point(point_id(key(), 0)) == turn_of_point(point_id(key(), 9))
    assert turn_of_point(point_id(key(), 0)) != turn_of_point(point_id(key(turn="u2"), 0))
