"""Turn retention's rules (server/domain/retention.py) on the in-memory fakes, with a clock the
tests move: the policy (default, a tenant's own value, off), expiry out of search at once and out
of the inspector, and the purge (rows, chunks, an audit event of counts, bounded per pass)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from server.domain.inspection import TurnInspector
from server.domain.model import (
    AuditAction,
    AuditQuery,
    Identity,
    SearchBounds,
    TurnRef,
    Writer,
)
from server.domain.retention import KEEP_ALL_TURNS, TurnRetention, TurnsKept
from server.runtime.settings import InvalidSettings, Settings
from tests.unit.world import ANA, BOB, T0, TENANT, World

DAY = timedelta(days=1)
MONTH = TurnRetention(default=timedelta(days=30))


def say(world: World, who: Identity, turn: str, words: str, age: timedelta) -> None:
    """An indexed turn of `age` before the world's clock."""
    world.intake.index_turn(who, "c1", turn, words, "noted", world.clock() - age, wait=True)


def found(world: World, who: Identity, query: str, bounds: SearchBounds | None = None) -> list[str]:
    return sorted(h.turn_id for h in world.search.search(who, query, 10, bounds=bounds))


def test_a_tenants_own_value_beats_the_default_and_none_keeps_everything() -> None:
    retention = TurnRetention(
        default=timedelta(days=30), tenants={"long": timedelta(days=365), "forever": None}
    )
    assert retention.period("any") == timedelta(days=30)
    assert retention.period("long") == timedelta(days=365)
    assert retention.period("forever") is None
    assert [retention.days(t) for t in ("any", "long", "forever")] == [30, 365, 0]
    assert retention.cutoff("forever", T0) is None
    assert retention.cutoff("any", T0) == T0 - 30 * DAY
    assert retention.active and not TurnRetention().active
    assert TurnRetention(tenants={"x": None}).active is False
    assert TurnRetention(tenants={"x": DAY}).active


@pytest.mark.parametrize("period", [timedelta(0), -DAY])
def test_a_period_that_is_not_positive_is_refused(period: timedelta) -> None:
    with pytest.raises(ValueError, match="positive"):
        TurnRetention(default=period)
    with pytest.raises(ValueError, match="positive"):
        TurnRetention(tenants={"t": period})


def test_the_cutoff_is_a_lower_bound_the_later_start_wins() -> None:
    cutoff = T0 - 30 * DAY
    assert MONTH.bounded(TENANT, T0, SearchBounds()) == SearchBounds(start_time=cutoff)
    earlier = SearchBounds("c1", T0 - 90 * DAY, T0)
    assert MONTH.bounded(TENANT, T0, earlier) == SearchBounds("c1", cutoff, T0)
    later = SearchBounds(start_time=T0 - DAY)
    assert MONTH.bounded(TENANT, T0, later) == later
    assert TurnRetention().bounded(TENANT, T0, earlier) == earlier


def test_a_turn_leaves_search_the_moment_it_is_older_than_the_retention() -> None:
    world = World(retention=MONTH)
    say(world, ANA, "old", "heron notes", 29 * DAY)
    say(world, ANA, "new", "heron sketches", 2 * DAY)
    assert found(world, ANA, "heron") == ["new", "old"]
    world.clock.now += DAY  # exactly 30 days old: kept (the cutoff is inclusive)
    assert found(world, ANA, "heron") == ["new", "old"]
    world.clock.now += timedelta(microseconds=1)
    assert found(world, ANA, "heron") == ["new"]  # before any purge
    assert world.index.count(TENANT, "ana") == 2
    # A caller's span that ends before the cutoff finds nothing, and is no caller's mistake.
    assert found(world, ANA, "heron", SearchBounds(end_time=T0 - 29 * DAY)) == []


def test_off_keeps_every_turn() -> None:
    world = World()
    say(world, ANA, "ancient", "heron notes", 5000 * DAY)
    assert found(world, ANA, "heron") == ["ancient"]
    assert world.purge.purge_once(10) == 0
    assert world.index.count(TENANT, "ana") == 1


def test_the_inspector_leaves_out_a_hit_that_expired_since() -> None:
    world = World(retention=MONTH)
    say(world, ANA, "old", "heron notes", 20 * DAY)
    say(world, ANA, "new", "heron sketches", 2 * DAY)
    turn = TurnRef("c9", "now")
    world.search.search(ANA, "heron", 10, turn)

    def inspector(kept: TurnsKept) -> TurnInspector:
        return TurnInspector(
            world.inspections, world.memory, world.turns, world.index, world.clock, kept=kept
        )

    world.clock.now += 15 * DAY  # "old" is 35 days old now
    (seen,) = inspector(TurnsKept(MONTH, world.clock)).inspect(ANA, turn).searches
    assert [h.turn_id for h in seen.hits] == ["new"] and seen.hit_count == 2
    (everything,) = inspector(KEEP_ALL_TURNS).inspect(ANA, turn).searches
    assert sorted(h.turn_id for h in everything.hits) == ["new", "old"]


def test_the_purge_removes_rows_and_chunks_and_audits_the_count_only() -> None:
    world = World(retention=MONTH)
    for n in range(3):
        say(world, ANA, f"old{n}", "heron notes", 40 * DAY)
    say(world, ANA, "new", "heron sketches", DAY)
    say(world, BOB, "bob-old", "heron notes", 40 * DAY)
    assert world.purge.purge_once(2) == 2 + 1  # two of ana's (the per-principal bound), bob's
    assert world.purge.purge_once(2) == 1
    assert world.purge.purge_once(2) == 0
    assert world.index.count(TENANT, "ana") == 1 and world.index.count(TENANT, "bob") == 0
    assert [t.turn_id for t in world.turns.list_turns(TENANT, "ana", 0, 10)] == ["new"]
    events = world.memory.list_audit(
        TENANT, AuditQuery(principal_id="ana", actions=frozenset({AuditAction.TURNS_EXPIRED}))
    )
    assert [e.deleted_turn_count for e in events] == [1, 2]
    for event in events:
        assert event.writer is Writer.SERVICE and event.actor_principal_id == ""
        assert event.conversation_id == event.turn_conversation_id == event.turn_id == ""
        assert event.removed_lines == event.added_lines == ()


def test_the_purge_takes_at_most_its_limit_of_principals_per_pass() -> None:
    world = World(retention=MONTH)
    for name in ("a", "b", "c"):
        say(world, Identity(TENANT, name), "old", "heron", 40 * DAY)
    assert world.purge.purge_once(2) == 2
    assert world.purge.purge_once(2) == 1


def test_the_settings_refuse_a_tenant_no_caller_could_be_and_an_impossible_value() -> None:
    with pytest.raises(InvalidSettings, match="tenant"):
        Settings(tenant_turn_retention_days={"": 30})
    with pytest.raises(InvalidSettings, match="36500"):
        Settings(tenant_turn_retention_days={"acme": -1})
    with pytest.raises(InvalidSettings):
        Settings(turn_retention_days=-1)
    settings = Settings(turn_retention_days=30, tenant_turn_retention_days={"acme": 0})
    assert settings.memory.tenant_turn_retention_days == {"acme": 0}
