"""Identity values through a real server: one rule for tenant, principal and role values.

grpc's own client refuses to send a header value with a tab or a non-ASCII byte, but a
hostile client is not bound by it, so the header cases go over raw HTTP/2 (h2) exactly as
such a client would send them.
"""

from __future__ import annotations

import base64
import socket
import struct

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
from google.rpc import error_details_pb2, status_pb2

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as block_service_pb
from tests.api.conftest import Api, expect_error, field_violations

GET_BLOCK = "/memoria.v1.MemoryBlockService/GetMemoryBlock"


def raw_call(port: int, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> tuple[int, str]:
    """One unary gRPC call over a bare HTTP/2 connection, headers sent byte for byte;
    returns (grpc-status, ErrorInfo reason or "")."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(
            client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
        )
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(
            stream,
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", GET_BLOCK.encode()),
                (b":authority", b"memoria"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                *headers,
            ],
        )
        conn.send_data(stream, b"\x00" + struct.pack(">I", len(body)) + body, end_stream=True)
        sock.sendall(conn.data_to_send())
        received: dict[bytes, bytes] = {}
        ended = False
        while not ended:
            data = sock.recv(65536)
            assert data, "the server closed the connection without a status"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    received.update(dict(event.headers))
                ended = ended or isinstance(event, h2.events.StreamEnded)
            sock.sendall(conn.data_to_send())
    return int(received[b"grpc-status"]), _reason(received.get(b"grpc-status-details-bin"))


def _reason(details: bytes | None) -> str:
    if details is None:
        return ""
    status = status_pb2.Status.FromString(base64.b64decode(details + b"=" * (-len(details) % 4)))
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


OK = grpc.StatusCode.OK.value[0]
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED.value[0]


@pytest.mark.parametrize(
    ("tenant", "principal", "roles"),
    [
        pytest.param(b"   ", b"p1", None, id="tenant-of-spaces"),
        pytest.param(b"t1", b" \t ", None, id="principal-of-whitespace"),
        pytest.param(b"t1", b" p1", None, id="leading-space"),
        pytest.param(b"t1", b"p1 ", None, id="trailing-space"),
        pytest.param("iso-á".encode(), b"p1", None, id="utf8-tenant"),
        pytest.param(b"iso-\xe1", b"p1", None, id="latin1-tenant"),
        pytest.param(b"t1", b"p\x7f1", None, id="del-in-principal"),
        pytest.param(b"t1", b"p" * 257, None, id="principal-of-257"),
        pytest.param(b"t1", b"p1", b"memoria-admin\t", id="roles-with-a-tab"),
        pytest.param(b"t1", b"p1", b"reader,\xe1dmin", id="roles-with-latin1"),
    ],
)
def test_identity_headers_outside_the_rule_are_unauthenticated(
    api: Api, tenant: bytes, principal: bytes, roles: bytes | None
) -> None:
    headers = [(b"x-memoria-tenant", tenant), (b"x-memoria-principal", principal)]
    if roles is not None:
        headers.append((b"x-memoria-roles", roles))
    assert raw_call(api.running.port, headers) == (UNAUTHENTICATED, "ERROR_REASON_UNAUTHENTICATED")


def test_identity_headers_inside_the_rule_are_served(api: Api) -> None:
    headers = [
        (b"x-memoria-tenant", api.tenant.encode()),
        (b"x-memoria-principal", b"p" * 256),
        (b"x-memoria-roles", b"reader, memoria-admin"),
    ]
    assert raw_call(api.running.port, headers) == (OK, "")


def test_a_principal_with_a_200_character_id_erases_its_own_data(api: Api) -> None:
    """Authentication accepts ids of up to 256 characters, so erasure must too (it once
    checked them with the 128-character conversation-id rule)."""
    long_one = api.who("p" * 200)
    api.blocks.RewriteMemoryBlock(
        block_service_pb.RewriteMemoryBlockRequest(text="Likes tea", writer=block_pb.WRITER_USER),
        metadata=long_one,
    )
    erased = api.search.ErasePrincipalData(search_pb.ErasePrincipalDataRequest(), metadata=long_one)
    assert erased.removed_line_count == 1
    again = api.search.ErasePrincipalData(
        search_pb.ErasePrincipalDataRequest(principal_id="p" * 200), metadata=long_one
    )
    assert again.removed_line_count == 0


@pytest.mark.parametrize(
    "principal_id",
    ["p" * 257, " bob", "bob\t", "b\u00f6b"],
    ids=["too-long", "leading-space", "tab", "non-ascii"],
)
def test_an_admin_naming_an_invalid_principal_gets_a_field_violation(
    api: Api, principal_id: str
) -> None:
    admin = api.who("root", roles="memoria-admin")
    error = expect_error(
        lambda: api.search.ErasePrincipalData(
            search_pb.ErasePrincipalDataRequest(principal_id=principal_id), metadata=admin
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ERROR_REASON_INVALID_ARGUMENT",
    )
    assert "principal_id" in field_violations(error)
