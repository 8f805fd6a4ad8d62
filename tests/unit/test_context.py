"""The keyword context of a chunk: the conversation's order and the weighted neighbours.

The order and the vectors are pure rules (server/domain/context.py, keywords.py); the
reading from a real index is tested in tests/contract/test_chunk_index.py and through the
indexer in tests/unit/test_indexer.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from server.domain.context import conversation_order
from server.domain.keywords import CONTEXT_WEIGHT, KeywordEncoder, _index
from server.domain.model import ChunkPlace

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
