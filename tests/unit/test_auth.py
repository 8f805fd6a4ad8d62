"""Unit tests of the authenticators: JWT (HS256, RS256, ES256, a JWKS file) and trusted headers.

Keys are made here with `cryptography` and tokens are signed with PyJWT, so every check runs
against real signatures. A refusal is always a MemoriaError with reason UNAUTHENTICATED, and its
message never echoes the token (tokens end up in logs and client error screens).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import Identity
from server.rpc.auth import (
    JwtAuthenticator,
    JwtSettings,
    TrustedHeaders,
    checked_id,
    load_jwks,
)
from server.runtime.builders.access import build_authenticator
from server.runtime.settings import Settings

SECRET = "unit-test-hs256-secret-0123456789abcdef"
OTHER_SECRET = "another-hs256-secret-fedcba9876543210"
ADMIN = "memoria-admin"
AUDIENCE = "memoria"
ISSUER = "https://issuer.example"
ASYMMETRIC = ("RS256", "ES256")
"""What build_authenticator allows for a PEM public key or a JWKS file."""

Metadata = Mapping[str, str]


# --- keys and tokens ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def other_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def now() -> int:
    return int(time.time())


def claims(**changes: Any) -> dict[str, Any]:
    """Valid claims for tenant t1 / principal p1; a change to None removes that claim.

    No `aud`: PyJWT refuses a token with an audience when none is configured (RFC 7519 4.1.3).
    """
    base: dict[str, Any] = {"tenant": "t1", "sub": "p1", "exp": now() + 300}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def hs256(payload: Mapping[str, Any], secret: str = SECRET) -> str:
    return jwt.encode(dict(payload), secret, algorithm="HS256")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header: Mapping[str, Any], payload: Mapping[str, Any], hmac_key: bytes | None) -> str:
    """A token built without PyJWT (which refuses to sign these): unsigned or any HMAC key."""
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(payload).encode())}"
    if hmac_key is None:
        return f"{signing_input}."
    digest = hmac.new(hmac_key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(digest)}"


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def jwt_settings(key: Any, algorithms: tuple[str, ...] = ("HS256",), **changes: Any) -> JwtSettings:
    """Settings as build_authenticator makes them by default (no aud/iss, leeway 30 s)."""
    base = JwtSettings(
        algorithms=algorithms,
        key=key,
        audience=None,
        issuer=None,
        tenant_claim="tenant",
        principal_claim="sub",
        roles_claim="roles",
        admin_role=ADMIN,
        leeway_seconds=30,
    )
    return replace(base, **changes)


def authenticator(
    key: Any = SECRET, algorithms: tuple[str, ...] = ("HS256",), **changes: Any
) -> JwtAuthenticator:
    return JwtAuthenticator(jwt_settings(key, algorithms, **changes))


def rejected(auth: JwtAuthenticator | TrustedHeaders, metadata: Metadata) -> MemoriaError:
    """Authenticating must fail with UNAUTHENTICATED, and the error must not quote the token."""
    with pytest.raises(MemoriaError) as caught:
        auth.authenticate(metadata)
    error = caught.value
    assert error.reason is ErrorReason.UNAUTHENTICATED
    token = metadata.get("authorization", "").partition(" ")[2].strip()
    if len(token) >= 8:
        assert token not in str(error)
        assert token not in error.message
    return error


# --- HS256 and claims -----------------------------------------------------------------------


def test_hs256_token_gives_the_identity_in_its_claims() -> None:
    identity = authenticator().authenticate(bearer(hs256(claims())))
    assert identity == Identity("t1", "p1", is_tenant_admin=False)


def test_bearer_scheme_is_case_insensitive() -> None:
    token = hs256(claims())
    assert authenticator().authenticate({"authorization": f"bearer {token}"}).principal_id == "p1"


def test_custom_tenant_and_principal_claims_are_read() -> None:
    auth = authenticator(tenant_claim="org", principal_claim="uid")
    token = hs256(claims(tenant=None, sub=None, org="acme", uid="alice"))
    assert auth.authenticate(bearer(token)) == Identity("acme", "alice")


def test_custom_claims_ignore_the_default_claim_names() -> None:
    auth = authenticator(tenant_claim="org", principal_claim="uid")
    rejected(auth, bearer(hs256(claims())))  # has tenant/sub, but not org/uid


@pytest.mark.parametrize(
    ("roles", "admin"),
    [
        pytest.param(["reader", ADMIN], True, id="list-with-admin"),
        pytest.param(f"reader {ADMIN}", True, id="space-separated-with-admin"),
        pytest.param(ADMIN, True, id="single-string"),
        pytest.param(["reader"], False, id="list-without-admin"),
        pytest.param("reader writer", False, id="string-without-admin"),
        pytest.param(f"{ADMIN}s", False, id="admin-as-a-prefix-only"),
        pytest.param([], False, id="empty-list"),
        pytest.param(None, False, id="no-roles-claim"),
    ],
)
def test_admin_only_when_the_admin_role_is_present(roles: object, admin: bool) -> None:
    identity = authenticator().authenticate(bearer(hs256(claims(roles=roles))))
    assert identity.is_tenant_admin is admin


@pytest.mark.parametrize(
    "roles",
    [
        pytest.param({"role": ADMIN}, id="object-is-not-roles"),
        pytest.param(7, id="number-is-not-roles"),
        pytest.param([ADMIN, 7], id="non-string-role"),
        pytest.param([f"{ADMIN}\t"], id="role-with-a-tab"),
        pytest.param([" reader"], id="role-with-a-leading-space"),
        pytest.param([""], id="empty-role"),
        pytest.param(f"{ADMIN}\t", id="string-with-a-tab"),
        pytest.param("r\u00f4le", id="non-ascii-role"),
        pytest.param("r" * 257, id="role-too-long"),
    ],
)
def test_roles_outside_the_identity_rule_are_unauthenticated(roles: object) -> None:
    """Guessing at a role claim the server does not understand could grant or drop a role."""
    rejected(authenticator(), bearer(hs256(claims(roles=roles))))


def test_admin_role_and_roles_claim_are_configurable() -> None:
    auth = authenticator(roles_claim="groups", admin_role="boss")
    assert auth.authenticate(bearer(hs256(claims(groups=["boss"])))).is_tenant_admin
    assert not auth.authenticate(bearer(hs256(claims(roles=["boss"])))).is_tenant_admin
    assert not auth.authenticate(bearer(hs256(claims(groups=[ADMIN])))).is_tenant_admin


def test_principal_of_exactly_256_characters_is_accepted() -> None:
    principal = "p" * 256
    assert authenticator().authenticate(bearer(hs256(claims(sub=principal)))).principal_id == (
        principal
    )


def test_audience_and_issuer_are_accepted_when_they_match() -> None:
    auth = authenticator(audience=AUDIENCE, issuer=ISSUER)
    assert auth.authenticate(bearer(hs256(strict_claims()))) == Identity("t1", "p1")
    token = hs256(strict_claims(aud=["other", AUDIENCE]))
    assert auth.authenticate(bearer(token)).principal_id == "p1"


def test_token_with_an_audience_is_refused_when_none_is_configured() -> None:
    """PyJWT's reading of RFC 7519 4.1.3: an aud the server cannot match is refused."""
    rejected(authenticator(), bearer(hs256(claims(aud=AUDIENCE))))


