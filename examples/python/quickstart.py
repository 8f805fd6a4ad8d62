"""Memoria from Python with the generated stubs: render the memory section, rewrite the block,
index a finished turn (waiting until it is searchable), search for it.

    pip install -c requirements.lock ./clients/python   # the stubs (memoria.v1) and gRPC
    MEMORIA_SERVER=127.0.0.1:50051 python examples/python/quickstart.py

The server must trust the x-memoria-* headers (`memoria serve` on loopback does); with a
Memoria in jwt mode send [("authorization", "Bearer <jwt>")] instead. scripts/test-clients.sh
runs this file against its server, so it stays correct. An agent loop should use
memoria_client.MemoriaTurnAdapter instead (clients/python/README.md).
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import UTC, datetime

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import memory_block_service_pb2_grpc as blocks_grpc


def main() -> None:
    channel = grpc.insecure_channel(os.environ.get("MEMORIA_SERVER", "127.0.0.1:50051"))
    blocks = blocks_grpc.MemoryBlockServiceStub(channel)
    search = search_grpc.ConversationSearchServiceStub(channel)
    who = [("x-memoria-tenant", "acme"), ("x-memoria-principal", "ana-python")]

    # The model rewrites the whole block; the answer lists the lines it removed and added.
    saved = blocks.RewriteMemoryBlock(
        blocks_pb.RewriteMemoryBlockRequest(
            text="Preferred name: Ana\nUses Jira account ana-42", writer=block_pb.WRITER_MODEL
        ),
        metadata=who,
    )
    print("added:", list(saved.added_lines), "removed:", list(saved.removed_lines))

    # Every turn: the section goes last in the system prompt.
    section = blocks.RenderMemoryBlock(blocks_pb.RenderMemoryBlockRequest(), metadata=who)
    print(section.prompt_section)

    # After the answer: send the finished turn (wait=True: searchable when this returns).
    conversation = f"quickstart-{uuid.uuid4().hex[:8]}"
    when = Timestamp()
    when.FromDatetime(datetime.now(UTC))
    indexed = search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id="1",
            question="Which account did the refund go to?",
            answer="To acct-4821, on 2026-11-02.",
            turn_time=when,
            wait=True,
        ),
        metadata=who,
    )
    print("indexed:", search_pb.IndexTurnOutcome.Name(indexed.outcome))

    # Only when a question points back to an earlier conversation.
    found = search.SearchConversations(
        search_pb.SearchConversationsRequest(query="acct-4821", page_size=5), metadata=who
    )
    for hit in found.hits:
        print(
            f"{hit.conversation_id}/{hit.turn_id} (keyword rank {hit.keyword_rank}, "
            f"semantic rank {hit.semantic_rank}): {hit.text}"
        )

    if not section.prompt_section.endswith("Uses Jira account ana-42") or not any(
        hit.conversation_id == conversation for hit in found.hits
    ):
        sys.exit("quickstart: the section or the search did not show what was written")
    channel.close()


if __name__ == "__main__":
    main()
