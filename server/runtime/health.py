"""Health of the stores, reported per service through `grpc.health.v1`.

A load balancer, a mesh or a Kubernetes readiness probe asks the standard health service
whether a replica can serve; the honest answer depends on the stores behind it. A monitor
thread probes each store about once a second with a cheap call of bounded duration and sets
the status of the services that store serves:

- the SQL store (SQLite or PostgreSQL: blocks, settings, audit, the turn queue) serves every
  Memoria service;
- the chunk index (the embedded Qdrant engine or a Qdrant server) serves only
  ConversationSearchService, so an index outage leaves the memory block and the audit log
  SERVING;
- the embedded stores' data dir (server/adapters/disk.py) below its free-space watermark turns
  only the overall entry NOT_SERVING: reads and deletes keep working on every service, only
  writes that add data are refused (STORAGE_FULL);
- the overall entry "" is SERVING only while every store answers (and the data dir has room);
- the health service's own name (`grpc.health.v1.Health`) is SERVING from start to shutdown
  whatever the stores do: it is what liveness probes ask about, since a store outage must not
  restart the process (deploy/README.md, "Probes").

A store whose probe raises, or does not answer within `PROBE_TIMEOUT_SECONDS`, is down at once
(one failed probe is enough: smoothing belongs to the caller, for example a readiness probe's
failureThreshold); it is up again on its first successful probe. Each transition of a store is
logged once, not every probe, and a service's status is set only when it changes, so Watch
streams see transitions only. A call that fails with STORE_UNAVAILABLE asks for a probe now
(`probe_soon`), so health follows an outage the moment a request meets it.

Shutdown is not decided here: the server's graceful shutdown turns every service NOT_SERVING
for good (the health servicer ignores later updates), and the monitor is stopped before the
stores close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from grpc_health.v1 import health_pb2

from memoria.v1 import (
    audit_service_pb2,
    conversation_search_service_pb2,
    memory_block_service_pb2,
)

log = logging.getLogger(__name__)

OVERALL = ""
"""The health entry of the whole server (grpc.health.v1 convention)."""

LIVENESS = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
"""The health service's own name, `grpc.health.v1.Health`: no probe ever changes it."""

MEMORY_BLOCK_SERVICE = memory_block_service_pb2.DESCRIPTOR.services_by_name[
    "MemoryBlockService"
].full_name
AUDIT_SERVICE = audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name
SEARCH_SERVICE = conversation_search_service_pb2.DESCRIPTOR.services_by_name[
    "ConversationSearchService"
].full_name

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING

PROBE_INTERVAL_SECONDS = 1.0
"""Pause between two rounds of probes: an outage shows within about this long."""

PROBE_TIMEOUT_SECONDS = 2.0
"""A probe that has not answered by then counts as failed (a silent network path would
otherwise hold the health of every replica on the driver's own timeouts, 5-15 s)."""

MIN_PROBE_GAP_SECONDS = 0.1
"""Probes asked for by failing calls (`probe_soon`) come at most this often, so a burst of
failing calls during an outage cannot turn the monitor into a busy loop."""


class StatusSink(Protocol):
    """Where statuses go: `grpc_health.v1.health.HealthServicer` (or a test's recorder)."""

    def set(self, service: str, status: int) -> None: ...


@dataclass(frozen=True)
class Dependency:
    """A store the server needs: its name in logs, a cheap probe, and the services it serves.

    `check` returns when the store answers and raises otherwise; it may block (the monitor
    bounds how long it waits for it).
    """

    name: str
    check: Callable[[], None]
    services: frozenset[str]
    down_as: str = "unreachable"
    """How the log names a failed probe ("sql store unreachable (...)")."""
    up_as: str = "reachable again"
    """How the log names the first passing probe after failures."""


