"""MCP on the HTTP port: the model's two tools and the memory prompt section at `/mcp`.

Streamable HTTP, stateless (no MCP session is kept between requests, so replicas need nothing
shared), with plain JSON answers (no event stream: nothing here streams), on the official MCP
Python SDK's low-level server. Mounted by the gateway (server/rpc/web.py) beside Connect and
gRPC-Web, and built the same way: each MCP request becomes one call to this process's own gRPC
server over loopback, carrying the request's `authorization` and `x-memoria-*` headers. So the
same interceptor authenticates it with the same authenticator (a bearer token in jwt mode, the
trusted headers on loopback), and the same admission limits, audit and telemetry apply; what the
model reads is ModelToolService's answer, worded in server/domain/model_words.py. Calling the
domain objects directly would have needed a second copy of the interceptor's identity checks.

- `tools/list`: GetModelTools (names, descriptions and JSON Schemas as the server serves them).
- `tools/call`: ExecuteToolCall with the arguments as the model produced them; the result's
  text and `isError` are the server's. As in every turn adapter, a call refused before any
  servicer ran (an unconfirmed identity, an unexpected error) gives the model the status's
  LocalizedMessage, and one that got no answer at all (the server overloaded or stopping) the
  tool's words for an unreachable memory.
- Resource `memoria://memory/prompt-section` (`resources/read`): RenderPromptSection, the base
  instructions then the person's block, last.
- `initialize` and `resources/list` read nothing of anyone's: they call nothing. Every request
  that reads or writes a person's data is refused without a confirmed identity: a tool call
  with the model's words for it, anything else with an MCP error carrying Memoria's message.
  Not an HTTP 401 before the request runs: the model's words for a refusal depend on the tool
  called, which only the call itself knows, and a check of its own would cost every request
  a second loopback call.

Turns. MCP has no turn ids, yet every render, search and write names a turn (the cap of failed
writes holds per turn; GetTurnInspection shows what each turn read and wrote). A request names
its turn in `_meta`: `{"memoria/conversation_id": "...", "memoria/turn_id": "..."}` (both or
neither; the server checks the ids as it checks any turn reference). Without them the request
is a turn of its own (`mcp-<random>`, turn `1`). MCP cannot send a finished turn, so turns made
here are indexed for conversation_search only when the backend finishes them itself (the
adapter's finish_turn or IndexTurn), and the rule of the turn adapters that refuses a rewrite
after a section that could not be rendered needs state kept between requests, which stateless
HTTP does not keep.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio
import mcp_types as types
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import model_tool_service_pb2 as tools_pb
from server.domain import model_words
from server.domain.errors import MemoriaError

log = logging.getLogger(__name__)

PATH = "/mcp"
PROMPT_SECTION_URI = "memoria://memory/prompt-section"
CONVERSATION_META = "memoria/conversation_id"
TURN_META = "memoria/turn_id"
SERVER_NAME = "memoria"

_SERVICE = "/memoria.v1.ModelToolService"
UNAUTHENTICATED_CODE = -32001
"""The JSON-RPC error code of a request refused for its identity (a server-defined code: the
message is Memoria's own, e.g. that the bearer token is missing)."""

Metadata = Sequence[tuple[str, str]]
_Response = TypeVar("_Response", bound=Message)

INSTRUCTIONS = (
    f"{model_words.BASE_INSTRUCTIONS.strip()}\n\nThe person's memory block, with these "
    f"instructions, is the resource {PROMPT_SECTION_URI}: place it last in the system prompt of "
    f"every turn. Name the turn in each request's _meta ({CONVERSATION_META}, {TURN_META})."
)
"""What `initialize` tells the host (the same instructions every prompt section starts with)."""

_SECTION = types.Resource(
    name="memory-prompt-section",
    title="Personal memory (system prompt section)",
    uri=PROMPT_SECTION_URI,
    description="The memory instructions and the person's memory block, block last: put it at "
    "the end of the system prompt on every turn.",
    mime_type="text/markdown",
)


class McpEndpoint:
    """The MCP endpoint as an ASGI app (`app`), whose SDK task group runs inside `run()`."""

    def __init__(
        self,
        channel_of: Callable[[], grpc.aio.Channel],
        metadata_of: Callable[[Request], Metadata],
        *,
        max_body_bytes: int,
        timeout_s: float,
    ) -> None:
        """`channel_of`: the gateway's channel to this process's gRPC server (made inside the
        server's event loop); `metadata_of`: a request's identity and trace headers as call
        metadata, exactly as the gateway forwards them (MemoriaError when one cannot be)."""
        self._channel_of = channel_of
        self._metadata_of = metadata_of
        self._timeout = timeout_s
        server: Server[Any] = Server(
            SERVER_NAME,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
        )
        self._manager = StreamableHTTPSessionManager(
            app=server,
            stateless=True,
            json_response=True,
            # Host and Origin are the gateway's to check (_LoopbackHosts, CORS), as for every
            # other route of the port; the SDK's own check stays off.
            security_settings=None,
            max_request_body_size=max_body_bytes,
        )
        self.app = StreamableHTTPASGIApp(self._manager)
        # The SDK logs each stateless request's end at INFO ("Terminating session: None"): a
        # line per call, where the port logs none (no access log); its warnings stay.
        logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Serve within this context (the gateway's lifespan)."""
        async with self._manager.run():
            yield

    # The handlers: each one gRPC call carrying the request's headers.

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        served = await self._call(
            ctx, "GetModelTools", tools_pb.GetModelToolsRequest(), tools_pb.GetModelToolsResponse
        )
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=t.name,
                    description=t.description,
                    input_schema=json.loads(t.parameters_json_schema),
                )
                for t in served.tools
            ]
        )

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        request = tools_pb.ExecuteToolCallRequest(
            turn=_turn(params.meta),
            tool_name=params.name,
            arguments_json=json.dumps(
                params.arguments or {}, separators=(",", ":"), ensure_ascii=False
            ),
        )
        try:
            response = await self._call(
                ctx, "ExecuteToolCall", request, tools_pb.ExecuteToolCallResponse, raw=True
            )
        except grpc.aio.AioRpcError as error:
            return _failed_call(params.name, error)
        return _result(response.text, is_error=response.is_error)

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[_SECTION])

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if str(params.uri) != PROMPT_SECTION_URI:
            raise MCPError(types.INVALID_PARAMS, f"no resource {params.uri}")
        request = tools_pb.RenderPromptSectionRequest(turn=_turn(params.meta))
        try:
            response = await self._call(
                ctx, "RenderPromptSection", request, tools_pb.RenderPromptSectionResponse, raw=True
            )
            text = response.prompt_section
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT):
                raise _mcp_error(error) from None
            # The block could not be read: the section says memory is unavailable this turn,
            # as every adapter's does.
            log.warning("RenderPromptSection failed over MCP: %s", error.code().name)
            text = model_words.UNAVAILABLE_PROMPT_SECTION
        contents = types.TextResourceContents(
            uri=PROMPT_SECTION_URI, mime_type="text/markdown", text=text
        )
        return types.ReadResourceResult(contents=[contents])

    async def _call(
        self,
        ctx: ServerRequestContext[Any],
        method: str,
        request: Message,
        response_type: type[_Response],
        *,
        raw: bool = False,
    ) -> _Response:
        """The call to this process's gRPC server; a failed call raises an MCP error with the
        server's message (or, `raw`, the AioRpcError for the caller to word)."""
        if not isinstance(ctx.request, Request):
            raise MCPError(types.INTERNAL_ERROR, "MCP is served over HTTP only here")
        try:
            metadata = self._metadata_of(ctx.request)
        except MemoriaError as error:
            raise MCPError(UNAUTHENTICATED_CODE, error.message) from None
        call = self._channel_of().unary_unary(
            f"{_SERVICE}/{method}",
            request_serializer=_serialize,
            response_deserializer=response_type.FromString,
        )
        try:
            response = await call(request, metadata=tuple(metadata), timeout=self._timeout)
        except grpc.aio.AioRpcError as error:
            if raw:
                raise
            raise _mcp_error(error) from None
        assert isinstance(response, response_type)
        return response


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _turn(meta: types.RequestParamsMeta | None) -> block_pb.TurnReference:
    """The turn a request names in `_meta`, or a turn of its own."""
    meta = meta or {}
    conversation, turn = meta.get(CONVERSATION_META), meta.get(TURN_META)
    if conversation is None and turn is None:
        return block_pb.TurnReference(conversation_id=f"mcp-{uuid.uuid4().hex[:16]}", turn_id="1")
    if not isinstance(conversation, str) or not isinstance(turn, str):
        raise MCPError(
            types.INVALID_PARAMS,
            f"_meta names a turn with both {CONVERSATION_META} and {TURN_META}, as strings",
        )
    return block_pb.TurnReference(conversation_id=conversation, turn_id=turn)


