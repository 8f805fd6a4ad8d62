"""Search quality on the labelled evaluation set: keyword-only, semantic-only and hybrid.

Builds one chunk index over bench/eval/dataset.json with the real components (chunking, the
BM25 keyword encoder, all-MiniLM-L6-v2 on onnxruntime, the embedded Qdrant engine or a Qdrant
collection in qdrant-client's local mode), then asks every question through the service's own
search operation (`ConversationSearch.search`: sanitizing, query encoding, retrieval depth,
`fuse`). The index's answer to that one call is recorded, so the three rankings compared per
question come from the same retrieval:

- keyword-only: the index's keyword side (BM25, best chunk per turn), cut to the page size;
- semantic-only: the index's semantic side (dense MAX_SIM over windows), cut likewise;
- hybrid: what the service returns (reciprocal rank fusion of the two).

Metrics per question, averaged overall and per category (README in bench/eval/):
recall@k = |relevant turns in the top k| / min(k, |relevant turns|), and MRR = 1 / rank of
the first relevant turn in the top `--page-size` (0 if none). A hit from another principal's
conversation is counted as a leak.

Exit status: 0 when hybrid recall@5 beats both single sides and nothing leaked; 1 otherwise,
with the reason; 2 on a setup error.

    .venv/bin/python bench/bench_search_quality.py                 # embedded engine, ~1-2 min
    .venv/bin/python bench/bench_search_quality.py --engine server # qdrant-client local mode
    .venv/bin/python bench/bench_search_quality.py --misses 20     # also list hybrid misses @5
    .venv/bin/python bench/bench_search_quality.py --json out.json # also write the figures
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from server.domain.chunking import split_turn
from server.domain.keywords import KeywordEncoder
from server.domain.model import (
    EncodedQuery,
    Identity,
    IndexedChunk,
    PrincipalMemory,
    RetrievalResult,
    SearchHit,
    SearchScope,
    TurnKey,
)
from server.domain.ports import ChunkIndex
from server.domain.search import ConversationSearch
from server.storage.embedding import OnnxMiniLmEmbedder

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / "bench" / "eval" / "dataset.json"
CATEGORIES = ("exact_id", "keyword", "paraphrase", "mixed")
METHODS = ("keyword", "semantic", "hybrid")
CUTOFFS = (1, 5, 10)
TARGET_K = 5
EMBED_BATCH = 64  # chunks per embed_documents call while building

Key = tuple[str, str]  # (conversation_id, turn_id)


# ------------------------------------------------------------------ the service, minus SQL


class _Memory:
    """Memory store stand-in: every principal has memory on (no block, no settings)."""

    def read(self, tenant_id: str, principal_id: str, *, fresh: bool = False) -> PrincipalMemory:
        return PrincipalMemory(block=None, settings=None)


class _Turns:
    """Turn store stand-in for search: nothing is deleted."""

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        return frozenset()


class RecordingIndex:
    """Passes searches to the real index and keeps the last RetrievalResult."""

    def __init__(self, index: ChunkIndex) -> None:
        self.index = index
        self.last: RetrievalResult | None = None
        self.last_turns = 0

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        self.last = self.index.search(scope, query, turns)
        self.last_turns = turns
        return self.last


def open_index(engine: str, directory: Path, dimension: int, model_id: str) -> ChunkIndex:
    if engine == "edge":
        from server.storage.qdrant_edge import QdrantEdgeChunkIndex

        return QdrantEdgeChunkIndex(directory / "chunks", dimension, model_id)
    from qdrant_client import QdrantClient

    from server.storage.qdrant_server import QdrantServerChunkIndex

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Payload indexes have no effect", UserWarning)
        client = QdrantClient(path=str(directory / "qdrant-local"))
        return QdrantServerChunkIndex(client, "chunks", dimension, model_id)


# ------------------------------------------------------------------ metrics


@dataclass
class Scores:
    n: int = 0
    recall: dict[int, float] = field(default_factory=lambda: dict.fromkeys(CUTOFFS, 0.0))
    rr: float = 0.0

    def add(self, ranking: Sequence[Key], relevant: set[Key], page: int) -> None:
        self.n += 1
        for k in CUTOFFS:
            found = len(relevant.intersection(ranking[:k]))
            self.recall[k] += found / min(k, len(relevant))
        for rank, key in enumerate(ranking[:page], start=1):
            if key in relevant:
                self.rr += 1.0 / rank
                break

    def row(self) -> dict[str, float]:
        d = max(self.n, 1)
        out = {f"recall@{k}": self.recall[k] / d for k in CUTOFFS}
        out["mrr"] = self.rr / d
        return out


def fmt_table(results: dict[str, dict[str, Scores]]) -> str:
    head = f"{'category':<11} {'n':>4}  {'method':<9}" + "".join(
        f"{h:>8}" for h in ("R@1", "R@5", "R@10", "MRR")
    )
    lines = [head, "-" * len(head)]
    for cat in ("overall", "macro", *CATEGORIES):
        if cat == "macro":
            present = [c for c in CATEGORIES if c in results]
            rows = {
                m: {
                    key: sum(results[c][m].row()[key] for c in present) / max(len(present), 1)
                    for key in ("recall@1", "recall@5", "recall@10", "mrr")
                }
                for m in METHODS
            }
            for i, m in enumerate(METHODS):
                r = rows[m]
                label = f"{'macro':<11} {'':>4}" if i == 0 else " " * 16
                lines.append(
                    f"{label}  {m:<9}"
                    + "".join(f"{r[k]:>8.3f}" for k in ("recall@1", "recall@5", "recall@10", "mrr"))
                )
            lines.append("")
            continue
        if cat not in results:
            continue
        rows = {m: results[cat][m].row() for m in METHODS}
        best5 = max(r["recall@5"] for r in rows.values())
        for i, m in enumerate(METHODS):
            r = rows[m]
            label = f"{cat:<11} {results[cat][m].n:>4}" if i == 0 else " " * 16
            mark = " *" if r["recall@5"] == best5 else ""
            lines.append(
                f"{label}  {m:<9}"
                + "".join(f"{r[k]:>8.3f}" for k in ("recall@1", "recall@5", "recall@10", "mrr"))
                + mark
            )
        lines.append("")
    lines.append("macro: the mean of the four categories, so the category mix cannot decide alone")
    lines.append("* best recall@5 in its category (ties marked on each)")
    return "\n".join(lines)


# ------------------------------------------------------------------ diagnostics


def rrf(
    result: RetrievalResult, turns: int, k: float, depth: int, w_kw: float, w_sem: float
) -> list[Key]:
    """Weighted reciprocal rank fusion over each side's top `depth`, with `fuse`'s tie-break.
    With k=60, depth=all and both weights 1 it ranks exactly as `fuse` (checked in `sweep`)."""
    ranks: dict[Key, dict[str, int]] = {}
    for side, hits in (("keyword", result.keyword[:depth]), ("semantic", result.semantic[:depth])):
        for rank, h in enumerate(hits, start=1):
            ranks.setdefault((h.conversation_id, h.turn_id), {}).setdefault(side, rank)
    weight = {"keyword": w_kw, "semantic": w_sem}
    scored = [
        (-sum(weight[s] / (k + r) for s, r in sides.items()), min(sides.values()), key)
        for key, sides in ranks.items()
    ]
    scored.sort()
    return [key for _, _, key in scored[:turns]]


SWEEP: list[tuple[str, dict[str, float]]] = [
    ("service: RRF k=60, depth 10", {"k": 60, "depth": 10, "w_kw": 1, "w_sem": 1}),
    ("RRF k=60, depth 30", {"k": 60, "depth": 30, "w_kw": 1, "w_sem": 1}),
    ("RRF k=60, depth 20", {"k": 60, "depth": 20, "w_kw": 1, "w_sem": 1}),
    ("RRF k=60, depth 5", {"k": 60, "depth": 5, "w_kw": 1, "w_sem": 1}),
    ("RRF k=10, depth 30", {"k": 10, "depth": 30, "w_kw": 1, "w_sem": 1}),
    ("RRF k=60, depth 30, keyword x0.5", {"k": 60, "depth": 30, "w_kw": 0.5, "w_sem": 1}),
    ("RRF k=60, depth 10, keyword x0.5", {"k": 60, "depth": 10, "w_kw": 0.5, "w_sem": 1}),
]


def sweep(raw: list[tuple[dict[str, Any], RetrievalResult, list[Key]]], page: int) -> str:
    """Recall@5 of other fusions of the very same retrievals. Diagnostic: the pass/fail
    above is the service's `fuse` only."""
    depth = max((max(len(r.keyword), len(r.semantic)) for _, r, _ in raw), default=0)
    mismatch = sum(rrf(r, page, 60, depth, 1, 1) != hybrid for _, r, hybrid in raw)
    head = f"{'fusion of the same two sides (diagnostic)':<36}" + "".join(
        f"{c[:10]:>11}" for c in ("overall", *CATEGORIES)
    )
    lines = [
        f"sweep: recall@{TARGET_K}; re-fusing with the service's settings reproduces "
        f"fuse() on {len(raw) - mismatch}/{len(raw)} questions",
        head,
        "-" * len(head),
    ]
    for label, p in SWEEP:
        per: dict[str, Scores] = defaultdict(Scores)
        for q, result, _ in raw:
            ranking = rrf(result, page, p["k"], int(p["depth"]), p["w_kw"], p["w_sem"])
            relevant = {(x["conversation_id"], x["turn_id"]) for x in q["relevant"]}
            per["overall"].add(ranking, relevant, page)
            per[q["category"]].add(ranking, relevant, page)
        lines.append(
            f"{label:<36}"
            + "".join(
                f"{per[c].row()[f'recall@{TARGET_K}']:>11.3f}" for c in ("overall", *CATEGORIES)
            )
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", type=Path, default=DATASET)
    ap.add_argument(
        "--engine",
        choices=("edge", "server"),
        default="edge",
        help="edge: embedded qdrant-edge (default); server: qdrant-client local mode",
    )
    ap.add_argument(
        "--page-size",
        type=int,
        default=10,
        help="turns asked of the service per question (default 10, the largest k)",
    )
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads (default 2)")
    ap.add_argument(
        "--misses", type=int, default=0, help="list up to N questions that hybrid misses at @5"
    )
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument(
        "--sweep",
        action="store_true",
        help="also score other fusions of the same retrievals (diagnostic only)",
    )
    args = ap.parse_args()
    if args.page_size < max(CUTOFFS):
        print(f"--page-size must be at least {max(CUTOFFS)}", file=sys.stderr)
        return 2
    try:
        data = json.loads(args.dataset.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        print(f"cannot read the dataset {args.dataset}: {error}", file=sys.stderr)
        return 2
    turns: list[dict[str, str]] = data["turns"]
    questions: list[dict[str, Any]] = data["questions"]
    owner = {(t["conversation_id"]): (t["tenant_id"], t["principal_id"]) for t in turns}

    started = time.perf_counter()
    embedder = OnnxMiniLmEmbedder(intra_op_threads=args.threads)
    keywords = KeywordEncoder()
    load_s = time.perf_counter() - started

    with tempfile.TemporaryDirectory(prefix="memoria-quality-") as tmp:
        index = open_index(args.engine, Path(tmp), embedder.dimension, embedder.model_id)
        try:
            # Build: chunk every turn, embed all chunks in batches, upsert turn by turn.
            t0 = time.perf_counter()
            chunked = [split_turn(t["question"], t["answer"]) for t in turns]
            texts = [c for ch in chunked for c in ch.chunks]
            dense: list[Any] = []
            for i in range(0, len(texts), EMBED_BATCH):
                dense.extend(embedder.embed_documents(texts[i : i + EMBED_BATCH]))
            embed_s = time.perf_counter() - t0
            vectors = iter(dense)
            t1 = time.perf_counter()
            for t, ch in zip(turns, chunked, strict=True):
                key = TurnKey(t["tenant_id"], t["principal_id"], t["conversation_id"], t["turn_id"])
                when = datetime.fromisoformat(t["turn_time"].replace("Z", "+00:00"))
                index.upsert_turn(
                    key,
                    when.astimezone(UTC),
                    [
                        IndexedChunk(i, text, next(vectors), keywords.encode_document(text))
                        for i, text in enumerate(ch.chunks)
                    ],
                )
            upsert_s = time.perf_counter() - t1
            windows = sum(len(m) for m in dense)
            multi = sum(len(ch.chunks) > 1 for ch in chunked)
            truncated = sum(ch.truncated for ch in chunked)

            recorder = RecordingIndex(index)
            service = ConversationSearch(
                _Turns(),  # type: ignore[arg-type]
                recorder,  # type: ignore[arg-type]
                embedder,
                keywords,
                _Memory(),  # type: ignore[arg-type]
                None,  # type: ignore[arg-type]  # the indexer: not used by search
                lambda: datetime.now(UTC),
            )

            results: dict[str, dict[str, Scores]] = defaultdict(
                lambda: {m: Scores() for m in METHODS}
            )
            leaks: list[str] = []
            misses: list[str] = []
            raw: list[tuple[dict[str, Any], RetrievalResult, list[Key]]] = []
            t2 = time.perf_counter()
            for q in questions:
                who = Identity(q["tenant_id"], q["principal_id"])
                hybrid: list[SearchHit] = service.search(who, q["query"], args.page_size)
                result = recorder.last
                assert result is not None
                rankings = {
                    "keyword": [(h.conversation_id, h.turn_id) for h in result.keyword],
                    "semantic": [(h.conversation_id, h.turn_id) for h in result.semantic],
                    "hybrid": [(h.conversation_id, h.turn_id) for h in hybrid],
                }
                rankings = {m: r[: args.page_size] for m, r in rankings.items()}
                raw.append((q, result, rankings["hybrid"]))
                relevant = {(r["conversation_id"], r["turn_id"]) for r in q["relevant"]}
                for m, ranking in rankings.items():
                    results["overall"][m].add(ranking, relevant, args.page_size)
                    results[q["category"]][m].add(ranking, relevant, args.page_size)
                    for conv, _ in ranking:
                        if owner.get(conv) != (q["tenant_id"], q["principal_id"]):
                            leaks.append(f"{q['id']} {m}: {conv} of {owner.get(conv)}")
                if not relevant.intersection(rankings["hybrid"][:TARGET_K]):
                    rank = {
                        m: next((i for i, k in enumerate(r, 1) if k in relevant), 0)
                        for m, r in rankings.items()
                    }
                    misses.append(
                        f"  {q['id']} [{q['category']}] {q['query']!r}  ranks: "
                        + ", ".join(f"{m} {v or '-'}" for m, v in rank.items())
                    )
            query_s = time.perf_counter() - t2
            depth = recorder.last_turns
        finally:
            index.close()

    principals = {(t["tenant_id"], t["principal_id"]) for t in turns}
    conversations = {(t["tenant_id"], t["principal_id"], t["conversation_id"]) for t in turns}
    per_cat = {c: results[c]["hybrid"].n for c in CATEGORIES}
    shown = args.dataset.relative_to(ROOT) if args.dataset.is_relative_to(ROOT) else args.dataset
    print(
        f"dataset   {shown}: "
        f"{len(principals)} principals, {len(conversations)} conversations, {len(turns)} turns, "
        f"{len(questions)} questions (" + ", ".join(f"{c} {n}" for c, n in per_cat.items()) + ")"
    )
    print(
        f"index     {args.engine}: {len(texts)} chunks ({multi} turns split into several, "
        f"{truncated} truncated), {windows} embedding windows; model {embedder.model_id}"
    )
    print(
        f"build     model load {load_s:.1f} s, embedding {embed_s:.1f} s, upserts {upsert_s:.1f} s"
        f" (total {load_s + embed_s + upsert_s:.1f} s)"
    )
    print(
        f"queries   {len(questions)} through ConversationSearch.search, page size "
        f"{args.page_size}, retrieval depth {depth} turns per side: {query_s:.1f} s "
        f"({1000 * query_s / max(len(questions), 1):.1f} ms each)"
    )
    print()
    print(fmt_table(results))

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "engine": args.engine,
                    "questions": len(questions),
                    "turns": len(turns),
                    "chunks": len(texts),
                    "page_size": args.page_size,
                    "results": {
                        c: {m: {"n": s.n, **s.row()} for m, s in ms.items()}
                        for c, ms in results.items()
                    },
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )

    if args.sweep:
        print()
        print(sweep(raw, args.page_size))

    if args.misses and misses:
        print(f"\nhybrid misses at @{TARGET_K} ({len(misses)}; first {args.misses}):")
        print("\n".join(misses[: args.misses]))

    failed = False
    if leaks:
        print(
            f"\nFAIL: {len(leaks)} hits from another principal's conversations, e.g.:",
            *leaks[:5],
            sep="\n  ",
            file=sys.stderr,
        )
        failed = True
    overall = {m: results["overall"][m].row()[f"recall@{TARGET_K}"] for m in METHODS}
    if not (overall["hybrid"] > overall["keyword"] and overall["hybrid"] > overall["semantic"]):
        print(
            f"\nFAIL: hybrid recall@{TARGET_K} {overall['hybrid']:.3f} does not beat both "
            f"keyword-only {overall['keyword']:.3f} and semantic-only {overall['semantic']:.3f} "
            "(issue 3, item 8); see the per-category rows above",
            file=sys.stderr,
        )
        failed = True
    if failed:
        return 1
    print(
        f"\nOK: hybrid recall@{TARGET_K} {overall['hybrid']:.3f} beats keyword-only "
        f"{overall['keyword']:.3f} and semantic-only {overall['semantic']:.3f}; no leaks"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
