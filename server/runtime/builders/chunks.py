"""The chunk index: the embedded Qdrant engine under the data dir, or a Qdrant server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.adapters.qdrant.layout import ChunkIndexError
from server.domain.errors import MemoriaError
from server.domain.ports import ChunkIndex, Embedder
from server.runtime.settings import Settings, StartupRefusal

if TYPE_CHECKING:
    from qdrant_client import QdrantClient


def build_chunk_index(settings: Settings, embedder: Embedder) -> ChunkIndex:
    """The index the settings choose, for `embedder`'s vectors. Vectors of another model, or
    a server that cannot be reached, refuse the start in one line (the same at every later
    open: `memoria worker`, each process of `--processes N`)."""
    if settings.qdrant.url is None:
        return _edge_index(settings, embedder)
    return _server_index(settings, embedder)


def _edge_index(settings: Settings, embedder: Embedder) -> ChunkIndex:
    from server.adapters.qdrant.edge import QdrantEdgeChunkIndex

    settings.store.data_dir.mkdir(parents=True, exist_ok=True)
    chunks = settings.store.data_dir / "chunks"
    try:
        return QdrantEdgeChunkIndex(chunks, embedder.dimension, embedder.model_id)
    except ChunkIndexError as error:  # vectors of another model
        raise StartupRefusal(
            f"cannot use the chunk index in {chunks}: {error}", "data_dir"
        ) from None


def stored_model_id(settings: Settings) -> str | None:
    """The embedding model the configured chunk index was made with, None for a new index (or
    one whose record cannot be read: opening it then refuses the start with the reason)."""
    if settings.qdrant.url is None:
        from server.adapters.qdrant.edge import read_model_record

        try:
            record = read_model_record(settings.store.data_dir / "chunks")
        except ChunkIndexError:
            return None
        return record.model_id if record is not None else None
    from server.adapters.qdrant.server import stored_model_record

    client, _ = _server_client(settings)
    try:
        server_record = stored_model_record(client, settings.qdrant.collection)
    except MemoriaError:  # unreachable: opening the index refuses the start in one line
        return None
    finally:
        client.close()
    return server_record.model_id if server_record is not None else None


def _server_client(settings: Settings) -> tuple[QdrantClient, str]:
    """A client of the configured Qdrant server, and how to name the server in a message."""
    from server.adapters.qdrant.server import server_client

    config = settings.qdrant
    assert config.url is not None
    api_key = config.api_key.get_secret_value() if config.api_key else None
    grpc_port = config.effective_grpc_port
    where = f"the Qdrant server at {config.url} " + (
        f"(gRPC port {grpc_port})" if config.prefer_grpc else "(REST only)"
    )
    client = server_client(
        config.url, grpc_port=grpc_port, prefer_grpc=config.prefer_grpc, api_key=api_key
    )
    return client, where


def _server_index(settings: Settings, embedder: Embedder) -> ChunkIndex:
    from server.adapters.qdrant.server import QdrantServerChunkIndex

    config = settings.qdrant
    client, where = _server_client(settings)
    try:
        return QdrantServerChunkIndex(
            client,
            config.collection,
            embedder.dimension,
            embedder.model_id,
            shard_number=config.shard_number,
            replication_factor=config.replication_factor,
        )
    except MemoriaError as error:  # STORE_UNAVAILABLE: the driver's error is its cause
        client.close()
        names = ("qdrant_url", "qdrant_grpc_port") if config.prefer_grpc else ("qdrant_url",)
        raise StartupRefusal(f"cannot reach {where}: {_cause_line(error)}", *names) from None
    except ChunkIndexError as error:
        client.close()
        raise StartupRefusal(f"cannot use {where}: {error}", "qdrant_collection") from None


def _cause_line(error: BaseException) -> str:
    """The first line of what the driver said (gRPC details, or the HTTP transport error)."""
    cause = error.__cause__ or error
    details = getattr(cause, "details", None)
    text = details() if callable(details) else str(cause)
    lines = str(text).strip().splitlines()
    return lines[0] if lines else type(cause).__name__
