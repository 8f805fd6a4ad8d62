"""The indexing worker: threads in `memoria serve`, or all of `memoria worker`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.inspections import SqlInspectionStore
from server.domain.keywords import keyword_representation
from server.domain.reindex import KeywordReindexer
from server.runtime.builders import utc_now
from server.runtime.builders.stores import Stores, build_stores
from server.runtime.settings import Settings
from server.runtime.worker import IndexWorker


def inspection_purge(settings: Settings, db: SqlDatabase) -> Callable[[int], int]:
    """The background removal of inspector records past the retention (for IndexWorker)."""
    retention = timedelta(days=settings.memory.inspection_retention_days)
    inspections = SqlInspectionStore(db)
    return lambda limit: inspections.purge(utc_now() - retention, limit)


def build_index_worker(settings: Settings, stores: Stores) -> IndexWorker:
    """The background indexing threads, with the periodic purges they also run."""
    parts = stores.search
    return IndexWorker(
        parts.indexer,
        threads=settings.indexing.worker_threads,
        batch_size=settings.indexing.batch_size,
        space=stores.space,
        purges=(
            inspection_purge(settings, stores.db),
            parts.purge.purge_once,
            KeywordReindexer(
                parts.index,
                parts.keywords,
                representation=keyword_representation(parts.embedder.model_id),
            ).run_once,
        ),
    )


@dataclass
class RunningWorker:
    """A started `memoria worker`: indexing threads on the shared stores, nothing served."""

    worker: IndexWorker
    stores: Stores

    def stop(self) -> None:
        """Finish the batches in hand, then close the stores."""
        self.worker.stop()
        self.stores.close()


def start_worker(settings: Settings) -> RunningWorker:
    """Build the stores and start indexing (at least one thread: indexing is all it does)."""
    if settings.indexing.worker_threads < 1:
        settings = settings.replace(index_worker_threads=1)
    stores = build_stores(settings)
    worker = build_index_worker(settings, stores)
    worker.start()
    return RunningWorker(worker, stores)
