"""Hybrid ranking: the keyword and the semantic side of a search fused into one list of turns.

The chunk index answers each side reduced to the best chunk per turn (`ChunkSearch`); `fuse`
combines the two by weighted normalized score fusion, and `retrieval_depth` says how deep each
side is read for a page. `one_side` serves the development setting MEMORIA_SEARCH_MODE
(keyword or semantic alone), which bench/bench_search_quality.py measures each side with.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.domain.model import (
    ChunkHit,
    EncodedQuery,
    RetrievalResult,
    SearchHit,
    SearchScope,
)
from server.domain.ports import ChunkSearch

KEYWORD_WEIGHT = 0.8
"""Share of the keyword side in the fused score; the semantic side has the rest.

Chosen on real conversations (bench/search_levers.py over the four LoCoMo development files,
leave-one-conversation-out, criterion: the mean of recall@1/5/10 and MRR@10): with the keyword
side's neighbouring-chunk context (keyword representation 3), every held-out file's choice
from the other three was 0.8 (of 0.6-0.9), for the default model; with multilingual-e5-small,
0.7 and 0.8 both meet the issue's targets. The keyword side is the stronger one there
(recall@1 0.48 against 0.23 for all-MiniLM-L6-v2) and its scores separate the answer from the
rest more sharply; an equal share let the weaker side's near-ties push good keyword hits
down. Before the context (representation 2) 0.7 was best."""

KEYWORD_WEIGHTS = {"e5-small-v2-int8": 0.6}
"""The keyword share for a model whose semantic side is stronger than MiniLM's, by the name
before the first colon of the embedder's model id; KEYWORD_WEIGHT for every other model.

e5-small-v2 alone finds the answering turn first 0.41 of the time (MiniLM 0.23), so it earns
more of the score. Chosen the same way with its keyword representation (two chunks of context
a side, server/domain/keywords.py TWO_NEIGHBOURS; bench/search_encoder.py, shares 0.5-0.8): 0.6
on every held-out file, held out 0.536 / 0.842 / 0.895 / 0.660 (recall@1/5/10, MRR@10; with one
chunk a side the folds chose 0.6-0.75, held out 0.512 / 0.837 / 0.888 / 0.646;
docs/decisions.md)."""


def keyword_weight(model_id: str) -> float:
    """The keyword share of the fused score for the embedder named by `model_id`."""
    return KEYWORD_WEIGHTS.get(model_id.split(":", 1)[0], KEYWORD_WEIGHT)


MIN_RETRIEVAL_TURNS = 50
"""Each side contributes its top turns (the turns wanted, at least this many) to the fusion.