# --- refusals -------------------------------------------------------------------------------

STRICT: dict[str, Any] = {"audience": AUDIENCE, "issuer": ISSUER}
"""The table below runs against an authenticator that checks aud and iss too."""


def strict_claims(**changes: Any) -> dict[str, Any]:
    """Valid claims for the STRICT authenticator (with aud and iss)."""
    return claims(**{"aud": AUDIENCE, "iss": ISSUER, **changes})


def _refusals() -> Iterator[Any]:
    def token(**changes: Any) -> Callable[[], Metadata]:
        return lambda: bearer(hs256(strict_claims(**changes)))

    yield pytest.param(lambda: {}, id="no-authorization-header")
    yield pytest.param(lambda: {"authorization": "Basic dXNlcjpwYXNz"}, id="basic-scheme")
    yield pytest.param(lambda: {"authorization": hs256(strict_claims())}, id="token-without-scheme")
    yield pytest.param(lambda: {"authorization": "Bearer"}, id="scheme-only")
    yield pytest.param(lambda: {"authorization": "Bearer "}, id="empty-token")
    yield pytest.param(lambda: {"authorization": "Bearer    "}, id="blank-token")
    yield pytest.param(lambda: bearer("this-is-not-a-jwt-at-all"), id="garbage")
    yield pytest.param(lambda: bearer("aaaa.bbbb.cccc"), id="garbage-three-parts")
    yield pytest.param(
        lambda: bearer(hs256(strict_claims(), OTHER_SECRET)), id="signed-with-other-secret"
    )
    yield pytest.param(
        lambda: bearer(hs256(strict_claims())[:-4] + "AAAA"), id="tampered-signature"
    )
    yield pytest.param(token(exp=now() - 3600), id="expired")
    yield pytest.param(token(nbf=now() + 3600), id="not-yet-valid")
    yield pytest.param(token(iat=now() + 3600), id="issued-in-the-future")
    yield pytest.param(token(aud="somebody-else"), id="wrong-audience")
    yield pytest.param(token(aud=None), id="missing-audience")
    yield pytest.param(token(iss="https://evil.example"), id="wrong-issuer")
    yield pytest.param(token(iss=None), id="missing-issuer")
    yield pytest.param(token(exp=None), id="missing-exp")
    yield pytest.param(token(tenant=None), id="missing-tenant")
    yield pytest.param(token(tenant=""), id="empty-tenant")
    yield pytest.param(token(tenant=42), id="non-string-tenant")
    yield pytest.param(token(tenant="t\n1"), id="tenant-with-newline")
    yield pytest.param(token(sub=None), id="missing-principal")
    yield pytest.param(token(sub=""), id="empty-principal")
    yield pytest.param(token(sub=12345), id="non-string-principal")
    yield pytest.param(token(sub=["p1"]), id="list-principal")
    yield pytest.param(token(sub="p" * 257), id="principal-257-chars")
    yield pytest.param(token(sub="p\x001"), id="principal-with-nul")
    yield pytest.param(token(sub="p\x1b[31m1"), id="principal-with-escape")
    yield pytest.param(token(sub="p\u200b1"), id="principal-with-zero-width-space")
    yield pytest.param(
        lambda: bearer(hand_made({"alg": "none", "typ": "JWT"}, strict_claims(), None)),
        id="alg-none",
    )
    yield pytest.param(
        lambda: bearer(hand_made({"alg": "None", "typ": "JWT"}, strict_claims(), None)),
        id="alg-None",
    )


