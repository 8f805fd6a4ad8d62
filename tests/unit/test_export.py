"""The export's rules on fakes: the record order and every page size giving the same records,
an indexed turn's text from its chunks (a queued turn's from the queue), audit events only
after the last erasure, and page tokens bound to the caller."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from server.domain.audit import PageTokens
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.export import ExportedTurn, Exporter, ExportItem
from server.domain.memory import BlockView, MemoryBlocks, SettingsView
from server.domain.model import (
    AuditAction,
    AuditEvent,
    Identity,
    NewAuditEvent,
    StoredTurn,
    Tombstone,
    Writer,
)
from tests.fakes import InMemoryMemoryStore

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ANA = Identity("acme", "ana")


class Turns:
    """The turn store reads the export makes, over fixed rows."""

    def __init__(self) -> None:
        self.rows: list[StoredTurn] = []
        self.tombstones: list[Tombstone] = []

    def list_turns(
        self,
        tenant_id: str,
        principal_id: str,
        after_row_id: int,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        rows = [r for r in self.rows if r.row_id > after_row_id]
        return [r for r in rows if since is None or r.turn_time >= since][:limit]

    def list_tombstones(
        self, tenant_id: str, principal_id: str, offset: int, limit: int
    ) -> list[Tombstone]:
        return self.tombstones[offset : offset + limit]


class Index:
    def __init__(self) -> None:
        self.chunks: dict[tuple[str, str], tuple[str, ...]] = {}

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        return {t: self.chunks[t] for t in turns if t in self.chunks}


Setup = tuple[Exporter, MemoryBlocks, InMemoryMemoryStore, Turns, Index]


@pytest.fixture
def setup() -> Setup:
    memory = InMemoryMemoryStore()
    blocks = MemoryBlocks(memory, lambda: T0)
    turns, index = Turns(), Index()
    # Turns and Index implement only the reads the export makes.
    tokens = PageTokens(b"0123456789abcdef")
    exporter = Exporter(blocks, memory, turns, index, tokens)  # type: ignore[arg-type]
    return exporter, blocks, memory, turns, index


def everything(exporter: Exporter, who: Identity, size: int) -> list[ExportItem]:
    records: list[ExportItem] = []
    token = ""
    while True:
        page = exporter.page(who, size, token)
        assert len(page.records) <= size
        records += page.records
        token = page.next_page_token
        if not token:
            return records


def test_order_and_every_page_size_give_the_same_records(setup: Setup) -> None:
    exporter, blocks, _, turns, index = setup
    blocks.rewrite(ANA, "Likes tea", Writer.USER)
    blocks.update_settings(ANA, Writer.USER, False)
    turns.rows = [
        StoredTurn(1, "c1", "t1", T0, None, True),
        StoredTurn(4, "c1", "t2", T0, "queued text", False),
        StoredTurn(7, "c2", "t1", T0, None, True),  # indexed, but its chunks are gone
    ]
    index.chunks = {("c1", "t1"): ("first chunk ", "second")}
    turns.tombstones = [Tombstone("gone", T0)]
    whole = everything(exporter, ANA, 1000)
    kinds = [type(r).__name__ for r in whole]
    assert kinds == [
        "SettingsView",
        "BlockView",
        "AuditEvent",
        "AuditEvent",
        "ExportedTurn",
        "ExportedTurn",
        "Tombstone",
    ]
    assert isinstance(whole[0], SettingsView) and not whole[0].memory_enabled
    assert isinstance(whole[1], BlockView) and whole[1].text == "Likes tea"
    assert whole[4] == ExportedTurn("c1", "t1", T0, "first chunk second", True)
    assert whole[5] == ExportedTurn("c1", "t2", T0, "queued text", False)
    for size in (1, 2, 3, 5):
        assert everything(exporter, ANA, size) == whole


def test_nothing_held_gives_an_empty_export(setup: Setup) -> None:
    exporter = setup[0]
    page = exporter.page(ANA, 0, "")
    assert (page.records, page.next_page_token) == ((), "")


def test_audit_events_only_after_the_last_erasure(setup: Setup) -> None:
    exporter, _, memory, _, _ = setup
    for i, action in enumerate(
        (
            AuditAction.BLOCK_REWRITTEN,
            AuditAction.PRINCIPAL_DATA_ERASED,
            AuditAction.BLOCK_REWRITTEN,
            AuditAction.SETTINGS_UPDATED,
        )
    ):
        memory.append("acme", NewAuditEvent("ana", action, Writer.USER, T0 + timedelta(i)))
    memory.append("acme", NewAuditEvent("bob", AuditAction.BLOCK_DELETED, Writer.USER, T0))
    events = [r for r in everything(exporter, ANA, 1) if isinstance(r, AuditEvent)]
    assert [e.action for e in events] == [
        AuditAction.SETTINGS_UPDATED,
        AuditAction.BLOCK_REWRITTEN,
    ]


def test_tokens_are_bound_to_the_caller(setup: Setup) -> None:
    exporter, blocks, _, _, _ = setup
    blocks.rewrite(ANA, "Likes tea", Writer.USER)
    token = exporter.page(ANA, 1, "").next_page_token
    assert token
    altered = token[:-1] + ("B" if token.endswith("A") else "A")
    for who, bad in ((Identity("acme", "bob"), token), (ANA, altered)):
        with pytest.raises(MemoriaError) as caught:
            exporter.page(who, 1, bad)
        assert caught.value.reason is ErrorReason.INVALID_PAGE_TOKEN
    with pytest.raises(MemoriaError) as caught:
        exporter.page(ANA, -1, "")
    assert caught.value.reason is ErrorReason.INVALID_ARGUMENT
