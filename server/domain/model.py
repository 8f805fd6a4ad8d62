"""Domain values: who calls, what is stored, what an audit event records."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from datetime import datetime

from server.domain.text import sanitize_and_count


@dataclass(frozen=True)
class Identity:
    """The authenticated caller. Every operation is scoped to its tenant and principal."""

    tenant_id: str
    principal_id: str
    is_tenant_admin: bool = False


class Writer(enum.Enum):
    """Who makes a change; stored in the audit log by value."""

    MODEL = "model"
    USER = "user"
    SERVICE = "service"
    """The service itself, by a rule (a retention purge); never a caller's claim."""


class AuditAction(enum.Enum):
    """What an audit event records; stored by value."""

    BLOCK_REWRITTEN = "block_rewritten"
    BLOCK_DELETED = "block_deleted"
    SETTINGS_UPDATED = "settings_updated"
    CONVERSATION_DELETED = "conversation_deleted"
    PRINCIPAL_DATA_ERASED = "principal_data_erased"
    TURNS_EXPIRED = "turns_expired"


@dataclass(frozen=True)
class StoredBlock:
    """A block row as the store holds it. `text` is re-sanitized on load by the domain."""

    text: str
    etag: str
    update_time: datetime

    @functools.cached_property
    def sanitized(self) -> tuple[str, int]:
        """`sanitize_and_count(text)`, computed once per row read: the read cache hands the
        same row to every render of it, and sanitizing on each was most of a render's own
        work for a block with non-ASCII text (measured: over half of the request thread's
        Python time at 16 in flight, bench/bench_blocks.py). Clean text that came back as
        it went in is the same string object, so a cached row keeps one copy."""
        clean, count = sanitize_and_count(self.text)
        return (self.text if clean == self.text else clean), count


@dataclass(frozen=True)
class StoredSettings:
    """A settings row; a principal without one has the defaults."""

    memory_enabled: bool
    update_time: datetime


@dataclass(frozen=True)
class PrincipalMemory:
    """Everything stored for one principal that the block operations need, read together."""

    block: StoredBlock | None
    settings: StoredSettings | None

    @property
    def memory_enabled(self) -> bool:
        return self.settings is None or self.settings.memory_enabled


@dataclass(frozen=True)
class NewAuditEvent:
    """An audit event to append. Holds changed lines (already truncated) or counts only."""

    principal_id: str
    action: AuditAction
    writer: Writer
    create_time: datetime
    removed_lines: tuple[str, ...] = ()
    added_lines: tuple[str, ...] = ()
    removed_line_count: int = 0
    added_line_count: int = 0
    char_count: int = 0
    memory_enabled: bool | None = None
    conversation_id: str = ""
    deleted_turn_count: int = 0
    actor_principal_id: str = ""
    turn_conversation_id: str = ""
    """The conversation of the turn a rewrite was made in; empty when it named no turn."""
    turn_id: str = ""
    """The turn a rewrite was made in (within `turn_conversation_id`); empty when none."""


@dataclass(frozen=True)
class Change:
    """One write to one principal's memory, with the state it was decided on.

    The store applies it only while the block's etag and the memory setting are still those
    of `decided_on`, and executes exactly what it says: `blank_audit_lines` blanks the lines
    of the principal's earlier audit events (the domain asks for it with every deletion:
    deleted content is not kept anywhere).
    """

    principal_id: str
    decided_on: PrincipalMemory
    event: NewAuditEvent
    block: StoredBlock | None = None
    delete_block: bool = False
    settings: StoredSettings | None = None
    blank_audit_lines: bool = False

    @property
    def expected_etag(self) -> str:
        """The etag the block must still have ("" for no block)."""
        return self.decided_on.block.etag if self.decided_on.block is not None else ""

    @property
    def expected_enabled(self) -> bool:
        """The memory setting that must still hold."""
        return self.decided_on.memory_enabled

    @property
    def after(self) -> PrincipalMemory:
        """The principal's memory once the change is applied."""
        block = None if self.delete_block else (self.block or self.decided_on.block)
        return PrincipalMemory(block=block, settings=self.settings or self.decided_on.settings)


@dataclass(frozen=True)
class AuditEvent(NewAuditEvent):
    """An appended audit event with its store-assigned, increasing id."""

    event_id: int = 0


@dataclass(frozen=True)
class AuditQuery:
    """Which audit events to read: one tenant, one principal or all (None), newest first."""

    principal_id: str | None
    actions: frozenset[AuditAction] = field(default_factory=frozenset)
    start_time: datetime | None = None
    end_time: datetime | None = None
    before_event_id: int | None = None
    limit: int = 50
    turn: TurnRef | None = None
    """Only the events of writes made in this turn (None: any)."""


