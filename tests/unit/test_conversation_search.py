"""Conversation search's rules on the in-memory fakes: a search sees only the caller's own
chunks, one hit per turn with its best chunk, never a deleted conversation, and nothing with
memory off; a deleted conversation is tombstoned first and refuses late turns; an erasure
removes everything of a principal and leaves only counts in the audit log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from server.domain import relevance
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.fusion import MIN_RETRIEVAL_TURNS
from server.domain.intake import TurnOutcome
from server.domain.model import (
    AuditAction,
    AuditQuery,
    EncodedQuery,
    Identity,
    InspectedHit,
    NewAuditEvent,
    RenderRecord,
    RetrievalResult,
    SearchBounds,
    SearchHit,
    SearchScope,
    StoredBlock,
    TurnKey,
    TurnRef,
    Writer,
)
from server.domain.ports import ChunkSearch
from server.domain.search import MAX_PAGE_SIZE
from tests.unit.world import ANA, BOB, T0, TENANT, World


@pytest.fixture
def world() -> World:
    return World()


def turns_of(hits: Sequence[SearchHit | InspectedHit]) -> list[tuple[str, str]]:
    return [(h.conversation_id, h.turn_id) for h in hits]


# --- Searching ---------------------------------------------------------------------------


def test_a_search_sees_only_the_callers_own_turns(world: World) -> None:
    elsewhere = Identity("t2", "ana")  # the same principal id in another tenant
    for who in (ANA, BOB, elsewhere):
        world.say(who, "c1", f"u-{who.tenant_id}-{who.principal_id}", "the heron by the lake")
    for who in (ANA, BOB, elsewhere):
        assert turns_of(world.find(who, "heron lake")) == [
            ("c1", f"u-{who.tenant_id}-{who.principal_id}")
        ]
    assert world.find(Identity("t3", "ana"), "heron lake") == []


def test_each_turn_is_one_hit_showing_its_best_chunk(world: World) -> None:
    filler = "we talked about the weather and the garden " * 100  # over one chunk
    world.say(ANA, "c1", "long", filler + "then the kingfisher landed", "yes")
    assert world.index.count(TENANT, "ana", "c1") == 2
    # Both chunks match (the first through its neighbour's words, keywords.py); both sides
    # rank the one turn first, so the keyword side's best chunk is shown: its own words.
    (hit,) = world.find(ANA, "kingfisher")
    assert (hit.turn_id, hit.chunk_index) == ("long", 1) and "kingfisher" in hit.text
    assert (hit.keyword_rank, hit.semantic_rank) == (1, 1)


def test_a_deleted_conversation_is_out_of_search_before_its_chunks_are_purged(
    world: World,
) -> None:
    world.say(ANA, "gone", "u1", "the otter swam by")
    world.say(ANA, "kept", "u1", "an otter again")
    assert world.removal.delete_conversation(ANA, "gone") == 1
    assert world.index.count(TENANT, "ana", "gone") == 1  # not purged yet...
    assert turns_of(world.find(ANA, "otter")) == [("kept", "u1")]  # ...and never found
    assert world.indexer.purge_once(10) == 1
    assert world.index.count(TENANT, "ana", "gone") == 0
    assert turns_of(world.find(ANA, "otter")) == [("kept", "u1")]


def test_with_memory_off_nothing_is_found_and_nothing_is_stored(world: World) -> None:
    world.say(ANA, "c1", "u1", "the badger's den")
    world.memory_off(ANA)
    assert world.find(ANA, "badger") == []
    result = world.say(ANA, "c1", "u2", "a second badger")
    assert result.outcome is TurnOutcome.SKIPPED_MEMORY_DISABLED
    assert world.turns.list_turns(TENANT, "ana", 0, 10)[-1].turn_id == "u1"
    assert world.index.count(TENANT, "ana") == 1


class SpySearch:
    """The index's search, recording how many turns each call asked for."""

    def __init__(self, search: ChunkSearch) -> None:
        self._search = search
        self.asked: list[int] = []

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        self.asked.append(turns)
        return self._search.search(scope, query, turns)


