"""Who a caller is (the authenticator the settings choose) and the key that signs page
tokens."""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any

from server.rpc.auth import Authenticator, JwtAuthenticator, JwtSettings, TrustedHeaders, load_jwks
from server.runtime.settings import Settings, is_loopback, listen_host

log = logging.getLogger(__name__)


def build_authenticator(settings: Settings) -> Authenticator:
    """The authenticator the settings choose; trusted headers set explicitly on an address
    others can reach is allowed (behind a mesh) but said loudly, once, at start."""
    if settings.effective_auth == "trusted-headers":
        _warn_of_open_trusted_headers(settings)
        return TrustedHeaders(admin_role=settings.access.admin_role)
    return JwtAuthenticator(jwt_settings(settings))


def jwt_settings(settings: Settings) -> JwtSettings:
    """How this server verifies bearer tokens (key, algorithms, claims), from its settings;
    also what `memoria token` signs with, so a minted token is one this server accepts."""
    jwt = settings.jwt
    key: Any
    algorithms: tuple[str, ...]
    if jwt.hs256_secret is not None:
        key, algorithms = jwt.hs256_secret.get_secret_value(), ("HS256",)
    elif jwt.public_key_file is not None:
        key, algorithms = jwt.public_key_file.read_text(), ("RS256", "ES256")
    else:
        assert jwt.jwks_file is not None
        key, algorithms = load_jwks(jwt.jwks_file), ("RS256", "ES256")
    return JwtSettings(
        algorithms=jwt.algorithms or algorithms,
        key=key,
        audience=jwt.audience,
        issuer=jwt.issuer,
        tenant_claim=jwt.tenant_claim,
        principal_claim=jwt.principal_claim,
        roles_claim=jwt.roles_claim,
        admin_role=settings.access.admin_role,
        leeway_seconds=jwt.leeway_seconds,
    )


def _warn_of_open_trusted_headers(settings: Settings) -> None:
    listens = [settings.serve.listen, *([settings.http.listen] if settings.http.listen else [])]
    for host in (listen_host(listen) for listen in listens):
        if not is_loopback(host):
            log.warning(
                "auth is trusted-headers on %s, which is not loopback: any client that "
                "reaches this port can claim any identity in x-memoria-* headers. Only run "
                "it so behind a proxy or mesh that authenticates callers and sets those "
                "headers itself.",
                host or "every interface",
            )


def page_token_key(settings: Settings) -> bytes:
    """The key that signs page tokens.

    Configured: used as is (the same on every replica). Embedded default: a random key kept in
    the data directory, so tokens survive a restart. Otherwise random for this process only.
    """
    if settings.serve.page_token_secret is not None:
        return settings.serve.page_token_secret.get_secret_value().encode()
    if settings.store.embedded:
        path = settings.store.data_dir / "page-token.key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(secrets.token_bytes(32))
        return path.read_bytes()
    log.warning(
        "MEMORIA_PAGE_TOKEN_SECRET is not set: page tokens are valid for this process only; "
        "set the same secret on every replica"
    )
    return secrets.token_bytes(32)
