"""Five more search levers on LoCoMo, in process, each chosen leave-one-conversation-out.

Issue 24 item 6 asks for recall@1 >= 0.50, recall@5 >= 0.84, recall@10 >= 0.90 and MRR@10
>= 0.64 by general means; the service gives 0.491 / 0.826 / 0.881 / 0.628. This lab tries what
bench/search_levers.py did not, on the same turns, questions, scoring and engine-exact scores
(it imports them from there), against the service's own setting (keyword representation 3 with
one neighbouring chunk a side at CONTEXT_WEIGHT, IDF over the collection, min-max fusion over
MIN_RETRIEVAL_TURNS a side at KEYWORD_WEIGHT, the semantic side on the turn's text, the model
of a new store):

- **feedback**: pseudo-relevance feedback on the keyword side (RM3-like): the terms of the
  fused top k turns, weighted by rank (1/r) times each turn's BM25 weight times IDF, the best
  T that the query lacks added to it at beta times their share of the largest; one more
  sparse query in the service;
- **utterances**: the semantic side with a vector per utterance (or per sentence) of a turn
  beside or instead of the turn's windows (MAX_SIM, or a mix with the turn's cosine);
- **bm25**: BM25's k1, b and the assumed average length (the encoder's constants);
- **adaptive**: a fusion weight per query, moved towards the side whose best turn stands out
  more from its top 50 (a logistic in the difference of the two sides' top-1 z-scores);
- **dense-feedback**: pseudo-relevance feedback on the semantic side (Rocchio): the query's
  vector moved towards the mean vector of the fused top k turns, searched again.

Each lever's grid is scored per file; the setting best on three files (by the mean of the four
figures, as search_levers.py --joint) is scored on the fourth, and the held-out scores pooled.

    .venv/bin/python bench/search_levers_more.py [--data DIR] [--cache DIR] [--levers ...]
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import DEFAULT_DATA, Scores
from search_levers import (
    Lab,
    Principal,
    Ranker,
    SparseDoc,
    Vector,
    _normalized,
    dev_principals,
    fmt,
    fuse_score,
    lab_for,
    mean_of_four,
    merged,
    ranked,
    score,
    select,
)
from serve_embedder import EMBEDDERS

import server.domain.keywords as keywords
from server.domain.chunking import turn_text
from server.domain.fusion import KEYWORD_WEIGHT, MIN_RETRIEVAL_TURNS
from server.domain.keywords import CONTEXT_WEIGHT

SERVICE_KEYWORD = f"ctx1+1@{CONTEXT_WEIGHT:g}"
LEVERS = ("feedback", "utterances", "bm25", "adaptive", "dense-feedback")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def service_fusion(kw: Vector, sem: Vector) -> list[int]:
    """The service's fusion (server/domain/fusion.py) as the lab computes it."""
    return fuse_score(kw, sem, "minmax", MIN_RETRIEVAL_TURNS, KEYWORD_WEIGHT)


class Matrices:
    """The keyword side as matrices: per principal its documents x terms (BM25 weights), the
    collection's IDF per term, and per principal its queries x terms (1 per query term)."""

    def __init__(self, docs_all: Sequence[Sequence[SparseDoc]], lab: Lab) -> None:
        vocab: dict[int, int] = {}
        for docs in docs_all:
            for d in docs:
                for term in d:
                    vocab.setdefault(term, len(vocab))
        self.docs = []
        for docs in docs_all:
            m = np.zeros((len(docs), len(vocab)), dtype=np.float64)
            for di, d in enumerate(docs):
                m[di, [vocab[t] for t in d]] = list(d.values())
            self.docs.append(m)
        df = sum((m > 0).sum(axis=0) for m in self.docs)
        n = sum(len(m) for m in self.docs)
        self.idf = np.where(df > 0, np.log(1 + (n - df + 0.5) / (df + 0.5)), 0.0)
        self.queries = []
        for terms_of in lab._query_terms:
            q = np.zeros((len(terms_of), len(vocab)), dtype=np.float64)
            for qi, terms in enumerate(terms_of):
                q[qi, [vocab[t] for t in terms if t in vocab]] = 1.0
            self.queries.append(q)

    def scores(self, queries: Sequence[np.ndarray] | None = None) -> list[Vector]:
        """Per principal: queries x documents, as the engine scores them."""
        qs = self.queries if queries is None else queries
        return [
            ((q * self.idf) @ m.T).astype(np.float32) for q, m in zip(qs, self.docs, strict=True)
        ]


