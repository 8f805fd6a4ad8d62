"""The turn store with the domain's operations on its units of work, as tests drive them.

Accepting a turn, deleting a conversation and erasing a principal are decided by the domain
(server/domain/conversations.py) and executed on a SQL unit of work; tests of the turn queue
call them beside the store's own methods through one object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.turns import SqlTurnStore
from server.adapters.sql.unit_of_work import SqlUnitsOfWork
from server.domain import conversations
from server.domain.model import AcceptOutcome, Erasure, NewAuditEvent, NewTurn


class TurnOperations:
    """`SqlTurnStore`'s methods, plus accept_turn, delete_conversation and erase_principal."""

    def __init__(self, db: SqlDatabase) -> None:
        self.store = SqlTurnStore(db)
        self.units = SqlUnitsOfWork(db)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def accept_turn(self, turn: NewTurn) -> AcceptOutcome:
        return conversations.accept_turn(self.units, turn)

    def delete_conversation(
        self, tenant_id: str, principal_id: str, conversation_id: str, event: NewAuditEvent
    ) -> int | None:
        return conversations.delete_conversation(
            self.units, tenant_id, principal_id, conversation_id, event
        )

    def erase_principal(
        self, tenant_id: str, principal_id: str, event: NewAuditEvent, purge: Callable[[], None]
    ) -> Erasure:
        return conversations.erase_principal(self.units, tenant_id, principal_id, event, purge)
