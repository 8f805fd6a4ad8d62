"""The indexer's rules on the in-memory fakes: the retry policy (growing, capped, jittered
delays; a turn given up after MAX_INDEX_ATTEMPTS, never for an unreachable index), indexing
is idempotent (a turn written again replaces its chunks), and deleted conversations' chunks
are purged (a failed purge stays pending). tests/unit/test_indexer.py runs the same policy
over the real SQLite queue and embedded index."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.indexing import (
    MAX_INDEX_ATTEMPTS,
    MAX_RETRY_DELAY,
    OUTAGE_RETRY_DELAY,
    Indexer,
)
from server.domain.keywords import KeywordEncoder
from server.domain.model import IndexedChunk, TurnKey
from tests.fakes import InMemoryChunkIndex
from tests.unit.world import ANA, T0, TENANT, World

KEY = TurnKey(TENANT, "ana", "c1", "u1")


class FailingIndex(InMemoryChunkIndex):
    """The fake index, its writes failing with `error` while it is set."""

    error: Exception | None = None

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        if self.error is not None:
            raise self.error
        super().upsert_turn(key, turn_time, chunks)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        if self.error is not None:
            raise self.error
        super().delete_conversation(tenant_id, principal_id, conversation_id)


@pytest.fixture
def world() -> World:
    return World(index=FailingIndex(None, 8, "hash-embedder-8"))


def fail_with(world: World, error: Exception | None) -> None:
    assert isinstance(world.index, FailingIndex)
    world.index.error = error


def due_after_failing(world: World) -> tuple[str, int, timedelta]:
    """Run the due turns once (KEY failing); its status, attempts and the delay to its retry."""
    assert world.indexer.run_once(10) == 1
    row = world.turns.rows[KEY]
    return row.status, row.attempts, row.due_time - world.clock.now


def test_failures_retry_after_growing_jittered_delays_then_the_turn_is_indexed(
    world: World,
) -> None:
    world.say(ANA, "c1", "u1", "herons", wait=False)
    fail_with(world, ConnectionError("index unavailable"))
    for attempt in range(1, 5):
        status, attempts, delay = due_after_failing(world)
        assert (status, attempts) == ("pending", attempt)
        base = timedelta(seconds=2**attempt)
        assert base <= delay <= base * 1.25  # the jitter adds at most a quarter
        assert world.indexer.run_once(10) == 0  # not due before its time
        world.clock.now = world.turns.rows[KEY].due_time
    assert world.turns.rows[KEY].last_error == "ConnectionError"  # the type, never the text
    fail_with(world, None)
    assert world.indexer.run_once(10) == 1
    assert world.turns.status(KEY) == ("indexed", None)
    assert world.index.count(TENANT, "ana") == 1


def test_a_turn_that_keeps_failing_is_given_up(world: World) -> None:
    world.say(ANA, "c1", "u1", "herons", wait=False)
    fail_with(world, ConnectionError("index unavailable"))
    for attempt in range(1, MAX_INDEX_ATTEMPTS):
        assert due_after_failing(world)[:2] == ("pending", attempt)
        world.clock.now = world.turns.rows[KEY].due_time
    assert world.indexer.run_once(10) == 1
    assert world.turns.rows[KEY].status == "failed"
    world.clock.now += timedelta(days=1)
    assert world.indexer.run_once(10) == 0  # never claimed again by the worker


def test_the_delay_between_tries_is_capped(world: World) -> None:
    world.indexer = Indexer(
        world.turns, world.index, world.embedder, KeywordEncoder(), world.clock, max_attempts=12
    )
    world.say(ANA, "c1", "u1", "herons", wait=False)
    fail_with(world, ConnectionError("index unavailable"))
    delays = []
    for _ in range(11):
        delays.append(due_after_failing(world)[2])
        world.clock.now = world.turns.rows[KEY].due_time
    assert delays[6] < MAX_RETRY_DELAY <= delays[8]  # 2**9 s is past the cap of 5 minutes
    assert all(MAX_RETRY_DELAY <= d <= MAX_RETRY_DELAY * 1.25 for d in delays[8:])


def test_an_unreachable_index_never_makes_a_turn_give_up(world: World) -> None:
    world.say(ANA, "c1", "u1", "herons", wait=False)
    fail_with(world, MemoriaError(ErrorReason.STORE_UNAVAILABLE, "unreachable"))
    for attempt in range(1, MAX_INDEX_ATTEMPTS + 3):
        status, attempts, delay = due_after_failing(world)
        assert (status, attempts) == ("pending", attempt)
        assert delay <= OUTAGE_RETRY_DELAY * 1.25
        world.clock.now = world.turns.rows[KEY].due_time
    fail_with(world, None)
    assert world.indexer.run_once(10) == 1 and world.turns.status(KEY)[0] == "indexed"


def test_a_model_failure_fails_every_turn_of_the_batch_for_a_retry(world: World) -> None:
    world.say(ANA, "c1", "u1", "herons", wait=False)
    world.say(ANA, "c1", "u2", "otters", wait=False)
    world.embedder.fail = RuntimeError("model crashed")
    assert world.indexer.run_once(10) == 2
    assert {(r.status, r.attempts, r.last_error) for r in world.turns.rows.values()} == {
        ("pending", 1, "RuntimeError")
    }
    assert world.index.count(TENANT, "ana") == 0


def test_waiting_for_a_turn_the_index_refuses_is_unavailable_and_leaves_it_queued(
    world: World,
) -> None:
    fail_with(world, ConnectionError("index unavailable"))
    with pytest.raises(MemoriaError) as raised:
        world.say(ANA, "c1", "u1", "herons")
    assert raised.value.reason is ErrorReason.STORE_UNAVAILABLE
    assert world.turns.rows[KEY].status == "pending"


def test_indexing_a_turn_again_replaces_its_chunks(world: World) -> None:
    long = "the weather and the garden " * 200  # two chunks
    world.say(ANA, "c1", "u1", long)
    assert world.index.count(TENANT, "ana") == 2
    world.say(ANA, "c1", "u1", long)  # the same turn again
    assert world.index.count(TENANT, "ana") == 2
    world.say(ANA, "c1", "u1", "now a short turn about wrens")
    assert world.index.count(TENANT, "ana") == 1
    (hit,) = world.find(ANA, "wrens")
    assert (hit.turn_id, hit.chunk_index) == ("u1", 0)
    # The old words are gone from the keyword side (the semantic side ranks every chunk).
    assert [h.keyword_rank for h in world.find(ANA, "garden")] == [0]
    assert world.indexer.index_now(KEY)  # an indexed turn waited for again: nothing to do
    assert world.index.count(TENANT, "ana") == 1


def test_a_turn_gone_before_it_is_waited_for_is_not_indexed(world: World) -> None:
    assert world.indexer.index_now(KEY) is False


def test_deleted_conversations_are_purged_once_and_a_failed_purge_stays_pending(
    world: World,
) -> None:
    world.say(ANA, "c1", "u1", "herons")
    world.say(ANA, "c2", "u1", "otters")
    world.removal.delete_conversation(ANA, "c1")
    fail_with(world, ConnectionError("index unavailable"))
    with pytest.raises(ConnectionError):
        world.indexer.purge_once(10)
    assert world.turns.deleted_conversations(TENANT, "ana") == {"c1"}
    fail_with(world, None)
    assert world.indexer.purge_once(10) == 1
    assert world.index.count(TENANT, "ana", "c1") == 0
    assert world.index.count(TENANT, "ana", "c2") == 1
    assert world.turns.deleted_conversations(TENANT, "ana") == frozenset()
    assert world.indexer.purge_once(10) == 0
    assert [t.conversation_id for t in world.turns.list_tombstones(TENANT, "ana", 0, 10)] == [
        "c1"
    ]  # purged, still refusing late turns
    assert world.turns.list_tombstones(TENANT, "ana", 0, 10)[0].delete_time == T0