def per_file(
    principals: Sequence[Principal], kw: Sequence[Vector], sem: Sequence[Vector], ranker: Ranker
) -> list[Scores]:
    """Scores of `ranker` on each file separately (what `select` chooses over)."""
    return [score(principals, kw, sem, ranker, [i]) for i in range(len(principals))]


def report(name: str, grid: dict[str, list[Scores]], baseline: dict[str, float]) -> None:
    """A lever's grid: the best setting in-sample, the leave-one-out choice pooled."""
    s = select(grid, mean_of_four)
    delta = " ".join(f"{s.pooled[m] - baseline[m]:+.3f}" for m in baseline)
    print(f"{name:<11} in-sample {fmt(s.in_sample)} [{s.best}]")
    print(f"{'':<11} LOO       {fmt(s.pooled)} ({delta} against the service) {s.chosen}")
    sys.stdout.flush()


# ------------------------------------------------------------------ the levers


def feedback(
    principals: Sequence[Principal], mx: Matrices, sem: Sequence[Vector]
) -> dict[str, list[Scores]]:
    """The feedback lever's grid (see the module docstring): k turns, T terms, beta."""
    base = mx.scores()
    grid = {}
    for k in (3, 5, 10):
        for terms in (5, 10, 20):
            for beta in (0.1, 0.2, 0.3):
                expanded = []
                for q, m, kw, se in zip(mx.queries, mx.docs, base, sem, strict=True):
                    out = q.copy()
                    for qi in range(len(q)):
                        top = service_fusion(kw[qi], se[qi])[:k]
                        rank_weight = 1.0 / np.arange(1, len(top) + 1)
                        weight = (rank_weight[:, None] * m[top]).sum(axis=0) * mx.idf
                        weight[q[qi] > 0] = 0.0
                        if terms < len(weight):
                            weight[weight < np.partition(weight, -terms)[-terms]] = 0.0
                        if weight.max() > 0:
                            out[qi] += beta * weight / weight.max()
                    expanded.append(out)
                grid[f"k={k} T={terms} beta={beta}"] = per_file(
                    principals, mx.scores(expanded), sem, service_fusion
                )
    return grid


def keyword_share(w: float) -> Ranker:
    """The service's fusion with another keyword share."""
    return lambda kw, sem: fuse_score(kw, sem, "minmax", MIN_RETRIEVAL_TURNS, w)


