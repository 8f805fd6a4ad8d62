"""The ports the domain needs from storage, as Protocols. Adapters live in server/adapters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

from server.domain.model import (
    EVERYONE,
    AuditEvent,
    AuditQuery,
    Change,
    ChunkPlace,
    ChunkWindows,
    ClaimedTurn,
    ConversationPurge,
    ConversationSummary,
    DenseContextUpdate,
    EncodedQuery,
    ExpiryCutoffs,
    IndexedChunk,
    ListCursor,
    NewAuditEvent,
    NewTurn,
    Owner,
    PrincipalMemory,
    RenderRecord,
    RetrievalResult,
    SearchRecord,
    SearchScope,
    SparseVector,
    StoredChunk,
    StoredTurn,
    Tombstone,
    TurnKey,
    TurnRecords,
)

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware UTC."""


class MemoryStore(Protocol):
    """Blocks, settings and audit events of every tenant; every call names its tenant.

    Writes are compare-and-set: the domain reads, decides in Python, and `apply` writes the
    decision only if the principal's memory is still what it was decided on. This keeps a write
    to one round trip on PostgreSQL and keeps the rules out of the store.
    """

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        """The principal's block and settings, read together in one consistent snapshot.

        This is the render path's read, on every turn: adapters make it as cheap as they can.
        It may lag a write committed by another server by the moment that server takes to
        tell this one (a cache, server/adapters/sql/cache.py), never a write made through this
        store; so a write decides on it and `apply` or `confirm` checks the decision.
        """
        ...

    def confirm(self, tenant_id: str, principal_id: str, memory: PrincipalMemory) -> bool:
        """True if the principal's block etag and memory setting are still `memory`'s, asked
        of the store itself: a decision that changes nothing (a refusal, a no-op) is answered
        only once confirmed, as a change is only applied while its state holds."""
        ...

    def apply(self, tenant_id: str, change: Change) -> bool:
        """Atomically: if the principal's block etag and memory setting are still the ones in
        `change.expected_*`, make the change and append its audit event (one transaction),
        and return True; otherwise change nothing and return False.

        Writers of one principal are serialized, so the check and the write see no other
        writer in between.
        """
        ...

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        """Audit events of the tenant matching `query`, newest (highest id) first."""
        ...


# --- The chunk index, by role ------------------------------------------------------------
# Conversation chunks of every tenant in a Qdrant engine (embedded or server). Point ids are
# deterministic in (turn key, chunk index), so writing a turn again replaces its points, and
# every read is filtered in the engine by tenant and principal. Each domain object takes the
# roles it uses; the adapters implement them all (`ChunkIndex`).


class ChunkWriter(Protocol):
    """Writing and removing turns' chunks: the indexer, the purge and the erasure."""

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        """Store the turn's chunks (replacing any earlier version of the turn, including
        chunks past the new chunk count). Durable and visible to search when it returns."""
        ...

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        """Remove every chunk of one conversation (any number of chunks)."""
        ...

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        """Remove every chunk of one principal (any number of chunks)."""
        ...

    def delete_before(self, tenant_id: str, principal_id: str, before: datetime) -> None:
        """Remove every chunk of one principal whose turn time is before `before` (the
        retention purge, server/domain/retention.py)."""
        ...


class ChunkSearch(Protocol):
    """The search itself (server/domain/search.py)."""

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        """Keyword and semantic retrieval over the scope's chunks, each side reduced to the
        best chunk per turn and cut to `turns` turns. Raises if either side fails."""
        ...


class KeywordVectors(Protocol):
    """Keeping keyword vectors current: the indexer's context vectors and the reindexer
    (server/domain/reindex.py)."""

    def stale_keyword_chunks(
        self, version: int, limit: int, owner: Owner = EVERYONE
    ) -> Sequence[StoredChunk]:
        """Up to `limit` chunks of the owner (of any tenant by default) whose keyword vector
        was made by another keyword representation than `version` (chunks without a recorded
        one are version 1)."""
        ...

    def count_stale_keyword_chunks(self, version: int, owner: Owner = EVERYONE) -> int:
        """How many chunks `stale_keyword_chunks` has left to give."""
        ...

    def set_keyword_vectors(
        self, updates: Sequence[tuple[StoredChunk, SparseVector]], version: int
    ) -> None:
        """Replace each chunk's keyword vector and record `version` with it; its dense vector,
        text and time stay. A chunk deleted meanwhile stays deleted."""
        ...


class ChunkTexts(Protocol):
    """Stored chunk texts by turn: the inspector (hit text read live) and the export."""

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        """The stored chunk texts, in chunk order, of each (conversation id, turn id) of the
        principal that has chunks; turns without any are left out."""
        ...


