"""Writes tests/vectors/e5_small_v2_reference.json: e5-small-v2 (8 bits) vectors computed the
model card's way, the reference for server/adapters/embedding/e5_small_v2.py.

What it proves. The recipe here is the one the model's card gives and shares no code with the
adapter: the prefix joined to the text as a string ("passage: ..." / "query: ..."), the
tokenizer's own template adding [CLS] and [SEP] (`add_special_tokens`), the model run with
onnxruntime's default session, and the mean over the attention mask, made unit length. Texts
that fit in one window are embedded; for longer ones the reference holds the window count the
window rule gives (the adapter's `window_spans` with 508 word pieces, overlap 32, fitted). The
test then proves the adapter computes the same vectors (prefixes, special tokens, pooling) and
catches a changed model file, tokenizer or window rule. It cannot prove the 8-bit export
against intfloat's float model (torch and the Hugging Face hub are not available here);
LangChain4j ships and runs this same export.

Texts: those of tests/vectors/minilm_reference.json, as for the other models. Run in the
project's venv after the model is fetched (`make setup`):

    .venv/bin/python scripts/e5_small_v2_reference.py
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort  # type: ignore[import-untyped]
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DECIMALS = 5


def main() -> None:
    from server.adapters.embedding.e5_small_v2 import (
        ARTIFACT,
        MAX_TOKENS,
        MODEL_FILE,
        TOKENIZER_FILE,
        default_model_dir,
    )
    from server.adapters.embedding.minilm import WINDOW_OVERLAP, window_spans

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "tests/vectors/e5_small_v2_reference.json"
    )
    args = parser.parse_args()
    texts = json.loads((ROOT / "tests/vectors/minilm_reference.json").read_text("utf-8"))
    tokenizer = Tokenizer.from_file(str(default_model_dir() / TOKENIZER_FILE))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    session = ort.InferenceSession(str(default_model_dir() / MODEL_FILE))

    def embed(text: str) -> list[float]:
        encoding = tokenizer.encode(text, add_special_tokens=True)
        feed = {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }
        (hidden,) = session.run(None, feed)
        mask = feed["attention_mask"][0][:, None].astype(np.float64)
        pooled = (hidden[0] * mask).sum(axis=0) / mask.sum()
        return [round(float(x), DECIMALS) for x in pooled / np.linalg.norm(pooled)]

    window = MAX_TOKENS - 2 - len(tokenizer.encode("passage: ", add_special_tokens=False).ids)
    cases = []
    for case in texts["cases"]:
        name, text = case["name"], case["text"]
        pieces = len(tokenizer.encode(text, add_special_tokens=False).ids)
        windows = len(window_spans(pieces, window, WINDOW_OVERLAP, fitted=True))
        entry: dict[str, object] = {"name": name, "text": text, "windows": windows}
        if windows == 1:
            entry["passage"] = embed("passage: " + text)
            entry["query"] = embed("query: " + text)
        cases.append(entry)
        print(f"{name:22} {windows} window(s)")
    document = {
        "description": (
            "e5-small-v2 (8 bits, Xenova's ONNX export in LangChain4j's jar) vectors computed "
            "the model card's way, the reference for server/adapters/embedding/e5_small_v2.py. "
            "Made by scripts/e5_small_v2_reference.py; see its docstring for what it proves."
        ),
        "generated_with": {
            "artifact": f"{ARTIFACT.group}:{ARTIFACT.name}:{ARTIFACT.version}",
            "onnxruntime": ort.__version__,
            "python": platform.python_version(),
        },
        "window_tokens": window,
        "window_overlap": WINDOW_OVERLAP,
        "decimals": DECIMALS,
        "cases": cases,
    }
    lines = ["{"]
    for key in ("description", "generated_with", "window_tokens", "window_overlap", "decimals"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(document[key], ensure_ascii=False)},")
    lines.append('  "cases": [')
    for i, entry in enumerate(cases):
        tail = "," if i < len(cases) - 1 else ""
        lines.append(f"    {json.dumps(entry, ensure_ascii=False)}{tail}")
    lines.append("  ]")
    lines.append("}")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    json.loads(args.out.read_text(encoding="utf-8"))  # it must parse
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
