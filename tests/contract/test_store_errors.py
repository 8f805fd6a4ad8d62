"""A failing engine answers STORE_UNAVAILABLE, never INTERNAL, on each adapter family.

Each adapter family maps its engine's failures in one place (SQL: `sql.store_errors`; the
embedded Qdrant engine: `qdrant_edge._engine_errors`; a Qdrant server: its own, tested in
test_chunk_index.py with a port nothing listens on). Here every operation of each port meets
a real failing engine, nothing patched:
- SQL on PostgreSQL: a URL whose port nothing listens on (connection refused);
- SQL on SQLite: a database file whose directory is gone (the data dir was removed);
- the embedded Qdrant engine: a closed shard, and a shard whose directory was removed.
A request the adapter itself built wrong (a bug, not an outage) still propagates as it is.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import (
    AuditAction,
    AuditQuery,
    Change,
    EncodedQuery,
    IndexedChunk,
    NewAuditEvent,
    NewTurn,
    PrincipalMemory,
    SearchScope,
    SparseVector,
    StoredChunk,
    StoredSettings,
    TurnKey,
    Writer,
)
from tests.turn_operations import TurnOperations

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DIM = 4
KEY = TurnKey("t1", "ana", "c1", "u1")
EVENT = NewAuditEvent("ana", AuditAction.SETTINGS_UPDATED, Writer.USER, T0, memory_enabled=False)


def free_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture(params=["postgres-refused", "sqlite-dir-gone"])
def broken_sql(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlMemoryStore]:
    if request.param == "postgres-refused":
        url = f"postgresql+psycopg://memoria@127.0.0.1:{free_port()}/memoria?connect_timeout=5"
    else:
        url = sqlite_url(tmp_path / "removed-data-dir")
    store = SqlMemoryStore(SqlDatabase(create_store_engine(url, pool_size=2)))
    yield store
    store.db.dispose()


def sql_operations(store: SqlMemoryStore) -> dict[str, Callable[[], object]]:
    """Every operation of the MemoryStore and TurnStore ports on `store`."""
    turns = TurnOperations(store.db)
    change = Change(
        principal_id="ana",
        decided_on=PrincipalMemory(block=None, settings=None),
        event=EVENT,
        settings=StoredSettings(memory_enabled=False, update_time=T0),
    )

    def claim() -> None:
        with turns.claim(10, T0):
            pass

    def claim_purges() -> None:
        with turns.claim_purges(10):
            pass

    return {
        "read": lambda: store.read("t1", "ana"),
        "apply": lambda: store.apply("t1", change),
        "list_audit": lambda: store.list_audit("t1", AuditQuery(principal_id="ana")),
        "accept_turn": lambda: turns.accept_turn(NewTurn(KEY, "hello", T0, T0)),
        "claim": claim,
        "claim_purges": claim_purges,
        "deleted_conversations": lambda: turns.deleted_conversations("t1", "ana"),
        "delete_conversation": lambda: turns.delete_conversation("t1", "ana", "c1", EVENT),
        "erase_principal": lambda: turns.erase_principal("t1", "ana", EVENT, lambda: None),
        "outbox_stats": turns.outbox_stats,
    }


def test_every_sql_operation_on_a_failing_database_is_store_unavailable(
    broken_sql: SqlMemoryStore,
) -> None:
    reasons = {}
    for name, operation in sql_operations(broken_sql).items():
        with pytest.raises(MemoriaError) as raised:
            operation()
        reasons[name] = raised.value.reason
    assert reasons == dict.fromkeys(reasons, ErrorReason.STORE_UNAVAILABLE)
    assert len(reasons) == 10


def chunk() -> IndexedChunk:
    return IndexedChunk(0, "hello", ((1.0, 0.0, 0.0, 0.0),), SparseVector((7,), (1.0,)))


def edge_operations(index: QdrantEdgeChunkIndex) -> dict[str, Callable[[], object]]:
    """Every operation of the ChunkIndex port (and the adapter's own flush) on `index`."""
    query = EncodedQuery((1.0, 0.0, 0.0, 0.0), SparseVector((7,), (1.0,)))
    return {
        "upsert_turn": lambda: index.upsert_turn(KEY, T0, [chunk()]),
        "search": lambda: index.search(SearchScope("t1", "ana"), query, 10),
        "delete_conversation": lambda: index.delete_conversation("t1", "ana", "c1"),
        "delete_principal": lambda: index.delete_principal("t1", "ana"),
        "count": lambda: index.count("t1", "ana"),
        "turn_chunks": lambda: index.turn_chunks("t1", "ana", [("c1", "u1")]),
        "conversation_places": lambda: index.conversation_places("t1", "ana", "c1"),
        "places_near": lambda: index.places_near("t1", "ana", "c1", T0, 5),
        "stale_keyword_chunks": lambda: index.stale_keyword_chunks(0, 10),
        "count_stale_keyword_chunks": lambda: index.count_stale_keyword_chunks(0),
        "set_keyword_vectors": lambda: index.set_keyword_vectors(
            [(StoredChunk(KEY, 0, "hello", T0), SparseVector((7,), (1.0,)))], 0
        ),
        "check": index.check,
        "flush": index.flush,
    }


def test_every_operation_on_a_closed_embedded_index_is_store_unavailable(tmp_path: Path) -> None:
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", DIM, "m")
    index.upsert_turn(KEY, T0, [chunk()])
    assert index.count("t1", "ana") == 1
    index.close()
    reasons = {}
    for name, operation in edge_operations(index).items():
        with pytest.raises(MemoriaError) as raised:
            operation()
        reasons[name] = raised.value.reason
    assert reasons == dict.fromkeys(reasons, ErrorReason.STORE_UNAVAILABLE)
    assert len(reasons) == 13


def test_an_embedded_index_whose_directory_is_gone_is_store_unavailable(tmp_path: Path) -> None:
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", DIM, "m")
    try:
        index.upsert_turn(KEY, T0, [chunk()])
        shutil.rmtree(tmp_path / "chunks")
        with pytest.raises(MemoriaError) as raised:
            index.flush()  # the engine's I/O error: the segment files cannot be written
        assert raised.value.reason is ErrorReason.STORE_UNAVAILABLE
    finally:
        with pytest.raises(MemoriaError):
            index.close()  # close flushes too, and fails the same way


def test_a_request_built_wrong_is_not_an_outage(tmp_path: Path) -> None:
    """An engine error that is not about the store (here a query vector of the wrong
    dimension, which only a bug could send) propagates as it is and answers INTERNAL."""
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", DIM, "m")
    try:
        wrong = EncodedQuery((1.0, 0.0), SparseVector((), ()))
        with pytest.raises(Exception, match="dimension") as raised:
            index.search(SearchScope("t1", "ana"), wrong, 10)
        assert not isinstance(raised.value, MemoriaError)
        assert index.count("t1", "ana") == 0  # and the index still serves
    finally:
        index.close()


def test_every_public_operation_of_the_embedded_index_maps_engine_errors() -> None:
    """The mapping is a decorator on each operation (qdrant_edge._engine_errors); an
    operation added without it would let the engine's errors through as INTERNAL."""
    public = {
        name: member
        for name, member in vars(QdrantEdgeChunkIndex).items()
        if callable(member) and not name.startswith("_")
    }
    unmapped = sorted(name for name, member in public.items() if not hasattr(member, "__wrapped__"))
    assert unmapped == []
    assert len(public) >= 12
