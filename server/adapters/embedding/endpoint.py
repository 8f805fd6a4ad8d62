"""Dense embeddings from an external OpenAI-compatible endpoint (`POST {base_url}/embeddings`).

DESIGN 4: embeddings are computed in-process by default, or, when configured, by an external
endpoint that speaks OpenAI's embeddings API (OpenAI itself, or a self-hosted server such as
Hugging Face TEI, vLLM, Ollama or a LiteLLM proxy). The request is `{"model": ..., "input":
[...]}` and the answer's `data[i].embedding` are the vectors, put back in input order by
their `index` (the API does not promise the order of `data`).

The contract of the `Embedder` port is kept as the local model keeps it:
- Windows. The endpoint's tokenizer is not known here, so a text is cut into windows of at
  most `max_input_chars` characters (the local model's windows are word pieces). Consecutive
  windows overlap by an eighth of a window (the local model's 32 of 254 word pieces), so a
  sentence cut by one window's edge is whole in its neighbour; the windows of a long text
  are spread evenly over it, so none is a short tail, and their edges move to whitespace
  when there is some near them, so few words are cut. A query is its first window.
- Unit length. Every vector is normalized here: most endpoints answer unit vectors already,
  some (self-hosted models without a normalization layer) do not, and the index compares
  vectors by cosine on the assumption that they are.
- The model id is `openai:<model>:<dimension>`, recorded with the collection, so a server
  configured with another model (or another dimension of the same one) refuses to open
  vectors it did not make. The base URL is not part of it: the same model behind another
  proxy makes the same vectors. Changing `max_input_chars` changes how texts are cut, not
  which space the vectors are in, so the vectors already stored stay comparable.
- Dimension: configured, or found by one request at construction and fixed from then on.
  Every answer is checked against it.

Failures. The endpoint is a dependency like a store, and every failure of it is the
deployment's, not the caller's: 429, 5xx, timeouts and connection errors are retried a
bounded number of times with exponential backoff and jitter (honouring a `Retry-After` in
seconds, capped by the longest backoff); any failure left (retries exhausted, another 4xx
such as a wrong key or model, an answer that is not vectors of the dimension) raises
MemoriaError(STORE_UNAVAILABLE). The indexer then keeps the turn queued and tries again
(an outage never makes a turn give up, so turns wait until the configuration is fixed), and a
search answers UNAVAILABLE. Neither the log nor the error carries the endpoint's answer or
the texts: an error body may quote its input, which is a person's conversation. The API key
is sent as `Authorization: Bearer` and never logged.

Threads. One `httpx.Client` (thread-safe, with a connection pool) serves gRPC handler threads
(queries) and the indexing worker (documents) at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import tenacity
from pydantic import BaseModel, ConfigDict, ValidationError
from tenacity.wait import wait_base

from server.domain.errors import ErrorReason, MemoriaError

log = logging.getLogger(__name__)

Vector = tuple[float, ...]
Multivector = tuple[Vector, ...]

DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_MAX_RETRIES = 2
DEFAULT_BATCH_SIZE = 32
"""Inputs per request: Hugging Face TEI's default `--max-client-batch-size` (OpenAI allows
2,048), so the default works with the common self-hosted server."""
DEFAULT_MAX_INPUT_CHARS = 2000
"""About 500 tokens of English: within a 512-token model's input, and two windows per 4,000-
character chunk on a model with a longer input."""
DEFAULT_BACKOFF_SECONDS = 0.5
DEFAULT_MAX_BACKOFF_SECONDS = 8.0
PROBE_TEXT = "dimension probe"
"""What the one request at construction embeds when no dimension is configured."""

_UNAVAILABLE_MESSAGE = (
    "the embeddings endpoint is unavailable; nothing was changed, retry with backoff"
)


class EndpointFailure(Exception):
    """Why a call to the endpoint failed, in words safe to log and to show an operator (a
    status code, an error type, a count; never the endpoint's answer or the texts)."""


class _Transient(EndpointFailure):
    """A failure worth trying again: 429, 5xx, a timeout or a connection error."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


@dataclass(frozen=True)
class EndpointConfig:
    """Where the endpoint is and how to call it (built from the settings by the app)."""

    base_url: str
    model: str
    api_key: str | None = None
    dimension: int | None = None
    send_dimension: bool = False
    """Send `dimensions` in each request (OpenAI's text-embedding-3 models can shorten their
    vectors; other endpoints may refuse the field)."""
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    max_retries: int = DEFAULT_MAX_RETRIES
    batch_size: int = DEFAULT_BATCH_SIZE
    max_input_chars: int = DEFAULT_MAX_INPUT_CHARS
    backoff_seconds: float = DEFAULT_BACKOFF_SECONDS
    max_backoff_seconds: float = DEFAULT_MAX_BACKOFF_SECONDS


class _Item(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)
    index: int
    embedding: list[float]


class _Answer(BaseModel):
    data: list[_Item]


def char_windows(text: str, size: int) -> list[str]:
    """The windows of `text`, each at most `size` characters (see the module docstring):
    the text of each span of `window_spans`, without the whitespace at its edges."""
    return [text[start:end].strip() or text[start:end] for start, end in window_spans(text, size)]


def window_spans(text: str, size: int) -> list[tuple[int, int]]:
    """[start, end) character spans of the windows of `text`, each at most `size` long.

    One span for a text that fits (also for an empty one); otherwise the fewest windows that
    overlap by at least `size // 8` characters before their edges move, starts spread evenly.
    An edge moves to whitespace by less than half that overlap, so consecutive windows still
    share text and no character is left out.
    """
    if len(text) <= size:
        return [(0, len(text))]
    overlap = size // 8
    count = math.ceil((len(text) - overlap) / (size - overlap))
    last_start = len(text) - size
    # Integer starts may lose one character of the overlap; the two moves take less than the
    # rest, so consecutive spans still meet.
    reach = max(0, (overlap - 1) // 2)
    spans = []
    for i in range(count):
        start = i * last_start // (count - 1)
        end = start + size
        if start > 0 and not text[start - 1].isspace():
            after = _first_space(text, start, start + reach)
            start = after + 1 if after is not None else start
        if end < len(text) and not text[end].isspace():
            before = _last_space(text, end - reach, end)
            end = before if before is not None else end
        spans.append((start, end))
    return spans


def _first_space(text: str, begin: int, end: int) -> int | None:
    return next((i for i in range(begin, min(end, len(text))) if text[i].isspace()), None)


def _last_space(text: str, begin: int, end: int) -> int | None:
    return next((i for i in range(end - 1, max(begin, 0) - 1, -1) if text[i].isspace()), None)


class OpenAiEmbedder:
    """The `Embedder` port on an OpenAI-compatible embeddings endpoint.

    Build one per process and share it between threads; `close` releases its connections.
    Raises MemoriaError(STORE_UNAVAILABLE) from construction when no dimension is configured
    and the probe fails (its cause says why, for the one line the server exits with).
    """

    def __init__(
        self, config: EndpointConfig, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        """Connects lazily; with no configured dimension, makes one request to learn it.
        `transport` replaces httpx's default (a proxy or TLS setup of the caller's)."""
        if config.batch_size < 1 or config.max_input_chars < 16 or config.max_retries < 0:
            raise ValueError("batch_size, max_input_chars and max_retries are out of range")
        self._config = config
        headers = {"Content-Type": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self._client = httpx.Client(
            base_url=config.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(config.timeout_seconds),
            transport=transport,
            # A redirect is a failure: the key must not follow it to another host. The
            # standard HTTPS_PROXY/NO_PROXY and SSL_CERT_FILE variables apply (httpx's
            # trust_env), as deployments route and trust their egress that way.
            follow_redirects=False,
        )
        self._retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(config.max_retries + 1),
            wait=_RetryAfterOr(
                tenacity.wait_exponential_jitter(
                    multiplier=config.backoff_seconds,
                    max=config.max_backoff_seconds,
                    jitter=config.backoff_seconds,
                ),
                cap=config.max_backoff_seconds,
            ),
            retry=tenacity.retry_if_exception_type(_Transient),
            before_sleep=self._log_retry,
            reraise=True,
        )
        self._dimension = config.dimension or 0
        if config.dimension is None:
            try:
                (vector,) = self._vectors([PROBE_TEXT])
            except BaseException:
                self._client.close()
                raise
            self._dimension = len(vector)
        self._model_id = f"openai:{config.model}:{self._dimension}"

    @property
    def model_id(self) -> str:
        """`openai:<model>:<dimension>`: vectors are comparable iff this matches."""
        return self._model_id

    @property
    def dimension(self) -> int:
        """Configured, or what the endpoint answered at construction."""
        return self._dimension

    def embed_documents(self, texts: Sequence[str]) -> list[Multivector]:
        """One multivector per text, one unit vector per window, in the order of `texts`;
        the windows of all texts go in requests of at most `batch_size` inputs."""
        windows = [(i, w) for i, text in enumerate(texts) for w in self._windows(text)]
        vectors = self._vectors([w for _, w in windows])
        result: list[list[Vector]] = [[] for _ in texts]
        for (index, _), vector in zip(windows, vectors, strict=True):
            result[index].append(vector)
        return [tuple(multivector) for multivector in result]

    def embed_query(self, text: str) -> Vector:
        """The unit vector of the query's first window."""
        (vector,) = self._vectors([self._windows(text)[0]])
        return vector

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()

    def _windows(self, text: str) -> list[str]:
        return char_windows(text, self._config.max_input_chars)

    def _vectors(self, inputs: Sequence[str]) -> list[Vector]:
        """Unit vectors of `inputs`, in order, in requests of at most `batch_size` inputs."""
        size = self._config.batch_size
        vectors: list[Vector] = []
        for begin in range(0, len(inputs), size):
            batch = list(inputs[begin : begin + size])
            try:
                vectors.extend(self._retrying(self._request, batch))
            except EndpointFailure as failure:
                log.warning("embeddings endpoint failed: %s", failure)
                raise MemoriaError(ErrorReason.STORE_UNAVAILABLE, _UNAVAILABLE_MESSAGE) from failure
        return vectors

    def _request(self, batch: list[str]) -> list[Vector]:
        """One request; raises _Transient for what a retry may cure, else EndpointFailure."""
        body: dict[str, object] = {"model": self._config.model, "input": batch}
        if self._config.send_dimension and self._config.dimension is not None:
            body["dimensions"] = self._config.dimension
        try:
            response = self._client.post("embeddings", json=body)
        except httpx.TimeoutException as error:
            raise _Transient(f"no answer within {self._config.timeout_seconds} s") from error
        except httpx.TransportError as error:
            raise _Transient(f"cannot connect ({type(error).__name__})") from error
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Transient(f"HTTP {status}", _retry_after(response))
        if status != 200:
            raise EndpointFailure(f"HTTP {status}{_error_kind(response)}")
        try:
            answer = _Answer.model_validate_json(response.content)
        except ValidationError as error:
            # The count and the first location only: pydantic's text quotes the input.
            first = ".".join(str(p) for p in error.errors()[0]["loc"]) if error.errors() else ""
            raise EndpointFailure(
                f"the answer is not an embeddings list ({error.error_count()} problems, "
                f"first at {first or 'the top'})"
            ) from None
        return self._checked(answer, len(batch))

    def _checked(self, answer: _Answer, count: int) -> list[Vector]:
        """The answer's vectors in input order, normalized, or EndpointFailure."""
        indexes = sorted(item.index for item in answer.data)
        if indexes != list(range(count)):
            raise EndpointFailure(
                f"the answer has {len(answer.data)} vectors for {count} inputs, or other indexes"
            )
        vectors: list[Vector] = []
        for item in sorted(answer.data, key=lambda item: item.index):
            if self._dimension and len(item.embedding) != self._dimension:
                raise EndpointFailure(
                    f"the endpoint answered vectors of dimension {len(item.embedding)}; "
                    f"this server is configured for {self._dimension} "
                    "(MEMORIA_EMBEDDING_DIMENSION)"
                )
            norm = math.hypot(*item.embedding)
            if not math.isfinite(norm) or norm == 0.0:
                raise EndpointFailure("the endpoint answered a zero or non-finite vector")
            vectors.append(tuple(x / norm for x in item.embedding))
        return vectors

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.info(
            "embeddings endpoint: %s; attempt %d of %d in %.2f s",
            error,
            state.attempt_number + 1,
            self._config.max_retries + 1,
            state.upcoming_sleep,
        )


class _RetryAfterOr(wait_base):
    """The wait a 429/503 asks for in `Retry-After` (seconds, capped), else `fallback`."""

    def __init__(self, fallback: wait_base, cap: float) -> None:
        self._fallback = fallback
        self._cap = cap

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        if isinstance(error, _Transient) and error.retry_after is not None:
            return min(error.retry_after, self._cap)
        return self._fallback(retry_state)


def _retry_after(response: httpx.Response) -> float | None:
    """`Retry-After` in seconds; None when absent or an HTTP date (the backoff applies)."""
    value = response.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 else None


def _error_kind(response: httpx.Response) -> str:
    """`: <type>/<code>` from an OpenAI-style error body, without its message (which may
    quote the input); empty when the body has no such fields."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    kinds = [str(error[key])[:64] for key in ("type", "code") if error.get(key)]
    return f": {'/'.join(kinds)}" if kinds else ""
