"""Which activation channels the 8-bit all-MiniLM-L6-v2 keeps in float32: measures and prints
server/adapters/embedding/minilm_graph.py's FLOAT_CHANNELS table.

Runs the float32 graph (the same builder, every dense layer's input exposed as an output) over
the LoCoMo development files' texts, each turn and each question as one window, and records
each input channel's largest absolute value. A channel is kept in float32 when that value is
above RATIO times the median channel's (at most LIMIT a layer): those few channels, large on
every text, are what made the one 8-bit scale per activation coarse (bench/README.md,
"Indexing in 8 bits"). The dev set is the one set the project tunes on; the table is numbers
only, and depends on the weights, so their hash is printed with it.

    .venv/bin/python bench/int8_channels.py [--data DIR] [--files 26.json,30.json]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search_quality import DEFAULT_DATA, FILES, load

from server.adapters.embedding import minilm, minilm_graph
from server.domain.chunking import turn_text

RATIO = 3.0
LIMIT = 32


def linear_inputs(model: object) -> dict[str, str]:
    """Dense layer prefix -> the name of its input tensor, in a float32 graph."""
    out = {}
    for node in model.graph.node:  # type: ignore[attr-defined]
        if node.op_type == "MatMul" and node.input[1].endswith(".weight_t"):
            out[node.input[1].removesuffix(".weight_t")] = node.input[0]
    return out


def channel_maxima(texts: Sequence[str]) -> dict[str, npt.NDArray[np.float32]]:
    """Per dense layer: each input channel's largest absolute value over `texts`."""
    import onnx
    import onnxruntime as ort  # type: ignore[import-untyped]
    from safetensors.numpy import load as load_safetensors

    model_dir = minilm.packaged_model_dir()
    model = minilm_graph.build_model(
        load_safetensors((model_dir / "model.safetensors").read_bytes()),
        minilm_graph.BertConfig.from_file(model_dir / "config.json"),
    )
    inputs = linear_inputs(model)
    names = sorted(set(inputs.values()))
    for name in names:
        model.graph.output.append(
            onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    embedder = minilm.OnnxMiniLmEmbedder(intra_op_threads=1)
    maxima: dict[str, npt.NDArray[np.float32]] = {}
    for text in texts:
        ids = embedder._word_pieces(text)[: minilm.WINDOW_WORD_PIECES]
        row = np.array([[embedder._cls_id, *ids, embedder._sep_id]], np.int64)
        outputs = session.run(names, {"input_ids": row, "attention_mask": np.ones_like(row)})
        for name, value in zip(names, outputs, strict=True):
            largest = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            maxima[name] = np.maximum(maxima[name], largest) if name in maxima else largest
    return {prefix: maxima[name] for prefix, name in inputs.items()}


def chosen(maxima: npt.NDArray[np.float32]) -> tuple[int, ...]:
    """The channels above RATIO x the median channel's maximum, the largest LIMIT, in order."""
    floor = RATIO * float(np.median(maxima))
    largest = [int(i) for i in np.argsort(-maxima) if maxima[i] > floor][:LIMIT]
    return tuple(sorted(largest))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--files", default=",".join(FILES), help="the dev files to measure on")
    args = ap.parse_args(argv)
    texts = []
    for name in args.files.split(","):
        turns, questions = load(args.data / name, f"locomo-{Path(name).stem}")
        texts += [turn_text(t.question, t.answer) for t in turns] + [q.text for q in questions]
    maxima = channel_maxima(texts)
    weights = (minilm.packaged_model_dir() / "model.safetensors").read_bytes()
    print(f"# {len(texts)} texts of {args.files}; ratio {RATIO:g}, at most {LIMIT} a layer")
    print(f'FLOAT_CHANNELS_WEIGHTS = "{hashlib.sha256(weights).hexdigest()[:16]}"')
    print("FLOAT_CHANNELS = {")
    for prefix in sorted(
        maxima, key=lambda p: [int(x) if x.isdigit() else x for x in p.split(".")]
    ):
        if channels := chosen(maxima[prefix]):
            print(f'    "{prefix}": {channels},')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
