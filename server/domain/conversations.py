"""What accepting a turn, deleting a conversation and erasing a principal change, decided
here and executed on one unit of work (`UnitsOfWork`, server/domain/ports.py).

Rules (DESIGN 3): a turn is accepted only while the principal's memory is on and its
conversation is not deleted (checked in the transaction that queues it); deleting a
conversation is final, takes its queued turns and inspector records with it and is audited
with the number of turns removed; erasing a principal removes its block, settings, turns,
tombstones and inspector records, blanks the lines of its earlier audit events (deleted
content is kept nowhere), removes its chunks from the index before anything commits, and is
audited with what it removed. Storage only executes these steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from server.domain.model import AcceptOutcome, Erasure, NewAuditEvent, NewTurn
from server.domain.ports import UnitsOfWork
from server.domain.text import block_line_count


def accept_turn(units: UnitsOfWork, turn: NewTurn) -> AcceptOutcome:
    """Queue the turn (replacing an earlier version of it), unless memory is off or its
    conversation is deleted."""
    key = turn.key
    with units(key.tenant_id, key.principal_id) as uow:
        if not uow.memory.load().memory_enabled:
            return AcceptOutcome.MEMORY_DISABLED
        if uow.tombstones.exists(key.conversation_id):
            return AcceptOutcome.CONVERSATION_DELETED
        uow.turns.put(turn)
        uow.commit()
    return AcceptOutcome.ACCEPTED


def delete_conversation(
    units: UnitsOfWork,
    tenant_id: str,
    principal_id: str,
    conversation_id: str,
    event: NewAuditEvent,
) -> int | None:
    """Tombstone the conversation, drop its queued turns and inspector records, append
    `event` with the number of turns removed; that number, or None (and nothing changed)
    when it was already deleted."""
    with units(tenant_id, principal_id) as uow:
        if uow.tombstones.exists(conversation_id):
            return None
        turns = uow.turns.delete_conversation(conversation_id)
        uow.inspections.delete_conversation(conversation_id)
        uow.tombstones.add(conversation_id, event.create_time)
        uow.audit.append(replace(event, deleted_turn_count=turns))
        uow.commit()
    return turns


def erase_principal(
    units: UnitsOfWork,
    tenant_id: str,
    principal_id: str,
    event: NewAuditEvent,
    purge: Callable[[], None],
) -> Erasure:
    """Remove everything of the principal (see the module) while none of its turns can be
    accepted or indexed; `purge` removes its chunks before the commit, and if it raises,
    nothing is erased."""
    with units(tenant_id, principal_id, exclusive=True) as uow:
        block = uow.memory.load().block
        lines = 0 if block is None else block_line_count(block.text)
        turns = uow.turns.delete_all()
        uow.tombstones.delete_all()
        inspections = uow.inspections.delete_all()
        uow.memory.delete()
        uow.audit.blank_lines()
        uow.audit.append(replace(event, removed_line_count=lines, deleted_turn_count=turns))
        purge()
        uow.commit()
    return Erasure(
        removed_line_count=lines, deleted_turn_count=turns, deleted_inspection_count=inspections
    )
