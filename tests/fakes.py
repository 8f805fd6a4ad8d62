"""An in-memory fake of the storage port, for unit tests of the domain.

The contract suite (tests/contract) runs the same assertions over this fake and over every
real adapter, so the fake cannot drift from what the real stores do.
"""

from __future__ import annotations

import threading
from dataclasses import fields, replace

from server.domain.model import (
    AuditEvent,
    AuditQuery,
    Change,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
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

    def read(self, tenant_id: str, principal_id: str, *, fresh: bool = False) -> PrincipalMemory:
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
                self._redact(tenant_id, change.principal_id)
            if change.settings is not None:
                self.settings[key] = change.settings
            self.append(tenant_id, change.event)
            return True

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
