"""The browser's way in: Connect (unary, JSON or binary) and gRPC-Web for Memoria's services,
plus the settings page's static files, on an HTTP/1.1 port of its own (MEMORIA_HTTP_LISTEN);
and MCP over streamable HTTP at `/mcp` (server/rpc/mcp.py), forwarded the same way.

A browser cannot speak native gRPC (it has no access to HTTP/2 trailers), so this gateway turns
each browser call into a gRPC call to this process's own gRPC server over loopback and turns
the answer back. Every rule therefore stays where it is: the same interceptor authenticates
the call from the same headers (`authorization`, `x-memoria-*`) with the same authenticator,
the same table (server/rpc/errors.py) maps errors to statuses, whose google.rpc details are
passed on as Connect error details (or gRPC-Web trailers), and the same admission limits and
message size limits apply, because the call is a gRPC call. Nothing here decides anything
about a request except how to carry it.

Why not the official `connectrpc` package (0.13): it serves Connect, gRPC and gRPC-Web well,
but from servicers written against its own generated interfaces (its own protoc plugin) and
its own interceptor and error types. Adopting it meant a second set of servicers, a second
authentication path and a second error table beside the gRPC ones, or rewriting the gRPC
server onto it; the team's rule is one copy of each rule. The protocols' unary forms are
small and fully specified (connectrpc.com/docs/protocol, the gRPC-Web spec in grpc/grpc's
PROTOCOL-WEB.md), so this one module carries them, on Starlette and uvicorn (maintained
libraries already in the environment). Streaming methods are not served (Memoria's contract
has none: buf's UNARY_RPC rule), nor Connect's GET form of idempotent calls (HTTP 404), nor
compressed requests (UNIMPLEMENTED): browsers' Connect clients use neither by default.

Costs: one loopback gRPC hop per browser call (a settings page makes a few calls per
minute). Request bodies are refused above MEMORIA_MAX_RECEIVE_MESSAGE_BYTES before they are
read in full. A JSON body that does not parse is forwarded as bytes that do not decode, so
the interceptor answers it exactly as it answers undecodable gRPC bytes: authentication
first, then MALFORMED_REQUEST. CORS is off unless origins are listed (MEMORIA_HTTP_CORS_ORIGINS).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import socket
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import uvicorn
from google.protobuf import descriptor_pool, json_format
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.rpc import status_pb2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from server.domain.errors import ErrorReason, MemoriaError
from server.rpc import mcp
from server.rpc.auth import unauthenticated
from server.rpc.errors import to_status

log = logging.getLogger(__name__)

WEB_DIST = Path(__file__).resolve().parents[2] / "web" / "dist"
"""Where `scripts/web.sh` (run by `make serve` and `make test`) puts the built page."""

FORWARDED_HEADERS = (
    "authorization",
    "x-memoria-tenant",
    "x-memoria-principal",
    "x-memoria-roles",
    "traceparent",
    "tracestate",
)
"""Request headers passed on as call metadata: identity for the authenticator, trace context
for telemetry. Anything else a browser sends (cookies above all) is not."""

UNDECODABLE = b"\x08"
"""A field tag without its value: no message of any type decodes from it (see the module
docstring: the interceptor then answers MALFORMED_REQUEST after authenticating)."""

MAX_TIMEOUT_S = 300.0
"""The longest deadline a browser call may ask for (and the one it gets without asking)."""

# Connect's codes and their HTTP statuses (connectrpc.com/docs/protocol#error-codes).
_CONNECT_CODES: dict[grpc.StatusCode, tuple[str, int]] = {
    grpc.StatusCode.CANCELLED: ("canceled", 499),
    grpc.StatusCode.UNKNOWN: ("unknown", 500),
    grpc.StatusCode.INVALID_ARGUMENT: ("invalid_argument", 400),
    grpc.StatusCode.DEADLINE_EXCEEDED: ("deadline_exceeded", 504),
    grpc.StatusCode.NOT_FOUND: ("not_found", 404),
    grpc.StatusCode.ALREADY_EXISTS: ("already_exists", 409),
    grpc.StatusCode.PERMISSION_DENIED: ("permission_denied", 403),
    grpc.StatusCode.RESOURCE_EXHAUSTED: ("resource_exhausted", 429),
    grpc.StatusCode.FAILED_PRECONDITION: ("failed_precondition", 400),
    grpc.StatusCode.ABORTED: ("aborted", 409),
    grpc.StatusCode.OUT_OF_RANGE: ("out_of_range", 400),
    grpc.StatusCode.UNIMPLEMENTED: ("unimplemented", 501),
    grpc.StatusCode.INTERNAL: ("internal", 500),
    grpc.StatusCode.UNAVAILABLE: ("unavailable", 503),
    grpc.StatusCode.DATA_LOSS: ("data_loss", 500),
    grpc.StatusCode.UNAUTHENTICATED: ("unauthenticated", 401),
}
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

_PROTOCOLS = {
    "application/proto": "connect+proto",
    "application/json": "connect+json",
    "application/grpc-web": "grpc-web",
    "application/grpc-web+proto": "grpc-web",
    "application/grpc-web-text": "grpc-web-text",
    "application/grpc-web-text+proto": "grpc-web-text",
}

_GRPC_TIMEOUT = re.compile(r"^(\d{1,8})([HMSmun])$")
_GRPC_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}

# What the page may load and run: its own files only, no inline script, no frames around it.
# A block holding markup could not run even if the page displayed it unescaped.
_PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


@dataclass(frozen=True)
class _Method:
    """One unary RPC as the gateway carries it."""

    path: str  # /memoria.v1.MemoryBlockService/GetMemoryBlock
    request: type[Message]
    response: type[Message]


@dataclass(frozen=True)
class _Failure:
    """A call's status as the browser gets it: code, message and google.rpc details."""

    code: grpc.StatusCode
    message: str
    details: bytes  # a serialized google.rpc.Status, or b"" when there are none