class ChunkPlaces(ChunkTexts, Protocol):
    """Where a conversation's chunks sit, and their texts: what the keyword context needs to
    find and read a chunk's neighbours (server/domain/context.py)."""

    def conversation_places(
        self, tenant_id: str, principal_id: str, conversation_id: str
    ) -> Sequence[ChunkPlace]:
        """Where every stored chunk of one conversation sits (turn, chunk index, time, order),
        in no particular order and without the texts."""
        ...

    def places_near(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        turn_time: datetime,
        limit: int,
    ) -> tuple[Sequence[ChunkPlace], Sequence[ChunkPlace]]:
        """Up to `limit` places of the conversation's chunks of a time at most `turn_time`,
        latest first, and up to `limit` of a time at least `turn_time`, earliest first (the
        chunks of exactly that time can be in both; among equal times in any order)."""
        ...


class DenseVectors(Protocol):
    """A chunk's semantic context vector (server/domain/context.py, DenseContext): its own
    windows read back, and its multivector rewritten as those windows and the context."""

    def chunk_windows(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        places: Sequence[tuple[str, int]],
    ) -> ChunkWindows:
        """The window vectors (without a context vector) of these chunks of one conversation,
        by (turn id, chunk index); a chunk not stored is left out."""
        ...

    def set_dense_context(
        self,
        updates: Sequence[DenseContextUpdate],
    ) -> None:
        """Each chunk's (turn key, chunk index) semantic multivector becomes its windows then
        its context vector; the next `chunk_windows` gives the windows alone. A chunk deleted
        meanwhile stays deleted."""
        ...


class ChunkCount(Protocol):
    """Counting stored chunks (no domain rule needs it: tests and operators do)."""

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        """Number of chunks stored for a principal, or for one of its conversations."""
        ...


class ChunkEngine(Protocol):
    """The engine's life: the health monitor's probe and the process's shutdown."""

    def check(self) -> None:
        """Return if the engine can serve now, else raise: a cheap probe with no effect, for
        the health monitor (which bounds how long it waits)."""
        ...

    def close(self) -> None:
        """Flush and release the engine."""
        ...


class ChunkIndex(
    ChunkWriter,
    ChunkSearch,
    KeywordVectors,
    ChunkPlaces,
    DenseVectors,
    ChunkCount,
    ChunkEngine,
    Protocol,
):
    """Every role at once: what the Qdrant adapters (server/adapters/qdrant) implement and
    the composition root builds, then hands out role by role."""


class Embedder(Protocol):
    """Turns text into dense vectors with one model; index and query time must agree."""

    @property
    def model_id(self) -> str:
        """Names the model and its settings; recorded with the collection."""
        ...

    @property
    def dimension(self) -> int:
        """Length of every vector."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        """One multivector per text: one unit-length vector per window of the text, so a
        text longer than the model's input is embedded whole. Batched for throughput."""
        ...

    def embed_query(self, text: str) -> tuple[float, ...]:
        """One unit-length vector for a query (its first window)."""
        ...


class TurnBatch(Protocol):
    """Turns claimed by one processor. Until the claim ends, no other processor takes them,
    and a re-send, a conversation delete or an erasure touching them waits for it."""

    @property
    def turns(self) -> Sequence[ClaimedTurn]: ...

    def indexed(self, turn: ClaimedTurn) -> None:
        """The turn's chunks are in the index: drop its text from the queue."""
        ...

    def failed(self, turn: ClaimedTurn, error: str, retry_at: datetime | None) -> None:
        """Indexing failed: try again at `retry_at`, or (None) record it as failed for good."""
        ...


