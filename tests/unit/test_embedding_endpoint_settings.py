"""The external embeddings endpoint's settings (MEMORIA_EMBEDDING_*) and the windows its
embedder cuts texts into (server/adapters/embedding/endpoint.py)."""

from __future__ import annotations

import json
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.adapters.embedding.endpoint import char_windows, window_spans
from server.runtime.settings import InvalidSettings, Settings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read MEMORIA_* from the environment; each settings test sets what it needs
    (not autouse: hypothesis refuses function-scoped fixtures around its examples)."""
    for name in list(os.environ):
        if name.startswith("MEMORIA_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_unset_means_the_local_model() -> None:
    settings = Settings()
    assert settings.embedding.url is None
    assert settings.embedding.model is None


@pytest.mark.usefixtures("clean_env")
def test_every_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "URL": "https://api.openai.com/v1",
        "MODEL": "text-embedding-3-small",
        "API_KEY": "sk-env-key-1234",
        "DIMENSION": "512",
        "SEND_DIMENSION": "true",
        "TIMEOUT_SECONDS": "2.5",
        "MAX_RETRIES": "4",
        "BATCH_SIZE": "100",
        "MAX_INPUT_CHARS": "6000",
    }.items():
        monkeypatch.setenv(f"MEMORIA_EMBEDDING_{name}", value)
    settings = Settings()
    assert settings.embedding.url == "https://api.openai.com/v1"
    assert settings.embedding.model == "text-embedding-3-small"
    assert settings.embedding.api_key is not None
    assert settings.embedding.api_key.get_secret_value() == "sk-env-key-1234"
    assert settings.embedding.dimension == 512
    assert settings.embedding.send_dimension is True
    assert settings.embedding.timeout_seconds == 2.5
    assert settings.embedding.max_retries == 4
    assert settings.embedding.batch_size == 100
    assert settings.embedding.max_input_chars == 6000
    assert Settings.unknown_env(os.environ) == []  # every name is one the server reads


@pytest.mark.usefixtures("clean_env")
def test_the_api_key_is_redacted_from_the_start_up_log() -> None:
    settings = Settings(
        embedding_url="https://api.openai.com/v1",
        embedding_model="text-embedding-3-small",
        embedding_api_key="sk-never-printed-42",
    )
    printed = settings.redacted()
    assert "sk-never-printed-42" not in json.dumps(printed)
    assert printed["embedding"]["model"] == "text-embedding-3-small"


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"embedding_url": "https://e.example/v1"},
            "MEMORIA_EMBEDDING_URL: needs MEMORIA_EMBEDDING_MODEL",
        ),
        ({"embedding_model": "m"}, "MEMORIA_EMBEDDING_MODEL: needs MEMORIA_EMBEDDING_URL"),
        ({"embedding_api_key": "k"}, "MEMORIA_EMBEDDING_API_KEY: needs MEMORIA_EMBEDDING_URL"),
        ({"embedding_dimension": 8}, "MEMORIA_EMBEDDING_DIMENSION: needs MEMORIA_EMBEDDING_URL"),
        (
            {"embedding_url": "ftp://e.example", "embedding_model": "m"},
            "MEMORIA_EMBEDDING_URL: must be http(s)",
        ),
        (
            {"embedding_url": "e.example/v1", "embedding_model": "m"},
            "MEMORIA_EMBEDDING_URL: must be http(s)",
        ),
        (
            {
                "embedding_url": "https://e.example/v1",
                "embedding_model": "m",
                "embedding_api_key": "k",
                "embedding_api_key_file": "/run/secrets/key",
            },
            "MEMORIA_EMBEDDING_API_KEY, MEMORIA_EMBEDDING_API_KEY_FILE: configure at most one",
        ),
        (
            {
                "embedding_url": "https://e.example",
                "embedding_model": "m",
                "embedding_send_dimension": True,
            },
            "MEMORIA_EMBEDDING_SEND_DIMENSION: needs MEMORIA_EMBEDDING_DIMENSION",
        ),
        (
            {"embedding_url": "https://e", "embedding_model": "m", "embedding_batch_size": 0},
            "MEMORIA_EMBEDDING_BATCH_SIZE: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            {"embedding_url": "https://e", "embedding_model": "m", "embedding_max_retries": 11},
            "MEMORIA_EMBEDDING_MAX_RETRIES:",
        ),
        (
            {"embedding_url": "https://e", "embedding_model": "m", "embedding_timeout_seconds": 0},
            "MEMORIA_EMBEDDING_TIMEOUT_SECONDS:",
        ),
        (
            {"embedding_url": "https://e", "embedding_model": "m", "embedding_max_input_chars": 8},
            "MEMORIA_EMBEDDING_MAX_INPUT_CHARS:",
        ),
    ],
    ids=[
        "url-without-model",
        "model-without-url",
        "key-without-url",
        "dimension-without-url",
        "ftp",
        "no-scheme",
        "two-key-sources",
        "send-without-dimension",
        "batch-zero",
        "retries-over",
        "timeout-zero",
        "window-too-small",
    ],
)
def test_inconsistent_settings_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSettings, match=re.escape(message)):
        Settings(**values)


@given(
    st.text(alphabet=st.sampled_from("ab cd\n\tef"), min_size=0, max_size=600),
    st.integers(min_value=16, max_value=120),
)
def test_windows_cover_every_character_within_the_size(text: str, size: int) -> None:
    spans = window_spans(text, size)
    assert all(0 <= start <= end <= len(text) and end - start <= size for start, end in spans)
    covered = {i for start, end in spans for i in range(start, end)}
    assert covered == set(range(len(text)))
    assert [s for s, _ in spans] == sorted(s for s, _ in spans)
    assert all(len(w) <= size for w in char_windows(text, size))


def test_a_text_that_fits_is_one_window() -> None:
    assert char_windows("hello world", 16) == ["hello world"]
    assert char_windows("", 16) == [""]


def test_window_edges_move_to_whitespace() -> None:
    text = " ".join(f"w{i:03d}" for i in range(200))  # 999 characters of 4-character words
    windows = char_windows(text, 100)
    assert len(windows) > 10
    for window in windows:
        assert all(len(word) == 4 and word.startswith("w") for word in window.split(" "))
