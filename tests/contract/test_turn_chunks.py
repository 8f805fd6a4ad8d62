"""`ChunkIndex.turn_chunks` (the inspector's live hit text, the export's turn text) on every
chunk index: the embedded engine, qdrant-client's local mode and the real Qdrant server, with
the fixtures of the chunk index contract."""

from __future__ import annotations

from datetime import UTC, datetime

from server.domain.ports import ChunkIndex
from tests.contract.test_chunk_index import chunk, index, key, opener  # noqa: F401 (fixtures)

WHEN = datetime(2026, 3, 1, 12, tzinfo=UTC)


def test_chunks_come_back_by_turn_in_chunk_order(index: ChunkIndex) -> None:  # noqa: F811
    index.upsert_turn(key(turn="u1"), WHEN, [chunk(i, f"part {i}") for i in (2, 0, 1)])
    index.upsert_turn(key(turn="u2"), WHEN, [chunk(0, "alone")])
    got = index.turn_chunks("t1", "ana", [("c1", "u1"), ("c1", "u2"), ("c1", "missing")])
    assert got == {("c1", "u1"): ("part 0", "part 1", "part 2"), ("c1", "u2"): ("alone",)}
    assert index.turn_chunks("t1", "ana", []) == {}


def test_only_the_owners_chunks_are_read(index: ChunkIndex) -> None:  # noqa: F811
    index.upsert_turn(key(turn="u1"), WHEN, [chunk(0, "ana's")])
    index.upsert_turn(key(principal="bob", turn="u1"), WHEN, [chunk(0, "bob's")])
    index.upsert_turn(key(tenant="t2", turn="u1"), WHEN, [chunk(0, "other tenant's")])
    assert index.turn_chunks("t1", "ana", [("c1", "u1")]) == {("c1", "u1"): ("ana's",)}
    assert index.turn_chunks("t1", "carl", [("c1", "u1")]) == {}
    assert index.turn_chunks("t3", "ana", [("c1", "u1")]) == {}


def test_a_deleted_conversations_chunks_are_gone(index: ChunkIndex) -> None:  # noqa: F811
    index.upsert_turn(key(conv="c1"), WHEN, [chunk(0, "kept")])
    index.upsert_turn(key(conv="c2"), WHEN, [chunk(0, "deleted")])
    index.delete_conversation("t1", "ana", "c2")
    assert index.turn_chunks("t1", "ana", [("c1", "u1"), ("c2", "u1")]) == {("c1", "u1"): ("kept",)}
