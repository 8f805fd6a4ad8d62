"""The keyword context of a chunk: the conversation's order and the weighted neighbours.

The order and the vectors are pure rules (server/domain/context.py, keywords.py); the
window read around a turn is checked against the whole conversation on the real embedded
index here, the reads themselves on every engine in tests/contract/test_chunk_index.py, and
the indexer's use in tests/unit/test_indexer.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from server.domain import context as context_module
from server.domain.context import (
    DenseContext,
    KeywordContext,
    conversation_order,
    dense_context_weight,
)
from server.domain.keywords import (
    CONTEXT_WEIGHT,
    ONE_NEIGHBOUR,
    TWO_NEIGHBOURS,
    KeywordEncoder,
    KeywordRepresentation,
    _index,
)
from server.domain.model import ChunkPlace, IndexedChunk, TurnKey

ENCODER = KeywordEncoder()
T0 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


def place(turn: str, chunk: int = 0, when: datetime = T0, order: int = 0) -> ChunkPlace:
    return ChunkPlace(turn_id=turn, chunk_index=chunk, turn_time=when, turn_order=order)


def test_turns_are_ordered_by_time_then_by_arrival_then_by_chunk() -> None:
    later = place("a", when=T0 + timedelta(seconds=1), order=1)
    second_chunk = place("b", 1, order=7)
    first_chunk = place("b", 0, order=7)
    arrived_first = place("z", order=3)
    assert conversation_order([later, second_chunk, first_chunk, arrived_first]) == [
        arrived_first,
        first_chunk,
        second_chunk,
        later,
    ]


def test_turns_without_a_recorded_arrival_are_ordered_by_their_ids_numbers() -> None:
    ids = ["s1-t10", "s1-t2", "s2-t1", "s1-t1"]
    assert [p.turn_id for p in conversation_order(place(t) for t in ids)] == [
        "s1-t1",
        "s1-t2",
        "s1-t10",
        "s2-t1",
    ]


def weights(vector: object) -> dict[int, float]:
    return dict(zip(vector.indices, vector.values, strict=True))  # type: ignore[attr-defined]


def test_without_context_the_vector_is_the_chunks_own() -> None:
    own = "we saw a heron"
    assert ENCODER.encode_in_context(own, []) == ENCODER.encode_document(own)
    assert ENCODER.encode_in_context(own, ["", ""]) == ENCODER.encode_document(own)


def test_neighbours_count_at_the_context_weight_and_add_to_shared_terms() -> None:
    own, before, after = "we saw a heron", "the lake at dawn", "a heron again"
    vector = weights(ENCODER.encode_in_context(own, [before, after]))
    alone = weights(ENCODER.encode_document(own))
    around = weights(ENCODER.encode_document(before + "\n\n" + after))
    assert vector[_index("lake")] == pytest.approx(CONTEXT_WEIGHT * around[_index("lake")])
    assert vector[_index("heron")] == pytest.approx(
        alone[_index("heron")] + CONTEXT_WEIGHT * around[_index("heron")]
    )
    assert vector[_index("saw")] == pytest.approx(alone[_index("saw")])
    assert vector[_index("lake")] < vector[_index("saw")]  # a neighbour's word counts less
    assert set(vector) == set(alone) | set(around)


@pytest.mark.parametrize("representation", [ONE_NEIGHBOUR, TWO_NEIGHBOURS], ids=["3", "4"])
@pytest.mark.parametrize("near", [2, 8, 32])
def test_the_window_around_a_turn_finds_the_same_neighbours_as_the_whole_conversation(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    near: int,
    representation: KeywordRepresentation,
) -> None:
    """Random conversations with many equal times and turns of several chunks, on the real
    embedded index: the vectors `turn_updates` writes from a small window (or, where the
    window cannot tell, from the whole conversation) equal those from the whole conversation,
    with one neighbour a side and with two."""
    rng = random.Random(near)
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", 4, "m")
    reads: list[tuple[str, ...]] = []
    whole = index.conversation_places

    def counted(*a: str) -> Sequence[ChunkPlace]:
        reads.append(a)
        return whole(*a)

    monkeypatch.setattr(index, "conversation_places", counted)
    try:
        keys = []
        for n in range(40):
            when = T0 + timedelta(minutes=rng.randrange(25))  # equal times are common
            key = TurnKey("t", "ana", "c1", f"u{n}")
            chunks = [
                IndexedChunk(
                    i,
                    f"turn {n} part {i} word{n}x{i}",
                    ((1.0, 0.0, 0.0, 0.0),),
                    ENCODER.encode_document("x"),
                    turn_order=n,
                )
                for i in range(rng.choice([1, 1, 1, 2, 3]))
            ]
            index.upsert_turn(key, when, chunks)
            keys.append((key, when))
        context = KeywordContext(index, ENCODER, representation)
        for key, when in keys:
            monkeypatch.setattr(context_module, "NEAR_PLACES", near)
            windowed = context.turn_updates(key, when)
            monkeypatch.setattr(context_module, "NEAR_PLACES", 10**6)
            exact = context.turn_updates(key, when)
            assert sorted(windowed, key=str) == sorted(exact, key=str), key
        if near == 2:  # a window this small never holds 2n chunks each side of a turn
            assert len(reads) == len(keys)
        else:  # the window answered, and at 8 it sometimes could not
            assert len(reads) < len(keys)
            assert reads or near == 32
    finally:
        index.close()


def test_a_context_vector_is_the_chunks_own_plus_its_neighbours_at_the_weight(
    tmp_path: Path,
) -> None:
    """DenseContext on the real embedded index: the context of a chunk is the unit vector of
    its windows' mean (made unit) plus the weight times each neighbour's, in conversation
    order; a new turn updates itself and the chunk on each side, and another conversation's
    chunks are nobody's neighbours."""
    index = QdrantEdgeChunkIndex(tmp_path / "chunks", 4, "m")
    e = [tuple(1.0 if d == n else 0.0 for d in range(4)) for n in range(4)]
    try:
        for n, windows in enumerate([(e[0],), (e[1], e[2]), (e[3],)]):
            index.upsert_turn(
                TurnKey("t", "ana", "c1", f"u{n}"),
                T0 + timedelta(minutes=n),
                [IndexedChunk(0, f"turn {n}", windows, ENCODER.encode_document("x"))],
            )
        index.upsert_turn(
            TurnKey("t", "ana", "c2", "other"),
            T0,
            [IndexedChunk(0, "elsewhere", (e[3],), ENCODER.encode_document("x"))],
        )
        updates = DenseContext(index, 0.2).turn_updates(
            TurnKey("t", "ana", "c1", "u1"), T0 + timedelta(minutes=1)
        )
        assert [(k.turn_id, chunk, windows) for k, chunk, windows, _ in updates] == [
            ("u0", 0, (e[0],)),
            ("u1", 0, (e[1], e[2])),
            ("u2", 0, (e[3],)),
        ]
        half = 1 / math.sqrt(2)  # u1's own vector: the unit mean of e1 and e2

        def unit(v: list[float]) -> list[float]:
            norm = math.sqrt(sum(x * x for x in v))
            return [x / norm for x in v]

        expected = [
            unit([1.0, 0.2 * half, 0.2 * half, 0.0]),  # u0: itself and u1 after it
            unit([0.2, half, half, 0.2]),  # u1: between u0 and u2
            unit([0.0, 0.2 * half, 0.2 * half, 1.0]),  # u2: u1 before it
        ]
        for (_, _, _, context), want in zip(updates, expected, strict=True):
            assert context == pytest.approx(want)
        assert dense_context_weight("e5-small-v2-int8:sha256-x") == 0.2
        assert dense_context_weight("all-MiniLM-L6-v2-int8:sha256-x") is None
        assert DenseContext(index, 0.2).turn_updates(TurnKey("t", "ana", "c1", "gone"), T0) == []
    finally:
        index.close()
