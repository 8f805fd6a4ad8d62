"""`memoria mcp`: Memoria's two model tools and the memory prompt section over MCP, over stdio.

The server itself serves MCP over streamable HTTP at `/mcp` on its HTTP port (server/rpc/mcp.py,
identity as every call, turns named in `_meta`); this process is for desktop hosts that start a
command (stdio), and, with `--transport http`, for a Memoria in jwt mode whose own HTTP port is
not reachable from where the MCP clients are.

An MCP host (Claude Desktop, an IDE, an agent framework) connects to this process instead of
calling Memoria's gRPC API itself. It is a client of a running Memoria server (`--server`) built
on the official MCP Python SDK's low-level server, so the tools keep exactly the descriptions and
JSON Schemas of `tools/memoria_tools.json`, and every result is the turn adapter's wording
(the server's words, through ModelToolService) with MCP's `isError` set as the server says.

- Tools `memory_rewrite` and `conversation_search`, executed by `MemoriaTurnAdapter.execute`.
- Resource `memoria://memory/prompt-section`: the base memory instructions and the person's
  rendered block, block last, as the adapter's `prompt_section()` returns it (RenderPromptSection
  for the turn the read starts).

Identity is never made up here. Over stdio (one host, one person) it comes from configuration:
a bearer token (`--token`/MEMORIA_TOKEN, for a Memoria in jwt mode) or a tenant and principal (the
trusted headers, for a Memoria on loopback or behind a mesh). Over streamable HTTP each request's
`Authorization: Bearer` token is checked by Memoria itself (a render call carrying it) before the
request reaches the MCP session, and then sent with every call made for that request: a request
without a token, or with one Memoria refuses, gets HTTP 401 and calls nothing.

MCP has no turn boundary this server could see, yet every call names a turn (the server counts
failed writes per turn and records what each turn read and wrote). A request may name its turn
in `_meta` (`memoria/conversation_id` and `memoria/turn_id`, as the server's own endpoint reads
them). Otherwise, over stdio the session is one conversation (`mcp-<random>`) whose turns (1, 2,
...) are told apart by `_StdioTurns` (a read of the prompt section, or a quiet gap); over
stateless HTTP each request is a turn of its own. MCP
cannot send a finished turn, so these turns are never indexed for conversation_search: an agent
loop that knows its turns should use the adapter directly.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import grpc
import mcp_types as types
import uvicorn
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import (
    AuthenticatedUser,
    BearerAuthBackend,
    RequireAuthMiddleware,
)
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from memoria.v1 import model_tool_service_pb2 as tools_pb
from memoria.v1 import model_tool_service_pb2_grpc as tools_grpc
from memoria_client.adapter import MemoriaTurnAdapter
from memoria_client.mcp_cli import HTTP_PATH
from memoria_client.tool_files import base_system_prompt, load_source

_log = logging.getLogger("memoria_client.mcp")

PROMPT_SECTION_URI = "memoria://memory/prompt-section"
SERVER_NAME = "memoria"

Metadata = tuple[tuple[str, str], ...]


class NotAuthenticated(Exception):
    """An HTTP request reached a handler without a verified bearer token (never expected:
    RequireAuthMiddleware answers such requests with 401 first)."""


@dataclass(frozen=True)
class Identity:
    """Who the tool calls of a stdio session act for: gRPC metadata sent with every call."""

    metadata: Metadata

    @staticmethod
    def from_config(
        token: str | None, tenant: str | None, principal: str | None
    ) -> Identity | None:
        """A bearer token, or a tenant and a principal (trusted headers); None when neither,
        or when the configuration is half of one (a tenant without a principal)."""
        if token and not (tenant or principal):
            return Identity((("authorization", f"Bearer {token}"),))
        if tenant and principal and not token:
            return Identity((("x-memoria-tenant", tenant), ("x-memoria-principal", principal)))
        return None


def _tools() -> list[types.Tool]:
    """The tools as `tools/memoria_tools.json` defines them (same names, texts and schemas)."""
    return [
        types.Tool(name=t["name"], description=t["description"], input_schema=t["parameters"])
        for t in load_source()
    ]


def _instructions() -> str:
    return (
        f"{base_system_prompt()}\n\nThe person's memory block, with these instructions, is the "
        f"resource {PROMPT_SECTION_URI}: place it last in the system prompt of every turn."
    )


def _conversation_id() -> str:
    """A fresh conversation id for the turns of one MCP session (or one HTTP request)."""
    return f"mcp-{uuid.uuid4().hex[:16]}"


class _StdioTurns:
    """Turn boundaries for the one person of a stdio session, which MCP does not signal.

    The session is one conversation; a new turn starts when the host reads the prompt section
    (hosts that follow the instructions do so once per turn) or when no tool call came for
    `gap` seconds (a model's calls within one turn follow each other within seconds; the
    person's next message takes longer). So the server's cap on failed memory writes per turn
    still stops a model stuck in a retry loop, and a refusal never outlasts a quiet minute.
    """

    def __init__(self, adapter: MemoriaTurnAdapter, gap: float, clock: Callable[[], float]):
        self.adapter = adapter
        self._gap = gap
        self._clock = clock
        self._last: float | None = None
        self._conversation = _conversation_id()
        self._turns = 0

    def before_call(self) -> MemoriaTurnAdapter:
        """The adapter, in a new turn when the last call was longer ago than the gap."""
        now = self._clock()
        if self._last is None or now - self._last > self._gap:
            return self.new_turn()
        self._last = now
        return self.adapter

    def new_turn(self) -> MemoriaTurnAdapter:
        """The adapter, in a new turn (the host asked for the prompt section)."""
        self._turns += 1
        self.adapter.start_turn(self._conversation, str(self._turns))
        self._last = self._clock()
        return self.adapter


DEFAULT_TURN_GAP_SECONDS = 60.0

CONVERSATION_META = "memoria/conversation_id"
TURN_META = "memoria/turn_id"
"""The `_meta` keys naming a request's turn, as the server's own MCP endpoint reads them
(server/rpc/mcp.py): a backend that names its turns can finish them with the same ids."""


def named_turn(meta: types.RequestParamsMeta | None) -> tuple[str, str] | None:
    """The turn a request names in `_meta` (both ids, as strings), or None when it names none."""
    meta = meta or {}
    conversation, turn = meta.get(CONVERSATION_META), meta.get(TURN_META)
    if conversation is None and turn is None:
        return None
    if not isinstance(conversation, str) or not isinstance(turn, str):
        raise MCPError(
            types.INVALID_PARAMS,
            f"_meta names a turn with both {CONVERSATION_META} and {TURN_META}, as strings",
        )
    return conversation, turn


def build_server(
    channel: grpc.Channel,
    identity: Identity | None,
    *,
    timeout: float | None = None,
    turn_gap: float = DEFAULT_TURN_GAP_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> Server[Any]:
    """The MCP server. `identity` is the stdio configuration (one person, one adapter whose
    turns `_StdioTurns` tells apart); None means HTTP, where each request's verified bearer
    token is the identity and each request gets an adapter and a turn of its own (the cap on
    failed writes per turn then applies per request: stateless HTTP keeps nothing between
    requests). The adapter is made on the first call, which fetches the model's tools once."""
    tools = _tools()
    made: list[MemoriaTurnAdapter] = []  # the first adapter: its fetched tools serve every other
    stdio: list[_StdioTurns] = []

    def adapter_for(metadata: Metadata) -> MemoriaTurnAdapter:
        if not made:
            made.append(MemoriaTurnAdapter(channel, metadata, timeout=timeout))
            return made[0]
        return made[0].for_identity(metadata)

    named: dict[tuple[str, str], MemoriaTurnAdapter] = {}  # stdio: the last turn named

    def http_adapter(
        ctx: ServerRequestContext[Any], turn: tuple[str, str] | None
    ) -> MemoriaTurnAdapter:
        scope = getattr(ctx.request, "scope", None) or {}
        user = scope.get("user")
        if not isinstance(user, AuthenticatedUser):
            raise NotAuthenticated("no verified bearer token on this request")
        runner = adapter_for((("authorization", f"Bearer {user.access_token.token}"),))
        runner.start_turn(*(turn or (_conversation_id(), "1")))
        return runner

    def stdio_named(first: MemoriaTurnAdapter, turn: tuple[str, str]) -> MemoriaTurnAdapter:
        # The same adapter while the host names the same turn (it keeps the turn's state).
        if turn not in named:
            assert identity is not None
            named.clear()
            named[turn] = first.for_identity(identity.metadata)
            named[turn].start_turn(*turn)
        return named[turn]

    async def adapter(
        ctx: ServerRequestContext[Any],
        meta: types.RequestParamsMeta | None,
        *,
        new_turn: bool = False,
    ) -> MemoriaTurnAdapter:
        turn = named_turn(meta)
        # The first adapter calls the server (GetModelTools): never on the event loop.
        if identity is None:
            return await anyio.to_thread.run_sync(http_adapter, ctx, turn)
        if not stdio:
            first = await anyio.to_thread.run_sync(adapter_for, identity.metadata)
            if not stdio:  # another call may have made it meanwhile
                stdio.append(_StdioTurns(first, turn_gap, clock))
        if turn is not None:
            return stdio_named(stdio[0].adapter, turn)
        return stdio[0].new_turn() if new_turn else stdio[0].before_call()

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        runner = await adapter(ctx, params.meta)
        arguments = dict(params.arguments or {})
        result = await anyio.to_thread.run_sync(runner.execute, params.name, arguments)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.text)], is_error=result.is_error
        )

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        section = types.Resource(
            name="memory-prompt-section",
            title="Personal memory (system prompt section)",
            uri=PROMPT_SECTION_URI,
            description="The memory instructions and the person's memory block, block last: "
            "put it at the end of the system prompt on every turn.",
            mime_type="text/markdown",
        )
        return types.ListResourcesResult(resources=[section])

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        if str(params.uri) != PROMPT_SECTION_URI:
            raise ValueError(f"unknown resource {params.uri}")
        runner = await adapter(ctx, params.meta, new_turn=True)
        text = await anyio.to_thread.run_sync(runner.prompt_section)
        contents = types.TextResourceContents(
            uri=PROMPT_SECTION_URI, mime_type="text/markdown", text=text
        )
        return types.ReadResourceResult(contents=[contents])

    return Server(
        SERVER_NAME,
        instructions=_instructions(),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
    )


