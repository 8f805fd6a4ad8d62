"""Settings validation: auth mode by listen address, key sources, redaction, env and flags.

The rule under test (DESIGN.md section 1): trusted headers are the default only when the server
listens on loopback; anywhere else `auto` means jwt, which must have a key, and a process that
cannot authenticate callers must refuse to start rather than trust them.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from server.runtime.cli import _settings
from server.runtime.settings import InvalidSettings, Settings, is_loopback, listen_host

HS256_SECRET = "config-test-jwt-secret-0123456789abcdef"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read MEMORIA_* from the environment; each test sets what it needs."""
    for name in list(os.environ):
        if name.startswith("MEMORIA_"):
            monkeypatch.delenv(name)


def flags(
    listen: str | None = None,
    data_dir: Path | None = None,
    database_url: str | None = None,
    auth: str | None = None,
) -> argparse.Namespace:
    """What `memoria serve` parses; None means the flag was not given."""
    return argparse.Namespace(
        listen=listen, data_dir=data_dir, database_url=database_url, auth=auth
    )


def test_default_listen_is_loopback_with_trusted_headers() -> None:
    settings = Settings()
    assert is_loopback(listen_host(settings.serve.listen))
    assert settings.access.mode == "auto"
    assert settings.effective_auth == "trusted-headers"


@pytest.mark.parametrize(
    ("listen", "host"),
    [("127.0.0.1:50051", "127.0.0.1"), ("[::1]:0", "::1"), ("localhost:1", "localhost")],
)
def test_listen_host(listen: str, host: str) -> None:
    assert listen_host(listen) == host


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.8.9.10:1", "[::1]:0", "localhost:50051"])
def test_auto_is_trusted_headers_on_loopback(listen: str) -> None:
    assert Settings(listen=listen).effective_auth == "trusted-headers"


@pytest.mark.parametrize(
    "listen", ["0.0.0.0:50051", "[::]:0", "10.1.2.3:50051", "memoria.example:443", ":50051"]
)
def test_auto_off_loopback_without_a_jwt_key_is_refused(listen: str) -> None:
    with pytest.raises(InvalidSettings) as caught:
        Settings(listen=listen)
    assert isinstance(caught.value, ValueError)  # what `memoria serve` catches
    assert "jwt" in str(caught.value).lower()
    # The refusal names the address that made `auto` jwt, as well as the mode.
    assert str(caught.value).startswith("MEMORIA_LISTEN, MEMORIA_AUTH: jwt authentication needs")


def test_auto_off_loopback_with_a_secret_in_the_env_is_jwt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMORIA_LISTEN", "0.0.0.0:50051")
    monkeypatch.setenv("MEMORIA_JWT_HS256_SECRET", HS256_SECRET)
    settings = Settings()
    assert settings.effective_auth == "jwt"
    assert settings.jwt.hs256_secret is not None
    assert settings.jwt.hs256_secret.get_secret_value() == HS256_SECRET


def test_auto_off_loopback_with_a_public_key_file_is_jwt(tmp_path: Path) -> None:
    settings = Settings(listen="0.0.0.0:0", jwt_public_key_file=tmp_path / "public.pem")
    assert settings.effective_auth == "jwt"


def test_explicit_jwt_on_loopback_needs_a_key() -> None:
    with pytest.raises(InvalidSettings, match="MEMORIA_JWT_HS256_SECRET"):
        Settings(listen="127.0.0.1:0", auth="jwt")
    assert (
        Settings(listen="127.0.0.1:0", auth="jwt", jwt_hs256_secret=HS256_SECRET).effective_auth
        == "jwt"
    )


def test_explicit_trusted_headers_off_loopback_is_the_operators_choice() -> None:
    """Behind a mesh the server listens on all interfaces; the operator says so explicitly."""
    assert Settings(listen="0.0.0.0:0", auth="trusted-headers").effective_auth == "trusted-headers"


def test_unknown_auth_mode_is_refused() -> None:
    with pytest.raises(InvalidSettings):
        Settings(auth="none")


@pytest.mark.parametrize(
    "keys",
    [
        pytest.param(
            {"jwt_hs256_secret": HS256_SECRET, "jwt_public_key_file": "k.pem"}, id="secret+pem"
        ),
        pytest.param(
            {"jwt_hs256_secret": HS256_SECRET, "jwt_jwks_file": "jwks.json"}, id="secret+jwks"
        ),
        pytest.param({"jwt_public_key_file": "k.pem", "jwt_jwks_file": "jwks.json"}, id="pem+jwks"),
    ],
)
@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:0"])
def test_two_jwt_key_sources_are_refused(keys: dict[str, str], listen: str) -> None:
    with pytest.raises(InvalidSettings, match="one JWT key source"):
        Settings(listen=listen, **keys)


