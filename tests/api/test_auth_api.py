"""Authentication end to end: a real server in JWT mode (and in trusted-headers mode).

Every Memoria RPC refuses a call without a confirmed identity with UNAUTHENTICATED and an
ErrorInfo, before any store is touched (DESIGN.md section 1); health and reflection answer
without credentials so probes and grpcurl work. The JWT server is started once per module and
SQL kind; each test uses its own tenant, so tests do not see each other's data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import jwt
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from memoria.v1 import (
    audit_service_pb2,
    audit_service_pb2_grpc,
    memory_block_pb2,
    memory_block_service_pb2,
    memory_block_service_pb2_grpc,
)
from tests.api.conftest import Api, Metadata, error_info, server_settings, start_server
from tests.conftest import SQL_KINDS

SECRET = "api-test-hs256-secret-0123456789abcdef"
AUDIENCE = "memoria"
ADMIN = "memoria-admin"


@dataclass
class JwtApi:
    """Stubs bound to a server in JWT mode, and helpers to make its tokens."""

    channel: grpc.Channel
    blocks: memory_block_service_pb2_grpc.MemoryBlockServiceStub
    audit: audit_service_pb2_grpc.AuditServiceStub

    @staticmethod
    def token(
        tenant: str,
        principal: str,
        *,
        expires_in: int = 300,
        secret: str = SECRET,
        **extra: Any,
    ) -> str:
        payload = {
            "tenant": tenant,
            "sub": principal,
            "aud": AUDIENCE,
            "exp": int(time.time()) + expires_in,
            **extra,
        }
        return jwt.encode(
            {k: v for k, v in payload.items() if v is not None}, secret, algorithm="HS256"
        )

    def bearer(self, tenant: str, principal: str, **options: Any) -> Metadata:
        return (("authorization", f"Bearer {self.token(tenant, principal, **options)}"),)


@pytest.fixture(scope="module", params=SQL_KINDS)
def jwt_api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JwtApi]:
    """A server with auth=jwt (HS256, audience 'memoria'), on SQLite or PostgreSQL."""
    settings = server_settings(
        request.param,
        request,
        tmp_path_factory.mktemp("jwt-server"),
        auth="jwt",
        jwt_hs256_secret=SECRET,
        jwt_audience=AUDIENCE,
    )
    assert settings.effective_auth == "jwt"
    running, channel = start_server(settings)
    try:
        yield JwtApi(
            channel,
            memory_block_service_pb2_grpc.MemoryBlockServiceStub(channel),
            audit_service_pb2_grpc.AuditServiceStub(channel),
        )
    finally:
        channel.close()
        running.stop(0)


# Every Memoria RPC, called with harmless valid requests, so only the credentials can fail.
Call = Callable[[JwtApi, Metadata], object]
RPCS: dict[str, Call] = {
    "GetMemoryBlock": lambda api, md: api.blocks.GetMemoryBlock(
        memory_block_service_pb2.GetMemoryBlockRequest(), metadata=md
    ),
    "RenderMemoryBlock": lambda api, md: api.blocks.RenderMemoryBlock(
        memory_block_service_pb2.RenderMemoryBlockRequest(), metadata=md
    ),
    "RewriteMemoryBlock": lambda api, md: api.blocks.RewriteMemoryBlock(
        memory_block_service_pb2.RewriteMemoryBlockRequest(
            text="intruder was here", writer=memory_block_pb2.WRITER_MODEL
        ),
        metadata=md,
    ),
    "DeleteMemoryBlock": lambda api, md: api.blocks.DeleteMemoryBlock(
        memory_block_service_pb2.DeleteMemoryBlockRequest(writer=memory_block_pb2.WRITER_USER),
        metadata=md,
    ),
    "GetMemorySettings": lambda api, md: api.blocks.GetMemorySettings(
        memory_block_service_pb2.GetMemorySettingsRequest(), metadata=md
    ),
    "UpdateMemorySettings": lambda api, md: api.blocks.UpdateMemorySettings(
        memory_block_service_pb2.UpdateMemorySettingsRequest(
            memory_enabled=False, writer=memory_block_pb2.WRITER_USER
        ),
        metadata=md,
    ),
    "ListAuditEvents": lambda api, md: api.audit.ListAuditEvents(
        audit_service_pb2.ListAuditEventsRequest(), metadata=md
    ),
}

# Credentials a JWT server must refuse, each naming the tenant and principal it targets.
Credentials = Callable[[JwtApi, str, str], Metadata]
BAD_CREDENTIALS: dict[str, Credentials] = {
    "no-metadata": lambda api, tenant, principal: (),
    "expired-token": lambda api, tenant, principal: api.bearer(tenant, principal, expires_in=-3600),
    "trusted-headers-only": lambda api, tenant, principal: (
        ("x-memoria-tenant", tenant),
        ("x-memoria-principal", principal),
        ("x-memoria-roles", ADMIN),
    ),
    "wrong-audience": lambda api, tenant, principal: api.bearer(tenant, principal, aud="other"),
    "other-secret": lambda api, tenant, principal: api.bearer(
        tenant, principal, secret="not-the-server-secret-0123456789abcdef"
    ),
    "two-different-tokens": lambda api, tenant, principal: (
        *api.bearer(tenant, principal),
        *api.bearer(tenant, "mallory"),
    ),
}


def assert_unauthenticated(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = caught.value
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    info = error_info(error)
    assert info.reason == "ERROR_REASON_UNAUTHENTICATED"
    assert info.domain == "memoria.v1"
    return error


def read_block(api: JwtApi, tenant: str, principal: str) -> memory_block_pb2.MemoryBlock:
    response = api.blocks.GetMemoryBlock(
        memory_block_service_pb2.GetMemoryBlockRequest(), metadata=api.bearer(tenant, principal)
    )
    return response.memory_block


def read_audit(api: JwtApi, tenant: str, principal: str) -> list[audit_service_pb2.AuditEvent]:
    response = api.audit.ListAuditEvents(
        audit_service_pb2.ListAuditEventsRequest(), metadata=api.bearer(tenant, principal)
    )
    return list(response.events)


# --- accepted ---------------------------------------------------------------------------------


def test_valid_token_rewrites_and_reads_its_block(jwt_api: JwtApi, tenant: str) -> None:
    alice = jwt_api.bearer(tenant, "alice")
    rewritten = jwt_api.blocks.RewriteMemoryBlock(
        memory_block_service_pb2.RewriteMemoryBlockRequest(
            text="Prefers to be called Ali.", writer=memory_block_pb2.WRITER_MODEL
        ),
        metadata=alice,
    )
    assert rewritten.changed
    assert read_block(jwt_api, tenant, "alice").text == "Prefers to be called Ali."
    assert [e.principal_id for e in read_audit(jwt_api, tenant, "alice")] == ["alice"]
    # the identity is the token's: another principal of the same tenant sees nothing
    assert read_block(jwt_api, tenant, "bob").text == ""


def test_trusted_headers_beside_a_valid_token_are_ignored(jwt_api: JwtApi, tenant: str) -> None:
    metadata = (*jwt_api.bearer(tenant, "alice"), ("x-memoria-principal", "mallory"))
    jwt_api.blocks.RewriteMemoryBlock(
        memory_block_service_pb2.RewriteMemoryBlockRequest(
            text="Alice's line.", writer=memory_block_pb2.WRITER_USER
        ),
        metadata=metadata,
    )
    assert read_block(jwt_api, tenant, "alice").text == "Alice's line."
    assert read_block(jwt_api, tenant, "mallory").text == ""


def test_admin_role_claim_reads_another_principals_audit(jwt_api: JwtApi, tenant: str) -> None:
    jwt_api.blocks.RewriteMemoryBlock(
        memory_block_service_pb2.RewriteMemoryBlockRequest(
            text="Bob's line.", writer=memory_block_pb2.WRITER_USER
        ),
        metadata=jwt_api.bearer(tenant, "bob"),
    )
    request = audit_service_pb2.ListAuditEventsRequest(principal_id="bob")
    with pytest.raises(grpc.RpcError) as caught:
        jwt_api.audit.ListAuditEvents(request, metadata=jwt_api.bearer(tenant, "carol"))
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    admin = jwt_api.bearer(tenant, "carol", roles=[ADMIN])
    events = jwt_api.audit.ListAuditEvents(request, metadata=admin).events
    assert [e.principal_id for e in events] == ["bob"]


# --- refused ----------------------------------------------------------------------------------


@pytest.mark.parametrize("credentials", list(BAD_CREDENTIALS))
@pytest.mark.parametrize("rpc", list(RPCS))
def test_every_rpc_refuses_bad_credentials(
    jwt_api: JwtApi, tenant: str, rpc: str, credentials: str
) -> None:
    metadata = BAD_CREDENTIALS[credentials](jwt_api, tenant, "alice")
    error = assert_unauthenticated(partial(RPCS[rpc], jwt_api, metadata))
    message = error.details() or ""
    for _, value in metadata:
        if value.startswith("Bearer "):
            assert value.removeprefix("Bearer ") not in message


@pytest.mark.parametrize("credentials", list(BAD_CREDENTIALS))
def test_refused_calls_touch_nothing(jwt_api: JwtApi, tenant: str, credentials: str) -> None:
    metadata = BAD_CREDENTIALS[credentials](jwt_api, tenant, "alice")
    for rpc in ("RewriteMemoryBlock", "UpdateMemorySettings", "DeleteMemoryBlock"):
        assert_unauthenticated(partial(RPCS[rpc], jwt_api, metadata))
    block = read_block(jwt_api, tenant, "alice")
    assert (block.text, block.etag) == ("", "")
    assert read_audit(jwt_api, tenant, "alice") == []
    settings = jwt_api.blocks.GetMemorySettings(
        memory_block_service_pb2.GetMemorySettingsRequest(),
        metadata=jwt_api.bearer(tenant, "alice"),
    ).settings
    assert settings.memory_enabled


def test_refused_calls_leave_an_existing_block_alone(jwt_api: JwtApi, tenant: str) -> None:
    jwt_api.blocks.RewriteMemoryBlock(
        memory_block_service_pb2.RewriteMemoryBlockRequest(
            text="Keep me.", writer=memory_block_pb2.WRITER_USER
        ),
        metadata=jwt_api.bearer(tenant, "alice"),
    )
    for credentials in BAD_CREDENTIALS.values():
        metadata = credentials(jwt_api, tenant, "alice")
        assert_unauthenticated(partial(RPCS["RewriteMemoryBlock"], jwt_api, metadata))
        assert_unauthenticated(partial(RPCS["DeleteMemoryBlock"], jwt_api, metadata))
    assert read_block(jwt_api, tenant, "alice").text == "Keep me."
    assert len(read_audit(jwt_api, tenant, "alice")) == 1


# --- open services ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "service", ["", "memoria.v1.MemoryBlockService", "memoria.v1.AuditService"]
)
def test_health_answers_without_credentials(jwt_api: JwtApi, service: str) -> None:
    health = health_pb2_grpc.HealthStub(jwt_api.channel)
    response = health.Check(health_pb2.HealthCheckRequest(service=service))
    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_answers_without_credentials(jwt_api: JwtApi) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(jwt_api.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = list(reflection.ServerReflectionInfo(iter([request])))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"memoria.v1.MemoryBlockService", "memoria.v1.AuditService"} <= names


# --- trusted-headers mode ---------------------------------------------------------------------


@pytest.mark.parametrize("header", ["x-memoria-principal", "x-memoria-tenant"])
def test_trusted_header_sent_twice_with_different_values_is_refused(api: Api, header: str) -> None:
    metadata = (*api.who("alice"), (header, "mallory"))
    assert_unauthenticated(
        lambda: api.blocks.RewriteMemoryBlock(
            memory_block_service_pb2.RewriteMemoryBlockRequest(
                text="which one am I?", writer=memory_block_pb2.WRITER_USER
            ),
            metadata=metadata,
        )
    )
    get = memory_block_service_pb2.GetMemoryBlockRequest()
    assert api.blocks.GetMemoryBlock(get, metadata=api.who("alice")).memory_block.text == ""
    assert api.blocks.GetMemoryBlock(get, metadata=api.who("mallory")).memory_block.text == ""


def test_trusted_header_sent_twice_with_the_same_value_is_accepted(api: Api) -> None:
    metadata = (*api.who("alice"), ("x-memoria-principal", "alice"))
    response = api.blocks.GetMemoryBlock(
        memory_block_service_pb2.GetMemoryBlockRequest(), metadata=metadata
    )
    assert response.memory_block.text == ""


def test_trusted_headers_mode_refuses_a_call_without_headers(api: Api) -> None:
    assert_unauthenticated(
        lambda: api.blocks.GetMemoryBlock(memory_block_service_pb2.GetMemoryBlockRequest())
    )
