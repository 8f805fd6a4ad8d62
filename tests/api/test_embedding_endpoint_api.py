"""A server configured for an external OpenAI-compatible embeddings endpoint, end to end: it
indexes and finds turns with the endpoint's vectors, records the endpoint's model with the
chunk index, refuses to open vectors of another model, answers UNAVAILABLE (never INTERNAL)
when the endpoint fails at query time, keeps a turn it could not embed queued, and exits in
one line when the endpoint cannot be used at start.

The endpoint is tests/embedding_endpoint.py: a real HTTP server answering the real local
model's vectors, so semantic search over them means what it means in production."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import conversation_search_service_pb2_grpc as pb_grpc
from server.runtime.app import start
from server.runtime.builders.embedding import build_embedder
from server.runtime.settings import Settings
from tests.api.conftest import Metadata, expect_error, shared_embedder, start_server
from tests.embedding_endpoint import SECRET_BODY, EmbeddingEndpoint, Fault
from tests.processes import clean_env, failed_in_one_line

pytestmark = pytest.mark.usefixtures("_fresh_endpoint")

WHEN = datetime(2026, 11, 30, 9, 30, tzinfo=UTC)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def settings_for(endpoint: EmbeddingEndpoint, data_dir: Path, **extra: object) -> Settings:
    values: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "data_dir": data_dir,
        "page_token_secret": "test-page-token-secret-0123456789",
        "shutdown_grace_seconds": 1,
        "embedding_url": endpoint.base_url,
        "embedding_model": "test-minilm",
        "embedding_api_key": "sk-api-test",
        "embedding_max_retries": 0,  # the adapter's retries are tested on their own
    }
    values.update(extra)
    return Settings(**values)


@contextmanager
def serving(settings: Settings) -> Iterator[pb_grpc.ConversationSearchServiceStub]:
    """The server the settings describe, embedder included (none is passed in)."""
    running = start(settings)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield pb_grpc.ConversationSearchServiceStub(channel)
    finally:
        channel.close()
        running.stop(0)


def who() -> Metadata:
    return (("x-memoria-tenant", f"t-{uuid.uuid4().hex[:8]}"), ("x-memoria-principal", "ana"))


def index(
    stub: pb_grpc.ConversationSearchServiceStub,
    caller: Metadata,
    turn: str,
    question: str,
    answer: str,
) -> pb.IndexTurnResponse:
    stamp = Timestamp()
    stamp.FromDatetime(WHEN)
    response: pb.IndexTurnResponse = stub.IndexTurn(
        pb.IndexTurnRequest(
            conversation_id="c1",
            turn_id=turn,
            question=question,
            answer=answer,
            turn_time=stamp,
            wait=True,
        ),
        metadata=caller,
    )
    return response


def search(
    stub: pb_grpc.ConversationSearchServiceStub, caller: Metadata, query: str
) -> list[pb.SearchHit]:
    response = stub.SearchConversations(
        pb.SearchConversationsRequest(query=query, page_size=5), metadata=caller
    )
    return list(response.hits)


def recorded_model(data_dir: Path) -> str:
    record = json.loads((data_dir / "chunks" / "memoria-index.json").read_text())
    model: str = record["memoria_embedding_model"]
    return model


def test_a_turn_is_indexed_and_found_with_the_endpoints_vectors(
    endpoint: EmbeddingEndpoint, tmp_path: Path
) -> None:
    # Semantic side only: the hit can come from the endpoint's vectors and nothing else.
    settings = settings_for(endpoint, tmp_path / "data", search_mode="semantic")
    ana = who()
    with serving(settings) as stub:
        done = index(stub, ana, "t1", "Which airline do I fly?", "You fly with Lufthansa.")
        assert done.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
        index(stub, ana, "t2", "Best pasta sauce?", "A slow-cooked ragu with tomatoes.")
        (first, *_) = search(stub, ana, "air travel and my carrier")
        assert (first.turn_id, first.semantic_rank) == ("t1", 1)
        (first, *_) = search(stub, ana, "cooking Italian food")
        assert (first.turn_id, first.semantic_rank) == ("t2", 1)
    # Probe, two turns, two queries: every request went to the endpoint with the key.
    assert len(endpoint.requests) == 5
    assert {r.headers["authorization"] for r in endpoint.requests} == {"Bearer sk-api-test"}
    assert recorded_model(tmp_path / "data") == "openai:test-minilm:384"


def test_the_key_can_come_from_a_file(endpoint: EmbeddingEndpoint, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-a-file\n")
    settings = settings_for(
        endpoint,
        tmp_path / "data",
        embedding_api_key=None,
        embedding_api_key_file=key_file,
        embedding_dimension=384,
    )
    with serving(settings) as stub:
        index(stub, who(), "t1", "What is my plan?", "The premium plan.")
    assert {r.headers["authorization"] for r in endpoint.requests} == {"Bearer sk-from-a-file"}


def test_a_failing_endpoint_at_query_time_is_unavailable_not_internal(
    endpoint: EmbeddingEndpoint, tmp_path: Path
) -> None:
    ana = who()
    with serving(settings_for(endpoint, tmp_path / "data")) as stub:
        index(stub, ana, "t1", "Which airline do I fly?", "You fly with Lufthansa.")
        endpoint.failing = Fault(status=500)
        error = expect_error(
            lambda: search(stub, ana, "Lufthansa"), UNAVAILABLE, "ERROR_REASON_STORE_UNAVAILABLE"
        )
        assert isinstance(error, grpc.Call)
        assert "embeddings endpoint is unavailable" in error.details()
        assert SECRET_BODY not in error.details()
        endpoint.failing = None
        assert [h.turn_id for h in search(stub, ana, "Lufthansa")] == ["t1"]


def test_a_turn_the_endpoint_could_not_embed_stays_queued_and_is_indexed_later(
    endpoint: EmbeddingEndpoint, tmp_path: Path
) -> None:
    # No worker threads: only the waiting IndexTurn calls index, so the test decides when.
    settings = settings_for(endpoint, tmp_path / "data", index_worker_threads=0)
    ana = who()
    with serving(settings) as stub:
        endpoint.failing = Fault(status=503)
        expect_error(
            lambda: index(stub, ana, "t1", "Which airline?", "Lufthansa."),
            UNAVAILABLE,
            "ERROR_REASON_STORE_UNAVAILABLE",
        )
        endpoint.failing = None
        assert search(stub, ana, "Lufthansa") == []  # accepted, not yet searchable
        done = index(stub, ana, "t1", "Which airline?", "Lufthansa.")
        assert done.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
        assert [h.turn_id for h in search(stub, ana, "Lufthansa")] == ["t1"]


@pytest.mark.parametrize("first", ["local", "other-endpoint-model"])
def test_a_chunk_index_of_another_model_is_refused_at_start(
    endpoint: EmbeddingEndpoint, tmp_path: Path, first: str
) -> None:
    data_dir = tmp_path / "data"
    if first == "local":
        running, channel = start_server(Settings(listen="127.0.0.1:0", data_dir=data_dir))
        channel.close()
        running.stop(0)
        before = shared_embedder().model_id
    else:
        with serving(settings_for(endpoint, data_dir, embedding_model="other-model")):
            pass
        before = "openai:other-model:384"
    assert recorded_model(data_dir) == before
    with pytest.raises(SystemExit) as refused:  # one line, as `memoria serve` prints it
        start(settings_for(endpoint, data_dir))
    assert "\n" not in str(refused.value)
    assert before in str(refused.value)
    assert "openai:test-minilm:384" in str(refused.value)
    assert recorded_model(data_dir) == before  # nothing was rewritten


def test_serve_exits_in_one_line_when_the_endpoint_cannot_be_used(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    last, stderr = failed_in_one_line(
        ["serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")],
        tmp_path,
        clean_env(
            MEMORIA_EMBEDDING_URL=url,
            MEMORIA_EMBEDDING_MODEL="m",
            MEMORIA_EMBEDDING_API_KEY="sk-never-in-the-log",
            MEMORIA_EMBEDDING_MAX_RETRIES="0",
        ),
    )
    assert last == (
        f"memoria serve: cannot use the embeddings endpoint at {url}: cannot connect "
        "(ConnectError); check MEMORIA_EMBEDDING_URL"
    )
    assert "sk-never-in-the-log" not in stderr


def test_a_key_file_that_cannot_be_read_is_one_line(
    endpoint: EmbeddingEndpoint, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-key"
    settings = settings_for(
        endpoint, tmp_path, embedding_api_key=None, embedding_api_key_file=missing
    )
    with pytest.raises(SystemExit) as refused:
        build_embedder(settings)
    assert str(refused.value) == (
        f"cannot read the embeddings API key file {missing}: FileNotFoundError; "
        "check MEMORIA_EMBEDDING_API_KEY_FILE"
    )
    assert endpoint.requests == []


def test_a_refused_probe_is_one_line_naming_the_status(
    endpoint: EmbeddingEndpoint, tmp_path: Path
) -> None:
    endpoint.failing = Fault(status=401)
    with pytest.raises(SystemExit) as refused:
        build_embedder(settings_for(endpoint, tmp_path))
    assert str(refused.value) == (
        f"cannot use the embeddings endpoint at {endpoint.base_url}: "
        "HTTP 401: test_error/401; check MEMORIA_EMBEDDING_URL"
    )
    assert SECRET_BODY not in str(refused.value)
