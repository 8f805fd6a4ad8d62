"""The OpenAI-compatible endpoint embedder against a real HTTP server (tests/embedding_endpoint.py)
that answers the real local model's vectors: the port's contract (unit vectors, one per
window, in order), batching, retries, timeouts, and every failure as STORE_UNAVAILABLE."""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Iterator

import pytest

from server.adapters.embedding.endpoint import (
    EndpointConfig,
    EndpointFailure,
    OpenAiEmbedder,
)
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.ports import Embedder
from tests.api.conftest import shared_embedder
from tests.embedding_endpoint import SECRET_BODY, EmbeddingEndpoint, Fault

pytestmark = pytest.mark.usefixtures("_fresh_endpoint")

MODEL = "test-minilm"


def config(endpoint: EmbeddingEndpoint, **changes: object) -> EndpointConfig:
    """Settings for `endpoint` with short backoffs, so retried tests stay fast."""
    values: dict[str, object] = {
        "base_url": endpoint.base_url,
        "model": MODEL,
        "api_key": "sk-test-key",
        "dimension": 384,
        "timeout_seconds": 2.0,
        "max_retries": 2,
        "backoff_seconds": 0.01,
        "max_backoff_seconds": 0.05,
    }
    values.update(changes)
    return EndpointConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
def embedder(endpoint: EmbeddingEndpoint) -> Iterator[OpenAiEmbedder]:
    built = OpenAiEmbedder(config(endpoint))
    yield built
    built.close()


