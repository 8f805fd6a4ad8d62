"""Every MEMORIA_* variable of the flat settings still configures what it did, now in its group.

The names below are written out, not derived from the settings: they are the variables
deployments set before the settings were grouped (MEMORIA_WORKERS, the older name of
MEMORIA_PROCESSES, is pinned in test_processes.py), so renaming a field or moving it to
another group without keeping its variable fails here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from server.runtime.cli import _parser, _settings
from server.runtime.settings import SETTINGS, InvalidSettings, Settings

ENDPOINT = {"MEMORIA_EMBEDDING_URL": "https://e.example/v1", "MEMORIA_EMBEDDING_MODEL": "m"}
JWT = {"MEMORIA_JWT_HS256_SECRET": "groups-test-secret-0123456789abcdef"}

# (variable, group.field, value set, value read, other variables it needs to be valid)
VARIABLES: list[tuple[str, str, str, Any, dict[str, str]]] = [
    ("MEMORIA_LISTEN", "serve.listen", "127.0.0.1:7001", "127.0.0.1:7001", {}),
    ("MEMORIA_THREADS", "serve.threads", "7", 7, {}),
    ("MEMORIA_PROCESSES", "serve.processes", "3", 3, {}),
    ("MEMORIA_PIN_CPU", "serve.pin_cpu", "true", True, {}),
    ("MEMORIA_PAGE_TOKEN_SECRET", "serve.page_token_secret", "pts", SecretStr("pts"), {}),
    ("MEMORIA_SHUTDOWN_GRACE_SECONDS", "serve.shutdown_grace_seconds", "2.5", 2.5, {}),
    ("MEMORIA_LOG_LEVEL", "serve.log_level", "DEBUG", "DEBUG", {}),
    ("MEMORIA_HTTP_LISTEN", "http.listen", "127.0.0.1:7002", "127.0.0.1:7002", {}),
    ("MEMORIA_HTTP_PAGE_DIR", "http.page_dir", "/srv/page", Path("/srv/page"), {}),
    (
        "MEMORIA_HTTP_CORS_ORIGINS",
        "http.cors_origins",
        '["https://a.example"]',
        ("https://a.example",),
        {},
    ),
    ("MEMORIA_AUTH", "access.mode", "jwt", "jwt", JWT),
    ("MEMORIA_ADMIN_ROLE", "access.admin_role", "boss", "boss", {}),
    ("MEMORIA_JWT_HS256_SECRET", "jwt.hs256_secret", "s" * 32, SecretStr("s" * 32), {}),
    ("MEMORIA_JWT_PUBLIC_KEY_FILE", "jwt.public_key_file", "/k.pem", Path("/k.pem"), {}),
    ("MEMORIA_JWT_JWKS_FILE", "jwt.jwks_file", "/jwks.json", Path("/jwks.json"), {}),
    ("MEMORIA_JWT_ALGORITHMS", "jwt.algorithms", '["RS256"]', ("RS256",), {}),
    ("MEMORIA_JWT_AUDIENCE", "jwt.audience", "memoria", "memoria", {}),
    ("MEMORIA_JWT_ISSUER", "jwt.issuer", "https://id.example", "https://id.example", {}),
    ("MEMORIA_JWT_TENANT_CLAIM", "jwt.tenant_claim", "org", "org", {}),
    ("MEMORIA_JWT_PRINCIPAL_CLAIM", "jwt.principal_claim", "uid", "uid", {}),
    ("MEMORIA_JWT_ROLES_CLAIM", "jwt.roles_claim", "groups", "groups", {}),
    ("MEMORIA_JWT_LEEWAY_SECONDS", "jwt.leeway_seconds", "5", 5.0, {}),
    ("MEMORIA_DATA_DIR", "store.data_dir", "/var/memoria", Path("/var/memoria"), {}),
    (
        "MEMORIA_DATABASE_URL",
        "store.database_url",
        "postgresql+psycopg://a@h/d",
        SecretStr("postgresql+psycopg://a@h/d"),
        {},
    ),
    (
        "MEMORIA_DB_POOLER",
        "store.db_pooler",
        "transaction",
        "transaction",
        {
            "MEMORIA_DATABASE_URL": "postgresql+psycopg://a@pooler/d",
            "MEMORIA_READ_CACHE_ENTRIES": "0",
        },
    ),
    (
        "MEMORIA_DATABASE_LISTEN_URL",
        "store.database_listen_url",
        "postgresql+psycopg://a@h/d",
        SecretStr("postgresql+psycopg://a@h/d"),
        {},
    ),
    ("MEMORIA_DB_POOL_SIZE", "store.db_pool_size", "3", 3, {}),
    ("MEMORIA_READ_CACHE_ENTRIES", "store.read_cache_entries", "0", 0, {}),
    ("MEMORIA_READ_CACHE_TTL_SECONDS", "store.read_cache_ttl_seconds", "9", 9.0, {}),
    ("MEMORIA_DISK_MIN_FREE_BYTES", "store.disk_min_free_bytes", "1024", 1024, {}),
    ("MEMORIA_DISK_MIN_FREE_PERCENT", "store.disk_min_free_percent", "1.5", 1.5, {}),
    ("MEMORIA_QDRANT_URL", "qdrant.url", "http://q:6333", "http://q:6333", {}),
    ("MEMORIA_QDRANT_API_KEY", "qdrant.api_key", "qk", SecretStr("qk"), {}),
    ("MEMORIA_QDRANT_COLLECTION", "qdrant.collection", "c2", "c2", {}),
    ("MEMORIA_QDRANT_GRPC_PORT", "qdrant.grpc_port", "7334", 7334, {}),
    ("MEMORIA_QDRANT_PREFER_GRPC", "qdrant.prefer_grpc", "false", False, {}),
    ("MEMORIA_QDRANT_SHARD_NUMBER", "qdrant.shard_number", "4", 4, {}),
    ("MEMORIA_QDRANT_REPLICATION_FACTOR", "qdrant.replication_factor", "2", 2, {}),
    (
        "MEMORIA_LOCAL_EMBEDDING_MODEL",
        "embedding.local_model",
        "multilingual-e5-small-q4",
        "multilingual-e5-small-q4",
        {},
    ),
    ("MEMORIA_EMBEDDING_THREADS", "embedding.threads", "2", 2, {}),
    (
        "MEMORIA_EMBEDDING_URL",
        "embedding.url",
        "https://x.example/v1",
        "https://x.example/v1",
        {"MEMORIA_EMBEDDING_MODEL": "m"},
    ),
    (
        "MEMORIA_EMBEDDING_MODEL",
        "embedding.model",
        "m2",
        "m2",
        {"MEMORIA_EMBEDDING_URL": "https://e.example/v1"},
    ),
    ("MEMORIA_EMBEDDING_API_KEY", "embedding.api_key", "ek", SecretStr("ek"), ENDPOINT),
    ("MEMORIA_EMBEDDING_API_KEY_FILE", "embedding.api_key_file", "/ek", Path("/ek"), ENDPOINT),
    ("MEMORIA_EMBEDDING_DIMENSION", "embedding.dimension", "256", 256, ENDPOINT),
    (
        "MEMORIA_EMBEDDING_SEND_DIMENSION",
        "embedding.send_dimension",
        "true",
        True,
        {**ENDPOINT, "MEMORIA_EMBEDDING_DIMENSION": "8"},
    ),
    ("MEMORIA_EMBEDDING_TIMEOUT_SECONDS", "embedding.timeout_seconds", "3", 3.0, ENDPOINT),
    ("MEMORIA_EMBEDDING_MAX_RETRIES", "embedding.max_retries", "0", 0, ENDPOINT),
    ("MEMORIA_EMBEDDING_BATCH_SIZE", "embedding.batch_size", "8", 8, ENDPOINT),
    ("MEMORIA_EMBEDDING_MAX_INPUT_CHARS", "embedding.max_input_chars", "512", 512, ENDPOINT),
    ("MEMORIA_INDEX_WORKER_THREADS", "indexing.worker_threads", "0", 0, {}),
    ("MEMORIA_INDEX_BATCH_SIZE", "indexing.batch_size", "4", 4, {}),
    ("MEMORIA_CHAR_LIMIT", "memory.char_limit", "5000", 5000, {}),
    ("MEMORIA_INSPECTION_RETENTION_DAYS", "memory.inspection_retention_days", "7", 7, {}),
    ("MEMORIA_TURN_RETENTION_DAYS", "memory.turn_retention_days", "90", 90, {}),
    (
        "MEMORIA_TENANT_TURN_RETENTION_DAYS",
        "memory.tenant_turn_retention_days",
        '{"acme": 30, "globex": 0}',
        {"acme": 30, "globex": 0},
        {},
    ),
    ("MEMORIA_SEARCH_MODE", "memory.search_mode", "keyword", "keyword", {}),
    ("MEMORIA_MAX_RECEIVE_MESSAGE_BYTES", "limits.max_receive_message_bytes", "65536", 65536, {}),
    ("MEMORIA_MAX_SEND_MESSAGE_BYTES", "limits.max_send_message_bytes", "2097152", 2097152, {}),
    ("MEMORIA_RECEIVE_TIMEOUT_SECONDS", "limits.receive_timeout_seconds", "4", 4.0, {}),
    ("MEMORIA_STREAM_IDLE_SECONDS", "limits.stream_idle_seconds", "30", 30.0, {}),
    ("MEMORIA_MAX_CALLS", "limits.max_calls", "500", 500, {}),
    ("MEMORIA_MAX_RECEIVING_CALLS", "limits.max_receiving_calls", "99", 99, {}),
    ("MEMORIA_MAX_STREAMS", "limits.max_streams", "9", 9, {}),
    ("MEMORIA_MAX_STREAMS_PER_CONNECTION", "limits.max_streams_per_connection", "17", 17, {}),
    ("MEMORIA_MAX_CONNECTIONS", "limits.max_connections", "100", 100, {}),
    ("MEMORIA_CONNECTION_IDLE_SECONDS", "limits.connection_idle_seconds", "45", 45.0, {}),
    ("MEMORIA_HANDSHAKE_TIMEOUT_SECONDS", "limits.handshake_timeout_seconds", "3", 3.0, {}),
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MEMORIA_")]:
        monkeypatch.delenv(name)


def read(settings: Settings, path: str) -> Any:
    group, field = path.split(".")
    return getattr(getattr(settings, group), field)


@pytest.mark.parametrize(
    ("variable", "path", "raw", "expected", "needs"), VARIABLES, ids=[v[0] for v in VARIABLES]
)
def test_each_variable_lands_in_its_group(
    variable: str,
    path: str,
    raw: str,
    expected: Any,
    needs: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert read(Settings(), path) != expected  # the value set is not the default
    for name, value in {**needs, variable: raw}.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert read(settings, path) == expected
    # The same name is the keyword (the flags' path): `Settings(qdrant_url=...)`.
    flat = variable.removeprefix("MEMORIA_").lower()
    assert read(Settings(**{flat: read(settings, path)}), path) == expected


def test_the_table_covers_every_setting() -> None:
    """A setting added later is added here, with a value, so its variable is pinned too."""
    assert sorted(v[0] for v in VARIABLES) == sorted(s.env for s in SETTINGS)


@pytest.mark.parametrize(
    ("argv", "path", "expected"),
    [
        (["--listen", "127.0.0.1:7003"], "serve.listen", "127.0.0.1:7003"),
        (["--data-dir", "/d"], "store.data_dir", Path("/d")),
        (
            ["--database-url", "postgresql+psycopg://a@h/d"],
            "store.database_url",
            SecretStr("postgresql+psycopg://a@h/d"),
        ),
        (["--qdrant-url", "http://q:6333"], "qdrant.url", "http://q:6333"),
        (["--qdrant-grpc-port", "7334"], "qdrant.grpc_port", 7334),
        (["--auth", "trusted-headers"], "access.mode", "trusted-headers"),
        (["--processes", "2"], "serve.processes", 2),
        (["--workers", "2"], "serve.processes", 2),
        (["--http-listen", "127.0.0.1:7004"], "http.listen", "127.0.0.1:7004"),
    ],
)
def test_each_serve_flag_lands_in_its_group(argv: list[str], path: str, expected: Any) -> None:
    assert read(_settings(_parser().parse_args(["serve", *argv])), path) == expected


def test_a_group_can_be_given_whole_and_stays_frozen() -> None:
    settings = Settings(qdrant={"url": "http://q:6333", "collection": "c"}, qdrant_grpc_port=1)
    assert (settings.qdrant.url, settings.qdrant.collection) == ("http://q:6333", "c")
    assert settings.qdrant.grpc_port == 1  # a flat name joins the group given whole
    with pytest.raises(ValueError):
        settings.qdrant.url = "http://other:6333"  # type: ignore[misc]


def test_replace_checks_as_a_start_does() -> None:
    settings = Settings()
    assert settings.replace(index_worker_threads=3).indexing.worker_threads == 3
    assert settings.indexing.worker_threads == 1  # the original is unchanged
    with pytest.raises(InvalidSettings, match="MEMORIA_INDEX_WORKER_THREADS"):
        settings.replace(index_worker_threads=-1)


POOLED = "postgresql+psycopg://app@pooler:6432/memoria"
DIRECT = "postgresql+psycopg://app@db:5432/memoria"


def test_a_transaction_pooler_needs_a_direct_url_for_the_cache_listener() -> None:
    with pytest.raises(InvalidSettings, match="MEMORIA_DATABASE_LISTEN_URL") as caught:
        Settings(database_url=POOLED, db_pooler="transaction")
    assert "MEMORIA_READ_CACHE_ENTRIES" in str(caught.value)  # or no cache at all
    with_listener = Settings(
        database_url=POOLED, db_pooler="transaction", database_listen_url=DIRECT
    )
    assert with_listener.store.listen_url == DIRECT
    uncached = Settings(database_url=POOLED, db_pooler="transaction", read_cache_entries=0)
    assert uncached.store.listen_url == POOLED  # never used: no cache, no listener
    assert Settings(database_url=DIRECT).store.listen_url == DIRECT


def test_a_pooler_needs_a_postgresql_url() -> None:
    with pytest.raises(InvalidSettings, match="MEMORIA_DB_POOLER"):
        Settings(db_pooler="transaction", read_cache_entries=0)
