"""The embedded default with a broken chunk index answers STORE_UNAVAILABLE, never INTERNAL.

The server runs on the real embedded Qdrant engine, whose shard is closed under it (as a
failed or released store would be): search and erasure answer UNAVAILABLE with
ERROR_REASON_STORE_UNAVAILABLE, which callers retry; before the embedded adapter mapped its
engine's errors (issue 14, finding 8) they surfaced as INTERNAL. Blocks keep serving.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from memoria.v1 import (
    conversation_search_service_pb2 as search_pb,
)
from memoria.v1 import (
    conversation_search_service_pb2_grpc,
    memory_block_service_pb2_grpc,
)
from memoria.v1 import (
    memory_block_service_pb2 as blocks_pb,
)
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from tests.api.conftest import (
    Metadata,
    expect_error,
    server_settings,
    shared_embedder,
    start_server,
)

WHO: Metadata = (("x-memoria-tenant", "t-broken"), ("x-memoria-principal", "ana"))
STORE_UNAVAILABLE = "ERROR_REASON_STORE_UNAVAILABLE"


def test_a_closed_embedded_index_answers_store_unavailable(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    embedder = shared_embedder()
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", embedder.dimension, embedder.model_id)
    running, channel = start_server(server_settings("sqlite", request, tmp_path), index=index)
    try:
        search = conversation_search_service_pb2_grpc.ConversationSearchServiceStub(channel)
        blocks = memory_block_service_pb2_grpc.MemoryBlockServiceStub(channel)
        query = search_pb.SearchConversationsRequest(query="invoice", page_size=5)
        assert list(search.SearchConversations(query, metadata=WHO, timeout=30).hits) == []
        index.close()
        expect_error(
            lambda: search.SearchConversations(query, metadata=WHO, timeout=30),
            grpc.StatusCode.UNAVAILABLE,
            STORE_UNAVAILABLE,
        )
        expect_error(
            lambda: search.ErasePrincipalData(
                search_pb.ErasePrincipalDataRequest(), metadata=WHO, timeout=30
            ),
            grpc.StatusCode.UNAVAILABLE,
            STORE_UNAVAILABLE,
        )
        block = blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=WHO, timeout=30)
        assert block.memory_block.text == ""
    finally:
        channel.close()
        running.stop(0)
