"""The HTTP port (server/rpc/web.py) carries Connect and gRPC-Web to the same server: same
identity rule, same errors with the same google.rpc details, same message limit, CORS off
unless origins are listed. Raw HTTP (httpx), so each protocol's bytes are what is checked."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import random
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2

from memoria.v1 import memory_block_pb2
from memoria.v1 import memory_block_service_pb2 as pb
from server.rpc.web import methods
from server.runtime.builders.grpc_server import SERVICE_NAMES
from tests.api.conftest import Api, server_settings, serving

BLOCKS = "/memoria.v1.MemoryBlockService"


@pytest.fixture(scope="module")
def web_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    """One server for the module (each test gets a tenant of its own from `web`)."""
    settings = server_settings(
        "sqlite",
        None,  # type: ignore[arg-type]
        tmp_path_factory.mktemp("web-gateway"),
        http_listen="127.0.0.1:0",
        http_cors_origins=("https://app.example.com",),
        max_receive_message_bytes=64 << 10,
    )
    with serving(settings) as api:
        yield api


@pytest.fixture
def web(web_server: Api) -> Iterator[tuple[Api, httpx.Client]]:
    api = dataclasses.replace(web_server, tenant=f"t-{uuid.uuid4().hex[:10]}")
    assert api.running.web is not None
    with httpx.Client(base_url=f"http://127.0.0.1:{api.running.web.port}") as client:
        yield api, client


def _who(api: Api, principal: str = "ana") -> dict[str, str]:
    return dict(api.who(principal))


def _connect_details(body: dict[str, object]) -> list[object]:
    """The Connect error's details, decoded by their type names."""
    kinds = {
        "google.rpc.ErrorInfo": error_details_pb2.ErrorInfo,
        "google.rpc.BadRequest": error_details_pb2.BadRequest,
    }
    decoded = []
    for detail in body.get("details", []):  # type: ignore[attr-defined]
        value = detail["value"]
        raw = base64.b64decode(value + "=" * (-len(value) % 4))
        decoded.append(kinds[detail["type"]].FromString(raw))
    return decoded


def test_connect_json_rewrite_then_get(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    saved = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        json={"text": "Preferred name: Ana", "writer": "WRITER_USER"},
        headers=_who(api),
    )
    assert saved.status_code == 200, saved.text
    assert saved.json()["memoryBlock"]["charCount"] == 19
    # The same principal through gRPC sees the write: one server, one store.
    got = api.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=api.who("ana"))
    assert got.memory_block.text == "Preferred name: Ana"
    assert got.memory_block.etag == saved.json()["memoryBlock"]["etag"]


def test_connect_proto(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    request = pb.RewriteMemoryBlockRequest(text="x", writer=memory_block_pb2.WRITER_MODEL)
    answer = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        content=request.SerializeToString(),
        headers={**_who(api), "content-type": "application/proto"},
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/proto"
    assert pb.RewriteMemoryBlockResponse.FromString(answer.content).memory_block.text == "x"


def test_no_identity_is_unauthenticated_and_touches_nothing(
    web: tuple[Api, httpx.Client],
) -> None:
    api, client = web
    answer = client.post(
        f"{BLOCKS}/RewriteMemoryBlock", json={"text": "x", "writer": "WRITER_USER"}
    )
    assert answer.status_code == 401
    assert answer.json()["code"] == "unauthenticated"
    (info,) = _connect_details(answer.json())
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.reason == "ERROR_REASON_UNAUTHENTICATED"
    # A header gRPC cannot carry is refused the same way, never an HTTP 500.
    bad = client.post(
        f"{BLOCKS}/GetMemoryBlock",
        json={},
        headers={b"x-memoria-tenant": "t\u00e9".encode("latin-1"), b"x-memoria-principal": b"ana"},
    )
    assert bad.status_code == 401
    got = api.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=api.who("ana"))
    assert got.memory_block.text == ""


def test_errors_carry_the_contract_details(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    empty = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        json={"text": "  ", "writer": "WRITER_USER"},
        headers=_who(api),
    )
    assert empty.status_code == 400
    assert empty.json()["code"] == "invalid_argument"
    infos = [
        d for d in _connect_details(empty.json()) if isinstance(d, error_details_pb2.ErrorInfo)
    ]
    assert [i.reason for i in infos] == ["ERROR_REASON_BLOCK_EMPTY"]
    assert infos[0].domain == "memoria.v1"

    stale = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        json={"text": "y", "writer": "WRITER_USER", "etag": "not-the-etag"},
        headers=_who(api),
    )
    assert stale.status_code == 409
    assert stale.json()["code"] == "aborted"
    (info,) = _connect_details(stale.json())
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.reason == "ERROR_REASON_ETAG_MISMATCH"

    no_writer = client.post(f"{BLOCKS}/RewriteMemoryBlock", json={"text": "y"}, headers=_who(api))
    assert no_writer.status_code == 400
    violations = [
        d for d in _connect_details(no_writer.json()) if isinstance(d, error_details_pb2.BadRequest)
    ]
    assert violations and violations[0].field_violations[0].field == "writer"