class _TooLarge(Exception):
    """The request body is larger than the message limit."""


def methods(service_names: Iterable[str]) -> dict[str, _Method]:
    """The unary methods of the named services (their pb2 modules must be imported)."""
    pool = descriptor_pool.Default()
    found: dict[str, _Method] = {}
    for name in service_names:
        service = pool.FindServiceByName(name)
        for method in service.methods:
            if method.client_streaming or method.server_streaming:
                continue
            path = f"/{service.full_name}/{method.name}"
            found[path] = _Method(
                path, GetMessageClass(method.input_type), GetMessageClass(method.output_type)
            )
    return found


def _failure_of(status: grpc.Status) -> _Failure:
    """The failure a status from server/rpc/errors.py describes (for errors found here)."""
    details = b""
    for key, value in status.trailing_metadata:
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            details = value
    return _Failure(status.code, status.details, details)


def _too_large(limit: int) -> _Failure:
    """RESOURCE_EXHAUSTED, as gRPC answers a message over the limit, with an ErrorInfo
    (reason INVALID_ARGUMENT: the request, not the server, is the problem); the message names
    the limit."""
    status = to_status(
        MemoriaError(
            ErrorReason.INVALID_ARGUMENT,
            f"the request is larger than the limit of {limit} bytes",
        )
    )
    failure = _failure_of(status)
    return _Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, failure.message, failure.details)


def _connect_error(failure: _Failure) -> Response:
    """A Connect unary error: HTTP status by code, JSON body with the details as Any."""
    code, http_status = _CONNECT_CODES.get(failure.code, ("unknown", 500))
    body: dict[str, Any] = {"code": code}
    if failure.message:
        body["message"] = failure.message
    if failure.details:
        status = status_pb2.Status.FromString(failure.details)
        body["details"] = [
            {
                "type": detail.type_url.rpartition("/")[2],
                "value": base64.b64encode(detail.value).decode().rstrip("="),
            }
            for detail in status.details
        ]
    return JSONResponse(body, status_code=http_status)


def _frame(flag: int, payload: bytes) -> bytes:
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


def _grpc_web(
    protocol: str, message: bytes | None, code: grpc.StatusCode, failure: _Failure | None
) -> Response:
    """A gRPC-Web response: the message frame (on success), then the trailer frame."""
    trailers = [f"grpc-status: {code.value[0]}"]
    if failure is not None:
        if failure.message:
            trailers.append(f"grpc-message: {urllib.parse.quote(failure.message, safe=' ')}")
        if failure.details:
            encoded = base64.b64encode(failure.details).decode().rstrip("=")
            trailers.append(f"grpc-status-details-bin: {encoded}")
    body = b"" if message is None else _frame(0, message)
    body += _frame(0x80, ("\r\n".join(trailers) + "\r\n").encode())
    media = "application/grpc-web+proto"
    if protocol == "grpc-web-text":
        body, media = base64.b64encode(body), "application/grpc-web-text+proto"
    return Response(body, media_type=media)


