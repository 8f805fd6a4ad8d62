"""The read cache: hits, invalidation on write, and no stale entry from a racing read."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from server.adapters.sql.cache import CachedMemoryStore, ExactCache
from server.domain.model import (
    AuditAction,
    Change,
    NewAuditEvent,
    PrincipalMemory,
    StoredBlock,
    Writer,
)
from server.domain.ports import MemoryStore
from tests.fakes import InMemoryMemoryStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def inner() -> InMemoryMemoryStore:
    return InMemoryMemoryStore()


def cached(inner: InMemoryMemoryStore, **extra: object) -> CachedMemoryStore:
    options: dict[str, object] = {"max_entries": 100, "ttl_seconds": 60.0, **extra}
    return CachedMemoryStore(inner, **options)  # type: ignore[arg-type]


def write(store: MemoryStore, text: str, principal: str = "ana") -> bool:
    current = store.read("t", principal)
    event = NewAuditEvent(principal, AuditAction.BLOCK_REWRITTEN, Writer.USER, NOW)
    change = Change(principal, current, event, block=StoredBlock(text, text, NOW))
    return store.apply("t", change)


def text_of(store: CachedMemoryStore, principal: str = "ana") -> str:
    block = store.read("t", principal).block
    assert block is not None
    return block.text


def test_second_read_is_served_from_memory(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    store.reset(enabled=True)
    before = inner.reads
    assert text_of(store) == "one"
    assert text_of(store) == "one"
    assert inner.reads == before + 1


def test_a_confirm_asks_the_store_and_a_failed_one_forgets_the_copy(
    inner: InMemoryMemoryStore,
) -> None:
    store = cached(inner)
    write(store, "one")
    copy = store.read("t", "ana")
    assert store.confirm("t", "ana", copy)
    write(inner, "changed elsewhere")  # another server's write: this cache has not heard
    assert text_of(store) == "one"  # the stale copy
    before = inner.reads
    assert not store.confirm("t", "ana", copy)
    assert text_of(store) == "changed elsewhere"
    assert inner.reads == before + 2  # the confirm, then the read that reloaded


def test_a_write_is_read_back_at_once(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    text_of(store)
    assert write(store, "two")
    assert text_of(store) == "two"


def test_a_write_leaves_what_it_wrote_in_the_cache(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    assert write(store, "one")
    before = inner.reads
    assert text_of(store) == "one"
    assert inner.reads == before  # the render after a write needs no database


def test_a_write_forgets_only_its_principal(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "ana's")
    write(store, "bob's", principal="bob")
    text_of(store)
    text_of(store, "bob")
    write(store, "ana's again")
    before = inner.reads
    assert text_of(store, "bob") == "bob's"
    assert inner.reads == before  # bob still cached
    assert text_of(store) == "ana's again"


def test_a_refused_write_still_forgets(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    text_of(store)
    stale = Change(
        "ana",
        PrincipalMemory(StoredBlock("older", "not-the-etag", NOW), None),
        NewAuditEvent("ana", AuditAction.BLOCK_DELETED, Writer.USER, NOW),
        delete_block=True,
    )
    assert not store.apply("t", stale)
    before = inner.reads
    text_of(store)
    assert inner.reads == before + 1


def test_a_read_racing_a_write_is_not_cached(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "old")
    store.reset(enabled=True)  # so the next read goes to the store

    class RacingInner(InMemoryMemoryStore):
        """Returns the old value while a write commits and invalidates mid-read."""

        def read(
            self, tenant_id: str, principal_id: str, *, fresh: bool = False
        ) -> PrincipalMemory:
            value = inner.read(tenant_id, principal_id)
            store._inner = inner
            write(store, "new")
            return value

    store._inner = RacingInner()
    assert text_of(store) == "old"  # the racing read answers what it read...
    assert text_of(store) == "new"  # ...but did not cache it


def test_disabled_cache_always_reads_the_store(inner: InMemoryMemoryStore) -> None:
    store = cached(inner, enabled=False)
    write(store, "one")
    before = inner.reads
    text_of(store)
    text_of(store)
    assert inner.reads == before + 2
    store.reset(enabled=True)
    text_of(store)
    text_of(store)
    assert inner.reads == before + 3


def test_reset_forgets_everything(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    text_of(store)
    inner.blocks[("t", "ana")] = StoredBlock("changed by hand", "e", NOW)
    store.reset(enabled=True)
    assert text_of(store) == "changed by hand"


def test_entries_expire(inner: InMemoryMemoryStore) -> None:
    clock = Clock()
    store = cached(inner, ttl_seconds=60.0, timer=clock)
    write(store, "one")
    text_of(store)
    inner.blocks[("t", "ana")] = StoredBlock("changed by hand", "e", NOW)
    clock.now = 59.0
    assert text_of(store) == "one"
    clock.now = 61.0
    assert text_of(store) == "changed by hand"


def test_exact_cache_keeps_loads_and_forgets_on_invalidation() -> None:
    cache: ExactCache[str, frozenset[str]] = ExactCache(max_entries=10)
    loads: list[str] = []

    def load(value: frozenset[str]) -> Callable[[], frozenset[str]]:
        def run() -> frozenset[str]:
            loads.append("x")
            return value

        return run

    assert cache.get("k", load(frozenset())) == frozenset()
    assert cache.get("k", load(frozenset({"never"}))) == frozenset()  # served from memory
    assert len(loads) == 1
    cache.invalidate("k")
    assert cache.get("k", load(frozenset({"c1"}))) == {"c1"}
    assert len(loads) == 2


def test_exact_cache_does_not_keep_a_load_that_raced_an_invalidation() -> None:
    cache: ExactCache[str, str] = ExactCache(max_entries=10)

    def slow_load() -> str:
        cache.invalidate("k")  # a write committed while this (older) read was running
        return "stale"

    assert cache.get("k", slow_load) == "stale"  # returned to its caller ...
    assert cache.get("k", lambda: "fresh") == "fresh"  # ... but never kept


def test_a_write_racing_writes_of_other_principals_stays_cached(
    inner: InMemoryMemoryStore,
) -> None:
    """Under load, writes of different principals overlap; each keeps its result cached."""
    store = cached(inner)
    write(store, "bob's", principal="bob")

    class OverlappingInner(InMemoryMemoryStore):
        """While ana's write is in the store, bob's write and a read of carl run and end."""

        def apply(self, tenant_id: str, change: Change) -> bool:
            store._inner = inner
            write(store, "bob's again", principal="bob")
            store.read("t", "carl")
            return inner.apply(tenant_id, change)

    store._inner = OverlappingInner()
    assert write(store, "ana's")
    before = inner.reads
    assert text_of(store) == "ana's"
    assert text_of(store, "bob") == "bob's again"
    assert store.read("t", "carl").block is None
    assert inner.reads == before  # all three served from memory


def test_overlapping_writes_of_one_principal_are_not_cached(inner: InMemoryMemoryStore) -> None:
    """Two writes of one principal overlap: which committed last is unknown, so neither is
    kept, and the next read goes to the store."""
    store = cached(inner)
    write(store, "one")

    class OverlappingInner(InMemoryMemoryStore):
        def apply(self, tenant_id: str, change: Change) -> bool:
            store._inner = inner
            write(store, "two")  # begins after ours, ends first
            return inner.apply(tenant_id, change)

    store._inner = OverlappingInner()
    write(store, "three")
    before = inner.reads
    text_of(store)
    assert inner.reads == before + 1


def test_a_failed_read_leaves_nothing_behind(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    store.reset(enabled=True)

    class FailingInner(InMemoryMemoryStore):
        def read(
            self, tenant_id: str, principal_id: str, *, fresh: bool = False
        ) -> PrincipalMemory:
            raise RuntimeError("lost connection")

    store._inner = FailingInner()
    with pytest.raises(RuntimeError):
        store.read("t", "ana")
    assert not store._races._open  # no run of ana is left open
    store._inner = inner
    assert text_of(store) == "one"


def test_exact_cache_keeps_a_load_that_overlapped_another_key() -> None:
    cache: ExactCache[str, str] = ExactCache(max_entries=10)

    def load_while_other_key_changes() -> str:
        cache.invalidate("other")
        return "value"

    assert cache.get("k", load_while_other_key_changes) == "value"
    assert cache.get("k", lambda: "never loaded") == "value"


def test_a_read_that_began_during_a_write_does_not_cache_what_it_read_before_the_commit(
    inner: InMemoryMemoryStore,
) -> None:
    """A read of the principal starts while a write is in the store, loads the state before the
    write commits, and ends after the write has ended: it must not replace the write's result
    in the cache (seen under the failover test's load, where IndexTurn reads the principal
    that the model rewrites)."""
    store = cached(inner)
    write(store, "old")
    store.reset(enabled=True)
    write_in_store, read_loaded, write_done = (threading.Event() for _ in range(3))

    class Interleaving(InMemoryMemoryStore):
        def apply(self, tenant_id: str, change: Change) -> bool:
            write_in_store.set()
            assert read_loaded.wait(10)
            return inner.apply(tenant_id, change)

        def read(
            self, tenant_id: str, principal_id: str, *, fresh: bool = False
        ) -> PrincipalMemory:
            if threading.current_thread() is threading.main_thread():
                return inner.read(tenant_id, principal_id)  # the writer's own read
            value = inner.read(tenant_id, principal_id)  # before the write commits
            read_loaded.set()
            assert write_done.wait(10)
            return value

    store._inner = Interleaving()
    raced: list[str] = []

    def reader() -> None:
        assert write_in_store.wait(10)
        raced.append(text_of(store))

    thread = threading.Thread(target=reader)
    thread.start()
    assert write(store, "new")
    write_done.set()
    thread.join(10)
    assert raced == ["old"]  # the racing read answers what it read...
    store._inner = inner
    assert text_of(store) == "new"  # ...but the cache keeps the write's result
