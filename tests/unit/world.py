"""Conversation search's use cases wired on the in-memory fakes (tests/fakes.py), as the
composition root wires them on the real adapters: for fast unit tests of the domain's rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from server.domain.indexing import Indexer
from server.domain.intake import IndexTurnResult, TurnIntake
from server.domain.keywords import KeywordEncoder
from server.domain.model import Identity, SearchHit, StoredSettings
from server.domain.removal import ConversationRemoval
from server.domain.retention import RetentionPurge, TurnRetention
from server.domain.search import ConversationSearch
from tests.fakes import (
    FakeClock,
    HashEmbedder,
    InMemoryChunkIndex,
    InMemoryInspectionStore,
    InMemoryMemoryStore,
    InMemoryTurnStore,
)

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
TENANT = "t1"
ANA = Identity(TENANT, "ana")
BOB = Identity(TENANT, "bob")


@dataclass
class World:
    """The fakes and the use cases on them; `wakes` counts the background worker's wake-ups."""

    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))
    memory: InMemoryMemoryStore = field(default_factory=InMemoryMemoryStore)
    inspections: InMemoryInspectionStore = field(default_factory=InMemoryInspectionStore)
    embedder: HashEmbedder = field(default_factory=HashEmbedder)
    index: InMemoryChunkIndex = field(
        default_factory=lambda: InMemoryChunkIndex(None, 8, HashEmbedder.model_id)
    )
    wakes: list[str] = field(default_factory=list)
    retention: TurnRetention = field(default_factory=TurnRetention)

    def __post_init__(self) -> None:
        self.turns = InMemoryTurnStore(self.memory, self.inspections)
        keywords = KeywordEncoder()
        self.indexer = Indexer(self.turns, self.index, self.embedder, keywords, self.clock)
        wake = lambda: self.wakes.append("wake")  # noqa: E731
        self.intake = TurnIntake(self.turns.units, self.indexer, self.clock, wake)
        self.search = ConversationSearch(
            self.memory,
            self.turns,
            self.embedder,
            keywords,
            self.index,
            self.clock,
            self.inspections,
            self.retention,
        )
        self.purge = RetentionPurge(
            self.retention, self.turns, self.turns.units, self.index, self.clock
        )
        self.removal = ConversationRemoval(
            self.turns.units, self.index, self.clock, wake, self.inspections
        )

    def say(
        self,
        who: Identity,
        conversation: str,
        turn: str,
        question: str,
        answer: str = "noted",
        *,
        wait: bool = True,
    ) -> IndexTurnResult:
        """Send a finished turn, by default waiting for it to be indexed."""
        return self.intake.index_turn(who, conversation, turn, question, answer, T0, wait=wait)

    def find(self, who: Identity, query: str, page_size: int = 10) -> list[SearchHit]:
        return self.search.search(who, query, page_size)

    def memory_off(self, who: Identity) -> None:
        key = (who.tenant_id, who.principal_id)
        self.memory.settings[key] = StoredSettings(memory_enabled=False, update_time=T0)