def _unframe(body: bytes) -> bytes:
    """The one message of a gRPC-Web request; bytes that do not decode when the framing is
    wrong (compressed, truncated, several messages), which the interceptor answers."""
    if len(body) < 5 or body[0] != 0:
        return UNDECODABLE
    length = int.from_bytes(body[1:5], "big")
    if len(body) != 5 + length:
        return UNDECODABLE
    return body[5:]


def _timeout(request: Request, protocol: str) -> float:
    """The deadline the caller asked for (Connect-Timeout-Ms or grpc-timeout), capped."""
    try:
        if protocol.startswith("connect"):
            value = request.headers.get("connect-timeout-ms")
            if value is not None and value.isdigit() and len(value) <= 10:
                return min(int(value) / 1000, MAX_TIMEOUT_S)
        elif (match := _GRPC_TIMEOUT.match(request.headers.get("grpc-timeout", ""))) is not None:
            amount, unit = match.groups()
            return min(int(amount) * _GRPC_TIMEOUT_UNITS[unit], MAX_TIMEOUT_S)
    except ValueError:
        pass
    return MAX_TIMEOUT_S


def _metadata(request: Request) -> list[tuple[str, str]]:
    """The forwarded headers as call metadata, every value of each (the interceptor refuses
    a header sent twice with different values). A value gRPC cannot carry (not printable
    ASCII) could never name an identity (server/domain/ids.py): UNAUTHENTICATED, as the
    authenticator answers an identity it cannot confirm."""
    metadata: list[tuple[str, str]] = []
    for key in FORWARDED_HEADERS:
        for value in request.headers.getlist(key):
            if not value.isascii() or not value.isprintable():
                raise unauthenticated(f"header {key} is not printable ASCII")
            metadata.append((key, value))
    return metadata


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})
"""The Host names a loopback-only HTTP port answers to (see _LoopbackHosts)."""


class _LoopbackHosts:
    """Refuses requests whose Host is not a loopback name (ASGI middleware).

    On loopback the server trusts the x-memoria-* headers, and a page of another site can
    make a browser call it under that site's own name by DNS rebinding (the name re-resolves
    to 127.0.0.1, so the browser counts the calls as same-origin and CORS never applies).
    Its Host header then still carries the other name. Written here rather than Starlette's
    TrustedHostMiddleware, which cuts the port off at the first ':' and so cannot match
    '[::1]:8080'.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").lower()
            name = host.rpartition(":")[0] if re.search(r":\d+$", host) else host
            if name not in LOOPBACK_HOSTS:
                refusal = PlainTextResponse(
                    "This server answers only to 127.0.0.1, localhost and [::1].",
                    status_code=403,
                )
                await refusal(scope, receive, send)
                return
        await self._app(scope, receive, send)


class _PageHeaders:
    """Adds the page's security headers to every static response (ASGI middleware)."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(event: dict[str, Any]) -> None:
            if event["type"] == "http.response.start":
                headers = list(event.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in _PAGE_HEADERS.items()]
                event = {**event, "headers": headers}
            await send(event)

        await self._app(scope, receive, send_with_headers)  # type: ignore[arg-type]


