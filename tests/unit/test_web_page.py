"""The HTTP port serves the built page from its directory (MEMORIA_HTTP_PAGE_DIR, else the
checkout's web/dist) with the page's security headers, and says how to build it when the
directory holds no page."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from server.rpc.web import Gateway
from server.runtime.builders.grpc_server import SERVICE_NAMES
from server.runtime.settings import Settings


def _gateway(page_dir: Path) -> Gateway:
    return Gateway(
        "127.0.0.1:9",  # never called: these requests are for the page
        SERVICE_NAMES,
        max_receive_message_bytes=1 << 20,
        max_send_message_bytes=1 << 20,
        receive_timeout_s=5,
        web_dist=page_dir,
    )


def test_the_page_directory_is_served_with_its_headers(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<!doctype html><title>page</title>")
    (tmp_path / "app.js").write_text("export {};")
    with TestClient(_gateway(tmp_path).app) as client:
        page = client.get("/")
        assert page.status_code == 200
        assert "<title>page</title>" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert client.get("/app.js").status_code == 200
        assert client.get("/../pyproject.toml").status_code == 404


def test_without_a_built_page_it_says_how_to_build_it(tmp_path: Path) -> None:
    with TestClient(_gateway(tmp_path).app) as client:
        answer = client.get("/")
        assert answer.status_code == 503
        assert "make web" in answer.text


def test_the_page_directory_is_a_setting(tmp_path: Path) -> None:
    assert Settings().http.page_dir is None
    assert Settings(http_page_dir=tmp_path).http.page_dir == tmp_path


def test_a_loopback_port_answers_only_to_loopback_names(tmp_path: Path) -> None:
    """Against DNS rebinding: another site's name re-resolved to 127.0.0.1 is refused."""
    (tmp_path / "index.html").write_text("<!doctype html><title>page</title>")
    gateway = Gateway(
        "127.0.0.1:9",
        SERVICE_NAMES,
        max_receive_message_bytes=1 << 20,
        max_send_message_bytes=1 << 20,
        receive_timeout_s=5,
        web_dist=tmp_path,
        loopback_only=True,
    )
    with TestClient(gateway.app) as client:
        for host in ("127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:8080", "[::1]"):
            assert client.get("/", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", "", "[::2]"):
            refused = client.get("/", headers={"host": host})
            assert refused.status_code == 403, host
            refused = client.post(
                "/memoria.v1.MemoryBlockService/GetMemoryBlock",
                content=b"{}",
                headers={"host": host, "content-type": "application/json"},
            )
            assert refused.status_code == 403, host


def test_the_page_words_every_error_reason() -> None:
    """Each reason of the contract has a sentence in the page (web/src/errors.ts), so a
    reason added to the contract without one fails here rather than showing a generic line."""
    from memoria.v1 import error_reason_pb2

    worded = (Path(__file__).parents[2] / "web" / "src" / "errors.ts").read_text()
    enum = error_reason_pb2.DESCRIPTOR.enum_types_by_name["ErrorReason"]
    reasons = [value.name for value in enum.values if value.number != 0]
    assert reasons
    assert [name for name in reasons if f"  {name}: " not in worded] == []
