"""The inspector: what memory a given turn saw, so memory is never opaque (issue 12).

A render or a search may name the turn it is made for (a `TurnRef`); the block operations and
the search then record, per turn, the block version rendered (etag, count, time) and each
search's query and hits (ids, ranks, score). This module reads those records back for the
caller and purges them after the retention.

Rules:
- Only the caller's own turns: the key is always (caller's tenant, caller's principal, turn).
- A record keeps no conversation text. A hit's text is read from the chunk index when the
  inspection is asked for, and a hit whose conversation is deleted (tombstoned, or its
  chunks already purged) is left out: a deleted conversation's text never comes back here.
  Records of a deleted conversation are removed with it, and a principal's with its erasure
  (server/adapters/sql/turns.py, in the same transactions).
- A hit on a turn past its tenant's turn retention is left out like a deleted one
  (server/domain/retention.py).
- Records are kept for `retention` (30 days by default): older ones are never shown, and a
  background loop removes them (`purge_once`, run by the index worker).
- An unknown turn has an empty inspection, not an error (like an absent block).
- What the turn wrote (each rewrite that named it) is read from the audit log, not recorded
  here: deleting the block blanks the lines there, so no second copy of deleted content is
  kept, and the writes stay visible as long as the audit keeps them. How many of the turn's
  writes through a tool call failed is a record here (server/domain/tool_calls.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from server.domain.errors import FieldViolation, invalid
from server.domain.ids import turn_reference_violations
from server.domain.model import (
    AuditAction,
    AuditQuery,
    Identity,
    InspectedHit,
    SearchBounds,
    SearchHit,
    TurnKey,
    TurnRecords,
    TurnRef,
    Writer,
)
from server.domain.ports import ChunkTexts, Clock, InspectionStore, MemoryStore, TurnStore
from server.domain.retention import KEEP_ALL_TURNS, TurnsKept

DEFAULT_RETENTION = timedelta(days=30)
"""How long a turn's records are kept (MEMORIA_INSPECTION_RETENTION_DAYS)."""

MAX_WRITES_SHOWN = 1000
"""At most this many of a turn's rewrites are shown (its latest); a turn makes a few."""


@dataclass(frozen=True)
class RenderView:
    """A render of the block for the turn, and whether that version is still current."""

    etag: str
    char_count: int
    render_time: datetime
    block_changed: bool


@dataclass(frozen=True)
class SearchView:
    """A search made for the turn: the hits still held (text read now), best first, how
    many the search returned in all, and the bounds it was made with."""

    query: str
    search_time: datetime
    hits: tuple[SearchHit, ...]
    hit_count: int
    bounds: SearchBounds


@dataclass(frozen=True)
class WriteView:
    """A rewrite made in the turn, as its audit event holds it (lines blanked once the block
    was deleted)."""

    writer: Writer
    write_time: datetime
    removed_lines: tuple[str, ...]
    added_lines: tuple[str, ...]
    removed_line_count: int
    added_line_count: int
    char_count: int


@dataclass(frozen=True)
class Inspection:
    """What one turn saw and wrote, oldest first, and whether the block has changed since."""

    turn: TurnRef
    renders: tuple[RenderView, ...]
    searches: tuple[SearchView, ...]
    current_etag: str
    block_changed: bool
    writes: tuple[WriteView, ...] = ()
    failed_write_count: int = 0


