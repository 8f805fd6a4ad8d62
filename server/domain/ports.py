"""The ports the domain needs from storage, as Protocols. Adapters live in server/storage."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from server.domain.model import (
    AuditEvent,
    AuditQuery,
    Change,
    EncodedQuery,
    IndexedChunk,
    PrincipalMemory,
    RetrievalResult,
    SearchScope,
    TurnKey,
)

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware UTC."""


class MemoryStore(Protocol):
    """Blocks, settings and audit events of every tenant; every call names its tenant.

    Writes are compare-and-set: the domain reads, decides in Python, and `apply` writes the
    decision only if the principal's memory is still what it was decided on. This keeps a write
    to one round trip on PostgreSQL and keeps the rules out of the store.
    """

    def read(self, tenant_id: str, principal_id: str, *, fresh: bool = False) -> PrincipalMemory:
        """The principal's block and settings, read together in one consistent snapshot.

        This is the render path's read, on every turn: adapters make it as cheap as they can
        (a cache may answer it). `fresh=True` asks the store itself, for decisions that must
        not rest on a cached copy.
        """
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


class ChunkIndex(Protocol):
    """Conversation chunks of every tenant in a Qdrant engine (embedded or server).

    Point ids are deterministic in (turn key, chunk index), so writing a turn again replaces
    its points. Every read is filtered in the engine by tenant and principal.
    """

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        """Store the turn's chunks (replacing any earlier version of the turn, including
        chunks past the new chunk count). Durable and visible to search when it returns."""
        ...

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        """Keyword and semantic retrieval over the scope's chunks, each side reduced to the
        best chunk per turn and cut to `turns` turns. Raises if either side fails."""
        ...

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        """Remove every chunk of one conversation (any number of chunks)."""
        ...

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        """Remove every chunk of one principal (any number of chunks)."""
        ...

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        """Number of chunks stored for a principal, or for one of its conversations."""
        ...

    def close(self) -> None:
        """Flush and release the engine."""
        ...


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
