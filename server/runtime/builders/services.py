"""The domain services the servicers call, wired on the stores once: the memory block
operations, the audit log, conversation search, the turn inspector, the export and the
conversation list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from server.adapters.secret_detector import DetectSecretsDetector
from server.adapters.sql.inspections import BufferedInspectionStore, SqlInspectionStore
from server.domain.audit import AuditLog, PageTokens
from server.domain.export import Exporter
from server.domain.inspection import TurnInspector
from server.domain.listing import ConversationList
from server.domain.memory import MemoryBlocks
from server.domain.ports import MemoryStore
from server.domain.tool_calls import ToolCalls
from server.runtime.builders import utc_now
from server.runtime.builders.access import page_token_key
from server.runtime.builders.search import Conversations, build_conversations, turns_kept
from server.runtime.builders.stores import Stores
from server.runtime.settings import Settings
from server.runtime.worker import IndexWorker


@dataclass
class Services:
    """The domain operations of one serving process."""

    blocks: MemoryBlocks
    audit: AuditLog
    conversations: Conversations
    inspector: TurnInspector
    exporter: Exporter
    listing: ConversationList
    """ListConversations and ListConversationTurns."""
    inspections: BufferedInspectionStore
    """The inspector's record writer, closed (what is queued written) before the stores."""
    tool_calls: ToolCalls
    """The model's tool calls and prompt section (ModelToolService)."""


def build_services(
    settings: Settings, stores: Stores, reads: MemoryStore, worker: IndexWorker
) -> Services:
    """The services on `stores`, reading memory through `reads` (the read cache), waking
    `worker` when a turn is accepted."""
    store, parts = stores.store, stores.search
    # One credential detector for the block's refusal and the turns' redaction (thread-safe).
    secrets_detector = DetectSecretsDetector()
    # Written from a background thread: a render naming its turn only queues its record.
    inspections = BufferedInspectionStore(SqlInspectionStore(store.db))
    blocks = MemoryBlocks(
        stores.telemetry.memory_store(reads),
        utc_now,
        char_limit=settings.memory.char_limit,
        secrets=secrets_detector,
        inspections=inspections,
    )
    tokens = PageTokens(page_token_key(settings))
    kept = turns_kept(settings)  # one retention rule for every read that shows turns
    conversations = build_conversations(
        settings,
        parts,
        reads,
        wake_worker=worker.wake,
        secrets=secrets_detector,
        inspections=inspections,
    )
    inspector = TurnInspector(
        inspections,
        reads,
        parts.turns,
        parts.index,
        utc_now,
        retention=timedelta(days=settings.memory.inspection_retention_days),
        kept=kept,
    )
    exporter = Exporter(blocks, store, parts.turns, parts.index, tokens, kept)
    listing = ConversationList(parts.turns, parts.index, tokens, kept)
    tool_calls = ToolCalls(blocks, conversations.search, inspections, utc_now)
    return Services(
        blocks,
        AuditLog(store, tokens),
        conversations,
        inspector,
        exporter,
        listing,
        inspections,
        tool_calls,
    )
