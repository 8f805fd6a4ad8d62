"""The SQL unit of work: one principal's rows of every table, on one transaction.

The domain (server/domain/conversations.py) decides what a turn's acceptance, a
conversation's deletion and an erasure change; this module only executes those steps, each
one statement scoped to the tenant and the principal, and commits when told to. After the
commit it tells the database's listeners what changed (the read cache forgets the
principal's memory, the search's cache of deleted conversations its tombstones), and on
PostgreSQL a change to the block or settings is announced to the other servers' caches in
the transaction itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, select

from server.adapters.sql.blocks import MemoryRows
from server.adapters.sql.database import SqlDatabase, SqlTransaction
from server.adapters.sql.tables import conversation_tombstones, conversation_turns, turn_inspections
from server.adapters.sql.turns import PENDING, upsert_turn_statement
from server.domain.model import NewAuditEvent, NewTurn, PrincipalMemory

_t, _z, _i = conversation_turns, conversation_tombstones, turn_inspections


class SqlUnitsOfWork:
    """`UnitsOfWork` on a `SqlDatabase`."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db
        self._upsert = upsert_turn_statement(db.engine.dialect.name)

    @contextmanager
    def __call__(
        self, tenant_id: str, principal_id: str, *, exclusive: bool = False
    ) -> Iterator[SqlUnitOfWork]:
        """See `UnitsOfWork`. SQLite: `exclusive` takes the processing lock first (indexing
        runs under it); PostgreSQL: a claim's row locks make the deletes wait instead."""
        processing = self._db.processing if exclusive else None
        with (
            processing or nullcontext(),
            self._db.transaction(tenant_id, lock_principal=principal_id) as tx,
        ):
            uow = SqlUnitOfWork(self._db, tx, principal_id, self._upsert)
            try:
                yield uow
            finally:
                if not uow.committed:
                    tx.connection.rollback()
        if uow.committed:
            uow.notify()


class SqlUnitOfWork:
    """`UnitOfWork` on one open transaction; see the module."""

    def __init__(self, db: SqlDatabase, tx: SqlTransaction, principal_id: str, upsert: Any):
        self._db = db
        self._tx = tx
        self._principal = principal_id
        self.committed = False
        self.memory_changed = False
        self.deletions_changed = False
        scope = {"tenant_id": tx.tenant_id, "principal_id": principal_id}
        self.memory = _PrincipalRows(self, MemoryRows(tx))
        self.audit = _AuditRows(MemoryRows(tx), principal_id)
        self.turns = _TurnRows(db, tx, scope, upsert)
        self.tombstones = _TombstoneRows(self, tx, scope)
        self.inspections = _InspectionRows(tx, scope)

    @property
    def principal_id(self) -> str:
        return self._principal

    def commit(self) -> None:
        """Keep everything done so far (the transaction commits as the context exits)."""
        self.committed = True

    def changing_memory(self) -> None:
        """The block or settings are about to change: announce it once (PostgreSQL)."""
        if not self.memory_changed:
            self._tx.announce(self._principal)
            self.memory_changed = True

    def notify(self) -> None:
        """After the commit: tell the database's listeners what changed."""
        if self.memory_changed:
            self._db.memory_changed(self._tx.tenant_id, self._principal)
        if self.deletions_changed:
            self._db.deletions_changed(self._tx.tenant_id, self._principal)


class _PrincipalRows:
    def __init__(self, uow: SqlUnitOfWork, rows: MemoryRows) -> None:
        self._uow = uow
        self._rows = rows

    def load(self) -> PrincipalMemory:
        return self._rows.load(self._uow.principal_id)

    def delete(self) -> None:
        self._uow.changing_memory()
        self._rows.delete_block(self._uow.principal_id)
        self._rows.delete_settings(self._uow.principal_id)


class _AuditRows:
    def __init__(self, rows: MemoryRows, principal_id: str) -> None:
        self._rows = rows
        self._principal = principal_id

    def append(self, event: NewAuditEvent) -> None:
        self._rows.append_audit(event)

    def blank_lines(self) -> None:
        self._rows.redact_audit_lines(self._principal)


class _TurnRows:
    def __init__(
        self, db: SqlDatabase, tx: SqlTransaction, scope: dict[str, str], upsert: Any
    ) -> None:
        self._db = db
        self._conn = tx.connection
        self._scope = scope
        self._upsert = upsert

    def put(self, turn: NewTurn) -> None:
        if self._db.space is not None:
            self._db.space.ensure_room()
        key = turn.key
        self._conn.execute(
            self._upsert,
            {
                **self._scope,
                "conversation_id": key.conversation_id,
                "turn_id": key.turn_id,
                "version": 1,
                "status": PENDING,
                "text": turn.text,
                "turn_time": turn.turn_time,
                "accept_time": turn.accept_time,
                "due_time": turn.accept_time,
                "attempts": 0,
                "last_error": None,
                "question_opening": turn.question_opening,
            },
        )

    def delete_conversation(self, conversation_id: str) -> int:
        where = _where(_t, self._scope, conversation_id)
        return int(self._conn.execute(delete(_t).where(*where)).rowcount)

    def delete_all(self) -> int:
        return int(self._conn.execute(delete(_t).where(*_where(_t, self._scope))).rowcount)

    def delete_before(self, before: datetime, limit: int) -> int:
        expired = (
            select(_t.c.turn_row_id)
            .where(*_where(_t, self._scope), _t.c.turn_time < before)
            .order_by(_t.c.turn_time)
            .limit(limit)
        )
        stmt = delete(_t).where(_t.c.turn_row_id.in_(expired))
        return int(self._conn.execute(stmt).rowcount)


class _TombstoneRows:
    def __init__(self, uow: SqlUnitOfWork, tx: SqlTransaction, scope: dict[str, str]) -> None:
        self._uow = uow
        self._conn = tx.connection
        self._scope = scope

    def exists(self, conversation_id: str) -> bool:
        where = _where(_z, self._scope, conversation_id)
        return bool(self._conn.execute(select(exists().where(*where))).scalar())

    def add(self, conversation_id: str, delete_time: datetime) -> None:
        self._uow.deletions_changed = True
        self._conn.execute(
            _z.insert().values(
                **self._scope,
                conversation_id=conversation_id,
                delete_time=delete_time,
                purge_time=None,
            )
        )

    def delete_all(self) -> int:
        self._uow.deletions_changed = True
        return int(self._conn.execute(delete(_z).where(*_where(_z, self._scope))).rowcount)


class _InspectionRows:
    def __init__(self, tx: SqlTransaction, scope: dict[str, str]) -> None:
        self._conn = tx.connection
        self._scope = scope

    def delete_conversation(self, conversation_id: str) -> int:
        where = _where(_i, self._scope, conversation_id)
        return int(self._conn.execute(delete(_i).where(*where)).rowcount)

    def delete_all(self) -> int:
        return int(self._conn.execute(delete(_i).where(*_where(_i, self._scope))).rowcount)


def _where(table: Any, scope: dict[str, str], conversation_id: str | None = None) -> list[Any]:
    """The tenant's and principal's rows of `table` (of one conversation, if named)."""
    clauses = [
        table.c.tenant_id == scope["tenant_id"],
        table.c.principal_id == scope["principal_id"],
    ]
    if conversation_id is not None:
        clauses.append(table.c.conversation_id == conversation_id)
    return clauses
