"""The inspector's rules on in-memory fakes: what a render and a search record for a turn,
what an inspection shows (retention, block changed since, hits of deleted conversations left
out, text read live), and that nothing is recorded without a turn or with an invalid one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.inspection import TurnInspector
from server.domain.memory import MemoryBlocks
from server.domain.model import (
    Identity,
    InspectedHit,
    RenderRecord,
    SearchRecord,
    TurnKey,
    TurnRef,
    Writer,
)
from tests.fakes import InMemoryInspectionStore, InMemoryMemoryStore

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ANA = Identity("acme", "ana")
TURN = TurnRef("c1", "t1")
KEY = TurnKey("acme", "ana", "c1", "t1")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class Turns:
    """The one TurnStore read the inspector needs: the deleted conversations."""

    def __init__(self) -> None:
        self.deleted: frozenset[str] = frozenset()

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        return self.deleted


class Index:
    """The one chunk index role the inspector needs (`ChunkTexts`): chunk texts by turn."""

    def __init__(self) -> None:
        self.chunks: dict[tuple[str, str], tuple[str, ...]] = {}
        self.asked: list[Sequence[tuple[str, str]]] = []

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        self.asked.append(list(turns))
        return {t: self.chunks[t] for t in turns if t in self.chunks}


Parts = tuple[InMemoryMemoryStore, InMemoryInspectionStore, Turns, Index, Clock]


@pytest.fixture
def parts() -> Parts:
    return InMemoryMemoryStore(), InMemoryInspectionStore(), Turns(), Index(), Clock()


def inspector(parts: Parts) -> TurnInspector:
    memory, records, turns, index, clock = parts
    # Turns and Index implement only the reads the inspector makes.
    return TurnInspector(records, memory, turns, index, clock, retention=timedelta(days=30))  # type: ignore[arg-type]


def hit(conversation: str, turn: str, chunk: int = 0) -> InspectedHit:
    return InspectedHit(conversation, turn, chunk, T0, 0.03, 1, 2)


def test_render_records_the_version_only_with_a_turn(parts: Parts) -> None:
    memory, records, _, _, clock = parts
    blocks = MemoryBlocks(memory, clock, inspections=records)
    blocks.rewrite(ANA, "Likes tea", Writer.USER)
    blocks.render(ANA)
    assert records.records == []
    rendered = blocks.render(ANA, TURN)
    assert records.read(KEY).renders == (RenderRecord(rendered.etag, 9, T0),)


def test_an_invalid_turn_is_refused_before_anything_is_rendered_or_recorded(parts: Parts) -> None:
    memory, records, _, _, clock = parts
    blocks = MemoryBlocks(memory, clock, inspections=records)
    reads = memory.reads
    with pytest.raises(MemoriaError) as caught:
        blocks.render(ANA, TurnRef("", "t\n1"))
    assert caught.value.reason is ErrorReason.INVALID_ARGUMENT
    assert {v.field for v in caught.value.violations} == {"turn.conversation_id", "turn.turn_id"}
    assert (memory.reads, records.records) == (reads, [])


def test_inspection_shows_renders_and_whether_the_block_changed(parts: Parts) -> None:
    memory, records, _, _, clock = parts
    blocks = MemoryBlocks(memory, clock, inspections=records)
    first = blocks.rewrite(ANA, "Likes tea", Writer.USER).block.etag
    blocks.render(ANA, TURN)
    got = inspector(parts).inspect(ANA, TURN)
    assert (got.current_etag, got.block_changed) == (first, False)
    second = blocks.rewrite(ANA, "Likes coffee", Writer.USER).block.etag
    got = inspector(parts).inspect(ANA, TURN)
    assert (got.current_etag, got.block_changed) == (second, True)
    assert [(r.etag, r.block_changed) for r in got.renders] == [(first, True)]
    blocks.delete(ANA, Writer.USER)
    assert inspector(parts).inspect(ANA, TURN).current_etag == ""


def test_hits_are_read_live_and_deleted_conversations_left_out(parts: Parts) -> None:
    _, records, turns, index, _ = parts
    hits = (hit("gone", "t1"), hit("kept", "t1", 1), hit("purged", "t3"), hit("kept", "t2", 5))
    records.record_search(KEY, SearchRecord("where is the key", T0, hits))
    index.chunks = {
        ("gone", "t1"): ("under the flowerpot",),
        ("kept", "t1"): ("first", "second"),
        ("kept", "t2"): ("only one chunk now",),
    }
    turns.deleted = frozenset({"gone"})
    (search,) = inspector(parts).inspect(ANA, TURN).searches
    assert [(h.conversation_id, h.turn_id, h.text) for h in search.hits] == [
        ("kept", "t1", "second"),
        ("kept", "t2", ""),  # the turn was re-indexed shorter: the chunk is gone
    ]
    assert search.hit_count == 4
    assert all(("gone", "t1") not in asked for asked in index.asked)  # never even read


def test_a_deleted_conversations_turn_shows_none_of_its_records(parts: Parts) -> None:
    """Records that outlived their conversation's deletion (on Citus a batch can race it) are
    never shown for its turns; other conversations' turns still show theirs."""
    _, records, turns, index, _ = parts
    other = TurnKey("acme", "ana", "c2", "t1")
    for key in (KEY, other):
        records.record_render(key, RenderRecord("e1", 9, T0))
        records.record_search(key, SearchRecord("where is the key", T0, (hit("c2", "t1"),)))
        records.record_failed_write(key, T0)
    index.chunks = {("c2", "t1"): ("under the flowerpot",)}
    turns.deleted = frozenset({"c1"})
    got = inspector(parts).inspect(ANA, TURN)
    assert (got.renders, got.searches, got.failed_write_count) == ((), (), 0)
    kept = inspector(parts).inspect(ANA, TurnRef("c2", "t1"))
    assert (len(kept.renders), len(kept.searches), kept.failed_write_count) == (1, 1, 1)
    assert [h.text for h in kept.searches[0].hits] == ["under the flowerpot"]


def test_records_past_the_retention_are_not_shown_and_are_purged(parts: Parts) -> None:
    _, records, _, _, clock = parts
    records.record_render(KEY, RenderRecord("old", 1, T0 - timedelta(days=31)))
    records.record_render(KEY, RenderRecord("new", 1, T0 - timedelta(days=29)))
    assert [r.etag for r in inspector(parts).inspect(ANA, TURN).renders] == ["new"]
    assert inspector(parts).purge_once(100) == 1
    clock.now = T0 + timedelta(days=2)
    assert inspector(parts).purge_once(100) == 1
    assert records.records == []


def test_inspection_needs_a_turn_and_is_scoped_to_the_caller(parts: Parts) -> None:
    _, records, _, _, _ = parts
    records.record_render(KEY, RenderRecord("e1", 1, T0))
    with pytest.raises(MemoriaError) as caught:
        inspector(parts).inspect(ANA, None)
    assert [v.field for v in caught.value.violations] == ["turn"]
    assert inspector(parts).inspect(Identity("acme", "bob"), TURN).renders == ()
    assert inspector(parts).inspect(Identity("other", "ana"), TURN).renders == ()
    assert len(inspector(parts).inspect(ANA, TURN).renders) == 1