# --- Conversation search -------------------------------------------------------------------


@dataclass(frozen=True)
class SparseVector:
    """Keyword (BM25 term-frequency) weights by term index; indices are unique, any order."""

    indices: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class IndexedChunk:
    """One chunk of a turn, ready for the chunk index: its text and both vectors.

    `dense` is a multivector: one embedding per window of the chunk (at least one), all of
    the embedder's dimension, compared with MAX_SIM so every part of the chunk is searchable.
    """

    chunk_index: int
    text: str
    dense: tuple[tuple[float, ...], ...]
    sparse: SparseVector
    keyword_version: int = 1
    """Which keyword representation `sparse` encodes (server/domain/keywords.py,
    KEYWORD_VERSION); 1 is the chunk's text alone, as before versions were recorded."""
    turn_order: int = 0
    """Where the turn was accepted among its conversation's turns (the turn queue's row id:
    increasing in the order turns arrive); orders turns of equal time (server/domain/context.py).
    0 on chunks written before it was recorded."""


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as the index holds it, enough to encode its keyword vector again."""

    key: TurnKey
    chunk_index: int
    text: str
    turn_time: datetime


@dataclass(frozen=True)
class Owner:
    """Whose chunks an operation over many covers: everyone's (the default), one tenant's, or
    one principal's of one tenant."""

    tenant_id: str | None = None
    principal_id: str | None = None

    def __post_init__(self) -> None:
        if self.principal_id is not None and self.tenant_id is None:
            raise ValueError("a principal is named within its tenant")


EVERYONE = Owner()
"""Every tenant's chunks."""


@dataclass(frozen=True)
class ChunkPlace:
    """Where a stored chunk sits in its conversation: enough to order the conversation's
    chunks without reading their text (server/domain/context.py)."""

    turn_id: str
    chunk_index: int
    turn_time: datetime
    turn_order: int


@dataclass(frozen=True)
class TurnKey:
    """Names one turn of one principal; the identity of its chunks in every store."""

    tenant_id: str
    principal_id: str
    conversation_id: str
    turn_id: str


DenseContextUpdate = tuple[TurnKey, int, tuple[tuple[float, ...], ...], tuple[float, ...]]
"""A chunk's (turn, chunk index) new semantic multivector: its windows, then its context
vector (server/domain/context.py, DenseContext)."""

ChunkWindows = dict[tuple[str, int], tuple[tuple[float, ...], ...]]
"""Chunks of one conversation by (turn id, chunk index), each with its window vectors alone
(without a context vector): what `DenseVectors.chunk_windows` reads back."""


@dataclass(frozen=True)
class SearchBounds:
    """Where the caller asked a search to look: one conversation, and a span of turn times.

    `start_time` is inclusive (turns at or after it), `end_time` exclusive (turns before it),
    both aware datetimes; None leaves that side open, and a None `conversation_id` searches
    every conversation. server/domain/search.py decides what is valid (`bounds_violations`).
    """

    conversation_id: str | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None


@dataclass(frozen=True)
class SearchScope:
    """Whose chunks a search may see, which of their conversations are deleted, and the
    caller's bounds.

    Adapters must filter on tenant and principal and on `bounds` in the engine (never after
    the fact: a hit filtered out of a side's top list would take the place of one below the
    cut) and exclude every chunk of `deleted_conversations`.
    """

    tenant_id: str
    principal_id: str
    deleted_conversations: frozenset[str] = frozenset()
    bounds: SearchBounds = SearchBounds()


@dataclass(frozen=True)
class EncodedQuery:
    """A search query as both retrieval sides need it."""

    dense: tuple[float, ...]
    sparse: SparseVector


@dataclass(frozen=True)
class ChunkHit:
    """A chunk found by one retrieval side; `score` is that side's raw score."""

    conversation_id: str
    turn_id: str
    chunk_index: int
    text: str
    turn_time: datetime
    score: float


@dataclass(frozen=True)
class RetrievalResult:
    """Both sides of one search, each a ranking of turns (best chunk per turn, best first)."""

    keyword: tuple[ChunkHit, ...]
    semantic: tuple[ChunkHit, ...]