def unavailable(call: object) -> MemoriaError:
    """Run `call` (a no-argument callable), which must raise STORE_UNAVAILABLE."""
    with pytest.raises(MemoriaError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.reason is ErrorReason.STORE_UNAVAILABLE
    assert SECRET_BODY not in caught.value.message
    assert isinstance(caught.value.__cause__, EndpointFailure)
    assert SECRET_BODY not in str(caught.value.__cause__)
    return caught.value


def norm(vector: tuple[float, ...]) -> float:
    return math.sqrt(sum(x * x for x in vector))


# --- The port's contract -------------------------------------------------------------------


def test_implements_the_port_and_names_model_and_dimension(embedder: OpenAiEmbedder) -> None:
    port: Embedder = embedder
    assert port.model_id == f"openai:{MODEL}:384"
    assert port.dimension == 384


def test_a_configured_dimension_makes_no_request_at_start(endpoint: EmbeddingEndpoint) -> None:
    endpoint.failing = Fault(status=503)  # an endpoint that is down does not stop a start
    built = OpenAiEmbedder(config(endpoint, dimension=256))
    built.close()
    assert endpoint.requests == []
    assert built.model_id == f"openai:{MODEL}:256"


def test_without_a_dimension_one_probe_finds_it(endpoint: EmbeddingEndpoint) -> None:
    built = OpenAiEmbedder(config(endpoint, dimension=None))
    built.close()
    assert built.dimension == 384
    assert built.model_id == f"openai:{MODEL}:384"
    assert len(endpoint.requests) == 1


def test_a_failing_probe_is_store_unavailable(endpoint: EmbeddingEndpoint) -> None:
    endpoint.failing = Fault(status=401)
    error = unavailable(lambda: OpenAiEmbedder(config(endpoint, dimension=None)))
    assert "HTTP 401: test_error/401" in str(error.__cause__)


def test_vectors_are_the_models_in_input_order_and_unit_length(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder
) -> None:
    # The server answers `data` in reverse order: only sorting by index gets these right.
    texts = ["the cat sat on the mat", "quarterly revenue grew", "acct-4821 was closed"]
    multivectors = embedder.embed_documents(texts)
    model = shared_embedder()
    assert len(multivectors) == 3
    for text, multivector in zip(texts, multivectors, strict=True):
        (vector,) = multivector
        assert vector == pytest.approx(model.embed_query(text), abs=1e-6)
        assert norm(vector) == pytest.approx(1.0, abs=1e-6)
    (request,) = endpoint.requests
    assert request.path == "/v1/embeddings"
    assert request.body == {"model": MODEL, "input": texts}
    assert request.headers["authorization"] == "Bearer sk-test-key"
    assert embedder.embed_query("quarterly revenue grew") == pytest.approx(
        multivectors[1][0], abs=1e-9
    )


def test_no_texts_make_no_request(endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder) -> None:
    assert embedder.embed_documents([]) == []
    assert endpoint.requests == []


def test_vectors_that_are_not_unit_length_are_normalized(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder
) -> None:
    endpoint.faults.append(Fault(scale=7.5))
    vector = embedder.embed_query("a long walk on the beach")
    assert norm(vector) == pytest.approx(1.0, abs=1e-9)
    assert vector == pytest.approx(shared_embedder().embed_query("a long walk on the beach"))


def test_the_dimension_is_sent_when_asked(endpoint: EmbeddingEndpoint) -> None:
    built = OpenAiEmbedder(config(endpoint, send_dimension=True))
    built.embed_query("hello")
    built.close()
    assert endpoint.requests[0].body["dimensions"] == 384


def test_no_key_sends_no_authorization(endpoint: EmbeddingEndpoint) -> None:
    built = OpenAiEmbedder(config(endpoint, api_key=None))
    built.embed_query("hello")
    built.close()
    assert "authorization" not in endpoint.requests[0].headers


# --- Windows and batches -------------------------------------------------------------------


def test_a_long_text_is_several_windows_each_within_the_limit(
    endpoint: EmbeddingEndpoint,
) -> None:
    built = OpenAiEmbedder(config(endpoint, max_input_chars=200))
    words = [f"word{i}" for i in range(150)]  # 150 distinct words, about 1,000 characters
    text = " ".join(words)
    (multivector,) = built.embed_documents([text])
    (request,) = endpoint.requests
    assert len(multivector) == len(request.inputs) > 1
    assert all(len(window) <= 200 for window in request.inputs)
    # Every word is whole in some window: edges moved to whitespace.
    assert all(any(w in window.split() for window in request.inputs) for w in words)
    assert all(norm(v) == pytest.approx(1.0) for v in multivector)
    endpoint.requests.clear()
    built.embed_query(text)  # a query is its first window
    (query_request,) = endpoint.requests
    assert query_request.inputs == [request.inputs[0]]
    built.close()


def test_requests_never_carry_more_inputs_than_the_batch_limit(
    endpoint: EmbeddingEndpoint,
) -> None:
    built = OpenAiEmbedder(config(endpoint, batch_size=4))
    texts = [f"turn number {i} about topic {i % 3}" for i in range(10)]
    multivectors = built.embed_documents(texts)
    built.close()
    assert [len(r.inputs) for r in endpoint.requests] == [4, 4, 2]
    assert [i for r in endpoint.requests for i in r.inputs] == texts
    model = shared_embedder()
    for text, (vector,) in zip(texts, multivectors, strict=True):
        assert vector == pytest.approx(model.embed_query(text), abs=1e-6)


# --- Failures ------------------------------------------------------------------------------


def test_429_and_5xx_are_retried_then_succeed(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder
) -> None:
    endpoint.faults.extend([Fault(status=429, retry_after="0"), Fault(status=502)])
    vector = embedder.embed_query("retried")
    assert vector == pytest.approx(shared_embedder().embed_query("retried"), abs=1e-6)
    assert len(endpoint.requests) == 3


def test_retry_after_is_honoured_within_the_cap(endpoint: EmbeddingEndpoint) -> None:
    built = OpenAiEmbedder(config(endpoint, backoff_seconds=5.0, max_backoff_seconds=0.2))
    endpoint.faults.append(Fault(status=429, retry_after="100"))  # capped at 0.2 s
    began = time.monotonic()
    built.embed_query("rate limited")
    built.close()
    assert 0.2 <= time.monotonic() - began < 5.0  # not the 100 s asked for
    assert len(endpoint.requests) == 2


def test_retries_are_bounded_then_store_unavailable(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint.failing = Fault(status=503)
    with caplog.at_level(logging.INFO):
        error = unavailable(lambda: embedder.embed_documents(["a secret-free text"]))
    assert len(endpoint.requests) == 3  # the first try and max_retries=2 more
    assert "HTTP 503" in str(error.__cause__)
    assert SECRET_BODY not in caplog.text
    assert "sk-test-key" not in caplog.text
    assert "a secret-free text" not in caplog.text


def test_a_client_error_is_not_retried(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder
) -> None:
    endpoint.failing = Fault(status=400)
    error = unavailable(lambda: embedder.embed_query("too long for the model"))
    assert len(endpoint.requests) == 1
    assert str(error.__cause__) == "HTTP 400: test_error/400"


def test_a_wrong_path_is_a_clear_failure(endpoint: EmbeddingEndpoint) -> None:
    built = OpenAiEmbedder(config(endpoint, base_url=endpoint.base_url + "/nope"))
    error = unavailable(lambda: built.embed_query("hello"))
    built.close()
    assert str(error.__cause__) == "HTTP 404: not_found"


def test_an_answer_beyond_the_timeout_is_retried_then_unavailable(
    endpoint: EmbeddingEndpoint,
) -> None:
    built = OpenAiEmbedder(config(endpoint, timeout_seconds=0.5, max_retries=1))
    endpoint.failing = Fault(hang=True)
    began = time.monotonic()
    error = unavailable(lambda: built.embed_query("slow"))
    elapsed = time.monotonic() - began
    built.close()
    assert "no answer within 0.5 s" in str(error.__cause__)
    assert len(endpoint.requests) == 2
    assert 1.0 <= elapsed < 5.0  # two tries of 0.5 s, not the 30 s the server would hang


def test_a_timeout_then_an_answer_succeeds(endpoint: EmbeddingEndpoint) -> None:
    built = OpenAiEmbedder(config(endpoint, timeout_seconds=0.5))
    endpoint.faults.append(Fault(hang=True))
    vector = built.embed_query("eventually")
    built.close()
    assert norm(vector) == pytest.approx(1.0)
    assert len(endpoint.requests) == 2


def test_a_dropped_connection_is_retried(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder
) -> None:
    endpoint.faults.append(Fault(drop=True))
    assert norm(embedder.embed_query("dropped once")) == pytest.approx(1.0)
    assert len(endpoint.requests) == 2


def test_nothing_listening_is_store_unavailable() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    built = OpenAiEmbedder(
        EndpointConfig(
            base_url=f"http://127.0.0.1:{port}/v1",
            model=MODEL,
            dimension=384,
            max_retries=1,
            backoff_seconds=0.01,
            max_backoff_seconds=0.01,
        )
    )
    error = unavailable(lambda: built.embed_query("hello"))
    built.close()
    assert "cannot connect (ConnectError)" in str(error.__cause__)


def test_vectors_of_another_dimension_are_refused_without_retrying(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder
) -> None:
    endpoint.failing = Fault(dimension=100)
    error = unavailable(lambda: embedder.embed_documents(["wrong size"]))
    assert "dimension 100" in str(error.__cause__)
    assert "configured for 384" in str(error.__cause__)
    assert len(endpoint.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"data": [{"index": 0}]}',
        b'{"data": [{"index": 0, "embedding": ["x"]}]}',
        b'{"data": [{"index": 0, "embedding": [NaN, 1.0]}]}',
        b'{"data": []}',
        b'{"data": [{"index": 5, "embedding": [1.0]}]}',
    ],
    ids=["not-json", "no-embedding", "not-numbers", "nan", "too-few", "bad-index"],
)
def test_an_answer_that_is_not_vectors_is_refused(
    endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder, body: bytes
) -> None:
    endpoint.failing = Fault(body=body)
    unavailable(lambda: embedder.embed_query("hello"))
    assert len(endpoint.requests) == 1


def test_a_zero_vector_is_refused(endpoint: EmbeddingEndpoint, embedder: OpenAiEmbedder) -> None:
    endpoint.failing = Fault(scale=0.0)
    error = unavailable(lambda: embedder.embed_query("hello"))
    assert "zero or non-finite" in str(error.__cause__)
