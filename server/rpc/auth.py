"""Who is calling: one pluggable authenticator reads the identity from call metadata.

`jwt` verifies a bearer token (HS256 secret, or RS256/ES256 public key or JWKS file) with
PyJWT; `trusted-headers` trusts a service mesh that already authenticated the caller and set
`x-memoria-tenant` / `x-memoria-principal` (and optionally `x-memoria-roles`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.ids import identity_value_problem, is_printable_ascii
from server.domain.model import Identity

TENANT_HEADER = "x-memoria-tenant"
PRINCIPAL_HEADER = "x-memoria-principal"
ROLES_HEADER = "x-memoria-roles"


class Authenticator(Protocol):
    """Turns call metadata into an Identity or raises UNAUTHENTICATED."""

    def authenticate(self, metadata: Mapping[str, str]) -> Identity: ...


def unauthenticated(why: str) -> MemoriaError:
    return MemoriaError(ErrorReason.UNAUTHENTICATED, f"unauthenticated: {why}")


def checked_id(value: object, what: str) -> str:
    """A tenant or principal id from a credential, checked by the one identity rule
    (server/domain/ids.py); anything else is UNAUTHENTICATED."""
    if value is None or value == "":
        raise unauthenticated(f"no {what} in the credentials")
    problem = identity_value_problem(value)
    if problem is not None:
        raise unauthenticated(f"the {what} id {problem}")
    assert isinstance(value, str)
    return value


def _roles(value: object) -> frozenset[str]:
    """Roles from a claim or header: a list of strings, or one space/comma separated string.

    Every role must follow the identity rule and a string must hold printable ASCII only (a
    tab is not a separator: `memoria-admin` and a tab is refused, not read as the admin role). A
    claim of any other type is refused too: the identity provider sent something this server
    does not understand, and guessing could grant or drop a role.
    """
    if value is None:
        return frozenset()
    if isinstance(value, str):
        if not is_printable_ascii(value):
            raise unauthenticated("the roles must be printable ASCII separated by spaces or commas")
        roles: list[object] = [r for r in value.replace(",", " ").split(" ") if r]
    elif isinstance(value, list):
        roles = value
    else:
        raise unauthenticated("the roles claim is neither a string nor a list of strings")
    for role in roles:
        problem = identity_value_problem(role)
        if problem is not None:
            raise unauthenticated(f"a role {problem}")
    return frozenset(r for r in roles if isinstance(r, str))


@dataclass(frozen=True)
class TrustedHeaders:
    """Identity set by a trusted proxy (Envoy/Istio) in metadata headers."""

    admin_role: str

    def authenticate(self, metadata: Mapping[str, str]) -> Identity:
        tenant = checked_id(metadata.get(TENANT_HEADER), "tenant")
        principal = checked_id(metadata.get(PRINCIPAL_HEADER), "principal")
        admin = self.admin_role in _roles(metadata.get(ROLES_HEADER, ""))
        return Identity(tenant, principal, is_tenant_admin=admin)


@dataclass(frozen=True)
class JwtSettings:
    """How bearer tokens are verified and where identity claims are read."""

    algorithms: Sequence[str]
    key: Any  # str secret, PEM public key, or a PyJWKSet
    audience: str | None
    issuer: str | None
    tenant_claim: str
    principal_claim: str
    roles_claim: str
    admin_role: str
    leeway_seconds: float


def load_jwks(path: Path) -> jwt.PyJWKSet:
    """A JWKS file (RS256/ES256 public keys) read once at start."""
    return jwt.PyJWKSet.from_dict(json.loads(path.read_text()))


class JwtAuthenticator:
    """Verifies `authorization: Bearer <jwt>`: signature, exp, nbf, aud and iss."""

    def __init__(self, settings: JwtSettings):
        self._s = settings

    def _key(self, token: str) -> Any:
        if not isinstance(self._s.key, jwt.PyJWKSet):
            return self._s.key
        keys = self._s.key.keys
        kid = jwt.get_unverified_header(token).get("kid")
        if kid is None and len(keys) == 1:
            return keys[0]
        for jwk in keys:
            if jwk.key_id == kid:
                # The PyJWK itself, not its bare key: PyJWT then checks that the token's alg
                # fits the key's type instead of failing inside the crypto library.
                return jwk
        raise unauthenticated("no key in the JWKS matches the token's kid")

    def authenticate(self, metadata: Mapping[str, str]) -> Identity:
        header = metadata.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthenticated("expected 'authorization: Bearer <token>'")
        token = token.strip()
        required = (
            ["exp"] + (["aud"] if self._s.audience else []) + (["iss"] if self._s.issuer else [])
        )
        try:
            claims = jwt.decode(
                token,
                key=self._key(token),
                algorithms=list(self._s.algorithms),
                audience=self._s.audience,
                issuer=self._s.issuer,
                leeway=self._s.leeway_seconds,
                options={"require": required},
            )
        except jwt.PyJWTError as error:
            raise unauthenticated(f"invalid token ({type(error).__name__})") from None
        tenant = checked_id(claims.get(self._s.tenant_claim), "tenant")
        principal = checked_id(claims.get(self._s.principal_claim), "principal")
        admin = self._s.admin_role in _roles(claims.get(self._s.roles_claim))
        return Identity(tenant, principal, is_tenant_admin=admin)
