"""Deleting a conversation and erasing a principal (DeleteConversation, ErasePrincipalData).

Rules (DESIGN 3): deleting a conversation is final: its tombstone commits first, which takes
it out of every search at once and refuses any late turn, and its chunks are purged from the
index in the background (server/domain/indexing.py). An erasure removes everything of a
principal (its block, settings, turns, tombstones, inspector records and chunks) except the
counts in the audit log; only a tenant administrator may erase another principal. What each
changes is decided on one unit of work (server/domain/conversations.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from server.domain.conversations import delete_conversation, erase_principal
from server.domain.errors import ErrorReason, FieldViolation, MemoriaError, invalid
from server.domain.ids import id_violations, identity_value_problem
from server.domain.model import AuditAction, Erasure, Identity, NewAuditEvent, Writer
from server.domain.ports import ChunkWriter, Clock, InspectionStore, UnitsOfWork


def _nobody() -> None:
    """No worker to wake (unit tests)."""


@dataclass(frozen=True)
class ConversationRemoval:
    """DeleteConversation and ErasePrincipalData for authenticated callers.

    `chunks` removes an erased principal's chunks before the erasure commits; `wake_worker`
    starts the purge of a deleted conversation's chunks. `inspections` is flushed before an
    erasure, so no record made before it outlives it; None has nothing to flush.
    """

    units: UnitsOfWork
    chunks: ChunkWriter
    clock: Clock
    wake_worker: Callable[[], None] = field(default=_nobody)
    inspections: InspectionStore | None = None

    def delete_conversation(self, who: Identity, conversation_id: str) -> int:
        """Take one of the caller's conversations out of search for good; the number of its
        turns removed (0 when it was deleted already)."""
        violations = id_violations("conversation_id", conversation_id)
        if violations:
            raise invalid(*violations)
        event = NewAuditEvent(
            principal_id=who.principal_id,
            action=AuditAction.CONVERSATION_DELETED,
            writer=Writer.USER,
            create_time=self.clock(),
            conversation_id=conversation_id,
            actor_principal_id=who.principal_id,
        )
        deleted = delete_conversation(
            self.units, who.tenant_id, who.principal_id, conversation_id, event
        )
        if deleted is not None:
            self.wake_worker()  # the purge of its chunks
        return deleted or 0

    def erase(self, who: Identity, principal_id: str) -> Erasure:
        """Erase all of a principal's memory: its own, or (administrators) another's."""
        target = principal_id or who.principal_id
        # A principal id, so the identity rule that authentication applies (not the
        # conversation-id rule): every principal that can call the service can erase itself.
        problem = identity_value_problem(target)
        if problem is not None:
            raise invalid(FieldViolation("principal_id", problem))
        if target != who.principal_id and not who.is_tenant_admin:
            raise MemoriaError(
                ErrorReason.PERMISSION_DENIED,
                "erasing another principal's data requires the tenant administrator role",
            )
        event = NewAuditEvent(
            principal_id=target,
            action=AuditAction.PRINCIPAL_DATA_ERASED,
            writer=Writer.USER,
            create_time=self.clock(),
            actor_principal_id=who.principal_id,
        )
        if self.inspections is not None:
            self.inspections.flush()  # no record made before the erasure may outlive it
        return erase_principal(
            self.units,
            who.tenant_id,
            target,
            event,
            purge=lambda: self.chunks.delete_principal(who.tenant_id, target),
        )
