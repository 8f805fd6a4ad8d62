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

from server.adapters.sql.engine import CHANGE_CHANNEL, KEY_SEPARATOR
from server.domain.model import AuditEvent, AuditQuery, Change, PrincipalMemory
from server.domain.ports import MemoryStore

log = logging.getLogger(__name__)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Races(Generic[K]):
    """Tells a load (or a write) of a key whether the key was invalidated while it ran, so
    that its result is cached only if it cannot be older than what the store now holds.

    Per key: work on other keys never spoils a ticket, so concurrent writes of different
    principals all keep their results (a single counter for the whole cache made almost every
    write under load miss its cache entry). A key is tracked only while a run of it is
    open. Not thread-safe: the owner calls it under its own lock.
    """

    def __init__(self) -> None:
        self._open: dict[K, list[int]] = {}  # key -> [runs open, invalidations seen]

    def start(self, key: K) -> int:
        """A run of `key` begins; pass the ticket to `end`, always (also after a failure)."""
        entry = self._open.get(key)
        if entry is None:
            entry = self._open[key] = [0, 0]
        entry[0] += 1
        return entry[1]

    def end(self, key: K, ticket: int) -> bool:
        """The run ends; True if `key` was not invalidated since its `start`."""
        entry = self._open[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._open[key]
        return entry[1] == ticket

    def spoil(self, key: K) -> None:
        """`key` changed: no run of it open now may cache its result."""
        entry = self._open.get(key)
        if entry is not None:
            entry[1] += 1

    def spoil_all(self) -> None:
        for entry in self._open.values():
            entry[1] += 1


class CachedMemoryStore:
    """`MemoryStore` that serves `read` from memory and forgets a principal when it changes.

    Every write names the principal it changes; that principal is invalidated once the write
    has ended. A read that overlaps an invalidation of its principal (a write's start and its
    end both count) is not cached (`Races`), so a slow read can never store a value older than
    a write it raced with, while reads and writes of other principals never stop each other
    from being cached. A write that finds its cached copy stale (a lost `apply`, a failed
    `confirm`) forgets it. The domain does not know the cache is there: it decides on `read`
    and checks with `apply` and `confirm`.
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
        self._races: Races[tuple[str, str]] = Races()
        self._enabled = enabled

    @property
    def enabled(self) -> bool:
        return self._enabled

    def read(self, tenant_id: str, principal_id: str) -> PrincipalMemory:
        key = (tenant_id, principal_id)
        with self._lock:
            if self._enabled:
                hit = self._cache.get(key)
                if hit is not None:
                    return hit
            ticket = self._races.start(key)
        loaded = False
        try:
            value = self._inner.read(tenant_id, principal_id)
            loaded = True
            return value
        finally:
            with self._lock:
                if self._races.end(key, ticket) and self._enabled and loaded:
                    self._cache[key] = value

    def apply(self, tenant_id: str, change: Change) -> bool:
        """Apply through the store; then remember the memory as the write left it (the next
        render, usually right after the model wrote, needs no database), or forget it."""
        key = (tenant_id, change.principal_id)
        with self._lock:
            self._forget(key)
            ticket = self._races.start(key)
        applied = False
        try:
            applied = self._inner.apply(tenant_id, change)
        finally:
            # Remember only if no other write of this principal reached this process's cache
            # in between (it would have ended this ticket's run); after a failure, whether it
            # committed may be unknown (a lost connection), so forget. Either way, a read of
            # the principal still running began after this write did and may have loaded the
            # state from before its commit: it must not replace what is kept now.
            with self._lock:
                kept = self._races.end(key, ticket) and applied and self._enabled
                self._forget(key)
                if kept:
                    self._cache[key] = change.after
        return applied

    def confirm(self, tenant_id: str, principal_id: str, memory: PrincipalMemory) -> bool:
        """Asks the store; a copy found stale is forgotten, so the next read loads anew."""
        confirmed = self._inner.confirm(tenant_id, principal_id, memory)
        if not confirmed:
            self.invalidate(tenant_id, principal_id)
        return confirmed

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        return self._inner.list_audit(tenant_id, query)

    def invalidate(self, tenant_id: str, principal_id: str) -> None:
        """Forget one principal (its memory changed)."""
        with self._lock:
            self._forget((tenant_id, principal_id))

    def reset(self, *, enabled: bool) -> None:
        """Forget everything, and turn caching on or off (off while changes may be missed)."""
        with self._lock:
            self._races.spoil_all()
            self._cache.clear()
            self._enabled = enabled

    def _forget(self, key: tuple[str, str]) -> None:
        self._races.spoil(key)
        self._cache.pop(key, None)


class ExactCache(Generic[K, V]):
    """A cache that is never stale, for data only this process writes (the embedded store).

    The writer invalidates a key after its change commits; a load that overlaps an
    invalidation of its key is returned but not kept (`Races`, as in CachedMemoryStore), so
    a slow load can never store a value older than a write it raced with.
    """

    def __init__(self, max_entries: int) -> None:
        self._entries: LRUCache[K, V] = LRUCache(max_entries)
        self._lock = threading.Lock()
        self._races: Races[K] = Races()

    def get(self, key: K, load: Callable[[], V]) -> V:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                return hit
            ticket = self._races.start(key)
        loaded = False
        try:
            value = load()
            loaded = True
            return value
        finally:
            with self._lock:
                if self._races.end(key, ticket) and loaded:
                    self._entries[key] = value

    def invalidate(self, key: K) -> None:
        with self._lock:
            self._races.spoil(key)
            self._entries.pop(key, None)


LISTENER_APPLICATION_NAME = "memoria-listener"
"""How the listener's connection shows in pg_stat_activity, followed by a space and its
server's origin: migration 0007's registration counts the listeners by these names."""


class Invalidations(Protocol):
    """Where the listener reports what it hears."""

    def invalidate(self, tenant_id: str, principal_id: str) -> None: ...

    def reset(self, *, enabled: bool) -> None: ...


class PostgresChangeListener:
    """A thread that LISTENs for committed memory changes of other replicas (notifications
    of `own_origin`, this server's store, are skipped: its cache already holds the result).

    It turns the cache on only once it is listening and registered (migration 0007: from
    then on every other server's writes are announced to it, and while this server's is the
    only listener, its own writes are not announced at all), turns it off (and empties it) the
    moment its connection fails, and reconnects with backoff. A liveness query every
    `check_seconds` finds a connection that died silently.
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
                    application_name=f"{LISTENER_APPLICATION_NAME} {self._own_origin}".strip(),
                ) as conn:
                    conn.execute(f"LISTEN {CHANGE_CHANNEL}")
                    # Waits for the writes in flight that may not have announced (none
                    # listened but their own server); every later one sees this listener.
                    conn.execute("SELECT memoria_register_listener()")
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
