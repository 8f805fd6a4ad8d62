"""`memoria token` against a real `memoria serve --auth jwt`: a token minted with the server's
environment is accepted (with the admin role only when asked for), an expired one and one for
another audience are refused with UNAUTHENTICATED, and without an HS256 secret the command
refuses in one line. The server reads non-default claim names, issuer and admin role, so a
token that used the defaults would be refused."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import jwt
import pytest

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import audit_service_pb2_grpc as audit_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as blocks_pb
from memoria.v1 import memory_block_service_pb2_grpc as blocks_grpc
from server.runtime.settings import Settings
from server.runtime.token_cli import mint
from tests.api.conftest import Metadata, error_info, expect_error
from tests.processes import MEMORIA, clean_env, failed_in_one_line, wait_for_port

SECRET = "token-test-hs256-secret-0123456789abcdef"
JWT_ENV = {
    "MEMORIA_JWT_HS256_SECRET": SECRET,
    "MEMORIA_JWT_AUDIENCE": "memoria-local",
    "MEMORIA_JWT_ISSUER": "memoria-test",
    "MEMORIA_JWT_TENANT_CLAIM": "org",
    "MEMORIA_ADMIN_ROLE": "acme-admin",
}
START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    """`memoria serve --auth jwt` with JWT_ENV, on an embedded data dir; a channel to it."""
    directory = tmp_path_factory.mktemp("jwt-serve")
    port_file, log = directory / "port", directory / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(MEMORIA),
                "serve",
                "--auth",
                "jwt",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(directory / "data"),
                "--port-file",
                str(port_file),
            ],
            cwd=directory,
            env=clean_env(**JWT_ENV),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        port = wait_for_port(process, port_file, log, timeout=START_TIMEOUT_S)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        process.terminate()
        process.wait(timeout=30)


def memoria_token(*args: str) -> str:
    """`memoria token *args` with the server's environment: its stdout, the token alone."""
    done = subprocess.run(
        [str(MEMORIA), "token", *args],
        env=clean_env(**JWT_ENV),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    [token] = done.stdout.splitlines()
    assert done.stdout == token + "\n"
    return token


def bearer(token: str) -> Metadata:
    return (("authorization", f"Bearer {token}"),)


def test_a_minted_token_is_accepted_and_admin_only_when_asked(jwt_server: grpc.Channel) -> None:
    blocks = blocks_grpc.MemoryBlockServiceStub(jwt_server)
    audit = audit_grpc.AuditServiceStub(jwt_server)
    ana = bearer(memoria_token("--tenant", "acme", "--principal", "ana"))
    blocks.RewriteMemoryBlock(
        blocks_pb.RewriteMemoryBlockRequest(
            text="Preferred name: Ana", writer=block_pb.WRITER_USER
        ),
        metadata=ana,
    )
    got = blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=ana)
    assert got.memory_block.text == "Preferred name: Ana"
    everyone = audit_pb.ListAuditEventsRequest(principal_id="-")
    expect_error(
        lambda: audit.ListAuditEvents(everyone, metadata=ana),
        grpc.StatusCode.PERMISSION_DENIED,
        "ERROR_REASON_PERMISSION_DENIED",
    )
    admin = memoria_token("--tenant", "acme", "--principal", "root", "--admin")
    events = audit.ListAuditEvents(everyone, metadata=bearer(admin)).events
    assert [e.principal_id for e in events] == ["ana"]
    claims = jwt.decode(admin, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 3600  # the default lifetime
    short = memoria_token("--tenant", "acme", "--principal", "ana", "--expires-in", "60")
    claims = jwt.decode(short, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 60


def test_an_expired_token_or_one_for_another_audience_is_refused(
    jwt_server: grpc.Channel,
) -> None:
    blocks = blocks_grpc.MemoryBlockServiceStub(jwt_server)

    def settings(audience: str) -> Settings:
        """The server's jwt settings (JWT_ENV), for `audience`."""
        return Settings(
            jwt_hs256_secret=SECRET,
            jwt_audience=audience,
            jwt_issuer="memoria-test",
            jwt_tenant_claim="org",
            admin_role="acme-admin",
        )

    accepted = mint(settings("memoria-local"), "acme", "ana")
    blocks.GetMemoryBlock(blocks_pb.GetMemoryBlockRequest(), metadata=bearer(accepted))
    expired = mint(settings("memoria-local"), "acme", "ana", expires_in=60, now=time.time() - 3600)
    elsewhere = mint(settings("another"), "acme", "ana")
    for token in (expired, elsewhere):
        request = blocks_pb.GetMemoryBlockRequest()
        with pytest.raises(grpc.RpcError) as refused:
            blocks.GetMemoryBlock(request, metadata=bearer(token))
        assert isinstance(refused.value, grpc.Call)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_info(refused.value).reason == "ERROR_REASON_UNAUTHENTICATED"


def test_without_an_hs256_secret_or_with_a_bad_id_it_refuses_in_one_line(
    tmp_path: Path,
) -> None:
    line, _ = failed_in_one_line(
        ["token", "--tenant", "acme", "--principal", "ana"], tmp_path, clean_env()
    )
    assert line.startswith("memoria token: no HS256 secret is configured")
    line, _ = failed_in_one_line(
        ["token", "--tenant", " acme", "--principal", "ana"], tmp_path, clean_env(**JWT_ENV)
    )
    assert line.startswith("memoria token: --tenant ")
    line, _ = failed_in_one_line(
        ["token", "--tenant", "acme", "--principal", "ana"],
        tmp_path,
        clean_env(**JWT_ENV, MEMORIA_JWT_ALGORITHMS='["RS256"]'),
    )
    assert "the server would refuse an HS256 token" in line