@dataclass(frozen=True)
class SearchHit:
    """One turn in a search answer: its best chunk, the fused score and each side's rank, and
    the two measures comparable across searches (server/domain/relevance.py): the semantic
    side's raw similarity (None when that side did not find the turn) and the share of the
    query's terms the turn's text holds. `other_text` is the text of the turn's other chunk
    that the search found, when the two sides chose different chunks of a long turn (None
    otherwise): the relevance rule reads both, so an id in the chunk not shown still counts."""

    conversation_id: str
    turn_id: str
    chunk_index: int
    text: str
    turn_time: datetime
    score: float
    keyword_rank: int
    semantic_rank: int
    semantic_similarity: float | None = None
    keyword_coverage: float = 0.0
    other_text: str | None = None
    semantic_chunk: int | None = None  # the chunk the semantic side found (its similarity's)


class AcceptOutcome(enum.Enum):
    """What the turn store did with a turn offered to it."""

    ACCEPTED = "accepted"
    CONVERSATION_DELETED = "conversation_deleted"
    MEMORY_DISABLED = "memory_disabled"


@dataclass(frozen=True)
class NewTurn:
    """A finished turn to queue for indexing: only the text that will be indexed is kept."""

    key: TurnKey
    text: str
    turn_time: datetime
    accept_time: datetime
    question_opening: str = ""
    """The opening of the question (server/domain/listing.py), kept after the turn is
    indexed: what lists the conversation without reading its text."""


@dataclass(frozen=True)
class ClaimedTurn:
    """A queued turn a processor holds; `version` changes whenever the turn is re-sent."""

    row_id: int
    version: int
    key: TurnKey
    text: str | None
    """None when the turn is already indexed (its text is not kept)."""
    turn_time: datetime
    attempts: int


@dataclass(frozen=True)
class ConversationPurge:
    """A deleted conversation whose chunks are still to be removed from the index."""

    tenant_id: str
    principal_id: str
    conversation_id: str


@dataclass(frozen=True)
class Erasure:
    """What erasing a principal removed."""

    removed_line_count: int
    deleted_turn_count: int
    deleted_inspection_count: int = 0
    """Inspector records (renders and searches recorded per turn) that were removed."""


# --- The inspector and the export ----------------------------------------------------------


@dataclass(frozen=True)
class TurnRef:
    """A turn named by the caller (the contract's TurnReference), within the caller's scope."""

    conversation_id: str
    turn_id: str


@dataclass(frozen=True)
class InspectedHit:
    """A hit as the inspector keeps it: ids, time, ranks and score, never its text (text is
    read from the index when the record is shown, so a deleted conversation's text is gone
    with its chunks)."""

    conversation_id: str
    turn_id: str
    chunk_index: int
    turn_time: datetime
    score: float
    keyword_rank: int
    semantic_rank: int


@dataclass(frozen=True)
class RenderRecord:
    """One render made for a turn: the block version (etag, count) and when."""

    etag: str
    char_count: int
    record_time: datetime


@dataclass(frozen=True)
class SearchRecord:
    """One search made for a turn: the sanitized query, when, its hits best first, and the
    bounds the caller gave it (none: every conversation, any time)."""

    query: str
    record_time: datetime
    hits: tuple[InspectedHit, ...]
    bounds: SearchBounds = SearchBounds()


@dataclass(frozen=True)
class TurnRecords:
    """Everything recorded for one turn, oldest first."""

    renders: tuple[RenderRecord, ...] = ()
    searches: tuple[SearchRecord, ...] = ()
    failed_writes: int = 0
    """Memory writes made for the turn through a tool call that failed (the per-turn cap)."""


@dataclass(frozen=True)
class StoredTurn:
    """An accepted turn as the turn store holds it, for the export. `text` is None once the
    turn is indexed (its text then lives in the chunk index)."""

    row_id: int
    conversation_id: str
    turn_id: str
    turn_time: datetime
    text: str | None
    indexed: bool


@dataclass(frozen=True)
class ExpiryCutoffs:
    """Each tenant's earliest kept turn time at one moment (server/domain/retention.py):
    `default` for every tenant not in `tenants`, which pairs a tenant with its own cutoff.
    A None cutoff keeps every turn of its tenants."""

    default: datetime | None
    tenants: tuple[tuple[str, datetime | None], ...] = ()


@dataclass(frozen=True)
class ListCursor:
    """Where a keyset listing continues: after the row of this time and row id (in the
    listing's order). Row ids are unique, so the pair orders rows totally."""

    time: datetime
    row_id: int


@dataclass(frozen=True)
class ConversationSummary:
    """One conversation of a principal as ListConversations lists it. `cursor` is its place
    in the listing: its last turn time and the highest row id of its turns."""

    conversation_id: str
    first_turn_time: datetime
    last_turn_time: datetime
    turn_count: int
    first_question_opening: str
    cursor: ListCursor


@dataclass(frozen=True)
class Tombstone:
    """A deleted conversation of a principal."""

    conversation_id: str
    delete_time: datetime