class MemoriaTokenVerifier:
    """Bearer tokens are checked by Memoria's own JWT authentication, never here: a call
    carrying the token (GetModelTools, which reads no store) either answers (the token names a
    person) or is UNAUTHENTICATED."""

    def __init__(self, channel: grpc.Channel, timeout: float | None) -> None:
        self._tools = tools_grpc.ModelToolServiceStub(channel)
        self._timeout = timeout

    def _check(self, token: str) -> bool:
        metadata = (("authorization", f"Bearer {token}"),)
        try:
            self._tools.GetModelTools(
                tools_pb.GetModelToolsRequest(), metadata=metadata, timeout=self._timeout
            )
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.UNAUTHENTICATED:
                return False
            raise  # Memoria unreachable or failing: a server error, not the caller's
        return True

    async def verify_token(self, token: str) -> AccessToken | None:
        """The token's access info when Memoria accepts it, else None (HTTP 401)."""
        if not await anyio.to_thread.run_sync(self._check, token):
            return None
        return AccessToken(token=token, client_id="memoria-mcp", scopes=[])


def build_http_app(channel: grpc.Channel, *, host: str, timeout: float | None = None) -> Starlette:
    """Streamable HTTP on `HTTP_PATH`, every request authenticated by Memoria first.

    Stateless (no MCP session kept between requests), so replicas need nothing shared, like
    the gRPC service behind them. On loopback the SDK's DNS-rebinding protection is on, as the
    SDK itself sets it up for loopback.
    """
    security = None
    if host in ("127.0.0.1", "localhost", "::1"):
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    manager = StreamableHTTPSessionManager(
        app=build_server(channel, None, timeout=timeout),
        stateless=True,
        security_settings=security,
    )
    endpoint = RequireAuthMiddleware(StreamableHTTPASGIApp(manager), required_scopes=[])
    return Starlette(
        routes=[Route(HTTP_PATH, endpoint=endpoint)],
        middleware=[
            Middleware(
                AuthenticationMiddleware,
                backend=BearerAuthBackend(MemoriaTokenVerifier(channel, timeout)),
            ),
            Middleware(AuthContextMiddleware),
        ],
        lifespan=lambda _app: manager.run(),
    )


def run_stdio(server: Server[Any]) -> None:
    """Serve one host over this process's stdin and stdout until it closes them."""
    anyio.run(_serve_stdio, server)


async def _serve_stdio(server: Server[Any]) -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def serve_http(app: Starlette, host: str, port: int, port_file: Path | None, target: str) -> None:
    """Serve `app` on HOST:PORT (port 0 picks one, written to `port_file`) until SIGTERM or
    SIGINT, which uvicorn turns into a graceful stop."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound = sock.getsockname()[1]
    _log.info("serving MCP on http://%s:%d%s for %s", host, bound, HTTP_PATH, target)
    _log.info("a Memoria with an HTTP port serves %s on it itself (server/rpc/mcp.py)", HTTP_PATH)
    if port_file is not None:
        # Connections made from now on wait in the backlog until uvicorn accepts them.
        port_file.write_text(str(bound))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
