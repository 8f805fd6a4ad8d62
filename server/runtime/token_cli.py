"""`memoria token`: a person's HS256 token, signed with this deployment's own jwt settings.

For trying jwt mode locally (the settings page's token mode, `memoria mcp` over HTTP, the
client commands' `--token`) without an identity provider: with MEMORIA_JWT_HS256_SECRET (and
the audience, issuer and claim names, if set) in the environment of both the server and this
command, the token it prints is one that server accepts. It reads the settings the server
reads and signs with what the server verifies with (`jwt_settings` in
server/runtime/builders/access.py), so the two cannot drift apart. A deployment verifying with
a public key or a JWKS gets its tokens from its identity provider, which holds the private key:
this command refuses there.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import jwt

from server.domain.ids import identity_value_problem
from server.runtime.settings import Settings

DEFAULT_EXPIRES_IN = 3600
"""An hour: long enough to try things, short enough that a token pasted somewhere expires."""


def _seconds(value: str) -> int:
    try:
        seconds = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of seconds: {value!r}") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `memoria token`."""
    parser.epilog = (
        "Signs with MEMORIA_JWT_HS256_SECRET and uses MEMORIA_JWT_AUDIENCE, MEMORIA_JWT_ISSUER "
        "and the claim names the server reads, so run it with the server's environment."
    )
    parser.add_argument("--tenant", required=True, help="the person's tenant")
    parser.add_argument("--principal", required=True, help="the person (the principal claim)")
    parser.add_argument(
        "--admin", action="store_true", help="with the admin role (MEMORIA_ADMIN_ROLE)"
    )
    parser.add_argument(
        "--expires-in",
        type=_seconds,
        default=DEFAULT_EXPIRES_IN,
        metavar="SECONDS",
        help=f"lifetime in seconds (default {DEFAULT_EXPIRES_IN})",
    )


def mint(
    settings: Settings,
    tenant: str,
    principal: str,
    *,
    admin: bool = False,
    expires_in: int = DEFAULT_EXPIRES_IN,
    now: float | None = None,
) -> str:
    """An HS256 token for `tenant`/`principal` that a server with `settings` accepts until
    `expires_in` seconds after `now`; ValueError (one line) when it cannot make one."""
    from server.runtime.builders.access import jwt_settings  # only this command needs it

    if settings.jwt.hs256_secret is None:
        raise ValueError(
            "no HS256 secret is configured (MEMORIA_JWT_HS256_SECRET); a deployment that "
            "verifies with a public key or JWKS gets its tokens from its identity provider"
        )
    verify = jwt_settings(settings)
    if "HS256" not in verify.algorithms:
        raise ValueError(
            f"MEMORIA_JWT_ALGORITHMS is {','.join(verify.algorithms)}: the server would refuse "
            "an HS256 token"
        )
    for flag, value in (("--tenant", tenant), ("--principal", principal)):
        if (problem := identity_value_problem(value)) is not None:
            raise ValueError(f"{flag} {problem}")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {
        verify.tenant_claim: tenant,
        verify.principal_claim: principal,
        "iat": issued,
        "exp": issued + expires_in,
    }
    if admin:
        claims[verify.roles_claim] = [verify.admin_role]
    if verify.audience is not None:
        claims["aud"] = verify.audience
    if verify.issuer is not None:
        claims["iss"] = verify.issuer
    return jwt.encode(claims, verify.key, algorithm="HS256")


def run(settings: Settings, args: argparse.Namespace) -> None:
    """Print the token alone on stdout (for `TOKEN=$(memoria token ...)`), or exit with one
    line on stderr."""
    try:
        token = mint(
            settings,
            args.tenant,
            args.principal,
            admin=args.admin,
            expires_in=args.expires_in,
        )
    except ValueError as error:
        sys.exit(f"memoria token: {error}")
    print(token)
