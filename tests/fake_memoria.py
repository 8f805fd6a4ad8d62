"""A scripted stand-in for a Memoria server: fake servicers that answer as told.

ModelToolService and IndexTurn, answering with the exact statuses and google.rpc details the
real server builds (a LocalizedMessage for the model), so an adapter's handling runs for real on
outcomes hard to provoke in a real server (an unreachable service, a failed render). Used by the
turn adapter's and the client README's tests; the real server's are tests/api and the
conformance runners.
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
from memoria.v1 import model_tool_service_pb2 as tools_pb
from memoria.v1 import model_tool_service_pb2_grpc as tools_grpc
from server.domain import model_words
from server.rpc.model_tools import MODEL_TOOLS

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


def _pack(
    message: error_details_pb2.ErrorInfo
    | error_details_pb2.BadRequest
    | error_details_pb2.LocalizedMessage,
) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def localized(code: grpc.StatusCode, reason: str, words: str) -> grpc.Status:
    """A failed ExecuteToolCall as the server sends it: ErrorInfo, then the model's words."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain="memoria.v1")
    message = error_details_pb2.LocalizedMessage(locale="en-US", message=words)
    return rpc_status.to_status(
        status_pb2.Status(
            code=getattr(code_pb2, code.name),
            message="refused",
            details=[_pack(info), _pack(message)],
        )
    )


@dataclass
class Script:
    """What the fake server answers, and what it was asked."""

    section: str = model_words.prompt_section(model_words.EMPTY_BLOCK)
    render: grpc.Status | None = None  # RenderPromptSection's refusal, if any
    # ExecuteToolCall's answer (the same for every call until changed).
    execute: tools_pb.ExecuteToolCallResponse | grpc.Status = field(
        default_factory=tools_pb.ExecuteToolCallResponse
    )
    # IndexTurn's refusals, by conversation id (every other turn is accepted).
    index_refusals: dict[str, grpc.Status] = field(default_factory=dict)
    tool_fetches: int = 0
    renders: list[tools_pb.RenderPromptSectionRequest] = field(default_factory=list)
    calls: list[tools_pb.ExecuteToolCallRequest] = field(default_factory=list)
    indexed: list[search_pb.IndexTurnRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)


class ModelTools(tools_grpc.ModelToolServiceServicer):
    def __init__(self, script: Script) -> None:
        self.script = script

    def GetModelTools(
        self, request: tools_pb.GetModelToolsRequest, context: grpc.ServicerContext
    ) -> tools_pb.GetModelToolsResponse:
        self.script.metadata.append(dict(context.invocation_metadata()))  # type: ignore[arg-type]
        self.script.tool_fetches += 1
        return MODEL_TOOLS

    def RenderPromptSection(
        self, request: tools_pb.RenderPromptSectionRequest, context: grpc.ServicerContext
    ) -> tools_pb.RenderPromptSectionResponse:
        self.script.metadata.append(dict(context.invocation_metadata()))  # type: ignore[arg-type]
        self.script.renders.append(request)
        if self.script.render is not None:
            context.abort_with_status(self.script.render)
        return tools_pb.RenderPromptSectionResponse(prompt_section=self.script.section)

    def ExecuteToolCall(
        self, request: tools_pb.ExecuteToolCallRequest, context: grpc.ServicerContext
    ) -> tools_pb.ExecuteToolCallResponse:
        self.script.metadata.append(dict(context.invocation_metadata()))  # type: ignore[arg-type]
        self.script.calls.append(request)
        answer = self.script.execute
        if isinstance(answer, grpc.Status):
            context.abort_with_status(answer)
        assert isinstance(answer, tools_pb.ExecuteToolCallResponse)
        return answer


class Search(search_grpc.ConversationSearchServiceServicer):
    def __init__(self, script: Script) -> None:
        self.script = script

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
    tools_grpc.add_ModelToolServiceServicer_to_server(
        ModelTools(script),
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


def answer(text: str, is_error: bool = False) -> tools_pb.ExecuteToolCallResponse:
    """An ExecuteToolCall answer (the outcome is the backend's, never read by an adapter)."""
    return tools_pb.ExecuteToolCallResponse(text=text, is_error=is_error)
