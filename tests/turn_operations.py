"""The turn store with the domain's operations on its units of work, as tests drive them.

Accepting a turn, deleting a conversation and erasing a principal are decided by the domain
(server/domain/conversations.py) and executed on a unit of work; tests of the turn queue call
them beside the store's own methods through one object, on SQL (`TurnOperations`) or on the
in-memory fakes (`FakeTurnOperations`), which also say what a turn's row holds and let a test
set a principal's block and settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.tables import conversation_turns
from server.adapters.sql.turns import SqlTurnStore
from server.adapters.sql.unit_of_work import SqlUnitsOfWork
from server.domain import conversations
from server.domain.model import (
    AcceptOutcome,
    Erasure,
    NewAuditEvent,
    NewTurn,
    StoredBlock,
    StoredSettings,
    TurnKey,
)
from server.domain.ports import MemoryStore, UnitsOfWork
from tests.fakes import InMemoryInspectionStore, InMemoryTurnStore


class _Operations:
    """The domain's operations on `units`, the store's own methods by delegation."""

    store: Any
    units: UnitsOfWork
    memory: MemoryStore

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


class TurnOperations(_Operations):
    """`SqlTurnStore`'s methods, plus accept_turn, delete_conversation and erase_principal."""

    def __init__(self, db: SqlDatabase) -> None:
        self.store = SqlTurnStore(db)
        self.units = SqlUnitsOfWork(db)
        self.memory = self.sql = SqlMemoryStore(db)

    def stored_text(self, key: TurnKey) -> tuple[str, str | None]:
        """The turn's status and stored text, as its row holds them."""
        t = conversation_turns
        with self.sql.transaction(key.tenant_id) as tx:
            row = tx.connection.execute(
                select(t.c.status, t.c.text).where(
                    t.c.tenant_id == key.tenant_id,
                    t.c.principal_id == key.principal_id,
                    t.c.conversation_id == key.conversation_id,
                    t.c.turn_id == key.turn_id,
                )
            ).one()
        return row[0], row[1]

    def put_memory(
        self,
        tenant_id: str,
        principal_id: str,
        block: StoredBlock | None = None,
        settings: StoredSettings | None = None,
    ) -> None:
        """Store the principal's block and settings as they are (test data)."""
        with self.sql.transaction(tenant_id, lock_principal=principal_id) as tx:
            if block is not None:
                tx.put_block(principal_id, block)
            if settings is not None:
                tx.put_settings(principal_id, settings)


class FakeTurnOperations(_Operations):
    """The same on `InMemoryTurnStore` and its units of work."""

    store: InMemoryTurnStore

    def __init__(self, inspections: InMemoryInspectionStore | None = None) -> None:
        self.store = InMemoryTurnStore(inspections=inspections)
        self.units = self.store.units
        self.memory = self.store.memory

    def stored_text(self, key: TurnKey) -> tuple[str, str | None]:
        """The turn's status and stored text, as its row holds them."""
        return self.store.status(key)

    def put_memory(
        self,
        tenant_id: str,
        principal_id: str,
        block: StoredBlock | None = None,
        settings: StoredSettings | None = None,
    ) -> None:
        """Store the principal's block and settings as they are (test data)."""
        if block is not None:
            self.store.memory.blocks[tenant_id, principal_id] = block
        if settings is not None:
            self.store.memory.settings[tenant_id, principal_id] = settings
