"""The e5-small-v2 (8-bit) embedder: the model card's vectors, windows over long texts, each
window its own run, safe to share between threads; refused clearly when not fetched.

The reference (tests/vectors/e5_small_v2_reference.json, scripts/e5_small_v2_reference.py)
is computed the model card's way with no code shared with the adapter. The model is fetched at
setup (`make setup`: scripts/fetch_model.py) and loaded once for the module.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.adapters.embedding.e5_small_v2 import (
    DIMENSION,
    MODEL_FILE,
    TOKENIZER_FILE,
    E5SmallV2Embedder,
    default_model_dir,
)
from server.adapters.embedding.minilm import WINDOW_OVERLAP
from server.domain.ports import Embedder
from server.runtime.builders.embedding import build_embedder
from server.runtime.settings import Settings, StartupRefusal

REFERENCE = Path(__file__).resolve().parents[1] / "vectors" / "e5_small_v2_reference.json"
MIN_COSINE = 0.9999


@pytest.fixture(scope="module")
def embedder() -> E5SmallV2Embedder:
    return E5SmallV2Embedder()


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(REFERENCE.read_text(encoding="utf-8"))
    return document


def cosine(a: Any, b: Any) -> float:
    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


def test_implements_the_port(embedder: E5SmallV2Embedder, reference: dict[str, Any]) -> None:
    port: Embedder = embedder
    assert port.dimension == DIMENSION == 384
    assert port.model_id == (
        f"e5-small-v2-int8:sha256-7d9092cb25f2bd1c:window={reference['window_tokens']}"
        f":overlap={WINDOW_OVERLAP}:fitted"
    )
    assert reference["window_tokens"] == 508  # 512 less [CLS], [SEP] and "passage", ":"
    assert reference["window_overlap"] == WINDOW_OVERLAP


def test_documents_and_queries_agree_with_the_model_cards_recipe(
    embedder: E5SmallV2Embedder, reference: dict[str, Any]
) -> None:
    single = [c for c in reference["cases"] if c["windows"] == 1]
    assert len(single) >= 10  # plain, ids, accents, CJK, emoji, code, empty ...
    documents = embedder.embed_documents([c["text"] for c in single])
    for case, multivector in zip(single, documents, strict=True):
        (vector,) = multivector
        assert cosine(vector, case["passage"]) >= MIN_COSINE, case["name"]
        assert cosine(embedder.embed_query(case["text"]), case["query"]) >= MIN_COSINE, case["name"]
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_the_prefixes_make_a_query_differ_from_its_passage(
    embedder: E5SmallV2Embedder, reference: dict[str, Any]
) -> None:
    text = reference["cases"][0]["text"]
    (passage,) = embedder.embed_documents([text])[0]
    assert cosine(passage, embedder.embed_query(text)) < 0.99


def test_long_texts_are_windows_of_the_rule(
    embedder: E5SmallV2Embedder, reference: dict[str, Any]
) -> None:
    for case in reference["cases"]:
        (vectors,) = embedder.embed_documents([case["text"]])
        assert len(vectors) == case["windows"], case["name"]
    long = next(c for c in reference["cases"] if c["windows"] > 1)
    windows = embedder.embed_documents([long["text"]])[0]
    assert cosine(windows[0], windows[-1]) < 0.999  # each window holds its own part


def test_a_window_never_depends_on_what_is_embedded_beside_it(
    embedder: E5SmallV2Embedder,
) -> None:
    """The export quantizes its activations per run: batched, a short text's vector would move
    with a long neighbour's. Each window runs alone."""
    short = "My dentist appointment moved to Thursday."
    alone = embedder.embed_documents([short])[0]
    beside = embedder.embed_documents(["budget " * 900, short])[1]
    assert alone == beside


def test_it_ranks_the_answering_passage_first(embedder: E5SmallV2Embedder) -> None:
    passages = [
        "We moved the team offsite to the lake house on the 14th of June.",
        "My account number at the credit union is acct-4821.",
        "The sourdough needs twelve hours of proofing before baking.",
    ]
    vectors = [v[0] for v in embedder.embed_documents(passages)]
    query = embedder.embed_query("Which account do I have at the credit union?")
    scores = [cosine(query, v) for v in vectors]
    assert max(range(3), key=scores.__getitem__) == 1


def test_threads_get_the_same_vectors(embedder: E5SmallV2Embedder) -> None:
    texts = [f"note {i}: the meeting with Ana is at {i} pm" for i in range(16)]
    expected = embedder.embed_documents(texts)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: embedder.embed_documents([t])[0], texts))
    assert got == expected


def test_a_missing_or_other_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"scripts/fetch_model\.py"):
        E5SmallV2Embedder(tmp_path)
    shutil.copy(default_model_dir() / TOKENIZER_FILE, tmp_path / TOKENIZER_FILE)
    (tmp_path / MODEL_FILE).write_bytes(b"not the model")
    with pytest.raises(ValueError, match="not the pinned model"):
        E5SmallV2Embedder(tmp_path)


def test_the_setting_runs_it(tmp_path: Path) -> None:
    made = build_embedder(Settings(data_dir=tmp_path, local_embedding_model="e5-small-v2-int8"))
    assert isinstance(made, E5SmallV2Embedder)


def test_the_server_refuses_to_start_without_the_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import server.adapters.embedding.e5_small_v2 as module

    monkeypatch.setattr(module, "default_model_dir", lambda: tmp_path / "absent")
    with pytest.raises(StartupRefusal) as refused:
        build_embedder(Settings(data_dir=tmp_path, local_embedding_model="e5-small-v2-int8"))
    assert "scripts/fetch_model.py" in str(refused.value)
