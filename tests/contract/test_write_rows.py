"""What a write carries is declared once (`write_rows`, server/adapters/sql/blocks.py) and stored
whole by every store: every field of an audit event round-trips on each of them, PostgreSQL's
`memoria_write()` and its plain path included, and the rows name exactly the tables' columns.

Adding a field to `NewAuditEvent` (and its column) makes these tests check it too: they
iterate over the dataclass, not over a list kept by hand.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from server.adapters.sql.blocks import SqlMemoryStore, write_rows
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine
from server.adapters.sql.tables import audit_events, memory_blocks, memory_settings
from server.domain.model import (
    AuditAction,
    AuditQuery,
    Change,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    StoredSettings,
    Writer,
)
from server.domain.ports import MemoryStore
from tests.conftest import PgDatabase

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def _every_field_set(principal: str) -> NewAuditEvent:
    """An event whose every field differs from its default (so a dropped field shows)."""
    values: dict[str, object] = {}
    for f in dataclasses.fields(NewAuditEvent):
        if f.name == "principal_id":
            values[f.name] = principal
        elif f.type == "AuditAction":
            values[f.name] = AuditAction.BLOCK_REWRITTEN
        elif f.type == "Writer":
            values[f.name] = Writer.MODEL
        elif f.type == "datetime":
            values[f.name] = T0
        elif f.type == "tuple[str, ...]":
            values[f.name] = (f'{f.name} ✓ "quoted", (x) \\ y', "second line")
        elif f.type == "int":
            values[f.name] = 7 + len(values)
        elif f.type == "bool | None":
            values[f.name] = False
        elif f.type == "str":
            values[f.name] = f'{f.name}-value "q", (p) \\'  # what a row literal must quote
        else:
            raise AssertionError(f"no test value for {f.name}: {f.type}")
    event = NewAuditEvent(**values)  # type: ignore[arg-type]
    for f in dataclasses.fields(NewAuditEvent):
        if f.default is not dataclasses.MISSING:
            assert getattr(event, f.name) != f.default, f.name
    return event


def test_every_audit_field_is_stored_by_every_store(store: MemoryStore, tenant: str) -> None:
    event = _every_field_set("ana")
    current = store.read(tenant, "ana")
    block = StoredBlock("a line", "e1", T0)
    assert store.apply(tenant, Change("ana", current, event, block=block))
    (stored,) = store.list_audit(tenant, AuditQuery(principal_id="ana"))
    assert stored.event_id > 0
    for f in dataclasses.fields(NewAuditEvent):
        assert getattr(stored, f.name) == getattr(event, f.name), f.name


def test_the_store_executes_deletion_and_blanking_as_asked(store: MemoryStore, tenant: str) -> None:
    """The store decides neither: a deletion keeps earlier lines unless asked to blank them."""
    lines = NewAuditEvent("ana", AuditAction.BLOCK_REWRITTEN, Writer.USER, T0, added_lines=("x",))
    assert store.apply(
        tenant, Change("ana", store.read(tenant, "ana"), lines, block=StoredBlock("x", "e", T0))
    )
    deleted = NewAuditEvent("ana", AuditAction.BLOCK_DELETED, Writer.USER, T0)
    assert store.apply(tenant, Change("ana", store.read(tenant, "ana"), deleted, delete_block=True))
    assert store.read(tenant, "ana").block is None
    assert [e.added_lines for e in store.list_audit(tenant, AuditQuery("ana"))] == [(), ("x",)]


def test_the_rows_name_exactly_the_tables_columns() -> None:
    change = Change(
        "ana",
        decided_on=PrincipalMemory(block=None, settings=None),
        event=_every_field_set("ana"),
        block=StoredBlock("text", "e", T0),
        settings=StoredSettings(memory_enabled=False, update_time=T0),
    )
    rows = write_rows("t", change)
    assert rows.block is not None and rows.settings is not None
    assert set(rows.block) == {c.name for c in memory_blocks.columns}
    assert set(rows.settings) == {c.name for c in memory_settings.columns}
    assert set(rows.event) == {c.name for c in audit_events.columns} - {"event_id"}


@pytest.mark.postgres
def test_a_write_survives_a_column_added_while_the_server_runs(
    postgres: PgDatabase, tenant: str
) -> None:
    """The fast path's row literals follow the table's columns as the database has them: a
    server that read them before a migration added one reads them again and writes."""
    store = SqlMemoryStore(SqlDatabase(create_store_engine(postgres.app_url, pool_size=1)))
    try:
        first = NewAuditEvent("ana", AuditAction.BLOCK_REWRITTEN, Writer.USER, T0)
        block = StoredBlock("one", "e1", T0)
        assert store.apply(tenant, Change("ana", store.read(tenant, "ana"), first, block=block))
        columns = store._columns
        assert columns is not None
        # As if the server had read them before `audit_events` gained its last column.
        store._columns = {**columns, "audit_events": columns["audit_events"][:-1]}
        second = NewAuditEvent("ana", AuditAction.BLOCK_REWRITTEN, Writer.USER, T0)
        two = StoredBlock("two", "e2", T0)
        assert store.apply(tenant, Change("ana", store.read(tenant, "ana"), second, block=two))
        assert store._columns == columns
        assert [e.action for e in store.list_audit(tenant, AuditQuery("ana"))] == [
            AuditAction.BLOCK_REWRITTEN,
            AuditAction.BLOCK_REWRITTEN,
        ]
    finally:
        store.db.dispose()