class TurnStore(Protocol):
    """The durable queue of accepted turns (the outbox) and conversation tombstones, as the
    indexer, the search and the export read them. What is accepted, deleted and erased is
    decided by the domain on a `UnitOfWork` (server/domain/conversations.py)."""

    def claim(
        self, limit: int, now: datetime, only: TurnKey | None = None
    ) -> AbstractContextManager[TurnBatch]:
        """Claim up to `limit` queued turns due at `now` (or just the turn `only`, waiting for
        another processor that holds it). The claim ends when the context exits."""
        ...

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        """The principal's deleted conversations whose chunks may still be in the index."""
        ...

    def claim_purges(self, limit: int) -> AbstractContextManager[list[ConversationPurge]]:
        """Deleted conversations whose chunks are still to be purged; those the context exits
        with (no exception) are marked purged."""
        ...

    def list_turns(
        self,
        tenant_id: str,
        principal_id: str,
        after_row_id: int,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        """Up to `limit` of the principal's accepted turns with a row id above `after_row_id`
        and (when `since` is set) a turn time at or after `since`, in row id order (for the
        export)."""
        ...

    def expired_principals(self, cutoffs: ExpiryCutoffs, limit: int) -> list[tuple[str, str]]:
        """Up to `limit` (tenant, principal) pairs, of any tenant, that have a turn older than
        their tenant's cutoff (the retention purge)."""
        ...

    def list_tombstones(
        self, tenant_id: str, principal_id: str, offset: int, limit: int
    ) -> list[Tombstone]:
        """Up to `limit` of the principal's deleted conversations from `offset`, ordered by
        conversation id (for the export)."""
        ...


class ConversationListing(Protocol):
    """A principal's conversations and one conversation's turns, read from the accepted turns
    (server/domain/listing.py): keyset pages, so a principal with thousands of turns is listed
    from an index, page by page."""

    def list_conversations(
        self,
        tenant_id: str,
        principal_id: str,
        after: ListCursor | None,
        limit: int,
        since: datetime | None = None,
    ) -> list[ConversationSummary]:
        """Up to `limit` of the principal's conversations that have turns, by last turn time
        then highest row id, both descending, from below `after` (None: from the newest).
        With `since`, only turns at or after it count (times, count, first question), and a
        conversation with none is left out."""
        ...

    def list_conversation_turns(
        self,
        tenant_id: str,
        principal_id: str,
        conversation_id: str,
        after: ListCursor | None,
        limit: int,
        since: datetime | None = None,
    ) -> list[StoredTurn]:
        """Up to `limit` of the conversation's turns by turn time then row id, ascending, from
        above `after` (None: from the first), and only those at or after `since` when set."""
        ...


class PrincipalRows(Protocol):
    """The unit of work's principal's block and settings."""

    def load(self) -> PrincipalMemory:
        """The block and settings as they are in this transaction."""
        ...

    def delete(self) -> None:
        """Remove the block and the settings (the settings fall back to their defaults)."""
        ...


class AuditRows(Protocol):
    """The unit of work's principal's audit events (append-only)."""

    def append(self, event: NewAuditEvent) -> None: ...

    def blank_lines(self) -> None:
        """Blank the changed lines of every earlier event of the principal (counts stay)."""
        ...


class TurnRows(Protocol):
    """The unit of work's principal's queued and indexed turns."""

    def put(self, turn: NewTurn) -> None:
        """Queue the turn, replacing a queued or indexed one with the same key (a turn being
        indexed is waited for). STORAGE_FULL while the embedded data dir is short of space."""
        ...

    def delete_conversation(self, conversation_id: str) -> int:
        """Remove the conversation's turns; how many."""
        ...

    def delete_all(self) -> int:
        """Remove every turn of the principal; how many."""
        ...

    def delete_before(self, before: datetime, limit: int) -> int:
        """Remove up to `limit` of the principal's turns with a turn time before `before`
        (oldest first); how many."""
        ...


class TombstoneRows(Protocol):
    """The unit of work's principal's deleted conversations."""

    def exists(self, conversation_id: str) -> bool: ...

    def add(self, conversation_id: str, delete_time: datetime) -> None: ...

    def delete_all(self) -> int: ...


class InspectionRows(Protocol):
    """The unit of work's principal's inspector records."""

    def delete_conversation(self, conversation_id: str) -> int: ...

    def delete_all(self) -> int: ...


class UnitOfWork(Protocol):
    """One principal's rows in one transaction: nothing is kept unless `commit` is called
    before the context exits (an exception or an early return rolls everything back).
    Writers of the principal are serialized while it is open."""

    @property
    def memory(self) -> PrincipalRows: ...

    @property
    def audit(self) -> AuditRows: ...

    @property
    def turns(self) -> TurnRows: ...

    @property
    def tombstones(self) -> TombstoneRows: ...

    @property
    def inspections(self) -> InspectionRows: ...

    def commit(self) -> None: ...


class UnitsOfWork(Protocol):
    """Opens units of work."""

    def __call__(
        self, tenant_id: str, principal_id: str, *, exclusive: bool = False
    ) -> AbstractContextManager[UnitOfWork]:
        """A unit of work on one principal; `exclusive` also waits for any indexing of the
        principal's turns in progress and holds off new indexing until it ends (erasure)."""
        ...


class FailedWrites(Protocol):
    """The count of a turn's failed memory writes (the per-turn cap of tool calls, server/
    domain/tool_calls.py), kept where every replica serving the turn reads it."""

    def record_failed_write(self, key: TurnKey, record_time: datetime) -> int:
        """Count one more failed memory write for the turn, written before it returns (never
        buffered: every replica serving the turn reads the count), unless its conversation is
        deleted; return the turn's count after it."""
        ...

    def failed_writes(self, key: TurnKey) -> int:
        """How many failed memory writes are counted for the turn, on any replica."""
        ...


class InspectionStore(FailedWrites, Protocol):
    """What the inspector recorded per turn (renders, searches, failed writes), in the turn
    store's database. Records of a deleted conversation are removed in the transaction that
    deletes it, and a principal's with its erasure (TurnStore)."""

    def record_render(self, key: TurnKey, record: RenderRecord) -> None:
        """Append a render record for the turn, unless its conversation is deleted (checked
        in the same statement)."""
        ...

    def record_search(self, key: TurnKey, record: SearchRecord) -> None:
        """Append a search record for the turn, unless its conversation is deleted."""
        ...

    def flush(self) -> None:
        """Return once every record made before this call is in the store (a buffering
        adapter writes in the background)."""
        ...

    def read(self, key: TurnKey) -> TurnRecords:
        """Everything recorded for the turn, oldest first, including every record made
        before this call."""
        ...

    def purge(self, before: datetime, limit: int) -> int:
        """Remove up to `limit` records (of any tenant) made before `before`; return how many."""
        ...
