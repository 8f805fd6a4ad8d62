"""The ports the domain needs from storage, as Protocols. Adapters live in server/storage."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from server.domain.model import AuditEvent, AuditQuery, Change, PrincipalMemory

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
