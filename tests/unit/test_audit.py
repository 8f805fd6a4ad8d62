"""Audit listing rules: who may read what, paging and signed page tokens."""

from __future__ import annotations

import base64
import json

import pytest

from server.domain.audit import MAX_PAGE_SIZE, AuditLog, AuditRequest, PageTokens
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import AuditAction, Identity, Writer
from tests.fakes import InMemoryMemoryStore
from tests.unit.test_memory import Clock

ANA = Identity("acme", "ana")
BOB = Identity("acme", "bob")
ADMIN = Identity("acme", "root", is_tenant_admin=True)
OTHER_ADMIN = Identity("globex", "root", is_tenant_admin=True)
TOKENS = PageTokens(b"0123456789abcdef0123456789abcdef")


@pytest.fixture
def store() -> InMemoryMemoryStore:
    store = InMemoryMemoryStore()
    blocks = MemoryBlocks(store, Clock())
    for i in range(5):
        blocks.rewrite(ANA, f"ana v{i}", Writer.MODEL)
    blocks.rewrite(BOB, "bob", Writer.USER)
    blocks.delete(BOB, Writer.USER)
    blocks.rewrite(Identity("globex", "ana"), "globex ana", Writer.MODEL)
    return store


def test_pages_are_newest_first_without_gaps_or_duplicates(store: InMemoryMemoryStore) -> None:
    log = AuditLog(store, TOKENS)
    seen: list[int] = []
    token = ""
    while True:
        page = log.list(ANA, AuditRequest(page_size=2, page_token=token))
        seen.extend(e.event_id for e in page.events)
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == 5
    assert seen == sorted(seen, reverse=True)


def test_last_full_page_has_no_token_only_when_nothing_follows(store: InMemoryMemoryStore) -> None:
    page = AuditLog(store, TOKENS).list(ANA, AuditRequest(page_size=5))
    assert len(page.events) == 5
    assert page.next_page_token == ""


def test_token_is_bound_to_caller_and_filters(store: InMemoryMemoryStore) -> None:
    log = AuditLog(store, TOKENS)
    token = log.list(ANA, AuditRequest(page_size=1)).next_page_token
    assert token
    for who, req in (
        (BOB, AuditRequest(page_size=1, page_token=token)),
        (
            ANA,
            AuditRequest(
                page_size=2, page_token=token, actions=frozenset({AuditAction.BLOCK_DELETED})
            ),
        ),
    ):
        with pytest.raises(MemoriaError) as excinfo:
            log.list(who, req)
        assert excinfo.value.reason is ErrorReason.INVALID_PAGE_TOKEN
    assert log.list(ANA, AuditRequest(page_size=3, page_token=token)).events  # size may change


@pytest.mark.parametrize("forge", ["garbage", "AAAA", "tampered"])
def test_forged_tokens_are_refused(store: InMemoryMemoryStore, forge: str) -> None:
    log = AuditLog(store, TOKENS)
    token = log.list(ANA, AuditRequest(page_size=1)).next_page_token
    if forge == "tampered":
        raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        body = json.loads(raw[16:])
        body["b"] += 100
        forged = bytes(raw[:16]) + json.dumps(body, separators=(",", ":")).encode()
        forge = base64.urlsafe_b64encode(forged).decode().rstrip("=")
    with pytest.raises(MemoriaError) as excinfo:
        log.list(ANA, AuditRequest(page_token=forge))
    assert excinfo.value.reason is ErrorReason.INVALID_PAGE_TOKEN


def test_another_principal_needs_the_admin_role(store: InMemoryMemoryStore) -> None:
    log = AuditLog(store, TOKENS)
    for requested in ("bob", "-"):
        with pytest.raises(MemoriaError) as excinfo:
            log.list(ANA, AuditRequest(principal_id=requested))
        assert excinfo.value.reason is ErrorReason.PERMISSION_DENIED
    assert {e.principal_id for e in log.list(ADMIN, AuditRequest(principal_id="-")).events} == {
        "ana",
        "bob",
    }
    assert len(log.list(ADMIN, AuditRequest(principal_id="bob")).events) == 2


def test_an_admin_never_sees_another_tenant(store: InMemoryMemoryStore) -> None:
    events = AuditLog(store, TOKENS).list(OTHER_ADMIN, AuditRequest(principal_id="-")).events
    assert [e.principal_id for e in events] == ["ana"]
    assert events[0].added_lines == ("globex ana",)


def test_filters_by_action(store: InMemoryMemoryStore) -> None:
    only = frozenset({AuditAction.BLOCK_DELETED})
    events = AuditLog(store, TOKENS).list(BOB, AuditRequest(actions=only)).events
    assert [e.action for e in events] == [AuditAction.BLOCK_DELETED]


def test_invalid_fields_are_reported_together(store: InMemoryMemoryStore) -> None:
    t = store.audit[0][1].create_time
    with pytest.raises(MemoriaError) as excinfo:
        AuditLog(store, TOKENS).list(ANA, AuditRequest(page_size=-1, start_time=t, end_time=t))
    assert excinfo.value.reason is ErrorReason.INVALID_ARGUMENT
    assert {v.field for v in excinfo.value.violations} == {"page_size", "end_time"}


def test_page_token_secret_must_be_long_enough() -> None:
    with pytest.raises(ValueError):
        PageTokens(b"short")


def test_page_size_is_capped_at_the_maximum() -> None:
    store = InMemoryMemoryStore()
    blocks = MemoryBlocks(store, Clock())
    for i in range(MAX_PAGE_SIZE + 2):
        blocks.rewrite(ANA, f"v{i}", Writer.MODEL)
    page = AuditLog(store, TOKENS).list(ANA, AuditRequest(page_size=1_000_000))
    assert len(page.events) == MAX_PAGE_SIZE
    assert page.next_page_token