class TurnInspector:
    """Reads a turn's records for its principal and purges expired records."""

    def __init__(
        self,
        inspections: InspectionStore,
        memory: MemoryStore,
        turns: TurnStore,
        index: ChunkTexts,
        clock: Clock,
        *,
        retention: timedelta = DEFAULT_RETENTION,
        kept: TurnsKept = KEEP_ALL_TURNS,
    ) -> None:
        self._kept = kept
        if retention <= timedelta(0):
            raise ValueError("retention must be positive")
        self._inspections = inspections
        self._memory = memory
        self._turns = turns
        self._index = index
        self._clock = clock
        self._retention = retention

    @property
    def retention(self) -> timedelta:
        return self._retention

    def inspect(self, who: Identity, turn: TurnRef | None) -> Inspection:
        """The caller's records for `turn` (required), within the retention."""
        if turn is None:
            raise invalid(FieldViolation("turn", "is required"))
        violations = turn_reference_violations(turn)
        if violations:
            raise invalid(*violations)
        key = TurnKey(who.tenant_id, who.principal_id, turn.conversation_id, turn.turn_id)
        since = self._clock() - self._retention
        deleted = self._turns.deleted_conversations(who.tenant_id, who.principal_id)
        # A deleted conversation's turn shows nothing it read: its records go with it in the
        # deleting transaction, and where a store cannot make that atomic (Citus checks the
        # tombstones and inserts a batch in two statements) a record that raced the deletion
        # is still never shown; retention removes it.
        records = TurnRecords() if turn.conversation_id in deleted else self._inspections.read(key)
        renders = [r for r in records.renders if r.record_time >= since]
        searches = [s for s in records.searches if s.record_time >= since]
        block = self._memory.read(who.tenant_id, who.principal_id).block
        current = block.etag if block is not None else ""
        kept_since = self._kept.since(who.tenant_id)

        def gone(hit: InspectedHit) -> bool:
            """Deleted, or past the turn retention: nothing of it is shown."""
            expired = kept_since is not None and hit.turn_time < kept_since
            return expired or hit.conversation_id in deleted

        wanted = sorted(
            {(h.conversation_id, h.turn_id) for s in searches for h in s.hits if not gone(h)}
        )
        chunks = self._index.turn_chunks(who.tenant_id, who.principal_id, wanted) if wanted else {}
        search_views = []
        for s in searches:
            hits = []
            for h in s.hits:
                held = chunks.get((h.conversation_id, h.turn_id))
                if gone(h) or held is None:
                    continue  # deleted since (or erased, or expired): nothing of it is shown
                text = held[h.chunk_index] if h.chunk_index < len(held) else ""
                hits.append(
                    SearchHit(
                        conversation_id=h.conversation_id,
                        turn_id=h.turn_id,
                        chunk_index=h.chunk_index,
                        text=text,
                        turn_time=h.turn_time,
                        score=h.score,
                        keyword_rank=h.keyword_rank,
                        semantic_rank=h.semantic_rank,
                    )
                )
            search_views.append(
                SearchView(s.query, s.record_time, tuple(hits), len(s.hits), s.bounds)
            )
        render_views = tuple(
            RenderView(r.etag, r.char_count, r.record_time, r.etag != current) for r in renders
        )
        return Inspection(
            turn=turn,
            renders=render_views,
            searches=tuple(search_views),
            current_etag=current,
            block_changed=bool(render_views) and render_views[-1].block_changed,
            writes=self._writes(who, turn),
            failed_write_count=records.failed_writes,
        )

    def _writes(self, who: Identity, turn: TurnRef) -> tuple[WriteView, ...]:
        """The rewrites that named the turn, oldest first, from the audit log."""
        events = self._memory.list_audit(
            who.tenant_id,
            AuditQuery(
                principal_id=who.principal_id,
                actions=frozenset({AuditAction.BLOCK_REWRITTEN}),
                limit=MAX_WRITES_SHOWN,
                turn=turn,
            ),
        )
        return tuple(
            WriteView(
                writer=e.writer,
                write_time=e.create_time,
                removed_lines=e.removed_lines,
                added_lines=e.added_lines,
                removed_line_count=e.removed_line_count,
                added_line_count=e.added_line_count,
                char_count=e.char_count,
            )
            for e in reversed(events)
        )

    def purge_once(self, limit: int) -> int:
        """Remove up to `limit` records older than the retention; return how many."""
        return self._inspections.purge(self._clock() - self._retention, limit)
