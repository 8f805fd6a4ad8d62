"""The outbox gauges: how many accepted turns wait to be indexed and how long the oldest
has waited (DESIGN 6), read through a callable the composition root passes (the turn store's
`outbox_stats`), so this module knows no storage."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Protocol

from opentelemetry import metrics
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import CallbackOptions, Observation

log = logging.getLogger(__name__)


class OutboxReading(Protocol):
    """One reading of the outbox (server/adapters/sql/turns.py's OutboxStats is one)."""

    @property
    def pending(self) -> int:
        """Turns waiting to be indexed."""
        ...

    @property
    def oldest_accept_time(self) -> datetime | None:
        """When the oldest of them was accepted (None: none waits)."""
        ...


OUTBOX_READ_INTERVAL_S = 15.0
"""The outbox is read at most this often, however many readers collect (the default export
interval is 60 s): one aggregate over the pending turns' partial index, never per call."""


class OutboxGauges:
    """`memoria.outbox.depth` and `memoria.outbox.oldest_pending_age`, observed on collection."""

    def __init__(
        self,
        stats: Callable[[], OutboxReading],
        meter: metrics.Meter,
        *,
        interval_s: float = OUTBOX_READ_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._stats = stats
        self._interval_s = interval_s
        self._clock = clock
        self._now = now
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._last: OutboxReading | None = None
        meter.create_observable_gauge(
            "memoria.outbox.depth",
            callbacks=[self._depth],
            unit="{turn}",
            description="Accepted turns waiting to be indexed",
        )
        meter.create_observable_gauge(
            "memoria.outbox.oldest_pending_age",
            callbacks=[self._age],
            unit="s",
            description="Seconds since the oldest turn still waiting was accepted (0: none)",
        )

    def _read(self) -> OutboxReading | None:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._interval_s:
                self._read_at = now
                try:
                    # Its SQL is not traced: a statement every interval, outside any call.
                    with suppress_instrumentation():
                        self._last = self._stats()
                except Exception:  # the store is down: report nothing rather than a guess
                    log.warning("outbox gauges: the turn store could not be read", exc_info=True)
                    self._last = None
            return self._last

    def _depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._read()
        return [] if stats is None else [Observation(stats.pending)]

    def _age(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._read()
        if stats is None:
            return []
        oldest = stats.oldest_accept_time
        age = 0.0 if oldest is None else max((self._now() - oldest).total_seconds(), 0.0)
        return [Observation(age)]