@pytest.mark.parametrize(("page_size", "page"), [(0, 10), (7, 7), (500, MAX_PAGE_SIZE)])
def test_the_page_is_capped_and_each_side_is_read_deep_enough(
    world: World, page_size: int, page: int
) -> None:
    spy = SpySearch(world.index)
    search = replace(world.search, chunks=spy)
    for n in range(60):
        world.say(ANA, "c1", f"u{n:02}", f"wren number {n}", wait=False)
    assert world.indexer.run_once(100) == 60
    assert len(search.search(ANA, "wren", page_size)) == page
    assert spy.asked == [MIN_RETRIEVAL_TURNS]  # the page or more: the fused scores' range


def test_an_empty_query_and_a_negative_page_are_invalid(world: World) -> None:
    with pytest.raises(MemoriaError) as raised:
        world.search.search(ANA, " \u200b ", -1)
    assert raised.value.reason is ErrorReason.INVALID_ARGUMENT
    assert {v.field for v in raised.value.violations} == {"query", "page_size"}


def say_at(world: World, conversation: str, turn: str, question: str, days: int) -> None:
    when = T0 + timedelta(days=days)
    world.intake.index_turn(ANA, conversation, turn, question, "noted", when, wait=True)


def test_bounds_limit_a_search_to_a_span_and_a_conversation(world: World) -> None:
    for days in range(5):
        say_at(world, "c1", f"d{days}", "the grebe nest", days)
        say_at(world, "c2", f"d{days}", "the grebe nest", days)
    span = SearchBounds(start_time=T0 + timedelta(days=1), end_time=T0 + timedelta(days=3))
    found = world.search.search(ANA, "grebe", 10, bounds=span)
    # Newer first among equal scores; day 3 is the (exclusive) end.
    assert turns_of(found) == [("c1", "d2"), ("c2", "d2"), ("c1", "d1"), ("c2", "d1")]
    one = replace(span, conversation_id="c2")
    assert turns_of(world.search.search(ANA, "grebe", 10, bounds=one)) == [
        ("c2", "d2"),
        ("c2", "d1"),
    ]


def test_bounds_reach_the_index_in_the_scope(world: World) -> None:
    spy = ScopeSpy(world.index)
    bounds = SearchBounds("c1", T0, T0 + timedelta(hours=1))
    replace(world.search, chunks=spy).search(ANA, "grebe", 5, bounds=bounds)
    assert [s.bounds for s in spy.scopes] == [bounds]


class ScopeSpy:
    """The index's search, recording each scope it was asked with."""

    def __init__(self, search: ChunkSearch) -> None:
        self._search = search
        self.scopes: list[SearchScope] = []

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        self.scopes.append(scope)
        return self._search.search(scope, query, turns)


@pytest.mark.parametrize(
    ("bounds", "field", "why"),
    [
        (SearchBounds(start_time=T0, end_time=T0), "end_time", "must be after start_time"),
        (
            SearchBounds(start_time=T0 + timedelta(seconds=1), end_time=T0),
            "end_time",
            "must be after start_time",
        ),
        (SearchBounds(conversation_id=""), "conversation_id", "is required"),
        (SearchBounds(conversation_id="x" * 129), "conversation_id", "at most 128"),
        (SearchBounds(conversation_id="c\u200b1"), "conversation_id", "invisible"),
        (SearchBounds(start_time=datetime(2026, 1, 1)), "start_time", "time zone"),
    ],
)
def test_invalid_bounds_are_refused_before_any_search(
    world: World, bounds: SearchBounds, field: str, why: str
) -> None:
    spy = ScopeSpy(world.index)
    with pytest.raises(MemoriaError) as raised:
        replace(world.search, chunks=spy).search(ANA, "grebe", 5, bounds=bounds)
    assert raised.value.reason is ErrorReason.INVALID_ARGUMENT
    ((named, description),) = [(v.field, v.description) for v in raised.value.violations]
    assert named == field and why in description
    assert spy.scopes == []