@pytest.mark.parametrize("metadata", list(_refusals()))
def test_invalid_credentials_are_unauthenticated(metadata: Callable[[], Metadata]) -> None:
    rejected(authenticator(**STRICT), metadata())


def test_the_strict_authenticator_accepts_the_unaltered_token() -> None:
    """The refusal table changes one thing each from this token, so this one must pass."""
    assert authenticator(**STRICT).authenticate(bearer(hs256(strict_claims()))) == Identity(
        "t1", "p1"
    )


def test_non_string_principal_in_a_custom_claim_is_unauthenticated() -> None:
    """`sub` is type-checked by PyJWT; a custom claim is checked by the authenticator itself."""
    auth = authenticator(principal_claim="uid")
    rejected(auth, bearer(hs256(claims(uid=12345))))
    rejected(auth, bearer(hs256(claims(uid={"id": "p1"}))))


def test_leeway_lets_a_recently_expired_token_pass() -> None:
    token = hs256(claims(exp=now() - 10))
    assert authenticator(leeway_seconds=30).authenticate(bearer(token)).principal_id == "p1"
    rejected(authenticator(leeway_seconds=0), bearer(token))


def test_leeway_also_applies_to_nbf() -> None:
    token = hs256(claims(nbf=now() + 10))
    assert authenticator(leeway_seconds=30).authenticate(bearer(token)).principal_id == "p1"
    rejected(authenticator(leeway_seconds=0), bearer(token))