The fused score of a side is min-max normalized over this list, so its depth sets what "the
side's worst" is: 20 and 50 measured alike (LoCoMo, bench/search_levers.py), 10 worse
(recall@10 0.79 against 0.82-0.83: a turn one side ranks 11th still helps when the other
ranks it high). Reciprocal rank fusion measured worse at every depth, because it throws the
scores away: a keyword hit far ahead of the rest counts the same as a near-tie."""


def fuse(
    result: RetrievalResult, turns: int, keyword_share: float = KEYWORD_WEIGHT
) -> list[SearchHit]:
    """Weighted normalized score fusion of the two per-turn rankings, best first, at most
    `turns`.

    Each side's raw scores are min-max normalized over its list (its best turn 1, its last
    0; a side whose scores are all equal gives each 1), and a turn's score is
    `keyword_share` (the model's, `keyword_weight`) times its keyword value plus the rest
    times its semantic value (0 on a side that did not list it). A side with no hits adds
    nothing, so one side alone ranks as that side does. The chunk shown is the one the side
    ranking the turn higher chose (keyword on a tie: an exact match is the easier one for a
    person to recognize); when the other side chose another chunk of the same turn, its text
    comes along as `other_text` (the relevance rule reads both). Among turns of equal score
    the newer comes first.
    """
    weights = {"keyword": keyword_share, "semantic": 1.0 - keyword_share}
    by_turn: dict[tuple[str, str], dict[str, tuple[int, float, ChunkHit]]] = {}
    for side, hits in (("keyword", result.keyword), ("semantic", result.semantic)):
        for rank, (hit, value) in enumerate(zip(hits, _min_max(hits), strict=True), start=1):
            entry = (rank, value, hit)
            by_turn.setdefault((hit.conversation_id, hit.turn_id), {}).setdefault(side, entry)
    fused: list[SearchHit] = []
    for sides in by_turn.values():
        keyword_rank = sides["keyword"][0] if "keyword" in sides else 0
        semantic_rank = sides["semantic"][0] if "semantic" in sides else 0
        _, _, chunk = min(sides.values(), key=lambda entry: entry[0])
        other = next((h for _, _, h in sides.values() if h.chunk_index != chunk.chunk_index), None)
        score = sum(weights[side] * value for side, (_, value, _) in sides.items())
        similarity = sides["semantic"][2].score if "semantic" in sides else None
        fused.append(
            SearchHit(
                conversation_id=chunk.conversation_id,
                turn_id=chunk.turn_id,
                chunk_index=chunk.chunk_index,
                text=chunk.text,
                turn_time=chunk.turn_time,
                score=score,
                keyword_rank=keyword_rank,
                semantic_rank=semantic_rank,
                semantic_similarity=similarity,
                other_text=None if other is None else other.text,
                semantic_chunk=sides["semantic"][2].chunk_index if "semantic" in sides else None,
            )
        )
    # Equal scores go to the newer turn (issue 24: questions point back to what was decided
    # last; equal scores mean the retrieval could not tell the turns apart, as a fact repeated
    # in two conversations does), then to the better single rank on either side, then a
    # stable order. Measured on the LoCoMo temporal category (bench/README.md).
    fused.sort(
        key=lambda h: (
            -h.score,
            -h.turn_time.timestamp(),
            min(r for r in (h.keyword_rank, h.semantic_rank) if r),
            h.conversation_id,
            h.turn_id,
        )
    )
    return fused[:turns]


def _min_max(hits: Sequence[ChunkHit]) -> list[float]:
    """Each hit's raw score mapped to 0..1 over the list (all 1 when they are all equal)."""
    if not hits:
        return []
    low = min(h.score for h in hits)
    span = max(h.score for h in hits) - low
    return [(h.score - low) / span if span > 0 else 1.0 for h in hits]


def retrieval_depth(turns: int) -> int:
    """How many turns each side ranks for a page of `turns` (see MIN_RETRIEVAL_TURNS)."""
    return max(turns, MIN_RETRIEVAL_TURNS)


class OneSideSearch:
    """A `ChunkSearch` that answers one retrieval side only (the other empty).

    Kept in the product for the development setting MEMORIA_SEARCH_MODE=keyword|semantic,
    which a running server is measured with (bench/bench_search_quality.py): `fuse` over one
    side ranks exactly as that side does, so a search answers keyword-only or semantic-only
    with the same index, representations and per-turn reduction as hybrid search. It wraps
    the search role alone: every other role of the index is used directly.
    """

    def __init__(self, search: ChunkSearch, side: str) -> None:
        if side not in ("keyword", "semantic"):
            raise ValueError(f"side must be keyword or semantic, not {side!r}")
        self._search = search
        self._side = side

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        """The wrapped search's result with the other side emptied."""
        result = self._search.search(scope, query, turns)
        if self._side == "keyword":
            return RetrievalResult(keyword=result.keyword, semantic=())
        return RetrievalResult(keyword=(), semantic=result.semantic)


def one_side(search: ChunkSearch, mode: str) -> ChunkSearch:
    """The search a `search_mode` runs on: `search` itself for hybrid, else a OneSideSearch."""
    if mode == "hybrid":
        return search
    return OneSideSearch(search, mode)