def utterances(
    principals: Sequence[Principal], lab: Lab, kw: Sequence[Vector], sem: Sequence[Vector]
) -> dict[str, list[Scores]]:
    """The utterance lever's grid: a vector per utterance or per sentence of a turn, as a
    maximum with the turn's own cosine or mixed into it, at two keyword shares."""
    pieces: dict[str, list[list[str]]] = {"turn": [], "utterance": [], "sentence": []}
    for p in principals:
        for t in p.turns:
            said = [u for u in (t.question, t.answer) if u]
            pieces["turn"].append([turn_text(t.question, t.answer)])
            pieces["utterance"].append(said)
            pieces["sentence"].append(
                [s for u in said for s in _SENTENCE_END.split(u) if s.strip()]
            )
    # Each kind embedded in one timed pass, in batches of 64 texts as the lab embeds turns: the
    # indexing cost a kind would add, beside the turn's own (the service embeds a turn once).
    vectors: dict[str, list[np.ndarray]] = {}
    seconds: dict[str, float] = {}
    for kind, per in pieces.items():
        texts = [text for row in per for text in row]
        started = time.process_time()
        flat: list[Sequence[Sequence[float]]] = []
        for b in range(0, len(texts), 64):
            flat += lab.embedder.embed_documents(texts[b : b + 64])
        seconds[kind] = time.process_time() - started
        vectors[kind], at = [], 0
        for row in per:
            vectors[kind].append(np.concatenate(flat[at : at + len(row)]).astype(np.float32))
            at += len(row)
    print(
        "  (embedding CPU: turns {turn:.1f} s, utterances {utterance:.1f} s, sentences"
        " {sentence:.1f} s)".format(**seconds)
    )
    counts = [0] + [len(p.turns) for p in principals]
    bounds = np.cumsum(counts)
    per_turn = [
        list(zip(vectors["utterance"][lo:hi], vectors["sentence"][lo:hi], strict=True))
        for lo, hi in itertools.pairwise(bounds)
    ]
    queries = [lab._queries[p.name] for p in principals]

    def variant(which: int, mix: float | None) -> list[Vector]:
        out = []
        for pi, rows in enumerate(per_turn):
            parts = np.stack([np.max(r[which] @ queries[pi].T, axis=0) for r in rows], axis=1)
            whole = sem[pi]
            side = np.maximum(whole, parts) if mix is None else (1 - mix) * whole + mix * parts
            out.append(side.astype(np.float32))
        return out

    grid = {}
    for which, label in ((0, "utterance"), (1, "sentence")):
        for mix in (None, 0.3, 0.5):
            side = variant(which, mix)
            for w in (0.7, 0.8):
                how = "max with the turn" if mix is None else f"mix {mix:g}"
                grid[f"{label} {how} keyword {w:g}"] = per_file(
                    principals,
                    kw,
                    side,
                    keyword_share(w),
                )
    return grid


@contextmanager
def bm25_constants(k1: float, b: float, average: float) -> Iterator[None]:
    """The keyword encoder's BM25 constants, set for a block (the lab's own process only)."""
    saved = keywords.BM25_K1, keywords.BM25_B, keywords.AVERAGE_TERMS
    keywords.BM25_K1, keywords.BM25_B, keywords.AVERAGE_TERMS = k1, b, average
    try:
        yield
    finally:
        keywords.BM25_K1, keywords.BM25_B, keywords.AVERAGE_TERMS = saved


def bm25(
    principals: Sequence[Principal], lab: Lab, sem: Sequence[Vector]
) -> dict[str, list[Scores]]:
    """The BM25 lever's grid: every document encoded again under each k1, b and length."""
    grid = {}
    for k1 in (0.9, 1.2, 1.6, 2.0):
        for b in (0.5, 0.75, 0.9):
            for average in (128.0, 256.0):
                with bm25_constants(k1, b, average):
                    kw = Matrices(lab.keyword_documents(SERVICE_KEYWORD), lab).scores()
                grid[f"k1={k1:g} b={b:g} average={average:g}"] = per_file(
                    principals, kw, sem, service_fusion
                )
    return grid


def _standing(values: Vector) -> float:
    """How far a side's best turn stands out: its z-score among the side's top 50."""
    top = np.sort(values)[::-1][:MIN_RETRIEVAL_TURNS]
    return float((top[0] - top.mean()) / (top.std() + 1e-9))


def adaptive_fusion(base: float, gamma: float) -> Ranker:
    """Min-max fusion whose keyword share moves, per query, towards the side whose best
    turn stands out more (`_standing`); gamma 0 is the service's fusion at `base`."""

    def rank(kw: Vector, sem: Vector) -> list[int]:
        logit = math.log(base / (1 - base)) + gamma * (_standing(kw) - _standing(sem))
        w = 1 / (1 + math.exp(-logit))
        total: dict[int, float] = {}
        for i, v in _normalized(
            kw, [i for i in ranked(kw, MIN_RETRIEVAL_TURNS) if kw[i] > 0], "minmax"
        ).items():
            total[i] = total.get(i, 0.0) + w * v
        for i, v in _normalized(sem, ranked(sem, MIN_RETRIEVAL_TURNS), "minmax").items():
            total[i] = total.get(i, 0.0) + (1 - w) * v
        return sorted(total, key=lambda i: -total[i])[:10]

    return rank