class _Probe:
    """One bounded run of a dependency's check on a daemon thread of its own.

    The check runs on its own thread so that one that hangs costs the monitor the timeout and
    no more, and a hung check never holds up the other store's probe or the process's exit.
    While a check is still hanging, no second one of the same dependency is started.
    """

    def __init__(self, dependency: Dependency) -> None:
        self.dependency = dependency
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None

    def begin(self) -> None:
        """Start a check, unless the previous one is still running."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._done.clear()
        self._error = None
        self._thread = threading.Thread(
            target=self._run, name=f"health-check-{self.dependency.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        try:
            self.dependency.check()
        except BaseException as error:  # whatever it is, it means "cannot serve"
            self._error = error
        finally:
            self._done.set()

    def failure(self, started: float, timeout: float) -> str | None:
        """Why the check failed (None: it passed), waiting for it until `timeout` seconds
        after `started` (monotonic)."""
        if not self._done.wait(max(0.0, started + timeout - time.monotonic())):
            return f"no answer within {timeout:g} s"
        if self._error is None:
            return None
        return describe(self._error)


def describe(error: BaseException) -> str:
    """A one-line account of a failure for the log: its type and the first line of its
    message, cut short (the drivers' messages name host, port and user, not passwords)."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:199] + "…"
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class HealthMonitor:
    """Probes the dependencies and keeps the health statuses of `services` and "" in step.

    `probe_once` runs one round synchronously (the thread started by `start` calls it about
    every `interval` seconds, sooner after `probe_soon`).
    """

    def __init__(
        self,
        sink: StatusSink,
        dependencies: Sequence[Dependency],
        services: Iterable[str],
        *,
        interval: float = PROBE_INTERVAL_SECONDS,
        timeout: float = PROBE_TIMEOUT_SECONDS,
    ) -> None:
        self._sink = sink
        self._probes = [_Probe(d) for d in dependencies]
        self._services = (OVERALL, *services)
        self._interval = interval
        self._timeout = timeout
        self._down: dict[str, float] = {}  # dependency name -> when it went down (monotonic)
        self._statuses: dict[str, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)

    @property
    def down(self) -> frozenset[str]:
        """Names of the dependencies the last round found down."""
        with self._lock:
            return frozenset(self._down)

    def start(self) -> None:
        """Report LIVENESS SERVING, probe once now (so the first statuses are true ones), then
        keep probing."""
        self._sink.set(LIVENESS, SERVING)
        self.probe_once()
        self._thread.start()

    def stop(self) -> None:
        """Stop probing; statuses are no longer changed. Waits at most about one probe."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout + 1.0)

    def probe_soon(self) -> None:
        """A call just found a store unavailable: probe now rather than at the next tick."""
        self._wake.set()

    def probe_once(self) -> None:
        """Run every dependency's check (in parallel, each bounded by the timeout) and update
        the statuses from what they found."""
        started = time.monotonic()
        for probe in self._probes:
            probe.begin()
        failures = {p.dependency.name: p.failure(started, self._timeout) for p in self._probes}
        self._update(failures)

    def _update(self, failures: dict[str, str | None]) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            now = time.monotonic()
            for probe in self._probes:
                dependency = probe.dependency
                failure = failures[dependency.name]
                if failure is not None and dependency.name not in self._down:
                    self._down[dependency.name] = now
                    log.warning(
                        "health: %s %s (%s); NOT_SERVING: %s",
                        dependency.name,
                        dependency.down_as,
                        failure,
                        ", ".join(("overall", *sorted(dependency.services))),
                    )
                elif failure is None and dependency.name in self._down:
                    since = self._down.pop(dependency.name)
                    log.info(
                        "health: %s %s after %.1f s", dependency.name, dependency.up_as, now - since
                    )
            affected = {
                service
                for probe in self._probes
                if probe.dependency.name in self._down
                for service in probe.dependency.services
            }
            for service in self._services:
                down = bool(self._down) if service == OVERALL else service in affected
                status = NOT_SERVING if down else SERVING
                if self._statuses.get(service) != status:
                    self._statuses[service] = status
                    self._sink.set(service, status)

    def _run(self) -> None:
        while True:
            # A floor between rounds, then the rest of the interval unless a failing call
            # asks for a probe sooner.
            if self._stop.wait(MIN_PROBE_GAP_SECONDS):
                return
            self._wake.wait(max(0.0, self._interval - MIN_PROBE_GAP_SECONDS))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.probe_once()
            except Exception:  # a bug here must not end health reporting silently
                log.exception("health: probe round failed")


def store_dependencies(
    sql_check: Callable[[], None],
    index_check: Callable[[], None],
    disk_check: Callable[[], None] | None = None,
) -> list[Dependency]:
    """Which store serves which service: the SQL store all three (every one of them reads or
    writes it, search included: the turn queue and tombstones live there), the chunk index
    only search.

    With `disk_check` (the embedded stores' free-space watermark, server/adapters/disk.py), a
    data dir short of space turns only the overall entry "" NOT_SERVING: reads keep working on
    every service (and deletes), only writes that add data are refused with STORAGE_FULL, so
    taking the replica out of a readiness rotation would cost more than it saves. "" says
    the server is not wholly serving, and the log says why, once per transition.
    """
    disk = (
        [Dependency("data dir", disk_check, frozenset(), "short of space", "has space again")]
        if disk_check is not None
        else []
    )
    return [
        Dependency(
            "sql store",
            sql_check,
            frozenset({MEMORY_BLOCK_SERVICE, AUDIT_SERVICE, SEARCH_SERVICE}),
        ),
        Dependency("chunk index", index_check, frozenset({SEARCH_SERVICE})),
        *disk,
    ]