def test_malformed_json_is_malformed_request_after_authentication(
    web: tuple[Api, httpx.Client],
) -> None:
    api, client = web
    for body in (b"{not json", b'{"text": 5}', b'{"nope": 1}', b"\xff\xfe"):
        answer = client.post(
            f"{BLOCKS}/RewriteMemoryBlock",
            content=body,
            headers={**_who(api), "content-type": "application/json"},
        )
        assert answer.status_code == 400, body
        (info,) = _connect_details(answer.json())
        assert isinstance(info, error_details_pb2.ErrorInfo)
        assert info.reason == "ERROR_REASON_MALFORMED_REQUEST"
    # Without identity the caller learns nothing about its bytes.
    anonymous = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert anonymous.json()["code"] == "unauthenticated"


def test_message_limit(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    big = json.dumps({"text": "a" * (70 << 10), "writer": "WRITER_USER"})
    answer = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        content=big,
        headers={**_who(api), "content-type": "application/json"},
    )
    assert answer.status_code == 429
    assert answer.json()["code"] == "resource_exhausted"
    assert "65536 bytes" in answer.json()["message"]


def _grpc_web_frames(body: bytes) -> list[tuple[int, bytes]]:
    frames = []
    while body:
        flag, length = body[0], int.from_bytes(body[1:5], "big")
        frames.append((flag, body[5 : 5 + length]))
        body = body[5 + length :]
    return frames


def test_grpc_web(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    message = pb.RewriteMemoryBlockRequest(text="hello", writer=memory_block_pb2.WRITER_USER)
    payload = message.SerializeToString()
    framed = b"\x00" + len(payload).to_bytes(4, "big") + payload
    ok = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        content=framed,
        headers={**_who(api), "content-type": "application/grpc-web+proto", "x-grpc-web": "1"},
    )
    assert ok.status_code == 200
    (data_flag, data), (trailer_flag, trailers) = _grpc_web_frames(ok.content)
    assert (data_flag, trailer_flag) == (0, 0x80)
    assert pb.RewriteMemoryBlockResponse.FromString(data).memory_block.text == "hello"
    assert b"grpc-status: 0" in trailers

    # An error: the trailers carry the status and its details, as gRPC does.
    empty = pb.RewriteMemoryBlockRequest(text=" ", writer=memory_block_pb2.WRITER_USER)
    payload = empty.SerializeToString()
    text_body = base64.b64encode(b"\x00" + len(payload).to_bytes(4, "big") + payload)
    failed = client.post(
        f"{BLOCKS}/RewriteMemoryBlock",
        content=text_body,
        headers={**_who(api), "content-type": "application/grpc-web-text"},
    )
    ((flag, trailer_block),) = _grpc_web_frames(base64.b64decode(failed.content))
    assert flag == 0x80
    fields = dict(line.split(": ", 1) for line in trailer_block.decode().strip().split("\r\n"))
    assert fields["grpc-status"] == "3"
    encoded = fields["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(base64.b64decode(encoded + "=" * (-len(encoded) % 4)))
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "ERROR_REASON_BLOCK_EMPTY"


def test_cors_only_for_listed_origins(web: tuple[Api, httpx.Client]) -> None:
    _api, client = web
    preflight = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type,x-memoria-tenant",
    }
    allowed = client.options(
        f"{BLOCKS}/GetMemoryBlock", headers={"origin": "https://app.example.com", **preflight}
    )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example.com"
    other = client.options(
        f"{BLOCKS}/GetMemoryBlock", headers={"origin": "https://evil.example", **preflight}
    )
    assert "access-control-allow-origin" not in other.headers


