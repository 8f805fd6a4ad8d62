"""Where a Memoria server is and who calls it: the flags every client command shares.

`memoria export`, `memoria import` and `memoria mcp` (also the client package's `memoria-mcp`)
are clients of a running server, and they say where it is and who is calling with the same
words, defined once here:

- `--server HOST:PORT` (env MEMORIA_SERVER, default 127.0.0.1:50051) and `--tls`;
- `--token` (env MEMORIA_TOKEN): the caller's bearer token, for a server in jwt mode;
- `--tenant` and `--principal` (env MEMORIA_TENANT, MEMORIA_PRINCIPAL): the caller's identity
  for a server in trusted-headers mode.

The names these commands had before (`--addr`, `--target`, MEMORIA_ADDR, MEMORIA_MCP_TARGET,
MEMORIA_MCP_TOKEN, MEMORIA_MCP_TENANT, MEMORIA_MCP_PRINCIPAL) keep working, hidden from
`--help`, so scripts and MCP host configurations written for them do not break. It lives in
the client package, which never imports the server's; the server's commands import it.
"""

from __future__ import annotations

import argparse
import os

import grpc

DEFAULT_SERVER = "127.0.0.1:50051"

Metadata = tuple[tuple[str, str | bytes], ...]

# Each setting's environment names, the agreed one first; the others are its earlier names.
SERVER_ENV = ("MEMORIA_SERVER", "MEMORIA_ADDR", "MEMORIA_MCP_TARGET")
TOKEN_ENV = ("MEMORIA_TOKEN", "MEMORIA_MCP_TOKEN")
TENANT_ENV = ("MEMORIA_TENANT", "MEMORIA_MCP_TENANT")
PRINCIPAL_ENV = ("MEMORIA_PRINCIPAL", "MEMORIA_MCP_PRINCIPAL")


def _from_env(names: tuple[str, ...]) -> str | None:
    """The first of `names` set to a non-empty value (an empty variable counts as unset)."""
    return next((value for name in names if (value := os.environ.get(name))), None)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the connection and identity flags to a client command's parser."""
    parser.add_argument(
        "--server",
        default=_from_env(SERVER_ENV) or DEFAULT_SERVER,
        metavar="HOST:PORT",
        help=f"the Memoria gRPC server (default $MEMORIA_SERVER or {DEFAULT_SERVER})",
    )
    # The earlier names of --server: same destination, no default of their own (argparse
    # would otherwise let the alias's default compete with --server's), not in --help.
    parser.add_argument(
        "--addr", "--target", dest="server", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    parser.add_argument("--tls", action="store_true", help="connect to the server over TLS")
    parser.add_argument(
        "--token",
        default=_from_env(TOKEN_ENV),
        help="jwt mode: the caller's bearer token (default $MEMORIA_TOKEN; the environment "
        "keeps it out of the process list)",
    )
    parser.add_argument(
        "--tenant",
        default=_from_env(TENANT_ENV),
        help="trusted-headers mode: the caller's tenant (default $MEMORIA_TENANT)",
    )
    parser.add_argument(
        "--principal",
        default=_from_env(PRINCIPAL_ENV),
        help="trusted-headers mode: the caller, a person (default $MEMORIA_PRINCIPAL)",
    )


def channel(args: argparse.Namespace) -> grpc.Channel:
    """A channel to `--server`, over TLS with `--tls` (the system's root certificates)."""
    if args.tls:
        return grpc.secure_channel(args.server, grpc.ssl_channel_credentials())
    return grpc.insecure_channel(args.server)


def metadata(args: argparse.Namespace) -> Metadata:
    """Call metadata naming the caller: the bearer token and/or the trusted headers given."""
    md: list[tuple[str, str | bytes]] = []
    if args.token:
        md.append(("authorization", f"Bearer {args.token}"))
    if args.tenant:
        md.append(("x-memoria-tenant", args.tenant))
    if args.principal:
        md.append(("x-memoria-principal", args.principal))
    return tuple(md)
