"""The health monitor on fake stores: which services a store outage takes down, bounded
probes, transitions logged and reported once, and the thread's own and early probes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from server.runtime.health import (
    AUDIT_SERVICE,
    LIVENESS,
    MEMORY_BLOCK_SERVICE,
    NOT_SERVING,
    OVERALL,
    SEARCH_SERVICE,
    SERVING,
    HealthMonitor,
    store_dependencies,
)

SERVICES = (MEMORY_BLOCK_SERVICE, AUDIT_SERVICE, SEARCH_SERVICE)
EVERYTHING = (OVERALL, *SERVICES)


class Recorder:
    """A status sink that keeps every `set` in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def set(self, service: str, status: int) -> None:
        with self._lock:
            self.calls.append((service, status))

    def status(self) -> dict[str, int]:
        """The latest status of each service set so far."""
        with self._lock:
            return dict(self.calls)


class FakeStore:
    """A store whose probe fails while `error` is set, and can be made to hang."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.checks = 0
        self.hang = threading.Event()  # set: the next check blocks until `release` is set
        self.release = threading.Event()

    def check(self) -> None:
        self.checks += 1
        if self.hang.is_set():
            self.release.wait(30)  # bounded; the test sets it
        if self.error is not None:
            raise self.error


@dataclass
class Rig:
    """Two fake stores, a recording sink, and the monitors a test made of them."""

    sql: FakeStore = field(default_factory=FakeStore)
    index: FakeStore = field(default_factory=FakeStore)
    sink: Recorder = field(default_factory=Recorder)
    started: list[HealthMonitor] = field(default_factory=list)

    def monitor(self, *, interval: float = 60.0, timeout: float = 2.0) -> HealthMonitor:
        """A monitor of the two stores, wired as the server wires the real ones."""
        return HealthMonitor(
            self.sink,
            store_dependencies(self.sql.check, self.index.check),
            SERVICES,
            interval=interval,
            timeout=timeout,
        )

    def start(self, *, interval: float) -> HealthMonitor:
        """A monitor with its thread running (stopped at the end of the test)."""
        monitor = self.monitor(interval=interval)
        self.started.append(monitor)
        monitor.start()
        return monitor

    def expect(self, not_serving: set[str]) -> None:
        """The latest status of every service: NOT_SERVING for those named, else SERVING
        (LIVENESS is set only by `start`, and only ever SERVING)."""
        statuses = self.sink.status()
        assert statuses.pop(LIVENESS, SERVING) == SERVING
        assert statuses == {
            name: NOT_SERVING if name in not_serving else SERVING for name in EVERYTHING
        }


@pytest.fixture
def rig() -> Iterator[Rig]:
    made = Rig()
    yield made
    for store in (made.sql, made.index):
        store.release.set()
    for monitor in made.started:
        monitor.stop()


def test_every_service_is_serving_while_every_store_answers(rig: Rig) -> None:
    rig.monitor().probe_once()
    rig.expect(set())


def test_the_sql_store_down_takes_every_service_down_and_back(rig: Rig) -> None:
    monitor = rig.monitor()
    monitor.probe_once()
    rig.sql.error = ConnectionRefusedError("connection refused")
    monitor.probe_once()
    rig.expect(set(EVERYTHING))
    assert monitor.down == {"sql store"}
    rig.sql.error = None
    monitor.probe_once()
    rig.expect(set())
    assert monitor.down == frozenset()


def test_the_chunk_index_down_takes_only_search_and_overall_down(rig: Rig) -> None:
    monitor = rig.monitor()
    rig.index.error = RuntimeError("qdrant: deadline exceeded")
    monitor.probe_once()
    rig.expect({OVERALL, SEARCH_SERVICE})
    # Then the SQL store goes too, and comes back first: search stays down for the index.
    rig.sql.error = ConnectionRefusedError()
    monitor.probe_once()
    rig.expect(set(EVERYTHING))
    rig.sql.error = None
    monitor.probe_once()
    rig.expect({OVERALL, SEARCH_SERVICE})
    rig.index.error = None
    monitor.probe_once()
    rig.expect(set())


def test_a_check_that_hangs_is_down_after_the_timeout_and_is_not_started_twice(
    rig: Rig,
) -> None:
    monitor = rig.monitor(timeout=0.2)
    rig.sql.hang.set()
    started = time.monotonic()
    monitor.probe_once()
    assert time.monotonic() - started < 5  # bounded by the timeout, not by the check
    rig.expect(set(EVERYTHING))
    monitor.probe_once()  # the first check still hangs: no second one is started
    assert rig.sql.checks == 1
    rig.expect(set(EVERYTHING))

    rig.sql.hang.clear()
    rig.sql.release.set()  # the hung check returns, passing (its late answer counts, if in time)
    monitor.probe_once()
    rig.expect(set())
    checks = rig.sql.checks
    monitor.probe_once()  # no check is hanging now: each round starts one
    assert rig.sql.checks == checks + 1
    rig.expect(set())


def test_transitions_are_logged_and_reported_once_not_every_probe(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = rig.monitor()
    caplog.set_level(logging.INFO, logger="server.runtime.health")
    monitor.probe_once()
    rig.sql.error = ConnectionRefusedError("connection refused\nsecond line")
    for _ in range(3):
        monitor.probe_once()
    rig.sql.error = None
    for _ in range(3):
        monitor.probe_once()

    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("health: sql store unreachable (ConnectionRefusedError: ")
    assert "second line" not in messages[0]
    assert caplog.records[0].levelno == logging.WARNING
    assert messages[1].startswith("health: sql store reachable again after ")
    # Each service's status was set three times: SERVING, NOT_SERVING, SERVING.
    for service in EVERYTHING:
        assert [s for name, s in rig.sink.calls if name == service] == [
            SERVING,
            NOT_SERVING,
            SERVING,
        ]


def test_the_thread_probes_on_its_own(rig: Rig) -> None:
    rig.start(interval=0.2)
    rig.expect(set())  # start probed once before returning
    assert rig.sink.calls[0] == (LIVENESS, SERVING)
    rig.index.error = RuntimeError("gone")
    wait_until(lambda: rig.sink.status()[SEARCH_SERVICE] == NOT_SERVING)
    rig.expect({OVERALL, SEARCH_SERVICE})
    rig.index.error = None
    wait_until(lambda: rig.sink.status()[SEARCH_SERVICE] == SERVING)
    rig.expect(set())
    assert [status for name, status in rig.sink.calls if name == LIVENESS] == [SERVING]


def test_probe_soon_probes_at_once_instead_of_at_the_next_tick(rig: Rig) -> None:
    monitor = rig.start(interval=3600)  # no tick during this test
    rig.sql.error = ConnectionRefusedError()
    monitor.probe_soon()  # what a call failing with STORE_UNAVAILABLE does
    wait_until(lambda: rig.sink.status()[OVERALL] == NOT_SERVING)
    rig.expect(set(EVERYTHING))


def test_after_stop_the_statuses_no_longer_change(rig: Rig) -> None:
    monitor = rig.start(interval=0.05)
    monitor.stop()
    rig.sql.error = ConnectionRefusedError()
    monitor.probe_once()
    rig.expect(set())


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll `condition` until true (bounded: fails after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
