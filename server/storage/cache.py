"""A read cache in front of the memory store, for the render path (every turn, every
conversation), kept correct by invalidation on every write.

Within one process a write invalidates its principal as soon as it commits, so a caller
always reads its own writes. Across replicas, PostgreSQL delivers each committed write as a
NOTIFY (sent inside the write transaction, so only committed writes are announced) to
`PostgresChangeListener`, which invalidates within milliseconds. While the listener is not
connected the cache is off (every read goes to the database) and it starts empty whenever the
listener (re)connects, so a missed notification can never leave a stale entry. Rows changed
by other means than Memoria (hand-written SQL) show within the entry lifetime (TTL).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

import psycopg
from cachetools import LRUCache, TTLCache

from server.domain.model import AuditEvent, AuditQuery, Change, PrincipalMemory
from server.domain.ports import MemoryStore
from server.storage.engine import CHANGE_CHANNEL, KEY_SEPARATOR

log = logging.getLogger(__name__)


class CachedMemoryStore:
    """`MemoryStore` that serves `read` from memory and forgets a principal when it changes.

    Every write names the principal it changes; that principal is invalidated once the write
    has ended. A read that overlaps an invalidation is not cached (a generation counter), so a
    slow read can never store a value older than a write it raced with. `fresh` reads bypass
    the cache (writes decide on them when it matters).
    """

    def __init__(
        self,
        inner: MemoryStore,
        *,
        max_entries: int,
        ttl_seconds: float,
        enabled: bool = True,
        timer: Callable[[], float] | None = None,
    ):
        self._inner = inner
        self._cache: TTLCache[tuple[str, str], PrincipalMemory] = (
            TTLCache(max_entries, ttl_seconds, timer=timer)
            if timer is not None
            else TTLCache(max_entries, ttl_seconds)
        )
        self._lock = threading.Lock()
        self._generation = 0
        self._enabled = enabled

    @property
    def enabled(self) -> bool:
        return self._enabled

    def read(self, tenant_id: str, principal_id: str, *, fresh: bool = False) -> PrincipalMemory:
        key = (tenant_id, principal_id)
        with self._lock:
            if self._enabled and not fresh:
                hit = self._cache.get(key)
                if hit is not None:
                    return hit
            generation = self._generation
        value = self._inner.read(tenant_id, principal_id)
        with self._lock:
            if self._enabled and generation == self._generation:
                self._cache[key] = value
        return value

    def apply(self, tenant_id: str, change: Change) -> bool:
        """Apply through the store; then remember the memory as the write left it (the next
        render, usually right after the model wrote, needs no database), or forget it."""
        key = (tenant_id, change.principal_id)
        with self._lock:
            self._generation += 1
            self._cache.pop(key, None)
            generation = self._generation
        applied = False
        try:
            applied = self._inner.apply(tenant_id, change)
        finally:
            # Remember only if no other write to this process's cache came in between (an
            # invalidation moved the generation on); after a failure, whether it committed may
            # be unknown (a lost connection), so forget.
            with self._lock:
                if applied and self._enabled and generation == self._generation:
                    self._cache[key] = change.after
                else:
                    self._generation += 1
                    self._cache.pop(key, None)
        return applied

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        return self._inner.list_audit(tenant_id, query)

    def invalidate(self, tenant_id: str, principal_id: str) -> None:
        """Forget one principal (its memory changed)."""
        with self._lock:
            self._generation += 1
            self._cache.pop((tenant_id, principal_id), None)

    def reset(self, *, enabled: bool) -> None:
        """Forget everything, and turn caching on or off (off while changes may be missed)."""
        with self._lock:
            self._generation += 1
            self._cache.clear()
            self._enabled = enabled


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ExactCache(Generic[K, V]):
    """A cache that is never stale, for data only this process writes (the embedded store).

    The writer invalidates a key after its change commits; a load that overlaps any
    invalidation is returned but not kept (a generation counter, as in CachedMemoryStore), so
    a slow load can never store a value older than a write it raced with.
    """

    def __init__(self, max_entries: int) -> None:
        self._entries: LRUCache[K, V] = LRUCache(max_entries)
        self._lock = threading.Lock()
        self._generation = 0

    def get(self, key: K, load: Callable[[], V]) -> V:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                return hit
            generation = self._generation
        value = load()
        with self._lock:
            if generation == self._generation:
                self._entries[key] = value
        return value

    def invalidate(self, key: K) -> None:
        with self._lock:
            self._generation += 1
            self._entries.pop(key, None)


LISTENER_APPLICATION_NAME = "memoria-listener"
"""How the listener's connection shows in pg_stat_activity."""


class Invalidations(Protocol):
    """Where the listener reports what it hears."""

    def invalidate(self, tenant_id: str, principal_id: str) -> None: ...

    def reset(self, *, enabled: bool) -> None: ...


class PostgresChangeListener:
    """A thread that LISTENs for committed memory changes of other replicas (notifications
    of `own_origin`, this server's store, are skipped: its cache already holds the result).

    It turns the cache on only once it is listening, turns it off (and empties it) the moment
    its connection fails, and reconnects with backoff. A liveness query every `check_seconds`
    finds a connection that died silently.
    """

    def __init__(
        self,
        conninfo: str,
        target: Invalidations,
        *,
        own_origin: str = "",
        check_seconds: float = 1.0,
    ):
        self._conninfo = conninfo
        self._target = target
        self._own_origin = own_origin
        self._check = check_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memoria-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; it does within `check_seconds` (not waited for: it holds
        nothing that shutdown needs, and its own connection closes with it)."""
        self._stop.set()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                with psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=LISTENER_APPLICATION_NAME,
                ) as conn:
                    conn.execute(f"LISTEN {CHANGE_CHANNEL}")
                    self._target.reset(enabled=True)
                    log.info("read cache on: listening for memory changes")
                    backoff = 0.2
                    while not self._stop.is_set():
                        # psycopg keeps notifications that arrive during the liveness query
                        # for the next notifies() call, so none is lost between the two.
                        for note in conn.notifies(timeout=self._check):
                            origin, tenant, principal = note.payload.split(KEY_SEPARATOR, 2)
                            if origin != self._own_origin:  # our own: already in the cache
                                self._target.invalidate(tenant, principal)
                        conn.execute("SELECT 1")
            except psycopg.Error as error:
                self._target.reset(enabled=False)
                if self._stop.is_set():
                    break
                log.warning("read cache off: change listener failed (%s)", type(error).__name__)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        self._target.reset(enabled=False)
