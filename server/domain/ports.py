"""The ports the domain needs from storage, as Protocols. Adapters live in server/storage."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

from server.domain.model import (
    AuditEvent,
    AuditQuery,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
)

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware UTC."""


class MemoryTransaction(Protocol):
    """One unit of work inside one tenant. Everything done in it commits or rolls back together.

    Every method is scoped to the transaction's tenant; the principal is named explicitly so
    that no query can forget it.
    """

    def load(self, principal_id: str) -> PrincipalMemory:
        """Read the principal's block and settings."""
        ...

    def put_block(self, principal_id: str, block: StoredBlock) -> None:
        """Create or replace the principal's block."""
        ...

    def delete_block(self, principal_id: str) -> None:
        """Remove the principal's block row."""
        ...

    def put_settings(self, principal_id: str, settings: StoredSettings) -> None:
        """Create or replace the principal's settings."""
        ...

    def redact_audit_lines(self, principal_id: str) -> None:
        """Blank the line content of the principal's audit events; actions, writers, times and
        counts stay. Deleting the block deletes its content from the audit log too."""
        ...

    def append_audit(self, event: NewAuditEvent) -> None:
        """Append an audit event (append-only: there is no update or delete)."""
        ...

    def list_audit(self, query: AuditQuery) -> list[AuditEvent]:
        """Audit events matching `query`, newest (highest id) first, at most `query.limit`."""
        ...


class MemoryStore(Protocol):
    """Opens units of work on blocks, settings and audit events."""

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        """The principal's block and settings, read together in one consistent snapshot.

        The render path's read, on every turn: adapters make it as cheap as they can (one
        round trip on PostgreSQL).
        """
        ...

    def transaction(
        self, tenant_id: str, *, lock_principal: str | None = None
    ) -> AbstractContextManager[MemoryTransaction]:
        """A unit of work in `tenant_id`; commits when the block exits without an exception.

        With `lock_principal`, the transaction first takes an exclusive lock on that principal's
        memory (even when no row exists yet), so concurrent writers of one principal run one
        after another and every read-check-write in the domain is atomic.
        """
        ...
