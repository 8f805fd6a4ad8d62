"""The indexing worker: a loop that indexes queued turns and purges deleted conversations.

It runs as threads of the server process (the default) or alone as `memoria worker`, in as
many processes as wanted when the stores are PostgreSQL and a Qdrant server (claims keep them
off each other's turns). It sleeps while there is nothing to do, wakes at once when this
process accepts a turn, and polls for turns accepted by other processes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from server.adapters.disk import FreeSpace
from server.adapters.thread_names import name_os_thread
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.indexing import Indexer

log = logging.getLogger(__name__)


class IndexWorker:
    """Runs an `Indexer` in background threads until stopped."""

    def __init__(
        self,
        indexer: Indexer,
        *,
        threads: int = 1,
        batch_size: int = 16,
        poll_seconds: float = 1.0,
        error_pause_seconds: float = 2.0,
        space: FreeSpace | None = None,
        purges: Sequence[Callable[[int], int]] = (),
    ) -> None:
        """`space`: the embedded data dir's free-space watermark; while it is short, the worker
        claims no turns (it would write the chunk index's memory-mapped files, and each turn
        would use up a retry) but still purges deleted conversations, which frees space.
        `purges`: more background removals run on each round like the conversation purge,
        each given the batch size and returning how many it removed (the inspector's expired
        records, server/domain/inspection.py)."""
        self._indexer = indexer
        self._purges = tuple(purges)
        self._space = space
        self._threads = [
            threading.Thread(target=self._run, name=f"index-worker-{i}", daemon=True)
            for i in range(threads)
        ]
        self._batch_size = batch_size
        self._poll_seconds = poll_seconds
        self._error_pause_seconds = error_pause_seconds
        self._wake = threading.Event()
        self._stop = threading.Event()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wake(self) -> None:
        """Work is waiting: stop sleeping now."""
        self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the batch in hand (a claim left open is rolled back and retried anyway)."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    def _short_of_space(self) -> bool:
        """The data dir is below its watermark (logged by health, once per transition)."""
        return self._space is not None and self._space.reading().short

    def _run(self) -> None:
        name_os_thread()  # "index-worker-N" in top -H and /proc (bench_turn_cost.py)
        failing = False
        while not self._stop.is_set():
            try:
                short = self._short_of_space()
                busy = 0 if short else self._indexer.run_once(self._batch_size)
                busy += self._indexer.purge_once(self._batch_size)
                for purge in self._purges:
                    busy += purge(self._batch_size)
            except Exception as error:  # a store is down: keep the worker alive, retry soon
                if not failing:  # once per outage, not every pause (health reports it too)
                    unavailable = (
                        isinstance(error, MemoriaError)
                        and error.reason is ErrorReason.STORE_UNAVAILABLE
                    )
                    log.warning(
                        "indexing paused: a store failed (%s); retrying every %ss",
                        type(error).__name__,
                        self._error_pause_seconds,
                        exc_info=not unavailable,
                    )
                failing = True
                self._stop.wait(self._error_pause_seconds)
                continue
            if failing:
                log.info("indexing resumed")
                failing = False
            if busy:
                continue
            self._wake.wait(self._poll_seconds)
            self._wake.clear()
