"""Turn retention on the real stores (server/domain/retention.py): the service's own search,
listing, export and purge over SQLite or PostgreSQL (as the service role, so row-level security
is in force and the cross-tenant lookup goes through `memoria_expired_principals`, migration
0013) and the embedded Qdrant engine or a real Qdrant server, with a clock the test moves.

The policy names only the test's own tenant: the PostgreSQL database is shared by the session,
and a deployment default would purge the other tests' tenants too (the default is covered on
SQLite, whose database is the test's own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.qdrant.server import QdrantServerChunkIndex
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.turns import SqlTurnStore
from server.adapters.sql.unit_of_work import SqlUnitsOfWork
from server.domain.audit import PageTokens
from server.domain.export import ExportedTurn, Exporter
from server.domain.indexing import Indexer
from server.domain.intake import TurnIntake
from server.domain.keywords import KeywordEncoder
from server.domain.listing import ConversationList
from server.domain.memory import MemoryBlocks
from server.domain.model import AuditAction, AuditQuery, Identity, SearchBounds, Writer
from server.domain.ports import ChunkIndex
from server.domain.retention import RetentionPurge, TurnRetention, TurnsKept
from server.domain.search import ConversationSearch
from tests.conftest import make_store
from tests.fakes import FakeClock, HashEmbedder

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
DAY = timedelta(days=1)


@dataclass
class Retained:
    """The service's parts over one SQL store and one chunk index, under `retention`."""

    who: Identity
    clock: FakeClock
    store: SqlMemoryStore
    turns: SqlTurnStore
    index: ChunkIndex
    intake: TurnIntake
    search: ConversationSearch
    listing: ConversationList
    exporter: Exporter
    purge: RetentionPurge

    def say(self, conversation: str, turn: str, words: str, age: timedelta) -> None:
        """A turn of `age` before the clock, indexed before it returns."""
        self.intake.index_turn(
            self.who, conversation, turn, words, "noted", self.clock() - age, wait=True
        )

    def found(self, query: str, bounds: SearchBounds | None = None) -> list[str]:
        return [h.turn_id for h in self.search.search(self.who, query, 10, bounds=bounds)]


def _build(
    who: Identity,
    store: SqlMemoryStore,
    index: ChunkIndex,
    retention: TurnRetention,
    clock: FakeClock | None = None,
) -> Retained:
    clock = clock or FakeClock(T0)
    db = store.db
    turns = SqlTurnStore(db)
    units = SqlUnitsOfWork(db)
    embedder, keywords = HashEmbedder(), KeywordEncoder()
    indexer = Indexer(turns, index, embedder, keywords, clock)
    kept = TurnsKept(retention, clock)
    tokens = PageTokens(b"0123456789abcdef")
    blocks = MemoryBlocks(store, clock)
    return Retained(
        who=who,
        clock=clock,
        store=store,
        turns=turns,
        index=index,
        intake=TurnIntake(units, indexer, clock),
        search=ConversationSearch(
            store, turns, embedder, keywords, index, clock, retention=retention
        ),
        listing=ConversationList(turns, index, tokens, kept),
        exporter=Exporter(blocks, store, turns, index, tokens, kept),
        purge=RetentionPurge(retention, turns, units, index, clock),
    )


@pytest.fixture(
    params=[
        ("sqlite", "edge"),
        pytest.param(("sqlite", "server"), marks=pytest.mark.qdrant),
        pytest.param(("postgres", "edge"), marks=pytest.mark.postgres),
        pytest.param(("postgres", "server"), marks=[pytest.mark.postgres, pytest.mark.qdrant]),
        pytest.param(("citus", "edge"), marks=[pytest.mark.postgres, pytest.mark.citus]),
    ],
    ids=lambda p: "-".join(p),
)
def parts(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SqlMemoryStore, ChunkIndex]]:
    sql, engine = request.param
    store = make_store(sql, request, tmp_path)
    assert isinstance(store, SqlMemoryStore)
    with contextlib.ExitStack() as stack:
        index: ChunkIndex
        if engine == "edge":
            index = QdrantEdgeChunkIndex(tmp_path / "chunks", 8, HashEmbedder.model_id)
        else:
            client = request.getfixturevalue("qdrant").client()
            stack.callback(client.close)
            collection = request.getfixturevalue("qdrant_collection")
            index = QdrantServerChunkIndex(client, collection, 8, HashEmbedder.model_id)
        stack.callback(index.close)
        yield store, index


