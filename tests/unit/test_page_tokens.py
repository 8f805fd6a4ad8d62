"""Page tokens are authenticated whole: only the exact string issued is accepted.

Each altered form named in issue 16 (version dropped or changed, keys added or reordered,
whitespace, padding, base64 alphabet) has a case; the properties then cover every token:
it round-trips, and any single-character change or truncation is refused.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.domain.audit import PageTokens
from server.domain.errors import ErrorReason, MemoriaError

TOKENS = PageTokens(b"0123456789abcdef0123456789abcdef")
SCOPE = "acme\x1fana\x1fana\x1f\x1f\x1f"
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def refused(token: str, scope: str = SCOPE) -> None:
    with pytest.raises(MemoriaError) as caught:
        TOKENS.verify(scope, token)
    assert caught.value.reason is ErrorReason.INVALID_PAGE_TOKEN
    assert [v.field for v in caught.value.violations] == ["page_token"]


def parts(token: str) -> tuple[bytes, bytes]:
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return raw[:16], raw[16:]


def encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def resigned(body: bytes, scope: str = SCOPE) -> str:
    """`body` under the MAC of a token issued for the same cursor: under the first format
    (which MAC'd only the cursor) every such body verified."""
    mac, _ = parts(TOKENS.issue(scope, 41))
    return encode(mac + body)


def test_a_token_round_trips() -> None:
    assert TOKENS.verify(SCOPE, TOKENS.issue(SCOPE, 41)) == 41


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"b":41}', id="version-dropped"),
        pytest.param(b'{"v":2,"b":41}', id="version-changed"),
        pytest.param(b'{"v":"1","b":41}', id="version-a-string"),
        pytest.param(b'{"b":41,"v":1}', id="keys-reordered"),
        pytest.param(b'{"v":1,"b":41,"x":0}', id="key-added"),
        pytest.param(b'{"v": 1, "b": 41}', id="whitespace"),
        pytest.param(b'{"v":1,"b":41} ', id="trailing-space"),
        pytest.param(b'{"v":1,"b":41.0}', id="cursor-a-float"),
        pytest.param(b'{"v":1,"b":true}', id="cursor-a-bool"),
    ],
)
def test_a_changed_body_is_refused(body: bytes) -> None:
    refused(resigned(body))


def test_a_body_changed_under_its_original_mac_is_refused() -> None:
    """Under the first format, only `b` was MAC'd: this exact forgery used to pass."""
    mac, body = parts(TOKENS.issue(SCOPE, 41))
    assert json.loads(body) == {"v": 1, "b": 41}
    refused(encode(mac + b'{"b":41}'))
    refused(encode(mac + b'{"v":9,"b":41}'))


def test_other_encodings_of_the_same_bytes_are_refused() -> None:
    # A token that needs padding and uses the url-safe characters (found deterministically).
    token = next(
        t
        for t in (TOKENS.issue(SCOPE, before) for before in range(100, 10_000))
        if len(t) % 4 and ("-" in t or "_" in t)
    )
    raw = decoded(token)
    padded = base64.urlsafe_b64encode(raw).decode()
    standard = base64.b64encode(raw).decode().rstrip("=")
    assert padded != token and standard != token
    refused(padded)  # padding
    refused(standard)  # the +/ alphabet
    refused(token + "=")
    refused(f" {token}")
    refused(f"{token}\n")
    refused(token[:10] + "." + token[10:])  # a character the lenient decoder would skip


def test_a_token_with_other_spare_bits_is_refused() -> None:
    """31 bytes end in a 2-character group whose last character has 4 unused bits: 15 other
    characters decode to the very same bytes, and none of them is the token."""
    token = TOKENS.issue(SCOPE, 410)
    raw = decoded(token)
    assert len(raw) % 3 == 1
    twins = [token[:-1] + c for c in B64URL if c != token[-1]]
    twins = [twin for twin in twins if decoded(twin) == raw]
    assert len(twins) == 15
    for twin in twins:
        refused(twin)


def decoded(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def test_a_token_is_bound_to_its_scope() -> None:
    refused(TOKENS.issue(SCOPE, 41), scope=SCOPE + "x")


def test_a_token_of_another_secret_is_refused() -> None:
    other = PageTokens(b"fedcba9876543210fedcba9876543210")
    refused(other.issue(SCOPE, 41))


@pytest.mark.parametrize("token", ["", "A", "AAAA", "=" * 8, "a" * 600, "\u00e9t\u00e9"])
def test_garbage_is_refused(token: str) -> None:
    refused(token)


@given(before=st.integers(min_value=0, max_value=2**63 - 1), scope=st.text(max_size=40))
def test_every_issued_token_round_trips(before: int, scope: str) -> None:
    token = TOKENS.issue(scope, before)
    assert set(token) <= set(B64URL)
    assert TOKENS.verify(scope, token) == before


@given(
    before=st.integers(min_value=0, max_value=2**40),
    data=st.data(),
)
def test_any_single_character_change_is_refused(before: int, data: st.DataObject) -> None:
    token = TOKENS.issue(SCOPE, before)
    position = data.draw(st.integers(min_value=0, max_value=len(token) - 1))
    replacement = data.draw(st.characters(codec="utf-8").filter(lambda c: c != token[position]))
    changed = token[:position] + replacement + token[position + 1 :]
    with pytest.raises(MemoriaError) as caught:
        TOKENS.verify(SCOPE, changed)
    assert caught.value.reason is ErrorReason.INVALID_PAGE_TOKEN


@given(before=st.integers(min_value=0, max_value=2**40), data=st.data())
def test_any_insertion_deletion_or_truncation_is_refused(before: int, data: st.DataObject) -> None:
    token = TOKENS.issue(SCOPE, before)
    position = data.draw(st.integers(min_value=0, max_value=len(token)))
    kind = data.draw(st.sampled_from(["insert", "delete", "truncate"]))
    if kind == "insert":
        changed = token[:position] + data.draw(st.characters(codec="utf-8")) + token[position:]
    elif kind == "delete":
        changed = token[: max(position - 1, 0)] + token[position:] if position else token[1:]
    else:
        changed = token[:position] if position < len(token) else token[:-1]
    with pytest.raises(MemoriaError) as caught:
        TOKENS.verify(SCOPE, changed)
    assert caught.value.reason is ErrorReason.INVALID_PAGE_TOKEN


@given(token=st.text(max_size=80))
def test_arbitrary_strings_are_refused_never_crash(token: str) -> None:
    with pytest.raises(MemoriaError) as caught:
        TOKENS.verify(SCOPE, token)
    assert caught.value.reason is ErrorReason.INVALID_PAGE_TOKEN
