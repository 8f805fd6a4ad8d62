"""An in-memory fake of the storage port, for unit tests of the domain.

The contract suite (tests/contract) runs the same assertions over this fake and over every
real adapter, so the fake cannot drift from what the real stores do.
"""

from __future__ import annotations

import threading
from dataclasses import fields, replace
from datetime import datetime

from server.domain.model import (
    AuditEvent,
    AuditQuery,
    Change,
    NewAuditEvent,
    PrincipalMemory,
    RenderRecord,
    SearchRecord,
    StoredBlock,
    StoredSettings,
    TurnKey,
    TurnRecords,
)

Key = tuple[str, str]


class InMemoryMemoryStore:
    """`MemoryStore` in process memory; `apply` is atomic under one lock."""

    def __init__(self) -> None:
        self.blocks: dict[Key, StoredBlock] = {}
        self.settings: dict[Key, StoredSettings] = {}
        self.audit: list[tuple[str, AuditEvent]] = []
        self.reads = 0
        self.applies = 0
        self._lock = threading.Lock()

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        with self._lock:
            self.reads += 1
            key = (tenant_id, principal_id)
            return PrincipalMemory(self.blocks.get(key), self.settings.get(key))

    def apply(self, tenant_id: str, change: Change) -> bool:
        with self._lock:
            self.applies += 1
            key = (tenant_id, change.principal_id)
            block = self.blocks.get(key)
            settings = self.settings.get(key)
            etag = block.etag if block is not None else ""
            enabled = settings is None or settings.memory_enabled
            if (etag, enabled) != (change.expected_etag, change.expected_enabled):
                return False
            if change.block is not None:
                self.blocks[key] = change.block
            if change.delete_block:
                self.blocks.pop(key, None)
            if change.blank_audit_lines:
                self._redact(tenant_id, change.principal_id)
            if change.settings is not None:
                self.settings[key] = change.settings
            self.append(tenant_id, change.event)
            return True

    def confirm(self, tenant_id: str, principal_id: str, memory: PrincipalMemory) -> bool:
        now = self.read(tenant_id, principal_id)
        etag = now.block.etag if now.block is not None else ""
        then = memory.block.etag if memory.block is not None else ""
        return (etag, now.memory_enabled) == (then, memory.memory_enabled)

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        with self._lock:
            found = [
                e
                for tenant, e in reversed(self.audit)
                if tenant == tenant_id
                and (query.principal_id is None or e.principal_id == query.principal_id)
                and (not query.actions or e.action in query.actions)
                and (query.start_time is None or e.create_time >= query.start_time)
                and (query.end_time is None or e.create_time < query.end_time)
                and (query.before_event_id is None or e.event_id < query.before_event_id)
            ]
        return found[: query.limit]

    def append(self, tenant_id: str, event: NewAuditEvent) -> None:
        """Append an event as the store would (tests use it to prepare audit data)."""
        values = {f.name: getattr(event, f.name) for f in fields(NewAuditEvent)}
        self.audit.append((tenant_id, AuditEvent(**values, event_id=len(self.audit) + 1)))

    def _redact(self, tenant_id: str, principal_id: str) -> None:
        for i, (tenant, event) in enumerate(self.audit):
            if tenant == tenant_id and event.principal_id == principal_id:
                self.audit[i] = (tenant, replace(event, removed_lines=(), added_lines=()))


class InMemoryInspectionStore:
    """`InspectionStore` in process memory. `deleted` holds tombstoned conversations
    ((tenant, principal, conversation)): records for them are not kept, as the SQL statement
    does; `delete_conversation` and `erase` mirror what the turn store's transactions do."""

    def __init__(self) -> None:
        self.records: list[tuple[int, TurnKey, RenderRecord | SearchRecord]] = []
        self.deleted: set[tuple[str, str, str]] = set()
        self.flushes = 0
        self._next = 0
        self._lock = threading.Lock()

    def _add(self, key: TurnKey, record: RenderRecord | SearchRecord) -> None:
        with self._lock:
            if (key.tenant_id, key.principal_id, key.conversation_id) in self.deleted:
                return
            self._next += 1
            self.records.append((self._next, key, record))

    def record_render(self, key: TurnKey, record: RenderRecord) -> None:
        self._add(key, record)

    def record_search(self, key: TurnKey, record: SearchRecord) -> None:
        self._add(key, record)

    def flush(self) -> None:
        self.flushes += 1

    def read(self, key: TurnKey) -> TurnRecords:
        with self._lock:
            mine = [r for _, k, r in self.records if k == key]
        return TurnRecords(
            tuple(r for r in mine if isinstance(r, RenderRecord)),
            tuple(r for r in mine if isinstance(r, SearchRecord)),
        )

    def purge(self, before: datetime, limit: int) -> int:
        with self._lock:
            expired = sorted(
                (r.record_time, n) for n, _, r in self.records if r.record_time < before
            )[:limit]
            gone = {n for _, n in expired}
            self.records = [entry for entry in self.records if entry[0] not in gone]
            return len(gone)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> int:
        with self._lock:
            self.deleted.add((tenant_id, principal_id, conversation_id))
            keep = [
                e
                for e in self.records
                if (e[1].tenant_id, e[1].principal_id, e[1].conversation_id)
                != (tenant_id, principal_id, conversation_id)
            ]
            removed, self.records = len(self.records) - len(keep), keep
            return removed

    def erase(self, tenant_id: str, principal_id: str) -> int:
        with self._lock:
            keep = [
                e
                for e in self.records
                if (e[1].tenant_id, e[1].principal_id) != (tenant_id, principal_id)
            ]
            removed, self.records = len(self.records) - len(keep), keep
            return removed
