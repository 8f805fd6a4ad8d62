"""The HTTP port (server/rpc/web.py): Connect, gRPC-Web and the settings page, as a gateway
to the gRPC port, when `http_listen` is set."""

from __future__ import annotations

from server.rpc.web import WEB_DIST, Gateway, WebServer, grpc_target
from server.runtime.builders.grpc_server import SERVICE_NAMES
from server.runtime.settings import Settings, StartupRefusal, is_loopback, listen_host


def build_web(settings: Settings, grpc_port: int) -> WebServer | None:
    """The gateway to the gRPC port `grpc_port`, bound to `http.listen` (None when unset)."""
    http, limits = settings.http, settings.limits
    if http.listen is None:
        return None
    gateway = Gateway(
        grpc_target(settings.serve.listen, grpc_port),
        SERVICE_NAMES,
        max_receive_message_bytes=limits.max_receive_message_bytes,
        max_send_message_bytes=limits.max_send_message_bytes,
        receive_timeout_s=limits.receive_timeout_seconds,
        cors_origins=http.cors_origins,
        web_dist=http.page_dir or WEB_DIST,
        loopback_only=is_loopback(listen_host(http.listen)),
    )
    try:
        return WebServer(
            gateway,
            http.listen,
            max_connections=limits.max_receiving_calls,
            reuse_port=settings.serve.processes > 1,
        )
    except SystemExit as error:  # WebServer's own one line: the port cannot be bound
        raise StartupRefusal(str(error), "http_listen") from None
