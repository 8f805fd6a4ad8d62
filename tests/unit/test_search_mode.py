"""The search_mode setting: one retrieval side alone, on the search role of the index only."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from server.domain.fusion import OneSideSearch, fuse, one_side
from server.domain.model import (
    ChunkHit,
    EncodedQuery,
    RetrievalResult,
    SearchScope,
    SparseVector,
)

T = datetime(2026, 12, 1, tzinfo=UTC)
QUERY = EncodedQuery(dense=(1.0,), sparse=SparseVector(indices=(1,), values=(1.0,)))
SCOPE = SearchScope("t", "p", frozenset())


def hit(turn: str) -> ChunkHit:
    return ChunkHit("c", turn, 0, turn, T, 1.0)


class Search:
    """Answers every search with keyword a, b and semantic c, b; records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[SearchScope, EncodedQuery, int]] = []

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        self.calls.append((scope, query, turns))
        return RetrievalResult(keyword=(hit("a"), hit("b")), semantic=(hit("c"), hit("b")))


def test_hybrid_is_the_search_itself() -> None:
    search = Search()
    assert one_side(search, "hybrid") is search


@pytest.mark.parametrize(
    ("mode", "turns", "ranks"),
    [("keyword", ["a", "b"], [(1, 0), (2, 0)]), ("semantic", ["c", "b"], [(0, 1), (0, 2)])],
)
def test_one_side_ranks_as_that_side(
    mode: str, turns: list[str], ranks: list[tuple[int, int]]
) -> None:
    hits = fuse(one_side(Search(), mode).search(SCOPE, QUERY, 10), 10)
    assert [h.turn_id for h in hits] == turns
    assert [(h.keyword_rank, h.semantic_rank) for h in hits] == ranks


def test_the_wrapped_search_gets_the_call_unchanged() -> None:
    search = Search()
    one_side(search, "semantic").search(SCOPE, QUERY, 7)
    assert search.calls == [(SCOPE, QUERY, 7)]


def test_unknown_side_is_refused() -> None:
    with pytest.raises(ValueError, match="keyword or semantic"):
        OneSideSearch(Search(), "hybrid")
