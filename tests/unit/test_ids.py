"""The one identity rule (server/domain/ids.py), and the authenticators that apply it.

Properties: the rule accepts exactly the printable-ASCII strings of 1-256 characters without
surrounding spaces; both authenticators, given any header value or any JSON claim, either
return an identity whose every value follows the rule or refuse with UNAUTHENTICATED, and
nothing else (no other reason, no other exception).
"""

from __future__ import annotations

import string
from typing import Any

import jwt
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.ids import (
    ID_MAX_CHARS,
    IDENTITY_MAX_CHARS,
    id_violations,
    identity_value_problem,
)
from server.domain.model import Identity
from server.domain.text import sanitize
from server.rpc.auth import JwtAuthenticator, JwtSettings, TrustedHeaders
from server.runtime.settings import Settings

ADMIN = "memoria-admin"
SECRET = "unit-test-hs256-secret-0123456789abcdef"
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)


def follows_the_rule(value: str) -> bool:
    """The rule restated independently: what the gRPC spec allows in a header, trimmed."""
    return (
        0 < len(value) <= IDENTITY_MAX_CHARS
        and all(c in string.printable and c not in "\t\n\r\x0b\x0c" for c in value)
        and value == value.strip(" ")
    )


@pytest.mark.parametrize(
    "value", ["a", "p" * 256, "alice@example.com", "a b", "urn:x:1", "~", "!#$%&'()*+,-./:;<=>?@"]
)
def test_the_rule_accepts_printable_ascii(value: str) -> None:
    assert identity_value_problem(value) is None


@pytest.mark.parametrize(
    "value",
    [None, 1, b"a", "", " ", "  a", "a ", "p" * 257, "a\tb", "a\x7f", "\u00e1", "\u200b", "a\n"],
    ids=repr,
)
def test_the_rule_refuses_everything_else(value: object) -> None:
    assert identity_value_problem(value) is not None


def test_the_reason_never_quotes_the_value() -> None:
    """Values come from hostile callers and the reason reaches logs and error messages."""
    for value in ("  distinctive", "distinctive\t", "distinctive\u00e1", "distinctive" * 30):
        problem = identity_value_problem(value)
        assert problem is not None and "distinctive" not in problem


@given(st.text(max_size=300) | st.text(PRINTABLE, max_size=300))
def test_the_rule_is_printable_ascii_without_surrounding_spaces(value: str) -> None:
    assert (identity_value_problem(value) is None) is follows_the_rule(value)


def identity_follows_the_rule(identity: Identity) -> None:
    assert identity_value_problem(identity.tenant_id) is None
    assert identity_value_problem(identity.principal_id) is None


header_values = st.none() | st.text(max_size=300) | st.text(PRINTABLE, max_size=300)


ID_TEXTS = st.text(max_size=ID_MAX_CHARS + 2) | st.text(
    st.characters(max_codepoint=0x7F) | st.sampled_from(" \t\n\r\x7f\u200b\u00a0"),
    max_size=12,
)


@given(ID_TEXTS)
@example(" c-1")
@example("c-1 ")
@example(" ")
@example("c 1")
@example("c\t1")
@example("c\x7f")
@example("c-1")
def test_a_conversation_or_turn_id_is_refused_exactly_when_sanitizing_changes_it(
    value: str,
) -> None:
    """`id_violations` answers printable ASCII without sanitizing (every call naming a turn
    checks two ids): it refuses exactly the ids the general rule refuses, ASCII or not."""
    valid = (
        0 < len(value) <= ID_MAX_CHARS
        and sanitize(value) == value
        and "\n" not in value
        and "\t" not in value
    )
    assert (id_violations("turn.turn_id", value) == []) == valid


@given(tenant=header_values, principal=header_values, roles=header_values)
def test_trusted_headers_give_a_valid_identity_or_unauthenticated(
    tenant: str | None, principal: str | None, roles: str | None
) -> None:
    metadata = {
        name: value
        for name, value in (
            ("x-memoria-tenant", tenant),
            ("x-memoria-principal", principal),
            ("x-memoria-roles", roles),
        )
        if value is not None
    }
    try:
        identity = TrustedHeaders(ADMIN).authenticate(metadata)
    except MemoriaError as error:
        assert error.reason is ErrorReason.UNAUTHENTICATED
        return
    identity_follows_the_rule(identity)
    assert identity.tenant_id == tenant and identity.principal_id == principal


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)

AUTH = JwtAuthenticator(
    JwtSettings(
        algorithms=("HS256",),
        key=SECRET,
        audience=None,
        issuer=None,
        tenant_claim="tenant",
        principal_claim="sub",
        roles_claim="roles",
        admin_role=ADMIN,
        leeway_seconds=30,
    )
)


@given(
    tenant=json_values | st.text(PRINTABLE, min_size=1, max_size=20),
    sub=json_values | st.text(PRINTABLE, min_size=1, max_size=20),
    roles=json_values | st.lists(st.text(PRINTABLE, max_size=20), max_size=3),
)
def test_jwt_claims_give_a_valid_identity_or_unauthenticated(
    tenant: Any, sub: Any, roles: Any
) -> None:
    claims = {"tenant": tenant, "sub": sub, "roles": roles, "exp": 4_000_000_000}
    try:
        token = jwt.encode(claims, SECRET, algorithm="HS256")
    except TypeError:
        return  # not a token PyJWT can make (e.g. a non-string sub it refuses to encode)
    try:
        identity = AUTH.authenticate({"authorization": f"Bearer {token}"})
    except MemoriaError as error:
        assert error.reason is ErrorReason.UNAUTHENTICATED
        return
    identity_follows_the_rule(identity)
    assert (identity.tenant_id, identity.principal_id) == (tenant, sub)


@pytest.mark.parametrize("role", ["", " admin", "admin\t", "r\u00f4le", "r" * 257])
def test_an_admin_role_no_credential_could_carry_is_refused_at_start(role: str) -> None:
    with pytest.raises(ValueError, match="MEMORIA_ADMIN_ROLE"):
        Settings(listen="127.0.0.1:0", admin_role=role)


def test_the_default_admin_role_follows_the_rule() -> None:
    assert identity_value_problem(Settings(listen="127.0.0.1:0").access.admin_role) is None
