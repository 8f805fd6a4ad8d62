"""The search_mode setting: one retrieval side alone, the index otherwise unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from server.domain.model import (
    EVERYONE,
    ChunkHit,
    ChunkPlace,
    EncodedQuery,
    IndexedChunk,
    Owner,
    RetrievalResult,
    SearchScope,
    SparseVector,
    StoredChunk,
    TurnKey,
)
from server.domain.search import OneSideIndex, fuse, search_index

T = datetime(2026, 12, 1, tzinfo=UTC)
QUERY = EncodedQuery(dense=(1.0,), sparse=SparseVector(indices=(1,), values=(1.0,)))
SCOPE = SearchScope("t", "p", frozenset())


def hit(turn: str) -> ChunkHit:
    return ChunkHit("c", turn, 0, turn, T, 1.0)


class Index:
    """Answers every search with keyword a, b and semantic c, b; records other calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        self.calls.append(f"upsert {key.turn_id}")

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        return RetrievalResult(keyword=(hit("a"), hit("b")), semantic=(hit("c"), hit("b")))

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        self.calls.append(f"delete {conversation_id}")

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        self.calls.append(f"erase {principal_id}")

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        return 7

    def stale_keyword_chunks(
        self, version: int, limit: int, owner: Owner = EVERYONE
    ) -> Sequence[StoredChunk]:
        self.calls.append(f"stale {version} {limit} {owner.principal_id}")
        return []

    def conversation_places(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> Sequence[ChunkPlace]:
        self.calls.append(f"places {conversation_id}")
        return [ChunkPlace("x", 0, T, 1)]

    def places_near(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        turn_time: datetime,
        limit: int,
    ) -> tuple[Sequence[ChunkPlace], Sequence[ChunkPlace]]:
        self.calls.append(f"near {conversation_id} {limit}")
        return [ChunkPlace("x", 0, T, 1)], []

    def count_stale_keyword_chunks(self, version: int, owner: Owner = EVERYONE) -> int:
        return 3

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, SparseVector]], version: int
    ) -> None:
        self.calls.append(f"set {len(updates)} {version}")

    def check(self) -> None:
        self.calls.append("check")

    def close(self) -> None:
        self.calls.append("close")


def test_hybrid_is_the_index_itself() -> None:
    index = Index()
    assert search_index(index, "hybrid") is index


@pytest.mark.parametrize(
    ("mode", "turns", "ranks"),
    [("keyword", ["a", "b"], [(1, 0), (2, 0)]), ("semantic", ["c", "b"], [(0, 1), (0, 2)])],
)
def test_one_side_ranks_as_that_side(
    mode: str, turns: list[str], ranks: list[tuple[int, int]]
) -> None:
    hits = fuse(search_index(Index(), mode).search(SCOPE, QUERY, 10), 10)
    assert [h.turn_id for h in hits] == turns
    assert [(h.keyword_rank, h.semantic_rank) for h in hits] == ranks


def test_everything_but_search_passes_through() -> None:
    index = Index()
    one = search_index(index, "keyword")
    one.upsert_turn(TurnKey("t", "p", "c", "x"), T, [])
    one.delete_conversation("t", "p", "c")
    one.delete_principal("t", "p")
    one.check()
    assert one.count("t", "p") == 7
    assert one.stale_keyword_chunks(2, 5) == []
    assert one.stale_keyword_chunks(2, 5, Owner("t", "p")) == []
    assert one.count_stale_keyword_chunks(2) == 3
    assert one.conversation_places("t", "p", "c") == [ChunkPlace("x", 0, T, 1)]
    assert one.places_near("t", "p", "c", T, 4) == ([ChunkPlace("x", 0, T, 1)], [])
    one.set_keyword_vectors([], 2)
    one.close()
    assert index.calls == [
        "upsert x",
        "delete c",
        "erase p",
        "check",
        "stale 2 5 None",
        "stale 2 5 p",
        "places c",
        "near c 4",
        "set 0 2",
        "close",
    ]


def test_unknown_side_is_refused() -> None:
    with pytest.raises(ValueError, match="keyword or semantic"):
        OneSideIndex(Index(), "hybrid")
