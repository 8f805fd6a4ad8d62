"""A log line at most once per interval, for what a hostile caller can repeat at will.

Malformed requests (server/rpc/interceptor.py) and refused admissions (server/rpc/limits.py)
are each logged through one of these, so a flood of them costs one line a minute, not one a
call, and the line says how many it stands for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    """Logs at most one line per `interval_s`; the next line counts those left out.

    Hand-written because it is a few lines around the stdlib logger, where a dependency
    (or a logging filter, which cannot count what it drops per message) would be more.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next = float("-inf")
        self._dropped = 0

    def warning(self, message: str, *args: object) -> bool:
        """Log `message % args` unless a line was logged less than the interval ago."""
        with self._lock:
            now = self._clock()
            if now < self._next:
                self._dropped += 1
                return False
            dropped, self._dropped = self._dropped, 0
            self._next = now + self._interval
        suffix = f" ({dropped} more since the last such line)" if dropped else ""
        self._log.warning(message + suffix, *args)
        return True