@pytest.mark.parametrize("listen", ["nope", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", ""])
def test_bad_listen_is_refused(listen: str) -> None:
    with pytest.raises(InvalidSettings, match="HOST:PORT"):
        Settings(listen=listen)


def test_redacted_never_contains_secret_values() -> None:
    password = "pg-password-0f9e8d7c"
    page_secret = "page-token-secret-6b5a4c3d"
    settings = Settings(
        listen="0.0.0.0:0",
        database_url=f"postgresql+psycopg://memoria_app:{password}@db.example:5432/memoria",
        jwt_hs256_secret=HS256_SECRET,
        page_token_secret=page_secret,
    )
    values = settings.redacted()
    text = json.dumps(values)
    for secret in (password, HS256_SECRET, page_secret):
        assert secret not in text
    assert values["derived"]["auth"] == "jwt"
    assert values["serve"]["listen"] == "0.0.0.0:0"
    assert values["jwt"]["hs256_secret"] == "**********"  # present, but masked
    assert values["store"]["database_url"] == "**********"


def test_redacted_never_contains_secrets_from_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORIA_DATABASE_URL", "postgresql+psycopg://u:env-password-1a2b@h/db")
    monkeypatch.setenv("MEMORIA_PAGE_TOKEN_SECRET", "env-page-secret-3c4d")
    text = json.dumps(Settings().redacted())
    assert "env-password-1a2b" not in text
    assert "env-page-secret-3c4d" not in text


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.serve.listen = "0.0.0.0:0"  # type: ignore[misc]


def test_unknown_keyword_is_refused() -> None:
    """extra="forbid" applies to values passed in code (the flags path)."""
    with pytest.raises(InvalidSettings):
        Settings(listn="0.0.0.0:0")


def test_unknown_memoria_env_var_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """pydantic-settings reads only MEMORIA_<field>: an unknown one (a typo) is silently ignored.

    extra="forbid" does not reach environment variables, so MEMORIA_LISTN=0.0.0.0:1 leaves the
    server on its default loopback address. This pins that behaviour (it fails safe: the default
    stays loopback with trusted headers) so a change to it is noticed.
    """
    monkeypatch.setenv("MEMORIA_FOO", "bar")
    monkeypatch.setenv("MEMORIA_LISTN", "0.0.0.0:1")
    settings = Settings()
    assert settings.serve.listen == "127.0.0.1:50051"
    assert "foo" not in settings.model_dump()
    assert "listn" not in settings.model_dump()


def test_env_wins_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORIA_CHAR_LIMIT", "5000")
    monkeypatch.setenv("MEMORIA_LISTEN", "127.0.0.1:4321")
    settings = Settings()
    assert settings.memory.char_limit == 5000
    assert settings.serve.listen == "127.0.0.1:4321"


def test_invalid_env_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORIA_CHAR_LIMIT", "0")
    with pytest.raises(InvalidSettings):
        Settings()


def test_flags_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The env alone would be refused (off loopback, no key): the flag must replace it."""
    monkeypatch.setenv("MEMORIA_LISTEN", "0.0.0.0:9999")
    settings = _settings(flags(listen="127.0.0.1:1234"))
    assert settings.serve.listen == "127.0.0.1:1234"
    assert settings.effective_auth == "trusted-headers"


def test_env_is_used_where_no_flag_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MEMORIA_LISTEN", "127.0.0.1:9999")
    monkeypatch.setenv("MEMORIA_AUTH", "jwt")
    monkeypatch.setenv("MEMORIA_JWT_HS256_SECRET", HS256_SECRET)
    settings = _settings(flags(auth="trusted-headers", data_dir=tmp_path))
    assert settings.serve.listen == "127.0.0.1:9999"  # env: no --listen
    assert settings.effective_auth == "trusted-headers"  # --auth wins over MEMORIA_AUTH
    assert settings.store.data_dir == tmp_path


def test_unknown_memoria_variables_are_reported_but_tooling_ones_are_not() -> None:
    environ = {
        "MEMORIA_LISTN": "0.0.0.0:1",
        "MEMORIA_LISTEN": "127.0.0.1:1",
        "MEMORIA_TEST_PG_APP_URL": "x",
        "MEMORIA_REQUIRE_POSTGRES": "1",
        "MEMORIA_REQUIRE_QDRANT": "1",
        "MEMORIA_TEST_QDRANT_BIN": "/x/qdrant",
        "PATH": "/bin",
    }
    assert Settings.unknown_env(environ) == ["MEMORIA_LISTN"]


def test_client_command_variables_are_not_reported_as_typos() -> None:
    """A shell that runs `memoria export` or `memoria mcp` beside a server exports their
    variables (memoria_client/connection.py): they are known, not typos of a setting."""
    environ = {
        "MEMORIA_SERVER": "127.0.0.1:50051",
        "MEMORIA_TOKEN": "t",
        "MEMORIA_TENANT": "acme",
        "MEMORIA_PRINCIPAL": "ana",
        "MEMORIA_MCP_TOKEN": "t",
        "MEMORIA_SERVR": "127.0.0.1:50051",
    }
    assert Settings.unknown_env(environ) == ["MEMORIA_SERVR"]


def test_embedded_page_token_key_survives_a_restart(tmp_path: Path) -> None:
    from server.runtime.builders.access import page_token_key

    settings = Settings(data_dir=tmp_path)
    first = page_token_key(settings)
    assert len(first) == 32
    assert page_token_key(Settings(data_dir=tmp_path)) == first
    assert (tmp_path / "page-token.key").stat().st_mode & 0o777 == 0o600
    configured = Settings(data_dir=tmp_path, page_token_secret="x" * 32)
    assert page_token_key(configured) == b"x" * 32


@pytest.mark.parametrize(
    ("url", "grpc_port", "rest", "grpc"),
    [
        ("http://qdrant:6333", None, 6333, 6334),  # Qdrant's standard pair
        ("http://127.0.0.1:16333", None, 16333, 16334),  # another pair: the URL's port + 1
        ("https://q.example", None, 6333, 6334),  # no port: the standard pair
        ("http://127.0.0.1:16333", 20001, 16333, 20001),  # given: used as is
    ],
)
def test_qdrant_grpc_port_follows_the_url_unless_given(
    url: str, grpc_port: int | None, rest: int, grpc: int
) -> None:
    settings = Settings(qdrant_url=url, qdrant_grpc_port=grpc_port)
    assert (settings.qdrant.rest_port, settings.qdrant.effective_grpc_port) == (rest, grpc)
    assert settings.redacted()["derived"]["qdrant_grpc_port"] == grpc


def test_qdrant_rest_only_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMORIA_QDRANT_PREFER_GRPC", "false")
    monkeypatch.setenv("MEMORIA_QDRANT_GRPC_PORT", "7000")
    settings = Settings(qdrant_url="http://qdrant:6333")
    assert settings.qdrant.prefer_grpc is False
    assert settings.redacted()["derived"]["qdrant_grpc_port"] is None


@pytest.mark.parametrize(
    "url", ["qdrant:6333", "ftp://qdrant:6333", "http://:6333", "http://qdrant:99999"]
)
def test_a_qdrant_url_that_is_not_http_host_port_is_refused(url: str) -> None:
    with pytest.raises(InvalidSettings, match="MEMORIA_QDRANT_URL"):
        Settings(qdrant_url=url)


def test_the_start_up_settings_are_one_json_line_per_group_with_secrets_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Readable (one short line per group) and machine-parsable (the group's values as JSON
    under `settings` in the JSON log line), and never a secret."""
    import io
    import logging

    from server.runtime.cli import _log_settings
    from server.telemetry.logs import JsonFormatter

    monkeypatch.setenv("MEMORIA_LISTN", "typo")
    settings = Settings(
        listen="0.0.0.0:0", jwt_hs256_secret=HS256_SECRET, qdrant_url="http://q:6333"
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("memoria")
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        _log_settings(settings)
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert HS256_SECRET not in stream.getvalue()
    groups = [line["settings"] for line in lines if "settings" in line]
    assert [next(iter(group)) for group in groups] == [*Settings.model_fields, "derived"]
    by_group = {name: values for group in groups for name, values in group.items()}
    assert by_group["serve"]["listen"] == "0.0.0.0:0"
    assert by_group["jwt"]["hs256_secret"] == "**********"
    assert by_group["derived"] == {"auth": "jwt", "qdrant_grpc_port": 6334}
    jwt_line = next(
        line["message"] for line in lines if line["message"].startswith("settings jwt:")
    )
    assert 'hs256_secret="**********"' in jwt_line
    assert max(len(line["message"]) for line in lines) < 700  # was one ~2,000-character line
    assert lines[-1]["message"] == "ignoring unknown environment variable MEMORIA_LISTN"