def test_an_expired_turn_leaves_search_at_once_and_the_purge_removes_it(
    parts: tuple[SqlMemoryStore, ChunkIndex], tenant: str
) -> None:
    store, index = parts
    ana = Identity(tenant, "ana")
    world = _build(ana, store, index, TurnRetention(tenants={tenant: timedelta(days=30)}))
    world.say("c1", "old", "heron migration notes", 29 * DAY)
    world.say("c1", "new", "heron nesting notes", 1 * DAY)
    world.say("c2", "other", "heron feathers", 10 * DAY)
    assert sorted(world.found("heron")) == ["new", "old", "other"]

    world.clock.now += 2 * DAY  # "old" is now 31 days old: out of search before any purge
    assert sorted(world.found("heron")) == ["new", "other"]
    assert index.count(tenant, "ana") == 3  # still held: hidden, not yet purged
    # The caller's own start_time combines with the cutoff: the later of the two wins.
    early = SearchBounds(start_time=T0 - 60 * DAY)
    assert sorted(world.found("heron", early)) == ["new", "other"]
    late = SearchBounds(start_time=T0 - 5 * DAY)
    assert world.found("heron", late) == ["new"]
    assert world.found("heron", SearchBounds(end_time=T0 - 29 * DAY)) == []

    page = world.listing.conversations(ana, 0, "")
    first = {c.conversation_id: c for c in page.conversations}
    assert (
        first["c1"].turn_count == 1 and first["c1"].first_question_opening == "heron nesting notes"
    )
    assert [t.turn_id for t in world.listing.turns(ana, "c1", 0, "").turns] == ["new"]
    export = world.exporter.page(ana, 1000, "")
    assert sorted(r.turn_id for r in export.records if isinstance(r, ExportedTurn)) == [
        "new",
        "other",
    ]
    assert export.turn_retention_days == 30

    assert world.purge.purge_once(100) == 1
    assert index.count(tenant, "ana") == 2
    assert [t.turn_id for t in world.turns.list_turns(tenant, "ana", 0, 100)] == ["new", "other"]
    (event,) = store.list_audit(
        tenant, AuditQuery(principal_id="ana", actions=frozenset({AuditAction.TURNS_EXPIRED}))
    )
    assert event.deleted_turn_count == 1 and event.writer is Writer.SERVICE
    assert event.conversation_id == "" and event.removed_lines == event.added_lines == ()
    assert world.purge.purge_once(100) == 0  # nothing left to purge: no second event
    assert len(store.list_audit(tenant, AuditQuery(principal_id="ana"))) == 1


def test_the_purge_is_bounded_per_pass_and_touches_no_other_tenant(
    parts: tuple[SqlMemoryStore, ChunkIndex], tenant: str
) -> None:
    store, index = parts
    ana = Identity(tenant, "ana")
    other = Identity(tenant + "-x", "ana")  # no policy: kept until deleted
    world = _build(ana, store, index, TurnRetention(tenants={tenant: timedelta(days=7)}))
    keeper = _build(other, store, index, TurnRetention(), world.clock)
    for n in range(5):
        world.say("c1", f"u{n}", f"kestrel {n}", 10 * DAY)
        keeper.say("c1", f"u{n}", f"kestrel {n}", 10 * DAY)
    assert world.found("kestrel") == []  # expired at once
    assert world.purge.purge_once(2) == 2  # at most two turns of a principal per pass
    assert world.purge.purge_once(2) == 2
    assert world.purge.purge_once(2) == 1
    assert world.purge.purge_once(2) == 0
    assert index.count(tenant, "ana") == 0
    assert world.turns.list_turns(tenant, "ana", 0, 100) == []
    events = store.list_audit(
        tenant, AuditQuery(principal_id="ana", actions=frozenset({AuditAction.TURNS_EXPIRED}))
    )
    assert [e.deleted_turn_count for e in events] == [1, 2, 2]
    assert index.count(other.tenant_id, "ana") == 5
    assert len(keeper.found("kestrel")) == 5
    assert len(keeper.turns.list_turns(other.tenant_id, "ana", 0, 100)) == 5


def test_the_default_applies_to_every_tenant_but_those_with_their_own_value(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On SQLite (the test's own database): the deployment default, a tenant's longer value,
    and a tenant's 0 (kept until deleted) that overrides the default."""
    store = make_store("sqlite", request, tmp_path)
    assert isinstance(store, SqlMemoryStore)
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", 8, HashEmbedder.model_id)
    request.addfinalizer(index.close)
    retention = TurnRetention(
        default=timedelta(days=30), tenants={"long": timedelta(days=365), "forever": None}
    )
    clock = FakeClock(T0)
    worlds = {
        tenant: _build(Identity(tenant, "ana"), store, index, retention, clock)
        for tenant in ("plain", "long", "forever")
    }
    for world in worlds.values():
        world.say("c1", "u1", "osprey", 100 * DAY)
    assert {t: w.found("osprey") for t, w in worlds.items()} == {
        "plain": [],
        "long": ["u1"],
        "forever": ["u1"],
    }
    assert worlds["plain"].exporter.page(worlds["plain"].who, 10, "").turn_retention_days == 30
    assert worlds["long"].exporter.page(worlds["long"].who, 10, "").turn_retention_days == 365
    assert worlds["forever"].exporter.page(worlds["forever"].who, 10, "").turn_retention_days == 0
    assert worlds["plain"].purge.purge_once(10) == 1
    assert [index.count(t, "ana") for t in ("plain", "long", "forever")] == [0, 1, 1]
    clock.now += 300 * DAY  # 400 days: past the long tenant's year, never the forever one's
    assert worlds["long"].found("osprey") == [] and worlds["forever"].found("osprey") == ["u1"]
    assert worlds["long"].purge.purge_once(10) == 1
    assert [index.count(t, "ana") for t in ("plain", "long", "forever")] == [0, 0, 1]
