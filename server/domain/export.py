"""The export: everything Memoria holds about the caller, page by page (issue 12, item 4).

The person's right of access and portability: settings, memory block, audit events, every
accepted turn with its text (from the chunk index once indexed, from the queue before) and the
ids of deleted conversations. `memoria export` writes the pages as JSON Lines and `memoria
import` replays them into another deployment through the ordinary RPCs
(server/runtime/export_cli.py).

Rules:
- The caller's own data only. No existing rule lets anyone read another principal's block or
  turns (a tenant administrator may read audit events and erase, never read content), so an
  export never names another principal.
- After an erasure nothing of the erased data is held, so an erased principal's export is
  empty: audit events are exported only from after the principal's last erasure (the events
  before it, and the erasure's own counts, stay readable with ListAuditEvents).
- Turns past the tenant's retention are not exported (they are out of reach at once, purged
  or not), and every page says which retention applied (`turn_retention_days`, 0: turns are
  kept until deleted; server/domain/retention.py).
- Pages are bound to the caller by signed, opaque tokens (the audit log's `PageTokens`). A
  token's position packs a section (head, audit, turns, deleted conversations) and a cursor
  within it. Each page reads in its own snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from server.domain.audit import PageTokens
from server.domain.errors import FieldViolation, invalid
from server.domain.memory import BlockView, MemoryBlocks, SettingsView
from server.domain.model import (
    AuditAction,
    AuditEvent,
    AuditQuery,
    Identity,
    StoredTurn,
    Tombstone,
)
from server.domain.ports import ChunkTexts, MemoryStore, TurnStore
from server.domain.retention import KEEP_ALL_TURNS, TurnsKept

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000

_HEAD, _AUDIT, _TURNS, _TOMBSTONES, _END = range(5)
_SHIFT = 1 << 48
"""A position is section * _SHIFT + cursor (row ids and offsets stay far below 2**48)."""


@dataclass(frozen=True)
class ExportedTurn:
    """One accepted turn with the text held for it."""

    conversation_id: str
    turn_id: str
    turn_time: datetime
    text: str
    indexed: bool


def held_turns(index: ChunkTexts, who: Identity, rows: Sequence[StoredTurn]) -> list[ExportedTurn]:
    """The caller's `rows` with the text held for each: the queue's until the turn is indexed,
    then its chunks (one read of the index for all). A turn indexed but without chunks (they
    were removed meanwhile) holds nothing and is left out. The export and
    ListConversationTurns (server/domain/listing.py) read turns through this."""
    indexed = [(r.conversation_id, r.turn_id) for r in rows if r.indexed]
    chunks = index.turn_chunks(who.tenant_id, who.principal_id, indexed) if indexed else {}
    out: list[ExportedTurn] = []
    for row in rows:
        text = row.text
        if row.indexed:
            held = chunks.get((row.conversation_id, row.turn_id))
            text = "".join(held) if held is not None else None
        if text is not None:
            out.append(
                ExportedTurn(row.conversation_id, row.turn_id, row.turn_time, text, row.indexed)
            )
    return out


ExportItem = SettingsView | BlockView | AuditEvent | ExportedTurn | Tombstone


@dataclass(frozen=True)
class ExportPage:
    """One page of the export, in export order, the next page's token ("" at the end) and
    the caller's tenant's turn retention in days (0: turns are kept until deleted)."""

    records: tuple[ExportItem, ...]
    next_page_token: str
    turn_retention_days: int = 0


class Exporter:
    """Pages through everything held about the caller."""

    def __init__(
        self,
        blocks: MemoryBlocks,
        memory: MemoryStore,
        turns: TurnStore,
        index: ChunkTexts,
        tokens: PageTokens,
        kept: TurnsKept = KEEP_ALL_TURNS,
    ) -> None:
        self._kept = kept
        self._blocks = blocks
        self._memory = memory
        self._turns = turns
        self._index = index
        self._tokens = tokens

    def page(self, who: Identity, page_size: int, page_token: str) -> ExportPage:
        """The page at `page_token` ("" for the first) of at most `page_size` records."""
        if page_size < 0:
            raise invalid(FieldViolation("page_size", "must not be negative"))
        scope = "export\x1f" + who.tenant_id + "\x1f" + who.principal_id
        position = self._tokens.verify(scope, page_token) if page_token else 0
        section, cursor = divmod(position, _SHIFT)
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        out: list[ExportItem] = []
        while section < _END and len(out) < size:
            room = size - len(out)
            if section == _HEAD:
                section, cursor = self._head(who, cursor, out)
            elif section == _AUDIT:
                section, cursor = self._audit(who, cursor, room, out)
            elif section == _TURNS:
                section, cursor = self._turns_page(who, cursor, room, out)
            else:
                section, cursor = self._tombstones(who, cursor, room, out)
        token = "" if section >= _END else self._tokens.issue(scope, section * _SHIFT + cursor)
        days = self._kept.retention.days(who.tenant_id)
        return ExportPage(tuple(out), token, days)

    def _head(self, who: Identity, cursor: int, out: list[ExportItem]) -> tuple[int, int]:
        """Cursor 0: the settings (when ever changed); 1: the block (when there is one)."""
        if cursor == 0:
            settings = self._blocks.settings(who)
            if settings.update_time is not None:
                out.append(settings)
            return _HEAD, 1
        block = self._blocks.get(who)
        if block.etag:
            out.append(block)
        return _AUDIT, 0

    def _audit(
        self, who: Identity, before: int, room: int, out: list[ExportItem]
    ) -> tuple[int, int]:
        """Events newest first, below event id `before` (0: from the newest), and only those
        after the principal's last erasure."""
        erasures = self._memory.list_audit(
            who.tenant_id,
            AuditQuery(
                principal_id=who.principal_id,
                actions=frozenset({AuditAction.PRINCIPAL_DATA_ERASED}),
                limit=1,
            ),
        )
        floor = erasures[0].event_id if erasures else 0
        query = AuditQuery(
            principal_id=who.principal_id, before_event_id=before or None, limit=room + 1
        )
        events = [e for e in self._memory.list_audit(who.tenant_id, query) if e.event_id > floor]
        out.extend(events[:room])
        if len(events) > room:
            return _AUDIT, events[room - 1].event_id
        return _TURNS, 0

    def _turns_page(
        self, who: Identity, after: int, room: int, out: list[ExportItem]
    ) -> tuple[int, int]:
        """Accepted turns still kept, by row id above `after`; an indexed turn's text is its
        chunks."""
        since = self._kept.since(who.tenant_id)
        rows = self._turns.list_turns(who.tenant_id, who.principal_id, after, room + 1, since)
        page = rows[:room]
        out.extend(held_turns(self._index, who, page))
        if len(rows) > room:
            return _TURNS, page[-1].row_id
        return _TOMBSTONES, 0

    def _tombstones(
        self, who: Identity, offset: int, room: int, out: list[ExportItem]
    ) -> tuple[int, int]:
        """Deleted conversations by id, from `offset`."""
        rows = self._turns.list_tombstones(who.tenant_id, who.principal_id, offset, room + 1)
        out.extend(rows[:room])
        if len(rows) > room:
            return _TOMBSTONES, offset + room
        return _END, 0
