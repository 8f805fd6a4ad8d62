"""A server configured for e5-small-v2 (MEMORIA_LOCAL_EMBEDDING_MODEL=e5-small-v2-int8), end to
end on the embedded default: it builds the model itself from the fetched files, indexes and
finds turns by meaning, records the model with the chunk index, fuses with the model's own
keyword share, and a store made with it keeps it when the setting is unset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memoria.v1 import conversation_search_service_pb2 as pb
from server.adapters.embedding.e5_small_v2 import MODEL_NAME
from server.domain.fusion import KEYWORD_WEIGHT, keyword_weight
from server.runtime.settings import Settings
from tests.api.test_embedding_endpoint_api import index, search, serving, who


def settings_for(data_dir: Path, **extra: object) -> Settings:
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "data_dir": data_dir,
        "page_token_secret": "test-page-token-secret-0123456789",
        "shutdown_grace_seconds": 1,
    }
    values.update(extra)
    return Settings(**values)


def recorded_model(data_dir: Path) -> str:
    record = json.loads((data_dir / "chunks" / "memoria-index.json").read_text())
    model: str = record["memoria_embedding_model"]
    return model


def test_turns_are_found_by_meaning_with_e5_small_v2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ana = who()
    # Semantic side only: the order can come from this model's vectors and nothing else.
    with serving(settings_for(data, local_embedding_model=MODEL_NAME, search_mode="semantic")) as (
        stub
    ):
        done = index(stub, ana, "t1", "Which airline do I fly?", "You fly with Lufthansa.")
        assert done.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
        index(stub, ana, "t2", "Best pasta sauce?", "A slow-cooked ragu with tomatoes.")
        (first, *_) = search(stub, ana, "air travel and my carrier")
        assert (first.turn_id, first.semantic_rank) == ("t1", 1)
        (first, *_) = search(stub, ana, "cooking Italian food")
        assert (first.turn_id, first.semantic_rank) == ("t2", 1)
    assert recorded_model(data).startswith(f"{MODEL_NAME}:sha256-7d9092cb25f2bd1c:window=508")

    # Unset, the store keeps its model; the hybrid then fuses at the model's share, and the
    # gate's floor is over the empty passage: a query about something never said gets nothing.
    with serving(settings_for(data)) as stub:
        (first, *_) = search(stub, ana, "Lufthansa")
        assert (first.turn_id, first.keyword_rank, first.semantic_rank) == ("t1", 1, 1)
        assert first.score == pytest.approx(1.0)  # best on both sides: the shares add up
        assert [h.turn_id for h in search(stub, ana, "which plane company do I use")] == ["t1"]
        assert search(stub, ana, "quarterly tax filing deadline") == []
    assert keyword_weight(recorded_model(data)) == 0.6 != KEYWORD_WEIGHT