class Gateway:
    """The Starlette app: one route per unary method, MCP at `/mcp`, the page at `/`."""

    def __init__(
        self,
        grpc_target: str,
        service_names: Sequence[str],
        *,
        max_receive_message_bytes: int,
        max_send_message_bytes: int,
        receive_timeout_s: float,
        cors_origins: Sequence[str] = (),
        web_dist: Path = WEB_DIST,
        loopback_only: bool = False,
    ) -> None:
        """`loopback_only`: the port listens on loopback, and only loopback Host names are
        answered (against DNS rebinding, see _LoopbackHosts)."""
        self._target = grpc_target
        self._methods = methods(service_names)
        self._max_receive = max_receive_message_bytes
        self._max_send = max_send_message_bytes
        self._receive_timeout = receive_timeout_s
        self._channel: grpc.aio.Channel | None = None
        # MCP's calls are gRPC calls on the same channel with the same forwarded headers, so
        # they are authenticated and limited exactly as the browser's (server/rpc/mcp.py).
        self._mcp = mcp.McpEndpoint(
            self._live_channel,
            _metadata,
            max_body_bytes=max_receive_message_bytes + 1024,  # the JSON-RPC envelope's bytes
            timeout_s=MAX_TIMEOUT_S,
        )
        routes: list[Route | Mount] = [
            Route(path, self._call, methods=["POST"]) for path in self._methods
        ]
        # POST only: stateless MCP has no session to end (DELETE) and no server-initiated
        # message to stream (a GET stream would only hold a connection open): HTTP 405.
        routes.append(Route(mcp.PATH, self._mcp.app, methods=["POST"]))
        routes.append(Route(mcp.PATH, _mcp_post_only))
        # Any other call (an unknown method, or a service this server does not have):
        # UNIMPLEMENTED, as gRPC answers it, rather than the page's 405 or 404.
        routes.append(Route("/{service:str}/{method:str}", self._unknown, methods=["POST"]))
        if (web_dist / "index.html").is_file():
            routes.append(Mount("/", _PageHeaders(StaticFiles(directory=web_dist, html=True))))
        else:
            routes.append(Route("/", _not_built))
        middleware = []
        if cors_origins:
            # Explicit origins only (never "*" with credentials); the headers a Connect or
            # gRPC-Web client sends and the trailers-as-headers gRPC-Web may read.
            middleware.append(
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(cors_origins),
                    allow_methods=["POST"],
                    allow_headers=[
                        "content-type",
                        "connect-protocol-version",
                        "connect-timeout-ms",
                        "grpc-timeout",
                        "x-grpc-web",
                        "x-user-agent",
                        "mcp-protocol-version",
                        *FORWARDED_HEADERS,
                    ],
                    expose_headers=["grpc-status", "grpc-message", "grpc-status-details-bin"],
                    max_age=600,
                )
            )
        if loopback_only:
            middleware.insert(0, Middleware(_LoopbackHosts))
        self.app = Starlette(routes=routes, middleware=middleware, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        # The channel belongs to the server's event loop, so it is made inside it.
        self._channel = grpc.aio.insecure_channel(
            self._target,
            options=[
                # The server's own limits decide; the channel must not be stricter than them
                # (the framing of a maximal request is a few bytes over its message).
                ("grpc.max_send_message_length", self._max_receive + 1024),
                ("grpc.max_receive_message_length", self._max_send),
            ],
        )
        try:
            async with self._mcp.run():
                yield
        finally:
            await self._channel.close(None)

    def _live_channel(self) -> grpc.aio.Channel:
        assert self._channel is not None, "the gateway serves only inside its lifespan"
        return self._channel

    async def _call(self, request: Request) -> Response:
        method = self._methods[request.url.path]
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        protocol = _PROTOCOLS.get(media)
        if protocol is None:
            return PlainTextResponse(
                "use Connect (application/json or application/proto) or gRPC-Web",
                status_code=415,
            )
        encoding = request.headers.get(
            "content-encoding" if protocol.startswith("connect") else "grpc-encoding", "identity"
        )
        if encoding.strip().lower() != "identity":
            # Browsers' Connect and gRPC-Web clients send uncompressed requests by default;
            # Connect's rule for an encoding the server lacks is UNIMPLEMENTED.
            failure = _Failure(
                grpc.StatusCode.UNIMPLEMENTED, "compressed requests are not accepted", b""
            )
            return self._error(protocol, failure)
        try:
            body = await self._body(request, protocol)
            payload = self._payload(method, protocol, body)
            message = await self._forward(method, payload, _metadata(request), request, protocol)
        except _TooLarge:
            return self._error(protocol, _too_large(self._max_receive))
        except MemoriaError as error:
            return self._error(protocol, _failure_of(to_status(error)))
        except _CallFailed as failed:
            return self._error(protocol, failed.failure)
        except ClientDisconnect:
            return Response(status_code=499)
        if protocol == "connect+proto":
            return Response(message, media_type="application/proto")
        if protocol == "connect+json":
            decoded = method.response.FromString(message)
            return Response(json_format.MessageToJson(decoded), media_type="application/json")
        return _grpc_web(protocol, message, grpc.StatusCode.OK, None)

    async def _unknown(self, request: Request) -> Response:
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        failure = _Failure(grpc.StatusCode.UNIMPLEMENTED, "no such method", b"")
        return self._error(_PROTOCOLS.get(media, "connect+json"), failure)

    def _error(self, protocol: str, failure: _Failure) -> Response:
        if protocol.startswith("connect"):
            return _connect_error(failure)
        return _grpc_web(protocol, None, failure.code, failure)

    async def _body(self, request: Request, protocol: str) -> bytes:
        """The request body, refused once it passes the limit, within the receive bound."""
        limit = self._max_receive
        if protocol.startswith("grpc-web"):
            limit += 5  # the frame header
        if protocol == "grpc-web-text":
            limit = (limit + 2) // 3 * 4
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self._receive_timeout):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise _TooLarge
                    chunks.append(chunk)
        except TimeoutError:
            raise _CallFailed(
                _Failure(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    "the request did not arrive in full in time",
                    b"",
                )
            ) from None
        return b"".join(chunks)

    def _payload(self, method: _Method, protocol: str, body: bytes) -> bytes:
        """The request message's bytes for the gRPC call."""
        if protocol == "connect+proto":
            return body
        if protocol == "connect+json":
            try:
                parsed = json_format.Parse(body or b"{}", method.request())
            except (json_format.ParseError, UnicodeDecodeError, ValueError, RecursionError):
                return UNDECODABLE
            return bytes(parsed.SerializeToString())
        if protocol == "grpc-web-text":
            try:
                body = base64.b64decode(body, validate=True)
            except ValueError:
                return UNDECODABLE
        return _unframe(body)

    async def _forward(
        self,
        method: _Method,
        payload: bytes,
        metadata: list[tuple[str, str]],
        request: Request,
        protocol: str,
    ) -> bytes:
        """The gRPC call: the response message's bytes, or _CallFailed with its status."""
        assert self._channel is not None, "the gateway serves only inside its lifespan"
        # No serializers: the payload and the answer are bytes, passed through as they are.
        call = self._channel.unary_unary(
            method.path, request_serializer=None, response_deserializer=None
        )
        try:
            response = await call(payload, metadata=metadata, timeout=_timeout(request, protocol))
        except grpc.aio.AioRpcError as error:
            details = b""
            trailing: Any = error.trailing_metadata() or ()
            for key, value in trailing:
                if key == "grpc-status-details-bin" and isinstance(value, bytes):
                    details = value
            raise _CallFailed(_Failure(error.code(), error.details() or "", details)) from None
        assert isinstance(response, bytes)
        return response