def test_error_message_does_not_contain_the_token() -> None:
    token = hs256(claims(sub="p-distinctive-principal", exp=now() - 3600))
    error = rejected(authenticator(), bearer(token))
    for part in token.split("."):
        assert part not in error.message
    assert "p-distinctive-principal" not in error.message


# --- RS256, ES256 and JWKS ------------------------------------------------------------------


def test_rs256_with_a_pem_public_key(rsa_key: rsa.RSAPrivateKey) -> None:
    auth = authenticator(public_pem(rsa_key), ASYMMETRIC)
    token = jwt.encode(claims(roles=[ADMIN]), rsa_key, algorithm="RS256")
    assert auth.authenticate(bearer(token)) == Identity("t1", "p1", is_tenant_admin=True)


def test_es256_with_a_pem_public_key(ec_key: ec.EllipticCurvePrivateKey) -> None:
    auth = authenticator(public_pem(ec_key), ASYMMETRIC)
    token = jwt.encode(claims(), ec_key, algorithm="ES256")
    assert auth.authenticate(bearer(token)) == Identity("t1", "p1")


def test_rs256_signed_by_another_key_is_unauthenticated(
    rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey
) -> None:
    auth = authenticator(public_pem(rsa_key), ASYMMETRIC)
    rejected(auth, bearer(jwt.encode(claims(), other_rsa_key, algorithm="RS256")))


