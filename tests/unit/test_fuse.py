"""Reciprocal rank fusion of the two retrieval sides, best chunk per turn."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from server.domain.model import ChunkHit, RetrievalResult
from server.domain.search import RRF_K, fuse

T = datetime(2026, 11, 30, tzinfo=UTC)


def hit(turn: str, chunk: int = 0, conversation: str = "c") -> ChunkHit:
    return ChunkHit(conversation, turn, chunk, f"{turn}/{chunk}", T, 1.0)


def test_turn_found_by_both_sides_beats_one_found_by_one() -> None:
    result = RetrievalResult(keyword=(hit("a"), hit("b")), semantic=(hit("c"), hit("b")))
    fused = fuse(result, 10)
    assert [h.turn_id for h in fused] == ["b", "a", "c"]
    b = fused[0]
    assert (b.keyword_rank, b.semantic_rank) == (2, 2)
    assert b.score == pytest.approx(2 / (RRF_K + 2))
    a, c = fused[1], fused[2]
    assert (a.keyword_rank, a.semantic_rank) == (1, 0)
    assert (c.keyword_rank, c.semantic_rank) == (0, 1)


def test_chunk_shown_is_from_the_side_that_ranked_the_turn_higher() -> None:
    result = RetrievalResult(
        keyword=(hit("x"), hit("t", chunk=3)), semantic=(hit("t", chunk=1), hit("y"))
    )
    fused = {h.turn_id: h for h in fuse(result, 10)}
    assert fused["t"].chunk_index == 1


def test_same_turn_id_in_two_conversations_are_two_turns() -> None:
    result = RetrievalResult(
        keyword=(hit("t", conversation="c1"),), semantic=(hit("t", conversation="c2"),)
    )
    assert len(fuse(result, 10)) == 2


def test_cut_to_the_turns_wanted_and_empty_sides() -> None:
    result = RetrievalResult(keyword=tuple(hit(str(i)) for i in range(20)), semantic=())
    assert [h.turn_id for h in fuse(result, 5)] == ["0", "1", "2", "3", "4"]
    assert fuse(RetrievalResult((), ()), 5) == []