def test_a_search_for_a_turn_is_recorded_for_the_inspector(world: World) -> None:
    world.say(ANA, "c1", "u1", "the heron")
    hits = world.search.search(ANA, "heron", 5, TurnRef("c9", "now"))
    (record,) = world.inspections.read(TurnKey(TENANT, "ana", "c9", "now")).searches
    assert record.query == "heron"
    assert turns_of(record.hits) == turns_of(hits)


# --- Accepting and deleting ----------------------------------------------------------------


def test_a_turn_not_waited_for_is_queued_and_wakes_the_worker(world: World) -> None:
    result = world.say(ANA, "c1", "u1", "queued words", wait=False)
    assert (result.outcome, result.chunk_count) == (TurnOutcome.ACCEPTED, 1)
    assert world.wakes == ["wake"] and world.find(ANA, "queued") == []
    assert world.indexer.run_once(10) == 1
    assert turns_of(world.find(ANA, "queued")) == [("c1", "u1")]


def test_deleting_tombstones_first_and_refuses_every_late_turn(world: World) -> None:
    world.say(ANA, "c1", "u1", "first words")
    world.say(ANA, "c1", "u2", "queued words", wait=False)
    world.wakes.clear()
    assert world.removal.delete_conversation(ANA, "c1") == 2
    assert world.wakes == ["wake"]  # the purge of its chunks
    assert world.turns.deleted_conversations(TENANT, "ana") == {"c1"}
    assert world.indexer.run_once(10) == 0  # its queued turn went with it
    for _ in range(2):  # before the purge and after it
        with pytest.raises(MemoriaError) as raised:
            world.say(ANA, "c1", "u3", "too late")
        assert raised.value.reason is ErrorReason.CONVERSATION_DELETED
        world.indexer.purge_once(10)
    assert world.removal.delete_conversation(ANA, "c1") == 0  # once only
    events = world.memory.list_audit(TENANT, AuditQuery(principal_id="ana"))
    assert [(e.action, e.conversation_id, e.deleted_turn_count) for e in events] == [
        (AuditAction.CONVERSATION_DELETED, "c1", 2)
    ]
    world.say(BOB, "c1", "u1", "bob's own c1 is untouched")
    assert turns_of(world.find(BOB, "untouched")) == [("c1", "u1")]


def test_a_bad_conversation_id_is_invalid(world: World) -> None:
    with pytest.raises(MemoriaError) as raised:
        world.removal.delete_conversation(ANA, "c\u200b1")
    assert raised.value.reason is ErrorReason.INVALID_ARGUMENT
    assert world.turns.deleted_conversations(TENANT, "ana") == frozenset()


# --- Erasing -------------------------------------------------------------------------------


def test_an_erasure_removes_everything_and_the_audit_keeps_counts_only(world: World) -> None:
    world.memory.blocks[TENANT, "ana"] = StoredBlock("likes herons\nlives by a lake", "e1", T0)
    world.memory.append(
        TENANT,
        NewAuditEvent(
            "ana", AuditAction.BLOCK_REWRITTEN, Writer.MODEL, T0, added_lines=("likes herons",)
        ),
    )
    world.say(ANA, "c1", "u1", "the heron")
    world.say(ANA, "c2", "u1", "the lake", wait=False)
    world.say(ANA, "c3", "u1", "to be deleted")
    world.removal.delete_conversation(ANA, "c3")
    world.inspections.record_render(TurnKey(TENANT, "ana", "c1", "u1"), RenderRecord("e1", 2, T0))
    world.say(BOB, "c1", "u1", "bob's heron")

    erased = world.removal.erase(ANA, "")
    assert (erased.removed_line_count, erased.deleted_turn_count) == (2, 2)
    assert erased.deleted_inspection_count == 1
    assert world.memory.read(TENANT, "ana").block is None
    assert world.index.count(TENANT, "ana") == 0 and world.index.count(TENANT, "bob") == 1
    assert world.turns.list_turns(TENANT, "ana", 0, 10) == []
    assert world.turns.list_tombstones(TENANT, "ana", 0, 10) == []
    assert world.indexer.run_once(10) == 0
    events = world.memory.list_audit(TENANT, AuditQuery(principal_id="ana"))
    assert [e.action for e in events] == [
        AuditAction.PRINCIPAL_DATA_ERASED,
        AuditAction.CONVERSATION_DELETED,
        AuditAction.BLOCK_REWRITTEN,
    ]
    assert all(e.added_lines == () and e.removed_lines == () for e in events)
    assert (events[0].removed_line_count, events[0].deleted_turn_count) == (2, 2)
    assert turns_of(world.find(BOB, "heron")) == [("c1", "u1")]
    world.say(ANA, "c3", "u1", "a conversation id may be used again after an erasure")


