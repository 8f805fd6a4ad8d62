"""A scripted stand-in for a Memoria server: fake servicers that answer as told.

They answer with the exact statuses and google.rpc details the real server's error table
builds, so a client's decoding runs for real on outcomes that are hard to provoke in a real
server (a store outage, a full disk). Used by the turn adapter's and the client README's tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import memory_block_service_pb2_grpc as blocks_grpc

WHO = [("x-memoria-tenant", "acme"), ("x-memoria-principal", "ana")]


def failure(
    code: grpc.StatusCode,
    reason: str = "",
    metadata: dict[str, str] | None = None,
    violations: list[tuple[str, str]] | None = None,
    message: str = "refused",
) -> grpc.Status:
    """A status as the server's error table builds it (ErrorInfo, then BadRequest)."""
    details = []
    if reason:
        info = error_details_pb2.ErrorInfo(reason=reason, domain="memoria.v1", metadata=metadata)
        details.append(_pack(info))
    if violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in violations
            ]
        )
        details.append(_pack(bad))
    return rpc_status.to_status(
        status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    )


def _pack(message: error_details_pb2.ErrorInfo | error_details_pb2.BadRequest) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


@dataclass
class Script:
    """What the fake server answers, and what it was asked."""

    section: str = ""
    render: grpc.Status | None = None  # RenderMemoryBlock's refusal, if any
    rewrite: blocks_pb.RewriteMemoryBlockResponse | grpc.Status | None = None
    search: search_pb.SearchConversationsResponse | grpc.Status | None = None
    # IndexTurn's refusals, by conversation id (every other turn is accepted).
    index_refusals: dict[str, grpc.Status] = field(default_factory=dict)
    rewrites: list[blocks_pb.RewriteMemoryBlockRequest] = field(default_factory=list)
    searches: list[search_pb.SearchConversationsRequest] = field(default_factory=list)
    indexed: list[search_pb.IndexTurnRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)


class Blocks(blocks_grpc.MemoryBlockServiceServicer):
    def __init__(self, script: Script) -> None:
        self.script = script

    def RenderMemoryBlock(
        self, request: blocks_pb.RenderMemoryBlockRequest, context: grpc.ServicerContext
    ) -> blocks_pb.RenderMemoryBlockResponse:
        self.script.metadata.append(dict(context.invocation_metadata()))  # type: ignore[arg-type]
        if self.script.render is not None:
            context.abort_with_status(self.script.render)
        return blocks_pb.RenderMemoryBlockResponse(prompt_section=self.script.section)

    def RewriteMemoryBlock(
        self, request: blocks_pb.RewriteMemoryBlockRequest, context: grpc.ServicerContext
    ) -> blocks_pb.RewriteMemoryBlockResponse:
        self.script.rewrites.append(request)
        answer = self.script.rewrite
        if isinstance(answer, grpc.Status):
            context.abort_with_status(answer)
        assert answer is not None
        return answer


class Search(search_grpc.ConversationSearchServiceServicer):
    def __init__(self, script: Script) -> None:
        self.script = script

    def SearchConversations(
        self, request: search_pb.SearchConversationsRequest, context: grpc.ServicerContext
    ) -> search_pb.SearchConversationsResponse:
        self.script.searches.append(request)
        answer = self.script.search
        if isinstance(answer, grpc.Status):
            context.abort_with_status(answer)
        assert answer is not None
        return answer

    def IndexTurn(
        self, request: search_pb.IndexTurnRequest, context: grpc.ServicerContext
    ) -> search_pb.IndexTurnResponse:
        self.script.indexed.append(request)
        refusal = self.script.index_refusals.get(request.conversation_id)
        if refusal is not None:
            context.abort_with_status(refusal)
        return search_pb.IndexTurnResponse(outcome=search_pb.INDEX_TURN_OUTCOME_ACCEPTED)


@contextmanager
def scripted_server() -> Iterator[tuple[Script, grpc.Channel, int]]:
    """A fake server on 127.0.0.1:0, a channel to it and its port; stopped on exit."""
    script = Script()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    # The generated stubs declare every method abstract; at run time the generated base
    # answers UNIMPLEMENTED for the methods a fake does not script.
    blocks_grpc.add_MemoryBlockServiceServicer_to_server(
        Blocks(script),  # type: ignore[abstract]
        server,
    )
    search_grpc.add_ConversationSearchServiceServicer_to_server(
        Search(script),  # type: ignore[abstract]
        server,
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield script, channel, port
    finally:
        channel.close()
        server.stop(0)


def saved_response(
    text: str, removed: list[str], added: list[str], changed: bool = True
) -> blocks_pb.RewriteMemoryBlockResponse:
    block = block_pb.MemoryBlock(text=text, char_count=len(text), char_limit=4000, etag="e")
    return blocks_pb.RewriteMemoryBlockResponse(
        memory_block=block, removed_lines=removed, added_lines=added, changed=changed
    )
