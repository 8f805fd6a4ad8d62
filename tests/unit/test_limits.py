"""Call admission (server/rpc/limits.py): the calls in progress, fair shares of the waiting, and
the receive bound."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from server.rpc.limits import Admission, AdmissionInterceptor, Limits, ReceiveBounds

LIMITS = Limits(
    executing=4,
    max_calls=30,
    max_receiving=10,
    max_streams=2,
    receive_timeout=1.0,
    stream_idle_timeout=5.0,
)


def test_calls_past_the_limit_in_progress_are_refused_until_one_ends() -> None:
    admission = Admission(LIMITS)
    assert all(admission.begin() for _ in range(30))
    assert not admission.begin()
    admission.end()
    assert admission.begin()
    assert not admission.begin()


def test_below_the_limit_every_connection_waits() -> None:
    admission = Admission(LIMITS)
    assert all(admission.enter("attacker") for _ in range(10))


def test_at_the_limit_the_connection_holding_its_share_is_refused_not_the_others() -> None:
    admission = Admission(LIMITS)
    for _ in range(8):
        assert admission.enter("attacker")
    assert admission.enter("other")
    assert admission.enter("other")
    # 10 waiting over 2 connections: a share is 5; the attacker holds 8, "other" 2.
    assert not admission.enter("attacker")
    assert admission.enter("other")
    assert admission.enter("victim")  # holds none: let in
    for _ in range(8):
        admission.leave("attacker")
    assert admission.enter("attacker")  # waiting is below the limit again


def test_twice_the_limit_refuses_everyone() -> None:
    admission = Admission(LIMITS)
    for peer in range(20):
        assert admission.enter(f"p{peer}")
    assert not admission.enter("victim")


class FakeContext:
    """The one method the reaper calls; `cancel` releases the blocked iterator."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()
        self.release.set()


def _never_sent(release: threading.Event) -> Iterator[int]:
    """A request stream whose message never comes: it ends when the call is cancelled."""
    release.wait(30)
    yield from ()


def test_a_request_that_never_arrives_is_cancelled_within_its_bound() -> None:
    bounds = ReceiveBounds(tick=0.05)
    bounds.start()
    try:
        release = threading.Event()
        context = FakeContext(release)
        with pytest.raises(StopIteration):
            bounds.receive(_never_sent(release), context, 0.2)  # type: ignore[arg-type]
        assert context.cancelled.is_set()
        assert bounds.cancelled == 1
        # A request that is there is returned, and nothing is cancelled.
        quick = FakeContext(threading.Event())
        assert bounds.receive(iter([7]), quick, 0.2) == 7  # type: ignore[arg-type]
        assert not quick.cancelled.is_set()
    finally:
        bounds.stop()


class PeerContext:
    """A servicer context with a peer, for the interceptor's behaviours."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def cancel(self) -> None:
        raise AssertionError("not expected")


def test_at_most_executing_calls_run_at_once_and_only_after_their_request() -> None:
    limits = Limits(
        executing=1,
        max_calls=10,
        max_receiving=10,
        max_streams=2,
        receive_timeout=5,
        stream_idle_timeout=5,
    )
    interceptor = AdmissionInterceptor(limits)
    running = threading.Semaphore(0)
    release = threading.Event()
    order: list[str] = []

    def inner(request: str, context: object) -> str:
        order.append(f"start {request}")
        running.release()
        release.wait(10)
        order.append(f"end {request}")
        return request

    behavior = interceptor._unary(inner)
    first = threading.Thread(target=behavior, args=(iter(["a"]), PeerContext("p1")))
    second = threading.Thread(target=behavior, args=(iter(["b"]), PeerContext("p2")))
    first.start()
    assert running.acquire(timeout=5)
    second.start()
    assert not running.acquire(timeout=0.3), "a second call executed beside the first"
    release.set()
    first.join(5)
    second.join(5)
    assert order == ["start a", "end a", "start b", "end b"]
    interceptor.stop()