def test_only_an_administrator_erases_another_principal(world: World) -> None:
    world.say(BOB, "c1", "u1", "bob's words")
    with pytest.raises(MemoriaError) as raised:
        world.removal.erase(ANA, "bob")
    assert raised.value.reason is ErrorReason.PERMISSION_DENIED
    assert world.index.count(TENANT, "bob") == 1
    erased = world.removal.erase(Identity(TENANT, "ana", is_tenant_admin=True), "bob")
    assert erased.deleted_turn_count == 1 and world.index.count(TENANT, "bob") == 0
    (event,) = world.memory.list_audit(TENANT, AuditQuery(principal_id="bob"))
    assert event.actor_principal_id == "ana"


def test_an_erasure_whose_chunks_cannot_be_removed_erases_nothing(world: World) -> None:
    world.memory.blocks[TENANT, "ana"] = StoredBlock("keep me", "e1", T0)
    world.say(ANA, "c1", "u1", "the heron")

    def down(tenant_id: str, principal_id: str) -> None:
        raise ConnectionError("index unavailable")

    world.index.delete_principal = down  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        world.removal.erase(ANA, "")
    assert world.memory.read(TENANT, "ana").block is not None
    assert len(world.turns.list_turns(TENANT, "ana", 0, 10)) == 1
    assert world.memory.list_audit(TENANT, AuditQuery(principal_id="ana")) == []


# --- The relevance gate ------------------------------------------------------------------


def test_a_search_answers_only_with_a_strong_match_unless_one_sided(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a floor known for the model, a search with no strong match answers nothing and
    one with an exact match answers; a one-sided development search (`gated=False`) answers
    with whatever its side found, as it did before the gate."""
    monkeypatch.setitem(relevance.SEMANTIC_FLOORS, world.search.embedder.model_id, 1.01)
    world.say(ANA, "c1", "t1", "the heron by the lake")
    assert world.find(ANA, "heron kingfisher") == []  # one term of two, no cosine reaches 1.01
    assert turns_of(world.find(ANA, "heron lake")) == [("c1", "t1")]  # every term
    one_sided = replace(world.search, gated=False)
    assert turns_of(one_sided.search(ANA, "heron kingfisher", 10)) == [("c1", "t1")]


@pytest.mark.parametrize(
    ("model_id", "share"), [("hash-embedder-8", 0.8), ("e5-small-v2-int8:sha256-x", 0.6)]
)
def test_the_fusion_takes_the_models_keyword_share(
    world: World, monkeypatch: pytest.MonkeyPatch, model_id: str, share: float
) -> None:
    """A model whose semantic side is stronger gets more of the score (fusion.KEYWORD_WEIGHTS):
    the search fuses with the share of the model that embedded the query."""
    import server.domain.search as search_module
    from server.domain.fusion import fuse

    shares: list[float] = []

    def spy(result: RetrievalResult, turns: int, keyword_share: float = -1.0) -> list[SearchHit]:
        shares.append(keyword_share)
        return fuse(result, turns, keyword_share)

    monkeypatch.setattr(search_module, "fuse", spy)
    monkeypatch.setattr(world.embedder, "model_id", model_id)
    world.say(ANA, "c1", "t1", "Which airline do I fly?", "Lufthansa.")
    (hit,) = world.find(ANA, "Lufthansa")
    assert shares == [share]
    assert hit.turn_id == "t1"