def test_es256_token_against_an_rsa_public_key_is_unauthenticated(
    rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    auth = authenticator(public_pem(rsa_key), ASYMMETRIC)
    rejected(auth, bearer(jwt.encode(claims(), ec_key, algorithm="ES256")))


@pytest.mark.parametrize(
    "algorithms",
    [
        pytest.param(ASYMMETRIC, id="asymmetric-only"),
        pytest.param(("RS256", "HS256"), id="misconfigured-to-allow-hs256"),
    ],
)
def test_algorithm_confusion_is_unauthenticated(
    rsa_key: rsa.RSAPrivateKey, algorithms: tuple[str, ...]
) -> None:
    """An HS256 token 'signed' with the public PEM as the HMAC secret must not pass."""
    pem = public_pem(rsa_key)
    token = hand_made({"alg": "HS256", "typ": "JWT"}, claims(), pem.encode())
    rejected(authenticator(pem, algorithms), bearer(token))


def test_unsigned_token_is_unauthenticated_by_an_asymmetric_authenticator(
    rsa_key: rsa.RSAPrivateKey,
) -> None:
    token = hand_made({"alg": "none", "typ": "JWT"}, claims(), None)
    rejected(authenticator(public_pem(rsa_key), ASYMMETRIC), bearer(token))


@pytest.fixture
def jwks_file(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> Path:
    """A JWKS with an RSA key (kid rsa-1) and an EC P-256 key (kid ec-1)."""
    rsa_jwk = RSAAlgorithm.to_jwk(rsa_key.public_key(), as_dict=True)
    ec_jwk = ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True)
    assert isinstance(rsa_jwk, dict) and isinstance(ec_jwk, dict)
    keys = [
        {**rsa_jwk, "kid": "rsa-1", "alg": "RS256", "use": "sig"},
        {**ec_jwk, "kid": "ec-1", "alg": "ES256", "use": "sig"},
    ]
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    return path


def test_jwks_chooses_the_key_by_kid(
    jwks_file: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    auth = authenticator(load_jwks(jwks_file), ASYMMETRIC)
    rs = jwt.encode(claims(sub="by-rsa"), rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
    es = jwt.encode(claims(sub="by-ec"), ec_key, algorithm="ES256", headers={"kid": "ec-1"})
    assert auth.authenticate(bearer(rs)) == Identity("t1", "by-rsa")
    assert auth.authenticate(bearer(es)) == Identity("t1", "by-ec")


def test_jwks_unknown_kid_is_unauthenticated(jwks_file: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    auth = authenticator(load_jwks(jwks_file), ASYMMETRIC)
    token = jwt.encode(claims(), rsa_key, algorithm="RS256", headers={"kid": "rsa-2"})
    rejected(auth, bearer(token))


def test_jwks_kid_of_another_key_is_unauthenticated(
    jwks_file: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey
) -> None:
    """A token must verify with the key its kid names."""
    auth = authenticator(load_jwks(jwks_file), ASYMMETRIC)
    foreign = jwt.encode(claims(), other_rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
    rejected(auth, bearer(foreign))


@pytest.mark.parametrize(
    ("alg", "kid"),
    [
        pytest.param("RS256", "ec-1", id="rs256-naming-ec-key"),
        pytest.param("ES256", "rsa-1", id="es256-naming-rsa-key"),
    ],
)
def test_jwks_alg_that_does_not_fit_the_kid_key_is_unauthenticated(
    jwks_file: Path,
    rsa_key: rsa.RSAPrivateKey,
    ec_key: ec.EllipticCurvePrivateKey,
    alg: str,
    kid: str,
) -> None:
    """A token signed correctly but naming the other kind of key: refused, not a crash."""
    auth = authenticator(load_jwks(jwks_file), ASYMMETRIC)
    signer = rsa_key if alg == "RS256" else ec_key
    rejected(auth, bearer(jwt.encode(claims(), signer, algorithm=alg, headers={"kid": kid})))


def test_jwks_forged_token_naming_the_wrong_key_kind_is_unauthenticated(jwks_file: Path) -> None:
    """Needs no key at all: any caller can send this header with a made-up signature."""
    auth = authenticator(load_jwks(jwks_file), ASYMMETRIC)
    rejected(auth, bearer(hand_made({"alg": "RS256", "kid": "ec-1"}, claims(), b"forged")))


def test_jwks_refuses_hs256_signed_with_a_jwk(jwks_file: Path) -> None:
    auth = authenticator(load_jwks(jwks_file), ASYMMETRIC)
    token = hand_made({"alg": "HS256", "kid": "rsa-1"}, claims(), jwks_file.read_text().encode())
    rejected(auth, bearer(token))


# --- wiring from Settings -------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read MEMORIA_* from the environment; these tests set everything themselves."""
    for name in list(os.environ):
        if name.startswith("MEMORIA_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_build_authenticator_from_a_public_key_file(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey
) -> None:
    pem = tmp_path / "public.pem"
    pem.write_text(public_pem(rsa_key))
    auth = build_authenticator(
        Settings(listen="0.0.0.0:0", jwt_public_key_file=pem, jwt_audience=AUDIENCE)
    )
    assert isinstance(auth, JwtAuthenticator)
    token = jwt.encode(claims(aud=AUDIENCE), rsa_key, algorithm="RS256")
    assert auth.authenticate(bearer(token)) == Identity("t1", "p1")
    rejected(auth, bearer(jwt.encode(claims(), rsa_key, algorithm="RS256")))  # no aud


@pytest.mark.usefixtures("clean_env")
def test_build_authenticator_defaults_to_trusted_headers_on_loopback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="server.runtime.builders.access"):
        auth = build_authenticator(Settings(listen="127.0.0.1:0"))
        assert isinstance(auth, TrustedHeaders)
        assert isinstance(build_authenticator(Settings(listen="[::1]:0")), TrustedHeaders)
    assert [r for r in caplog.records if r.name == "server.runtime.builders.access"] == []


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:0", "10.1.2.3:0", "memoria:0"])
def test_trusted_headers_set_explicitly_off_loopback_start_with_a_warning(
    caplog: pytest.LogCaptureFixture, listen: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="server.runtime.builders.access"):
        auth = build_authenticator(Settings(listen=listen, auth="trusted-headers"))
    assert isinstance(auth, TrustedHeaders)
    lines = [r.getMessage() for r in caplog.records if r.name == "server.runtime.builders.access"]
    assert len(lines) == 1
    assert "trusted-headers" in lines[0] and "not loopback" in lines[0]


# --- trusted headers ------------------------------------------------------------------------


def test_trusted_headers_give_the_identity() -> None:
    identity = TrustedHeaders(ADMIN).authenticate(
        {"x-memoria-tenant": "t1", "x-memoria-principal": "p1"}
    )
    assert identity == Identity("t1", "p1", is_tenant_admin=False)


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param({}, id="none"),
        pytest.param({"x-memoria-principal": "p1"}, id="no-tenant"),
        pytest.param({"x-memoria-tenant": "t1"}, id="no-principal"),
        pytest.param({"x-memoria-tenant": "", "x-memoria-principal": "p1"}, id="empty-tenant"),
        pytest.param({"x-memoria-tenant": "t1", "x-memoria-principal": ""}, id="empty-principal"),
        pytest.param(
            {"x-memoria-tenant": "t1", "x-memoria-principal": "p" * 257}, id="principal-too-long"
        ),
        pytest.param(
            {"x-memoria-tenant": "t1", "x-memoria-principal": "p\r\n1"}, id="principal-with-crlf"
        ),
        pytest.param(
            {"authorization": f"Bearer {hs256(claims())}"}, id="a-bearer-token-is-not-headers"
        ),
        pytest.param({"x-memoria-tenant": "   ", "x-memoria-principal": "p1"}, id="blank-tenant"),
        pytest.param({"x-memoria-tenant": "iso-\u00e1", "x-memoria-principal": "p1"}, id="utf8"),
        pytest.param(
            {
                "x-memoria-tenant": "t1",
                "x-memoria-principal": "p1",
                "x-memoria-roles": f"{ADMIN}\t",
            },
            id="roles-with-a-tab",
        ),
    ],
)
def test_trusted_headers_missing_or_invalid_are_unauthenticated(metadata: Metadata) -> None:
    rejected(TrustedHeaders(ADMIN), metadata)


@pytest.mark.parametrize(
    ("roles", "admin"),
    [
        pytest.param(ADMIN, True, id="only-admin"),
        pytest.param(f"reader {ADMIN}", True, id="space-separated"),
        pytest.param(f"reader,{ADMIN}", True, id="comma-separated"),
        pytest.param("reader", False, id="other-role"),
        pytest.param("", False, id="empty"),
        pytest.param(f" reader , {ADMIN} ", True, id="spaces-around"),
    ],
)
def test_trusted_headers_admin_role(roles: str, admin: bool) -> None:
    identity = TrustedHeaders(ADMIN).authenticate(
        {"x-memoria-tenant": "t1", "x-memoria-principal": "p1", "x-memoria-roles": roles}
    )
    assert identity.is_tenant_admin is admin


# --- checked_id -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["p1", "alice@example.com", "p" * 256, "a b", "~!#$%&'()*+,-./:;<=>?@[\\]^_`{|}"]
)
def test_checked_id_accepts_printable_ascii_ids(value: str) -> None:
    assert checked_id(value, "principal") == value


@pytest.mark.parametrize(
    "value",
    [
        *(None, 7, b"p1", "", "p" * 257, "a\tb", "a\nb", "a\x7fb", "a\u200bb", "a\u202eb"),
        *(" ", "   ", "\t", " p1", "p1 ", "Zo\u00eb", "iso-\u00e1", "\u00a0p", "p\u3000"),
    ],
    ids=repr,
)
def test_checked_id_refuses_anything_else(value: object) -> None:
    with pytest.raises(MemoriaError) as caught:
        checked_id(value, "principal")
    assert caught.value.reason is ErrorReason.UNAUTHENTICATED
