"""The HTTP port's settings: it follows the gRPC port's authentication rule (trusted headers
only when every port is loopback), its address and CORS origins are checked at start."""

from __future__ import annotations

import pytest

from server.rpc.web import grpc_target
from server.runtime.settings import InvalidSettings, Settings

SECRET = "a-test-secret-of-at-least-32-bytes!!"


def test_off_by_default() -> None:
    assert Settings().http.listen is None
    assert Settings().http.cors_origins == ()


def test_both_ports_on_loopback_trust_headers() -> None:
    settings = Settings(listen="127.0.0.1:0", http_listen="127.0.0.1:8080")
    assert settings.effective_auth == "trusted-headers"


@pytest.mark.parametrize("http_listen", ["0.0.0.0:8080", "[::]:8080", "10.1.2.3:80"])
def test_an_http_port_others_reach_needs_jwt(http_listen: str) -> None:
    with pytest.raises(InvalidSettings, match="jwt"):
        Settings(listen="127.0.0.1:0", http_listen=http_listen)
    settings = Settings(listen="127.0.0.1:0", http_listen=http_listen, jwt_hs256_secret=SECRET)
    assert settings.effective_auth == "jwt"


@pytest.mark.parametrize("http_listen", ["8080", "127.0.0.1", "127.0.0.1:http"])
def test_http_listen_must_be_host_port(http_listen: str) -> None:
    with pytest.raises(InvalidSettings, match="MEMORIA_HTTP_LISTEN"):
        Settings(http_listen=http_listen)


@pytest.mark.parametrize(
    "origin", ["*", "app.example.com", "https://app.example.com/", "ftp://x.example", "null"]
)
def test_cors_origins_are_origins(origin: str) -> None:
    with pytest.raises(InvalidSettings, match="not an origin"):
        Settings(http_cors_origins=(origin,))
    assert Settings(http_cors_origins=("https://app.example.com:8443",)).http.cors_origins


def test_cors_origins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "MEMORIA_HTTP_CORS_ORIGINS", '["https://a.example", "http://localhost:3000"]'
    )
    assert Settings().http.cors_origins == ("https://a.example", "http://localhost:3000")


@pytest.mark.parametrize(
    ("listen", "target"),
    [
        ("127.0.0.1:0", "127.0.0.1:5"),
        ("0.0.0.0:50051", "127.0.0.1:5"),
        ("[::]:50051", "[::1]:5"),
        ("[::1]:50051", "[::1]:5"),
        ("10.1.2.3:50051", "10.1.2.3:5"),
        ("localhost:1", "localhost:5"),
    ],
)
def test_the_gateway_reaches_its_own_grpc_port(listen: str, target: str) -> None:
    assert grpc_target(listen, 5) == target