class _CallFailed(Exception):
    def __init__(self, failure: _Failure) -> None:
        super().__init__(failure.code)
        self.failure = failure


async def _mcp_post_only(_request: Request) -> Response:
    return PlainTextResponse(
        "MCP here is stateless streamable HTTP: POST each JSON-RPC message.",
        status_code=405,
        headers={"allow": "POST"},
    )


async def _not_built(_request: Request) -> Response:
    return PlainTextResponse(
        "The settings page is not built: run `make web` (scripts/web.sh) and restart.",
        status_code=503,
    )


def grpc_target(listen: str, port: int) -> str:
    """Where the gateway reaches this process's gRPC server: its own address, or loopback
    when it listens on every interface."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0"):
        return f"127.0.0.1:{port}"
    if host == "::":
        return f"[::1]:{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Uvicorn(uvicorn.Server):
    """uvicorn's server that says when it is listening (it runs on a thread of its own)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


class WebServer:
    """The gateway served by uvicorn on a thread, on a socket bound before it starts (so
    port 0 works and a taken port fails the start in one line)."""

    def __init__(
        self, gateway: Gateway, listen: str, *, max_connections: int, reuse_port: bool = False
    ) -> None:
        """`reuse_port`: several processes share the port (`--workers N`), as the gRPC one."""
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets
        # whose protocol says TCP, and with Nagle on each answer after a connection's first
        # waited for the client's delayed ACK (about 40 ms per call, measured).
        self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if reuse_port:
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            self._socket.bind((host, int(port)))
            self._socket.listen(128)
        except OSError as error:
            self._socket.close()
            raise SystemExit(f"cannot listen on {listen} for HTTP: {error.strerror}") from None
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            gateway.app,
            http="h11",
            ws="none",
            lifespan="on",
            log_config=None,
            access_log=False,
            # Beyond this many connections and calls at once, new ones get HTTP 503.
            limit_concurrency=max_connections,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=5,
        )
        self._server = _Uvicorn(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="http", daemon=True
        )

    def start(self) -> None:
        """Serve; returns once the port accepts calls (or the server failed to start)."""
        self._thread.start()
        while not self._server.ready.wait(0.05):
            if not self._thread.is_alive():
                raise SystemExit("the HTTP server failed to start (see the log)")

    def stop(self) -> None:
        """Stop accepting, let calls in flight finish (bounded), close the socket."""
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
