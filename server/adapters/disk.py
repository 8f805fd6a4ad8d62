"""Free space on the data dir: a watermark below which the embedded stores take no new data.

Why: on a full filesystem SQLite's writes fail cleanly, but the embedded Qdrant engine writes
through memory-mapped files, and a page the kernel cannot back kills the process with SIGBUS
(observed: writes first answered STORE_UNAVAILABLE, seconds later the process died, and it
could not restart until far more space was freed). So, as databases and search engines do
(Elasticsearch's flood-stage watermark, etcd's quota, PostgreSQL operators' reserve), writes
stop while free space is below a watermark, well before the engines meet a full disk:

- the watermark is `max(min_free_bytes, min_free_percent of the filesystem)` (defaults 256 MiB
  and 5 %, `MEMORIA_DISK_MIN_FREE_BYTES` / `MEMORIA_DISK_MIN_FREE_PERCENT`): 256 MiB leaves
  room for the engines' own allocations (a WAL segment, a SQLite checkpoint) on a small
  volume, 5 % keeps the reserve proportionate on a large one;
- while short, what adds data is refused with STORAGE_FULL (RESOURCE_EXHAUSTED): a block
  rewrite, a settings change, accepting a turn, and the indexing worker pauses before it
  claims turns (so nothing is written to the engine's memory-mapped files and no turn uses up
  its retries); what removes data is still allowed (deleting a block or a conversation,
  erasure, the background purge): each writes a few records, and they are how space and a
  person's right to erasure are served; reads are never affected;
- service resumes by itself: the reading is taken again at most every `max_age_seconds`;
- a server that starts below the watermark refuses to start, in one line (`startup_refusal`).

Where it is checked: `SqlMemoryStore.apply` (for a change that writes a block or settings),
the unit of work's `turns.put` (server/adapters/sql/unit_of_work.py, accepting a turn), and
`IndexWorker` before each batch (server/runtime/worker.py).

The check is on the write path, so a reading is cached: `os.statvfs` costs about 2 µs and
releases the GIL (a hand-off to another thread under load), a cached answer about 0.2 µs
(measured on this machine). A stale answer of up to `max_age_seconds` (0.25 s) cannot matter:
Memoria's writes are kilobytes each, far below any watermark.

On PostgreSQL and a Qdrant server the data dir holds nothing of the stores, so no guard is
built (`FreeSpace.for_settings` returns None); those servers answer a full disk themselves
(docs/operations.md, "A full disk").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from server.domain.errors import ErrorReason, MemoriaError, StorageFull

MiB = 1 << 20

DEFAULT_MIN_FREE_BYTES = 256 * MiB
DEFAULT_MIN_FREE_PERCENT = 5.0
DEFAULT_MAX_AGE_SECONDS = 0.25


@dataclass(frozen=True)
class DiskReading:
    """One look at the filesystem: bytes available to this process, its size, the watermark."""

    free_bytes: int
    total_bytes: int
    watermark_bytes: int

    @property
    def short(self) -> bool:
        """Free space is below the watermark: no new data may be written."""
        return self.free_bytes < self.watermark_bytes

    def describe(self) -> str:
        """'12.0 MiB free of 64.0 MiB, below the watermark of 16.0 MiB' (for logs, errors)."""
        where = "below" if self.short else "above"
        return (
            f"{self.free_bytes / MiB:.1f} MiB free of {self.total_bytes / MiB:.1f} MiB, "
            f"{where} the watermark of {self.watermark_bytes / MiB:.1f} MiB"
        )


Statvfs = Callable[[Path], os.statvfs_result]


class FreeSpace:
    """The data dir's free space against its watermark, read at most every `max_age_seconds`.

    Thread-safe without a lock: a reading is an immutable value replaced whole; two threads
    refreshing at once both take a true reading. It logs nothing: the health monitor probes it
    every second and logs each transition once (server/runtime/health.py).
    """

    def __init__(
        self,
        path: Path,
        *,
        min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
        min_free_percent: float = DEFAULT_MIN_FREE_PERCENT,
        max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
        statvfs: Statvfs = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._min_free_bytes = min_free_bytes
        self._min_free_fraction = min_free_percent / 100.0
        self._max_age = max_age_seconds
        self._statvfs = statvfs
        self._clock = clock
        self._reading = self._read()
        self._read_at = clock()

    @property
    def path(self) -> Path:
        """The directory whose filesystem is watched."""
        return self._path

    def reading(self) -> DiskReading:
        """The current reading (taken again when the cached one is older than max age)."""
        now = self._clock()
        if now - self._read_at >= self._max_age:
            self._reading, self._read_at = self._read(), now
        return self._reading

    def fresh(self) -> DiskReading:
        """A reading taken now (for the health monitor and start-up)."""
        self._read_at = self._clock() - self._max_age
        return self.reading()

    def ensure_room(self) -> None:
        """Return if new data may be written now; else raise STORAGE_FULL."""
        reading = self.reading()
        if reading.short:
            raise storage_full(reading)

    def check(self) -> None:
        """Health probe: raise while short (the monitor reports it and logs the transition)."""
        reading = self.fresh()
        if reading.short:
            raise DiskShort(reading.describe())

    def _read(self) -> DiskReading:
        stat = self._statvfs(self._path)
        total = stat.f_blocks * stat.f_frsize
        watermark = max(self._min_free_bytes, int(total * self._min_free_fraction))
        return DiskReading(stat.f_bavail * stat.f_frsize, total, watermark)


class DiskShort(Exception):
    """Raised by the health probe while the data dir is below its watermark."""


def storage_full(reading: DiskReading) -> MemoriaError:
    """The STORAGE_FULL error, with the figures an operator needs in its metadata."""
    return MemoriaError(
        ErrorReason.STORAGE_FULL,
        "the server's disk is too full to accept writes; nothing was written, reads keep "
        "working; retry with backoff",
        details=StorageFull(reading.free_bytes, reading.watermark_bytes),
    )


def startup_refusal(space: FreeSpace) -> str | None:
    """Why a server must not start on this data dir now (None: it may), in one line."""
    reading = space.fresh()
    if not reading.short:
        return None
    return (
        f"the data dir {space.path} has {reading.describe()}: free space on its filesystem "
        "(or lower MEMORIA_DISK_MIN_FREE_BYTES / MEMORIA_DISK_MIN_FREE_PERCENT) and start again"
    )
