"""Conversation search's parts: the turn queue, the chunk index, the embedder, the keyword
encoder and the indexer (shared by `memoria serve` and `memoria worker`), and the conversation
operations on them (intake, search, removal). Everything that wires search is here, in these
two functions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.turns import SqlTurnStore
from server.adapters.sql.unit_of_work import SqlUnitsOfWork
from server.domain.fusion import one_side
from server.domain.indexing import Indexer
from server.domain.intake import TurnIntake
from server.domain.keywords import KeywordEncoder
from server.domain.ports import ChunkIndex, Embedder, InspectionStore, MemoryStore
from server.domain.removal import ConversationRemoval
from server.domain.retention import RetentionPurge, TurnRetention, TurnsKept
from server.domain.search import ConversationSearch
from server.domain.secrets import SecretDetector
from server.runtime.builders import utc_now
from server.runtime.builders.chunks import build_chunk_index
from server.runtime.builders.embedding import build_embedder
from server.runtime.settings import Settings
from server.telemetry import Telemetry


def turn_retention(settings: Settings) -> TurnRetention:
    """The deployment's turn retention (MEMORIA_TURN_RETENTION_DAYS and each tenant's own
    MEMORIA_TENANT_TURN_RETENTION_DAYS; 0 keeps turns until deleted)."""

    def period(days: int) -> timedelta | None:
        return timedelta(days=days) if days else None

    memory = settings.memory
    return TurnRetention(
        default=period(memory.turn_retention_days),
        tenants={t: period(d) for t, d in memory.tenant_turn_retention_days.items()},
    )


def turns_kept(settings: Settings) -> TurnsKept:
    """The retention against the clock, for the reads that show turns."""
    return TurnsKept(turn_retention(settings), utc_now)


@dataclass
class SearchParts:
    """Everything conversation search runs on, built once per process."""

    turns: SqlTurnStore
    units: SqlUnitsOfWork
    index: ChunkIndex
    embedder: Embedder
    keywords: KeywordEncoder
    indexer: Indexer
    purge: RetentionPurge
    """The retention purge the index worker runs (a no-op while retention is off)."""


def build_search_parts(
    settings: Settings,
    db: SqlDatabase,
    *,
    embedder: Embedder | None = None,
    index: ChunkIndex | None = None,
    telemetry: Telemetry | None = None,
) -> SearchParts:
    """The turn queue, chunk index, embedder and indexer. An embedder or index passed in is
    used as is (tests share one model across servers). With `telemetry`, the index and
    embedder are traced and the outbox observed."""
    turns = SqlTurnStore(db)
    embedder = embedder or build_embedder(settings)
    index = index or build_chunk_index(settings, embedder)
    telemetry = telemetry or Telemetry()
    embedder = telemetry.embedder(embedder)
    index = telemetry.chunk_index(index, "embedded" if settings.qdrant.embedded else "server")
    telemetry.observe_outbox(turns.outbox_stats)
    keywords = KeywordEncoder()
    worker_turns = telemetry.indexer_turns(turns)
    indexer = Indexer(worker_turns, index, embedder, keywords, utc_now)
    units = SqlUnitsOfWork(db)
    purge = RetentionPurge(turn_retention(settings), worker_turns, units, index, utc_now)
    return SearchParts(turns, units, index, embedder, keywords, indexer, purge)


@dataclass
class Conversations:
    """The conversation operations the servicer calls."""

    intake: TurnIntake
    search: ConversationSearch
    removal: ConversationRemoval


def build_conversations(
    settings: Settings,
    parts: SearchParts,
    reads: MemoryStore,
    *,
    wake_worker: Callable[[], None],
    secrets: SecretDetector,
    inspections: InspectionStore,
) -> Conversations:
    """Turns accepted (redacted, queued, the indexing worker woken), searched (from the index,
    one side alone in the development search modes) and deleted or erased."""
    return Conversations(
        intake=TurnIntake(parts.units, parts.indexer, utc_now, wake_worker, secrets),
        search=ConversationSearch(
            reads,
            parts.turns,
            parts.embedder,
            parts.keywords,
            one_side(parts.index, settings.memory.search_mode),
            utc_now,
            inspections,
            turn_retention(settings),
            gated=settings.memory.search_mode == "hybrid",
            windows=parts.index,
        ),
        removal=ConversationRemoval(parts.units, parts.index, utc_now, wake_worker, inspections),
    )
