"""The index worker runs the extra background purges (the inspector's expired records) on
each round, with its batch size, and keeps running them while there is work."""

from __future__ import annotations

import threading

from server.runtime.worker import IndexWorker


class IdleIndexer:
    """An indexer with nothing to index or purge."""

    def run_once(self, limit: int) -> int:
        return 0

    def purge_once(self, limit: int) -> int:
        return 0


def test_purges_run_with_the_batch_size_until_nothing_is_left() -> None:
    left = [3]
    limits: list[int] = []
    done = threading.Event()

    def purge(limit: int) -> int:
        limits.append(limit)
        removed = min(left[0], 1)
        left[0] -= removed
        if left[0] == 0:
            done.set()
        return removed

    worker = IndexWorker(IdleIndexer(), batch_size=7, poll_seconds=60, purges=(purge,))  # type: ignore[arg-type]
    worker.start()
    try:
        # Three rounds back to back (each removed something), not one per poll interval.
        assert done.wait(timeout=10)
    finally:
        worker.stop()
    assert left == [0]
    assert set(limits) == {7}
