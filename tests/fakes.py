"""In-memory fakes of the storage ports, for unit tests of the domain.

The contract suite (tests/contract) runs the same assertions over these fakes and over every
real adapter, so a fake cannot drift from what the real stores do.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

from server.domain.model import (
    AuditEvent,
    AuditQuery,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
)

Key = tuple[str, str]


class InMemoryMemoryStore:
    """`MemoryStore` in process memory: committed state plus staged writes per transaction."""

    def __init__(self) -> None:
        self.blocks: dict[Key, StoredBlock] = {}
        self.settings: dict[Key, StoredSettings] = {}
        self.audit: list[tuple[str, AuditEvent]] = []
        self.transactions = 0
        self._commit = threading.Lock()
        self._principals: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        self.transactions += 1
        with self._commit:
            key = (tenant_id, principal_id)
            return PrincipalMemory(self.blocks.get(key), self.settings.get(key))

    @contextmanager
    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None
    ) -> Iterator[InMemoryTransaction]:
        self.transactions += 1
        lock: Any = (
            self._principals[(tenant_id, lock_principal)] if lock_principal else nullcontext()
        )
        with lock:
            tx = InMemoryTransaction(self, tenant_id)
            yield tx
            with self._commit:
                tx.apply()


class InMemoryTransaction:
    """Reads committed state (and its own staged writes); applies the writes on commit."""

    def __init__(self, store: InMemoryMemoryStore, tenant_id: str):
        self._store = store
        self._tenant = tenant_id
        self._blocks: dict[Key, StoredBlock | None] = {}
        self._settings: dict[Key, StoredSettings] = {}
        self._events: list[NewAuditEvent] = []
        self._redact: set[str] = set()

    def load(self, principal_id: str) -> PrincipalMemory:
        key = (self._tenant, principal_id)
        block = self._blocks[key] if key in self._blocks else self._store.blocks.get(key)
        settings = self._settings.get(key) or self._store.settings.get(key)
        return PrincipalMemory(block=block, settings=settings)

    def put_block(self, principal_id: str, block: StoredBlock) -> None:
        self._blocks[(self._tenant, principal_id)] = block

    def delete_block(self, principal_id: str) -> None:
        self._blocks[(self._tenant, principal_id)] = None

    def put_settings(self, principal_id: str, settings: StoredSettings) -> None:
        self._settings[(self._tenant, principal_id)] = settings

    def redact_audit_lines(self, principal_id: str) -> None:
        self._redact.add(principal_id)

    def append_audit(self, event: NewAuditEvent) -> None:
        self._events.append(event)

    def list_audit(self, query: AuditQuery) -> list[AuditEvent]:
        found = [
            e
            for tenant, e in reversed(self._store.audit)
            if tenant == self._tenant
            and (query.principal_id is None or e.principal_id == query.principal_id)
            and (not query.actions or e.action in query.actions)
            and (query.start_time is None or e.create_time >= query.start_time)
            and (query.end_time is None or e.create_time < query.end_time)
            and (query.before_event_id is None or e.event_id < query.before_event_id)
        ]
        return found[: query.limit]

    def apply(self) -> None:
        for key, block in self._blocks.items():
            if block is None:
                self._store.blocks.pop(key, None)
            else:
                self._store.blocks[key] = block
        self._store.settings.update(self._settings)
        for i, (tenant, event) in enumerate(self._store.audit):
            if tenant == self._tenant and event.principal_id in self._redact:
                self._store.audit[i] = (tenant, replace(event, removed_lines=(), added_lines=()))
        for event in self._events:
            event_id = len(self._store.audit) + 1
            fields = {f: getattr(event, f) for f in NewAuditEvent.__dataclass_fields__}
            self._store.audit.append((self._tenant, AuditEvent(**fields, event_id=event_id)))