def adaptive(
    principals: Sequence[Principal], kw: Sequence[Vector], sem: Sequence[Vector]
) -> dict[str, list[Scores]]:
    """The adaptive fusion's grid: the base keyword share and how far a query moves it."""
    return {
        f"base={base:g} gamma={gamma:g}": per_file(
            principals, kw, sem, adaptive_fusion(base, gamma)
        )
        for base in (0.7, 0.8)
        for gamma in (0.0, 0.2, 0.4, 0.8)
    }


def dense_feedback(
    principals: Sequence[Principal], lab: Lab, kw: Sequence[Vector], sem: Sequence[Vector]
) -> dict[str, list[Scores]]:
    """The dense feedback lever's grid (Rocchio on the semantic side): the query's vector plus
    beta times the mean of the vectors of the fused top k turns (each turn's windows averaged),
    renormalized, searched again on the semantic side and fused with the same keyword side;
    one more vector query in the service."""
    docs = lab.dense_vectors("own")
    turn_vectors = []
    for windows in docs:
        m = np.stack([w.mean(axis=0) for w in windows])
        turn_vectors.append(m / np.linalg.norm(m, axis=1, keepdims=True))
    grid = {}
    for k in (1, 3, 5, 10):
        for beta in (0.1, 0.2, 0.35, 0.5):
            moved = []
            for p, d, tv, kwp, sep in zip(principals, docs, turn_vectors, kw, sem, strict=True):
                q = lab.query_vectors(p.name).copy()
                for qi in range(len(q)):
                    top = service_fusion(kwp[qi], sep[qi])[:k]
                    v = q[qi] + beta * tv[top].mean(axis=0)
                    q[qi] = v / np.linalg.norm(v)
                moved.append(np.stack([np.max(w @ q.T, axis=0) for w in d], axis=1))
            grid[f"k={k} beta={beta:g}"] = per_file(principals, kw, moved, service_fusion)
    return grid


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--cache", type=Path, help="keep the turns' vectors here between runs")
    ap.add_argument("--embedder", choices=sorted(EMBEDDERS), default="minilm-int8")
    ap.add_argument("--levers", default=",".join(LEVERS), help=f"some of {','.join(LEVERS)}")
    args = ap.parse_args(argv)
    principals = dev_principals(args.data, "search_levers_more")
    if principals is None:
        return 2
    lab = lab_for(principals, args.embedder, args.cache)
    sem = lab.dense_scores("own")
    mx = Matrices(lab.keyword_documents(SERVICE_KEYWORD), lab)
    kw = mx.scores()
    baseline = merged(per_file(principals, kw, sem, service_fusion)).row()
    print(
        f"questions: {sum(len(p.questions) for p in principals)};"
        " figures: recall@1 recall@5 recall@10 MRR@10"
    )
    print(f"{'service':<11}           {fmt(baseline)} (keyword {SERVICE_KEYWORD}, {args.embedder})")
    for lever in args.levers.split(","):
        if lever == "feedback":
            report(lever, feedback(principals, mx, sem), baseline)
        elif lever == "utterances":
            report(lever, utterances(principals, lab, kw, sem), baseline)
        elif lever == "bm25":
            report(lever, bm25(principals, lab, sem), baseline)
        elif lever == "adaptive":
            report(lever, adaptive(principals, kw, sem), baseline)
        elif lever == "dense-feedback":
            report(lever, dense_feedback(principals, lab, kw, sem), baseline)
        else:
            ap.error(f"unknown lever {lever!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
