"""The free-space watermark (server/adapters/disk.py) and the stores' disk-full answers.

FreeSpace on a fake statvfs and clock: the watermark, the cached reading and its refresh, the
STORAGE_FULL error and the one-line start-up refusal. A real SQLite database that runs out of
pages answers STORAGE_FULL, not STORE_UNAVAILABLE, and so does PostgreSQL's disk-full error
(SQLSTATE 53100). Health: a short data dir turns only the overall entry NOT_SERVING.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict, Unpack

import psycopg.errors
import pytest
from sqlalchemy import event

from server.adapters.disk import DiskShort, FreeSpace, MiB, startup_refusal, storage_full
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase, store_unavailable
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, Writer
from server.runtime.health import (
    AUDIT_SERVICE,
    MEMORY_BLOCK_SERVICE,
    NOT_SERVING,
    OVERALL,
    SEARCH_SERVICE,
    SERVING,
    HealthMonitor,
    store_dependencies,
)
from tests.unit.test_health import Recorder

GiB = 1024 * MiB


class FakeDisk:
    """A filesystem of `total` bytes with `free` available, counting the statvfs calls."""

    def __init__(self, total: int, free: int) -> None:
        self.total = total
        self.free = free
        self.calls = 0

    def statvfs(self, path: Path) -> os.statvfs_result:
        self.calls += 1
        block = 4096
        # f_bsize, f_frsize, f_blocks, f_bfree, f_bavail, f_files, f_ffree, f_favail, f_flag,
        # f_namemax
        fields = (block, block, self.total // block, self.free // block, self.free // block)
        return os.statvfs_result((*fields, 0, 0, 0, 0, 255))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Limits(TypedDict, total=False):
    """FreeSpace's thresholds a test sets."""

    min_free_bytes: int
    min_free_percent: float


def _space(disk: FakeDisk, clock: Clock, **kwargs: Unpack[Limits]) -> FreeSpace:
    return FreeSpace(
        Path("/data"), statvfs=disk.statvfs, clock=clock, max_age_seconds=0.25, **kwargs
    )


def test_the_watermark_is_the_larger_of_bytes_and_percent() -> None:
    clock = Clock()
    small = _space(FakeDisk(total=1 * GiB, free=1 * GiB), clock)  # 5 % = 51 MiB < 256 MiB
    assert small.reading().watermark_bytes == 256 * MiB
    large = _space(FakeDisk(total=100 * GiB, free=100 * GiB), clock)  # 5 % = 5 GiB
    assert large.reading().watermark_bytes == 5 * GiB
    tuned = _space(
        FakeDisk(total=100 * GiB, free=1 * GiB), clock, min_free_bytes=16 * MiB, min_free_percent=0
    )
    assert tuned.reading().watermark_bytes == 16 * MiB
    assert not tuned.reading().short


def test_a_short_disk_refuses_until_space_returns_and_readings_are_cached() -> None:
    disk, clock = FakeDisk(total=4 * GiB, free=2 * GiB), Clock()
    space = _space(disk, clock)
    space.ensure_room()
    disk.free = 100 * MiB
    space.ensure_room()  # the cached reading (younger than 0.25 s) still says there is room
    calls = disk.calls
    for _ in range(1000):
        space.reading()
    assert disk.calls == calls, "a fresh reading is not taken on every write"

    clock.now += 0.25
    with pytest.raises(MemoriaError) as caught:
        space.ensure_room()
    assert caught.value.reason is ErrorReason.STORAGE_FULL
    assert caught.value.metadata == {
        "free_bytes": str(100 * MiB),
        "watermark_bytes": str(256 * MiB),
    }
    with pytest.raises(DiskShort, match=r"100\.0 MiB free of 4096\.0 MiB, below the watermark"):
        space.check()  # the health probe reads now, whatever the cache holds

    disk.free = 300 * MiB
    clock.now += 0.25
    space.ensure_room()


def test_a_start_on_a_short_disk_is_refused_in_one_line() -> None:
    disk = FakeDisk(total=64 * MiB, free=8 * MiB)
    space = _space(disk, Clock(), min_free_bytes=16 * MiB, min_free_percent=0)
    refusal = startup_refusal(space)
    assert refusal is not None
    assert "\n" not in refusal
    assert refusal.startswith("the data dir /data has 8.0 MiB free of 64.0 MiB, below the")
    assert "MEMORIA_DISK_MIN_FREE_BYTES" in refusal
    disk.free = 32 * MiB
    assert startup_refusal(space) is None


def test_sqlite_out_of_space_answers_storage_full_and_keeps_the_old_block(tmp_path: Path) -> None:
    engine = create_store_engine(sqlite_url(tmp_path), pool_size=2)
    migrate.upgrade(engine)
    store = SqlMemoryStore(SqlDatabase(engine))
    blocks = MemoryBlocks(store, lambda: datetime(2026, 12, 1, tzinfo=UTC))
    ana = Identity("t-disk", "ana")
    blocks.rewrite(ana, "Preferred name: Ana", Writer.USER)
    pages = engine.connect().exec_driver_sql("PRAGMA page_count").scalar()

    @event.listens_for(engine, "connect")
    def _cap(dbapi_connection: object, _record: object) -> None:
        # The database may not grow past its current size: SQLite then answers SQLITE_FULL,
        # exactly as on a full disk.
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]

    engine.dispose()
    with pytest.raises(MemoriaError) as caught:
        for line in range(200):  # more text than the pages left can take
            blocks.rewrite(ana, f"Preferred name: Ana\n{'x' * 3900} {line}", Writer.USER)
    assert caught.value.reason is ErrorReason.STORAGE_FULL
    assert blocks.get(ana).text.startswith("Preferred name: Ana")
    store.db.dispose()


def test_postgres_disk_full_answers_storage_full() -> None:
    error = store_unavailable(psycopg.errors.DiskFull("could not extend file"))
    assert error.reason is ErrorReason.STORAGE_FULL
    other = store_unavailable(psycopg.OperationalError("connection refused"))
    assert other.reason is ErrorReason.STORE_UNAVAILABLE


def test_storage_full_carries_the_figures() -> None:
    space = _space(FakeDisk(total=64 * MiB, free=1 * MiB), Clock(), min_free_bytes=2 * MiB)
    error = storage_full(space.reading())
    assert error.metadata["free_bytes"] == str(1 * MiB)


def test_a_short_data_dir_takes_only_the_overall_entry_down() -> None:
    sink = Recorder()
    disk = FakeDisk(total=64 * MiB, free=32 * MiB)
    space = _space(disk, Clock(), min_free_bytes=16 * MiB, min_free_percent=0)
    services = (MEMORY_BLOCK_SERVICE, AUDIT_SERVICE, SEARCH_SERVICE)
    monitor = HealthMonitor(
        sink, store_dependencies(lambda: None, lambda: None, space.check), services
    )
    monitor.probe_once()
    assert sink.status() == dict.fromkeys((OVERALL, *services), SERVING)
    disk.free = 8 * MiB
    monitor.probe_once()
    assert sink.status() == {OVERALL: NOT_SERVING, **dict.fromkeys(services, SERVING)}
    disk.free = 32 * MiB
    monitor.probe_once()
    assert sink.status()[OVERALL] == SERVING