def test_unknown_method_and_media_type(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    unknown = client.post(f"{BLOCKS}/Nope", json={}, headers=_who(api))
    assert (unknown.status_code, unknown.json()["code"]) == (501, "unimplemented")
    # The page is served at / (scripts/web.sh built it), with its security headers.
    page = client.get("/")
    assert page.status_code == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    wrong = client.post(
        f"{BLOCKS}/GetMemoryBlock", content=b"x", headers={"content-type": "text/plain"}
    )
    assert wrong.status_code == 415


def test_random_bodies_get_clear_answers(web: tuple[Api, httpx.Client]) -> None:
    """Seeded random, cut and hostile bodies to every method in every protocol: each answer
    is a success or a contract error with an ErrorInfo, never INTERNAL or an HTTP 500."""
    api, client = web
    rng = random.Random(12)
    paths = sorted(methods(SERVICE_NAMES))
    media = ["application/json", "application/proto", "application/grpc-web+proto"]
    codes: dict[str, int] = {}
    for i in range(240):
        path, kind = paths[i % len(paths)], media[i % len(media)]
        body = rng.randbytes(rng.randrange(0, 64))
        if kind == "application/json" and i % 2:
            body = json.dumps(
                {"text": rng.choice(["", "x", "\u0000", 5]), "page_size": -1}
            ).encode()
        if kind == "application/grpc-web+proto" and i % 2:
            body = b"\x00" + len(body).to_bytes(4, "big") + body
        answer = client.post(path, content=body, headers={**_who(api), "content-type": kind})
        assert answer.status_code < 500 or answer.status_code == 503, (path, kind, body)
        if kind == "application/grpc-web+proto":
            trailer = _grpc_web_frames(answer.content)[-1][1].decode()
            code = trailer.split("grpc-status: ", 1)[1].split("\r\n", 1)[0]
            assert code not in ("2", "13"), (path, body, trailer)  # UNKNOWN, INTERNAL
            name = f"grpc-{code}"
            if code != "0":
                assert "grpc-status-details-bin" in trailer
        elif answer.status_code == 200:
            name = "ok"
        else:
            name = answer.json()["code"]
            infos = [
                d
                for d in _connect_details(answer.json())
                if isinstance(d, error_details_pb2.ErrorInfo)
            ]
            assert infos and infos[0].reason.startswith("ERROR_REASON_"), (path, body)
            assert infos[0].reason != "ERROR_REASON_INTERNAL"
        codes[name] = codes.get(name, 0) + 1
    assert codes.get("invalid_argument", 0) > 0  # the bodies did reach the decoder
    print(f"answers by code: {dict(sorted(codes.items()))}")


def test_calls_on_one_connection_are_not_delayed(web: tuple[Api, httpx.Client]) -> None:
    """Nagle is off on the HTTP port: with it on, every answer after a connection's first
    waited for the client's delayed ACK, about 40 ms each (measured before the fix; about
    1.5 ms after). The median over 15 calls on one keep-alive connection stays well below."""
    api, client = web
    durations = []
    for _ in range(16):
        started = time.perf_counter()
        answer = client.post(f"{BLOCKS}/GetMemoryBlock", json={}, headers=_who(api))
        durations.append(time.perf_counter() - started)
        assert answer.status_code == 200
    assert statistics.median(durations[1:]) < 0.025, durations


def test_compressed_requests_are_unimplemented(web: tuple[Api, httpx.Client]) -> None:
    api, client = web
    answer = client.post(
        f"{BLOCKS}/GetMemoryBlock",
        content=gzip.compress(b"{}"),
        headers={**_who(api), "content-type": "application/json", "content-encoding": "gzip"},
    )
    assert (answer.status_code, answer.json()["code"]) == (501, "unimplemented")


@pytest.mark.parametrize("protocol", ["connect", "grpcweb"])
def test_buf_curl_speaks_to_it(web: tuple[Api, httpx.Client], protocol: str) -> None:
    """Another implementation of both protocols (buf curl, on connect-go) over HTTP/1.1."""
    api, client = web
    root = Path(__file__).parents[2]
    who = [arg for key, value in _who(api).items() for arg in ("-H", f"{key}: {value}")]
    command = [str(root / ".venv" / "bin" / "buf"), "curl", "--protocol", protocol]
    command += ["--schema", str(root / "proto"), *who]
    base = str(client.base_url).rstrip("/")
    url = f"{base}{BLOCKS}/RewriteMemoryBlock"
    saved = subprocess.run(
        [*command, "-d", '{"text": "via buf curl", "writer": "WRITER_USER"}', url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(saved.stdout)["memoryBlock"]["text"] == "via buf curl"
    refused = subprocess.run(
        [*command, "-d", '{"text": " ", "writer": "WRITER_USER"}', url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    error = json.loads(refused.stderr)
    assert error["code"] == "invalid_argument"
    assert [d["type"] for d in error["details"]] == [
        "google.rpc.ErrorInfo",
        "google.rpc.BadRequest",
    ]
