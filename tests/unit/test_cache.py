"""The read cache: hits, invalidation on write, and no stale entry from a racing read."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from server.domain.model import PrincipalMemory, StoredBlock
from server.storage.cache import CachedMemoryStore
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


def write(store: CachedMemoryStore, text: str, principal: str = "ana") -> None:
    with store.transaction("t", lock_principal=principal) as tx:
        tx.put_block(principal, StoredBlock(text, text, NOW))


def test_second_read_is_served_from_memory(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    before = inner.transactions
    assert store.read("t", "ana").block.text == "one"  # type: ignore[union-attr]
    assert store.read("t", "ana").block.text == "one"  # type: ignore[union-attr]
    assert inner.transactions == before + 1


def test_a_write_is_read_back_at_once(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    store.read("t", "ana")
    write(store, "two")
    assert store.read("t", "ana").block.text == "two"  # type: ignore[union-attr]


def test_a_write_forgets_only_its_principal(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "ana's")
    write(store, "bob's", principal="bob")
    store.read("t", "ana")
    store.read("t", "bob")
    before = inner.transactions
    write(store, "ana's again")
    store.read("t", "bob")
    assert inner.transactions == before + 1  # the write; bob still cached


def test_failed_write_still_forgets(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    store.read("t", "ana")
    with pytest.raises(RuntimeError), store.transaction("t", lock_principal="ana"):
        raise RuntimeError
    before = inner.transactions
    store.read("t", "ana")
    assert inner.transactions == before + 1


def test_a_read_racing_a_write_is_not_cached(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "old")

    class RacingInner:
        """Returns the old value, while a write commits and invalidates mid-read."""

        def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
            value = inner.read(tenant_id, principal_id)
            write(store, "new")
            return value

        def transaction(self, *args: object, **kwargs: object) -> object:
            return inner.transaction(*args, **kwargs)  # type: ignore[arg-type]

    store._inner = RacingInner()  # type: ignore[assignment]
    assert store.read("t", "ana").block.text == "old"  # type: ignore[union-attr]
    store._inner = inner
    assert store.read("t", "ana").block.text == "new"  # type: ignore[union-attr]


def test_disabled_cache_always_reads_the_store(inner: InMemoryMemoryStore) -> None:
    store = cached(inner, enabled=False)
    write(store, "one")
    before = inner.transactions
    store.read("t", "ana")
    store.read("t", "ana")
    assert inner.transactions == before + 2
    store.reset(enabled=True)
    store.read("t", "ana")
    store.read("t", "ana")
    assert inner.transactions == before + 3


def test_reset_forgets_everything(inner: InMemoryMemoryStore) -> None:
    store = cached(inner)
    write(store, "one")
    store.read("t", "ana")
    inner.blocks[("t", "ana")] = StoredBlock("changed by hand", "e", NOW)
    store.reset(enabled=True)
    assert store.read("t", "ana").block.text == "changed by hand"  # type: ignore[union-attr]


def test_entries_expire(inner: InMemoryMemoryStore) -> None:
    clock = Clock()
    store = cached(inner, ttl_seconds=60.0, timer=clock)
    write(store, "one")
    store.read("t", "ana")
    inner.blocks[("t", "ana")] = StoredBlock("changed by hand", "e", NOW)
    clock.now = 59.0
    assert store.read("t", "ana").block.text == "one"  # type: ignore[union-attr]
    clock.now = 61.0
    assert store.read("t", "ana").block.text == "changed by hand"  # type: ignore[union-attr]
