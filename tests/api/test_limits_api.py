"""The admission limits on a running server (server/rpc/limits.py), each in isolation.

A request that never arrives in full is cancelled once the receive bound passes (and the
caller's other calls go on); long-lived streams over MEMORIA_MAX_STREAMS are refused with
RESOURCE_EXHAUSTED while those admitted keep working (health Watch still reports changes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import memory_block_service_pb2 as pb
from tests.api.conftest import Api, server_settings, serving

RECEIVE_TIMEOUT_S = 0.5


@pytest.fixture
def limited(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    settings = server_settings(
        "sqlite", request, tmp_path, receive_timeout_seconds=RECEIVE_TIMEOUT_S, max_streams=2
    )
    with serving(settings) as api:
        yield api


def test_a_request_that_never_arrives_is_cancelled_after_the_bound(limited: Api) -> None:
    # A client-streaming call on a unary method: the headers go out, the message never does.
    never = threading.Event()

    def requests() -> Iterator[bytes]:
        never.wait(20)  # bounded; set at the end
        yield from ()

    half_sent = limited.channel.stream_unary(
        "/memoria.v1.MemoryBlockService/GetMemoryBlock", None, None
    )
    started = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            half_sent(requests(), metadata=limited.who("ana"), timeout=15)
    finally:
        never.set()
    elapsed = time.monotonic() - started
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.CANCELLED
    assert RECEIVE_TIMEOUT_S <= elapsed < RECEIVE_TIMEOUT_S + 2
    # The same caller's well-formed call is served as ever.
    got = limited.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=limited.who("ana"))
    assert got.memory_block.text == ""


def test_long_lived_streams_over_the_limit_are_refused_and_admitted_ones_work(
    limited: Api,
) -> None:
    health = health_pb2_grpc.HealthStub(limited.channel)
    request = health_pb2.HealthCheckRequest(service="memoria.v1.MemoryBlockService")
    admitted = [health.Watch(request, timeout=10) for _ in range(2)]
    assert [next(watch).status for watch in admitted] == [
        health_pb2.HealthCheckResponse.SERVING
    ] * 2
    refused = health.Watch(request, timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        next(refused)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Unary calls do not wait behind the streams: they run on other threads.
    check = health.Check(request, timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    # The admitted watches still report a change, and ending one frees its place.
    limited.running.health.set(
        "memoria.v1.MemoryBlockService", health_pb2.HealthCheckResponse.NOT_SERVING
    )
    assert [next(watch).status for watch in admitted] == [
        health_pb2.HealthCheckResponse.NOT_SERVING
    ] * 2
    admitted[0].cancel()
    deadline = time.monotonic() + 5
    while True:  # the stream's thread sees the cancellation at its next wake-up
        again = health.Watch(request, timeout=10)
        try:
            assert next(again).status == health_pb2.HealthCheckResponse.NOT_SERVING
            break
        except grpc.RpcError as error:
            assert isinstance(error, grpc.Call)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline, "a cancelled watch never freed its place"
        finally:
            again.cancel()
    for watch in admitted:
        watch.cancel()
