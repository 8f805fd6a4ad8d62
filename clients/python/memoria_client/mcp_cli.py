"""The command line of Memoria's MCP server: `memoria mcp` and the client package's `memoria-mcp`.

Kept apart from `mcp_server` so that parsing the flags (every `memoria` command builds this
parser) imports nothing of the MCP SDK, and so that the client package works without its `mcp`
extra for everything but this command.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from memoria_client import connection

HTTP_PATH = "/mcp"


def _parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `memoria mcp` (also used by `server/runtime/cli.py`): the connection flags
    every client command shares (memoria_client/connection.py), then the MCP server's own."""
    parser.epilog = (
        "Identity over stdio: --token (or MEMORIA_TOKEN) with a bearer token (Memoria in jwt "
        "mode), or --tenant and --principal (trusted headers). Over HTTP, Memoria itself serves "
        f"MCP at {HTTP_PATH} on its own HTTP port (--http-listen); --transport http is for a "
        "Memoria in jwt mode whose HTTP port is not reachable: each caller's Authorization: "
        "Bearer token, checked by Memoria; a request without one gets 401."
    )
    connection.add_arguments(parser)
    parser.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help=f"default stdio (the server serves {HTTP_PATH} on its HTTP port itself)",
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8765",
        help=f"http: HOST:PORT to serve {HTTP_PATH} on (default 127.0.0.1:8765; port 0 picks one)",
    )
    parser.add_argument("--port-file", type=Path, help="http: write the bound port here")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds per Memoria call (default 10)"
    )
    parser.add_argument(
        "--turn-gap-seconds",
        type=float,
        default=60.0,
        help="stdio: a tool call after this long a quiet spell starts a new turn (default 60)",
    )


def run(args: argparse.Namespace) -> None:
    """Serve MCP as `args` say until the host closes stdio or the HTTP server is stopped."""
    try:
        from memoria_client import mcp_server
    except ImportError as error:  # the package installed without its mcp extra
        sys.exit(
            f"memoria mcp: the MCP SDK is not installed (no module {error.name!r}): "
            "pip install -c requirements.lock './clients/python[mcp]'"
        )

    if args.transport == "stdio":
        identity = mcp_server.Identity.from_config(args.token, args.tenant, args.principal)
        if identity is None:
            sys.exit(
                "memoria mcp: say who the tools act for: --token or MEMORIA_TOKEN (Memoria in "
                "jwt mode), or --tenant and --principal (trusted headers), not both"
            )
    elif args.token or args.tenant or args.principal:
        sys.exit(
            "memoria mcp --transport http: each caller's Authorization: Bearer token is the "
            "identity; --token, --tenant and --principal (and their MEMORIA_* variables) are "
            "for stdio"
        )
    else:
        try:
            host, port = _parse_listen(args.listen)
        except ValueError as error:
            sys.exit(f"memoria mcp: {error}")
    channel = connection.channel(args)
    try:
        if args.transport == "stdio":
            server = mcp_server.build_server(
                channel, identity, timeout=args.timeout, turn_gap=args.turn_gap_seconds
            )
            mcp_server.run_stdio(server)
        else:
            app = mcp_server.build_http_app(channel, host=host, timeout=args.timeout)
            mcp_server.serve_http(app, host, port, args.port_file, args.server)
    finally:
        channel.close()


def main(argv: Sequence[str] | None = None) -> None:
    """`memoria-mcp` (the client package's own command; `memoria mcp` is the same)."""
    parser = argparse.ArgumentParser(
        prog="memoria-mcp", description="Memoria's model tools and memory prompt section over MCP."
    )
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    run(parser.parse_args(argv))
