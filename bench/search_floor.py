"""A relevance floor for search, studied in-process on LoCoMo with leave-one-out (issue 24 item 2).

The question: can a search answer "nothing matched" honestly? Today every search returns its
best turns, however unrelated: scores are min-max normalized per search, so the best of a set
of unrelated turns scores 1. A floor keeps a turn only when it shares something real with the
query: its keyword side's raw score (BM25 as the engine scores it: the sum over the query's
terms of Qdrant's IDF times the turn's BM25 term weight) reaches K, or its semantic side's
raw score (MAX_SIM cosine) reaches S. Both are absolute, so one floor applies to every search.

Measured here with the service's own representations and fusion (search_levers.py's `Lab`:
keyword representation 3, context 0.5; the text alone on the semantic side; min-max over 50
turns a side, keyword weight 0.8): for each development file's principal, its own questions
(recall@5 with the floor, which must not fall) and every other file's questions as foreign
queries (a foreign query should come back empty: its answers are another person's). K and S
are chosen by leave-one-conversation-out: on three files, the pair that empties the most
foreign queries while their recall@5 stays at least the unfloored one; scored on the fourth;
the held-out figures pooled.

What it does not settle (why the floor is not in the service yet): the keyword side's IDF is
the collection's, every tenant's chunks together, so its raw scores grow with the collection
(ln of the chunk count) and a fixed K means less as a deployment grows; and the semantic floor
belongs to one model (a store records its model, so the floor could too). `--coverage` tries a
keyword measure that does not depend on the collection instead of K: the share of the query's
distinct terms (the service's own KeywordEncoder terms) that the turn's keyword document holds,
which the service could compute from a hit's text.

    .venv/bin/python bench/search_floor.py [--data DIR] [--cache DIR] [--coverage]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import DEFAULT_DATA, FILES, Question, load
from search_levers import Lab, Principal, Vector, context_name, fuse_score
from serve_embedder import build_embedder

from server.domain.chunking import turn_text
from server.domain.fusion import KEYWORD_WEIGHT, MIN_RETRIEVAL_TURNS
from server.domain.keywords import CONTEXT_WEIGHT, KeywordEncoder, keyword_document

KEYWORD_FLOORS = [x / 2 for x in range(6, 30)]
"""Raw BM25 floors tried (3 to 14.5; own questions' best turn scored 12-13 at the 10th
percentile, foreign queries' 6-7.5 at the median)."""
COVERAGE_FLOORS = [0.05 * i for i in range(1, 20)]
"""Query-term coverage floors tried with --coverage (0.05 to 0.95)."""
SEMANTIC_FLOORS = [0.3 + 0.025 * i for i in range(14)] + [1.1]
"""Cosine floors tried (0.3 to 0.625, and 1.1: the semantic side alone never passes)."""


@dataclass(frozen=True)
class Tally:
    """One principal under one floor: own questions with an answer in the top 5, of how
    many; foreign queries that came back empty, of how many."""

    found: int
    own: int
    empty: int
    foreign: int


def with_foreign(principals: list[Principal]) -> list[Principal]:
    """Each principal asked its own questions and then every other file's, as foreign queries
    (no relevant turn), in that order."""
    extended = []
    for p in principals:
        foreign = [
            Question(p.turns[0].principal, q.text, "foreign", frozenset())
            for other in principals
            if other is not p
            for q in other.questions
        ]
        extended.append(Principal(p.name, p.turns, [*p.questions, *foreign]))
    return extended


def tally(
    p: Principal,
    own: int,
    kw: Vector,
    sem: Vector,
    ranks: list[list[int]],
    k_floor: float,
    s_floor: float,
) -> Tally:
    """Recall@5 of the own questions and the empty share of the foreign ones, with the floor."""
    found = empty = 0
    for qi, order in enumerate(ranks):
        kept = [i for i in order if kw[qi][i] >= k_floor or sem[qi][i] >= s_floor]
        if qi < own:
            turns = {(p.turns[i].conversation_id, p.turns[i].turn_id) for i in kept[:5]}
            found += bool(turns & p.questions[qi].relevant)
        else:
            empty += not kept
    return Tally(found, own, empty, len(ranks) - own)


def coverage(keywords: KeywordEncoder, p: Principal, ranks: list[list[int]]) -> Vector:
    """Questions x turns: the share of each question's distinct terms that the turn's keyword
    document (its date, then its text) holds; only for the turns a question ranks (0 elsewhere:
    the floor is only ever asked about those)."""
    documents: dict[int, set[str]] = {}
    out = np.zeros((len(p.questions), len(p.turns)), dtype=np.float32)
    for qi, question in enumerate(p.questions):
        wanted = set(keywords.terms(question.text))
        for i in ranks[qi]:
            if i not in documents:
                t = p.turns[i]
                text = keyword_document(turn_text(t.question, t.answer), t.turn_time)
                documents[i] = set(keywords.terms(text))
            out[qi, i] = len(wanted & documents[i]) / len(wanted) if wanted else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--cache", type=Path, help="keep the documents' vectors here between runs")
    ap.add_argument(
        "--coverage",
        action="store_true",
        help="floor the keyword side by query-term coverage instead of raw BM25",
    )
    args = ap.parse_args(argv)
    if not all((args.data / f).is_file() for f in FILES):
        print(f"search_floor: the LoCoMo files are absent from {args.data}", file=sys.stderr)
        return 2
    base = []
    for name in FILES:
        turns, questions = load(args.data / name, f"locomo-{Path(name).stem}")
        base.append(Principal(name, turns, questions))
    principals = with_foreign(base)
    lab = Lab(principals, build_embedder("minilm", 2), args.cache, "dense")
    kw = lab.keyword_scores(context_name(1, 1, CONTEXT_WEIGHT), "collection")
    sem = lab.dense_scores("own")
    ranks = [
        [
            fuse_score(k, s, "minmax", MIN_RETRIEVAL_TURNS, KEYWORD_WEIGHT)
            for k, s in zip(kw[pi], sem[pi], strict=True)
        ]
        for pi in range(len(principals))
    ]
    own = [len(p.questions) for p in base]
    keyword_floors, label = KEYWORD_FLOORS, "K"
    if args.coverage:
        kw = [coverage(lab.keywords, p, ranks[pi]) for pi, p in enumerate(principals)]
        keyword_floors, label = COVERAGE_FLOORS, "coverage"

    def run(k_floor: float, s_floor: float) -> list[Tally]:
        return [
            tally(p, own[pi], kw[pi], sem[pi], ranks[pi], k_floor, s_floor)
            for pi, p in enumerate(principals)
        ]

    unfloored = run(float("-inf"), float("-inf"))
    grid = {(k, s): run(k, s) for k in keyword_floors for s in SEMANTIC_FLOORS}
    print(
        f"{sum(own)} own questions, {sum(t.foreign for t in unfloored)} foreign queries; "
        f"recall@5 unfloored {sum(t.found for t in unfloored) / sum(own):.3f}"
    )
    pooled = Tally(0, 0, 0, 0)
    for held in range(len(base)):
        others = [pi for pi in range(len(base)) if pi != held]
        need = sum(unfloored[pi].found for pi in others)
        best: tuple[float, float, float] | None = None
        for (k_floor, s_floor), tallies in grid.items():
            if sum(tallies[pi].found for pi in others) < need:
                continue
            rate = sum(tallies[pi].empty for pi in others) / sum(
                tallies[pi].foreign for pi in others
            )
            if best is None or rate > best[0]:
                best = (rate, k_floor, s_floor)
        assert best is not None  # the lowest floors keep every turn
        _, k_floor, s_floor = best
        t = grid[k_floor, s_floor][held]
        print(
            f"  {base[held].name} held out: {label} {k_floor:g} S {s_floor:.3f}; recall@5 "
            f"{t.found / t.own:.3f} (unfloored {unfloored[held].found / t.own:.3f}), "
            f"foreign queries empty {t.empty / t.foreign:.3f}"
        )
        pooled = Tally(
            pooled.found + t.found,
            pooled.own + t.own,
            pooled.empty + t.empty,
            pooled.foreign + t.foreign,
        )
    print(
        f"  pooled: recall@5 {pooled.found / pooled.own:.3f}, "
        f"foreign queries empty {pooled.empty / pooled.foreign:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