def _result(text: str, *, is_error: bool) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=is_error
    )


def _failed_call(tool: str, error: grpc.aio.AioRpcError) -> types.CallToolResult:
    """What the model reads for a tool call that got no answer (the adapters' rule)."""
    words = _localized_message(error)
    if words is not None:  # an unconfirmed identity or a server error: the server's words
        return _result(words, is_error=True)
    if error.code() == grpc.StatusCode.INVALID_ARGUMENT or tool not in model_words.UNREACHABLE_TEXT:
        raise _mcp_error(error)  # the host's own mistake (the turn in _meta), not the model's
    log.warning("ExecuteToolCall %s over MCP got no answer: %s", tool, error.code().name)
    return _result(model_words.UNREACHABLE_TEXT[tool], is_error=True)


def _localized_message(error: grpc.aio.AioRpcError) -> str | None:
    """The LocalizedMessage of the status's google.rpc details, if it has one."""
    trailing: Any = error.trailing_metadata() or ()
    for key, value in trailing:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            for detail in status_pb2.Status.FromString(value).details:
                message = error_details_pb2.LocalizedMessage()
                if detail.Unpack(message):
                    return str(message.message)
    return None


def _mcp_error(error: grpc.aio.AioRpcError) -> MCPError:
    """A failed call as an MCP error: Memoria's message, its status code's name as data."""
    code = error.code()
    number = {
        grpc.StatusCode.UNAUTHENTICATED: UNAUTHENTICATED_CODE,
        grpc.StatusCode.INVALID_ARGUMENT: types.INVALID_PARAMS,
    }.get(code, types.INTERNAL_ERROR)
    return MCPError(number, error.details() or code.name, {"status": code.name})
