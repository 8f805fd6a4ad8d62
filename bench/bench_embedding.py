"""The in-process embedder's cost: startup, one query, and 4,000-character chunks per second.

What it measures
----------------
``OnnxMiniLmEmbedder`` (server/adapters/embedding/minilm.py) runs all-MiniLM-L6-v2 on onnxruntime in
the server process. Its cost bounds two things: the latency a search adds before the engine
is even asked (one query embedding per ``SearchConversations``), and how fast the indexing
worker can drain the outbox (chunks of up to 4,000 characters, each embedded as several
254-word-piece windows). For each intra-op thread count given (default 1 and 2) it prints:

* ``startup``: building the ONNX graph from the packaged weights and the session (the reason
  the graph is built in memory at every start rather than cached on disk);
* ``query``: ``embed_query`` of short questions (5-25 words), p50 and p99 in milliseconds;
* ``chunks``: ``embed_documents`` of 4,000-character chunks, 10 per call (a turn's most), in
  chunks/s, windows/s and word pieces per chunk;
* ``under indexing``: the query latency again while another thread embeds chunks without
  pause (the server's worker next to its gRPC handlers), with the chunks/s that thread
  reached; the ratio of its p99 to the idle p99 is printed, as the noisy 2-core reference
  machine makes ratios steadier than absolute numbers.

Usage (from the repository root)::

    .venv/bin/python bench/bench_embedding.py                  # ~1 minute
    .venv/bin/python bench/bench_embedding.py --threads 1 --queries 2000 --chunks 100

Nothing is started outside this process; the texts are generated from a fixed seed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]  # ships no type information
from safetensors.numpy import load_file
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from server.adapters.embedding import minilm_graph as onnx_minilm  # noqa: E402  (after the path insert)
from server.adapters.embedding.minilm import OnnxMiniLmEmbedder, packaged_model_dir  # noqa: E402

SEED = 20240601
CHUNK_CHARS = 4_000
CHUNKS_PER_CALL = 10  # DESIGN 3: at most 10 chunks per turn
WARMUP = 20


def sentence_pool() -> list[str]:
    """Sentences of the reference texts: English prose with names, ids, dates, some non-ASCII."""
    reference = json.loads(
        (REPO / "tests/vectors/minilm_reference.json").read_text(encoding="utf-8")
    )
    sentences: list[str] = []
    for case in reference["cases"]:
        sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+", case["text"]) if s.strip()]
    return sorted(set(sentences))


def make_chunks(count: int, rng: random.Random, pool: Sequence[str]) -> list[str]:
    """Chunks of at most 4,000 characters cut back to whitespace, as the chunker makes them."""
    chunks = []
    for _ in range(count):
        text = ""
        while len(text) < CHUNK_CHARS:
            text += rng.choice(pool) + ("\n\n" if rng.random() < 0.15 else " ")
        chunks.append(text[: text.rfind(" ", 0, CHUNK_CHARS)])
    return chunks


def make_queries(count: int, rng: random.Random, pool: Sequence[str]) -> list[str]:
    """Questions of 5-25 words, taken from the same prose."""
    words = " ".join(pool).split()
    queries = []
    for _ in range(count):
        start = rng.randrange(len(words) - 25)
        queries.append(" ".join(words[start : start + rng.randint(5, 25)]) + "?")
    return queries


def percentiles(samples_ms: Sequence[float]) -> tuple[float, float]:
    return float(np.percentile(samples_ms, 50)), float(np.percentile(samples_ms, 99))


def time_queries(embedder: OnnxMiniLmEmbedder, queries: Sequence[str]) -> list[float]:
    samples = []
    for query in queries:
        started = time.perf_counter()
        embedder.embed_query(query)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def time_graph_build() -> float:
    """Seconds to read the weights and build the graph, without the session."""
    started = time.perf_counter()
    model_dir = packaged_model_dir()
    onnx_minilm.build_model(
        load_file(str(model_dir / "model.safetensors")),
        onnx_minilm.BertConfig.from_file(model_dir / "config.json"),
    ).SerializeToString()
    return time.perf_counter() - started


def run(threads: int, queries: list[str], chunks: list[str], word_pieces: float) -> None:
    started = time.perf_counter()
    embedder = OnnxMiniLmEmbedder(intra_op_threads=threads)
    startup = time.perf_counter() - started
    graph = time_graph_build()
    print(f"\nintra_op_threads={threads}")
    print(f"  startup          {startup:6.2f} s (of which reading weights + graph {graph:.2f} s)")

    time_queries(embedder, queries[:WARMUP])
    idle = time_queries(embedder, queries)
    p50, p99 = percentiles(idle)
    print(f"  query            p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   ({len(queries)} queries)")

    embedder.embed_documents(chunks[:2])
    windows = 0
    started = time.perf_counter()
    for i in range(0, len(chunks), CHUNKS_PER_CALL):
        windows += sum(len(m) for m in embedder.embed_documents(chunks[i : i + CHUNKS_PER_CALL]))
    elapsed = time.perf_counter() - started
    print(
        f"  chunks           {len(chunks) / elapsed:6.2f} chunks/s   {windows / elapsed:6.1f} "
        f"windows/s   ({len(chunks)} chunks of <= {CHUNK_CHARS} chars, "
        f"{word_pieces:.0f} word pieces and {windows / len(chunks):.1f} windows each)"
    )

    stop = threading.Event()
    indexed = 0

    def index() -> None:
        nonlocal indexed
        while not stop.is_set():
            embedder.embed_documents(chunks[:2])
            indexed += 2

    worker = threading.Thread(target=index, name="indexing")
    worker.start()
    try:
        time.sleep(0.3)
        started = time.perf_counter()
        busy = time_queries(embedder, queries)
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        worker.join()
    b50, b99 = percentiles(busy)
    print(
        f"  under indexing   p50 {b50:6.2f} ms   p99 {b99:6.2f} ms   "
        f"(p99 x{b99 / p99:.1f} idle; indexing thread {indexed / elapsed:.2f} chunks/s)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--chunks", type=int, default=40)
    args = parser.parse_args(argv)

    rng = random.Random(SEED)
    pool = sentence_pool()
    queries = make_queries(args.queries, rng, pool)
    chunks = make_chunks(args.chunks, rng, pool)
    tokenizer = Tokenizer.from_file(str(packaged_model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    word_pieces = statistics.mean(
        len(tokenizer.encode(c, add_special_tokens=False).ids) for c in chunks
    )

    print(
        f"bench_embedding: {platform.python_version()}, onnxruntime {ort.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    )
    for threads in args.threads:
        run(threads, queries, chunks, word_pieces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
