"""Weighted normalized score fusion of the two retrieval sides, best chunk per turn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from server.domain.fusion import KEYWORD_WEIGHT, fuse, keyword_weight
from server.domain.model import ChunkHit, RetrievalResult

T = datetime(2026, 11, 30, tzinfo=UTC)


def hit(turn: str, chunk: int = 0, conversation: str = "c", score: float = 1.0) -> ChunkHit:
    return ChunkHit(conversation, turn, chunk, f"{turn}/{chunk}", T, score)


def test_turn_found_by_both_sides_beats_one_found_by_one() -> None:
    result = RetrievalResult(
        keyword=(hit("a", score=9.0), hit("b", score=8.5), hit("z", score=1.0)),
        semantic=(hit("c", score=0.8), hit("b", score=0.75), hit("y", score=0.3)),
    )
    fused = fuse(result, 10)
    assert [h.turn_id for h in fused[:3]] == ["b", "a", "c"]
    b, a, c = fused[:3]
    assert (b.keyword_rank, b.semantic_rank) == (2, 2)
    assert b.score == pytest.approx(KEYWORD_WEIGHT * 7.5 / 8 + (1 - KEYWORD_WEIGHT) * 0.45 / 0.5)
    assert (a.keyword_rank, a.semantic_rank) == (1, 0)
    assert a.score == pytest.approx(KEYWORD_WEIGHT)
    assert (c.keyword_rank, c.semantic_rank) == (0, 1)
    assert c.score == pytest.approx(1 - KEYWORD_WEIGHT)


def test_scores_count_not_only_ranks() -> None:
    """A keyword hit far ahead of its side's rest beats a turn both sides list low; with
    ranks alone (reciprocal rank fusion) the turn listed twice would win."""
    result = RetrievalResult(
        keyword=(hit("far", score=20.0), hit("both", score=2.2), hit("x", score=2.0)),
        semantic=(hit("s", score=0.60), hit("both", score=0.55), hit("y", score=0.2)),
    )
    assert [h.turn_id for h in fuse(result, 2)] == ["far", "s"]


def test_a_side_of_equal_scores_counts_each_hit_fully() -> None:
    result = RetrievalResult(keyword=(hit("a", score=3.0), hit("b", score=3.0)), semantic=())
    assert [h.score for h in fuse(result, 10)] == [pytest.approx(KEYWORD_WEIGHT)] * 2


def test_one_side_alone_ranks_as_that_side() -> None:
    semantic = tuple(hit(str(i), score=1.0 - i / 10) for i in range(5))
    fused = fuse(RetrievalResult(keyword=(), semantic=semantic), 10)
    assert [h.turn_id for h in fused] == ["0", "1", "2", "3", "4"]
    assert [h.semantic_rank for h in fused] == [1, 2, 3, 4, 5]


def test_chunk_shown_is_from_the_side_that_ranked_the_turn_higher() -> None:
    result = RetrievalResult(
        keyword=(hit("x"), hit("t", chunk=3)), semantic=(hit("t", chunk=1), hit("y"))
    )
    fused = {h.turn_id: h for h in fuse(result, 10)}
    assert fused["t"].chunk_index == 1
    assert fused["t"].other_text == "t/3"  # the keyword side's chunk comes along
    assert fused["x"].other_text is None  # one side only
    same = fuse(RetrievalResult(keyword=(hit("t", 2),), semantic=(hit("t", 2),)), 10)
    assert same[0].other_text is None  # both sides chose the chunk shown


def test_same_turn_id_in_two_conversations_are_two_turns() -> None:
    result = RetrievalResult(
        keyword=(hit("t", conversation="c1"),), semantic=(hit("t", conversation="c2"),)
    )
    assert len(fuse(result, 10)) == 2


def test_cut_to_the_turns_wanted_and_empty_sides() -> None:
    result = RetrievalResult(keyword=tuple(hit(str(i)) for i in range(20)), semantic=())
    assert [h.turn_id for h in fuse(result, 5)] == ["0", "1", "2", "3", "4"]
    assert fuse(RetrievalResult((), ()), 5) == []


def dated(turn: str, days: int, score: float, conversation: str = "c") -> ChunkHit:
    return ChunkHit(conversation, turn, 0, turn, T + timedelta(days=days), score)


def test_equal_scores_put_the_newer_turn_first() -> None:
    # Each side lists the older turn first with the same raw score: relevance cannot tell
    # them apart, so recency does (whatever the ranks and the ids' order).
    result = RetrievalResult(
        keyword=(dated("old", 0, 5.0, "a"), dated("new", 9, 5.0, "z"), dated("x", 5, 1.0)),
        semantic=(dated("old", 0, 0.7, "a"), dated("new", 9, 0.7, "z"), dated("x", 5, 0.1)),
    )
    fused = fuse(result, 10)
    assert [h.turn_id for h in fused] == ["new", "old", "x"]
    assert fused[0].score == fused[1].score
    assert (fused[0].keyword_rank, fused[1].keyword_rank) == (2, 1)


def test_recency_never_outranks_a_better_score() -> None:
    result = RetrievalResult(
        keyword=(dated("old", 0, 5.0), dated("new", 9, 4.9), dated("x", 5, 1.0)), semantic=()
    )
    assert [h.turn_id for h in fuse(result, 10)] == ["old", "new", "x"]


def test_ties_order_the_same_whatever_order_the_engine_returned_them_in() -> None:
    hits = [dated(f"u{n}", n % 3, 2.0, conversation=f"c{n}") for n in range(6)]
    forward = fuse(RetrievalResult(keyword=tuple(hits), semantic=()), 10)
    backward = fuse(RetrievalResult(keyword=tuple(reversed(hits)), semantic=()), 10)
    assert [h.turn_time for h in forward] == sorted((h.turn_time for h in hits), reverse=True)
    assert [h.turn_time for h in forward] == [h.turn_time for h in backward]


def test_the_keyword_share_is_the_models() -> None:
    result = RetrievalResult(keyword=(hit("k", score=3.0),), semantic=(hit("s", score=0.8),))
    assert keyword_weight("e5-small-v2-int8:sha256-7d9092cb25f2bd1c:window=508") == 0.6
    assert keyword_weight("all-MiniLM-L6-v2-int8:sha256-53aa51172d142c89") == KEYWORD_WEIGHT
    assert keyword_weight("openai:text-embedding-3-small:1536") == KEYWORD_WEIGHT
    fused = {h.turn_id: h.score for h in fuse(result, 10, 0.7)}
    assert fused == {"k": pytest.approx(0.7), "s": pytest.approx(0.3)}
