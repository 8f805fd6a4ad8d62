"""Load held (issue 23, item 1): bursts within the limits are all answered, overload is refused
with a reason and a retry delay.

The real `memoria serve` runs in a subprocess (the callers here do not share its GIL), on the
default limits:

- 60 callers over 6 fresh connections, 10 calls in flight on each, 600 mixed calls of the
  memory-block service: every call is answered;
- 400 calls in flight on one fresh channel, sent before the client has read the server's
  HTTP/2 SETTINGS: every call is answered.

Both lost calls to RST_STREAM REFUSED_STREAM (UNAVAILABLE, no details) while grpc counted a
connection's streams until they were freed (server/runtime/builders/grpc_server.py turns that
off). Then, on
a server taking 4 calls at once, 4 held calls fill it and a burst of 400 gets
RESOURCE_EXHAUSTED with ERROR_REASON_OVERLOADED and a RetryInfo, every one (never a bare
transport refusal); a channel with the retry policy docs/api.md gives ("Retries") retries each
refusal after the server's pushback; once the held calls end, calls are answered again. The
tallies are printed (`pytest -s`). Loopback only; bounded in count and time; everything is
closed at the end.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from tests.processes import MEMORIA, ROOT, clean_env, wait_for_port

START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 30.0
CONNECTIONS, CALLERS_PER_CONNECTION, CALLS_PER_CALLER = 6, 10, 10
ONE_CHANNEL_IN_FLIGHT = 400
OVERLOAD_MAX_CALLS = 4
FRESH = [("grpc.use_local_subchannel_pool", 1)]
"""Each channel its own connection (channels to one target share one by default)."""


def _documented_service_config() -> str:
    """The service config docs/api.md tells clients to use (its "Retries" JSON block)."""
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    shown = api[api.index("## Retries") :]
    shown = shown[shown.index("```json\n") + len("```json\n") :]
    return json.dumps(json.loads(shown[: shown.index("```")]))


def _who(caller: int) -> tuple[tuple[str, str], ...]:
    return (("x-memoria-tenant", "t-burst"), ("x-memoria-principal", f"p{caller % 20}"))


def _serve(tmp_path: Path, **settings: str) -> Iterator[int]:
    port_file, log = tmp_path / "port", tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(str(MEMORIA), "serve", "--listen", "127.0.0.1:0"),
                *("--data-dir", str(tmp_path / "d"), "--port-file", str(port_file)),
            ],
            cwd=tmp_path,
            env=clean_env(MEMORIA_SHUTDOWN_GRACE_SECONDS="1", **settings),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield wait_for_port(process, port_file, log, timeout=START_TIMEOUT_S)
        assert process.poll() is None, "the server must survive the bursts"
        assert "Traceback" not in log.read_text(errors="replace")
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def default_port(tmp_path: Path) -> Iterator[int]:
    yield from _serve(tmp_path)


@pytest.fixture
def small_port(tmp_path: Path) -> Iterator[int]:
    yield from _serve(
        tmp_path,
        MEMORIA_MAX_CALLS=str(OVERLOAD_MAX_CALLS),
        MEMORIA_RECEIVE_TIMEOUT_SECONDS="60",  # the held calls outlast the test
    )


def _outcome(call: Callable[[], object]) -> str:
    """'OK', or the status code and its ErrorInfo reason (none when there is no ErrorInfo)."""
    try:
        call()
    except grpc.RpcError as error:
        assert isinstance(error, grpc.Call)
        return f"{error.code().name} {_reason(error) or 'without ErrorInfo'}"
    return "OK"


def _details(error: grpc.Call) -> list[object]:
    status = rpc_status.from_call(error)
    if status is None:
        return []
    found: list[object] = []
    for packed in status.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.RetryInfo):
            if packed.Is(kind.DESCRIPTOR):
                message = kind()
                packed.Unpack(message)
                found.append(message)
    return found


def _reason(error: grpc.Call) -> str:
    infos = [d for d in _details(error) if isinstance(d, error_details_pb2.ErrorInfo)]
    return infos[0].reason if infos else ""


def _mixed_call(stub: pb_grpc.MemoryBlockServiceStub, caller: int, k: int) -> Callable[[], object]:
    """One of four block calls, by turn: render, get, rewrite, get settings."""
    who, kind = _who(caller), (caller + k) % 4
    if kind == 0:
        return lambda: stub.RenderMemoryBlock(
            pb.RenderMemoryBlockRequest(), metadata=who, timeout=CALL_TIMEOUT_S
        )
    if kind == 1:
        return lambda: stub.GetMemoryBlock(
            pb.GetMemoryBlockRequest(), metadata=who, timeout=CALL_TIMEOUT_S
        )
    if kind == 2:
        request = pb.RewriteMemoryBlockRequest(
            text=f"Preferred name: Caller {caller}", writer=block_pb.WRITER_USER
        )
        return lambda: stub.RewriteMemoryBlock(request, metadata=who, timeout=CALL_TIMEOUT_S)
    return lambda: stub.GetMemorySettings(
        pb.GetMemorySettingsRequest(), metadata=who, timeout=CALL_TIMEOUT_S
    )


def _in_flight_on_one_channel(port: int, count: int) -> Counter[str]:
    """`count` RenderMemoryBlock calls started at once on one fresh channel, by outcome."""
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=FRESH) as channel:
        stub = pb_grpc.MemoryBlockServiceStub(channel)
        calls = [
            stub.RenderMemoryBlock.future(
                pb.RenderMemoryBlockRequest(), metadata=_who(i), timeout=CALL_TIMEOUT_S
            )
            for i in range(count)
        ]
        return Counter(_outcome(call.result) for call in calls)


def test_60_callers_over_6_fresh_connections_are_all_answered(default_port: int) -> None:
    channels = [
        grpc.insecure_channel(f"127.0.0.1:{default_port}", options=FRESH)
        for _ in range(CONNECTIONS)
    ]
    stubs = [pb_grpc.MemoryBlockServiceStub(channel) for channel in channels]

    def caller(number: int) -> list[str]:
        stub = stubs[number % CONNECTIONS]
        return [_outcome(_mixed_call(stub, number, k)) for k in range(CALLS_PER_CALLER)]

    callers = CONNECTIONS * CALLERS_PER_CONNECTION
    try:
        with futures.ThreadPoolExecutor(max_workers=callers) as pool:
            tally = Counter(o for outcomes in pool.map(caller, range(callers)) for o in outcomes)
    finally:
        for channel in channels:
            channel.close()
    print(f"\n{callers} callers over {CONNECTIONS} fresh connections: {dict(tally)}")
    assert tally == {"OK": callers * CALLS_PER_CALLER}


def test_400_calls_in_flight_on_one_fresh_channel_are_all_answered(default_port: int) -> None:
    tally = _in_flight_on_one_channel(default_port, ONE_CHANNEL_IN_FLIGHT)
    print(f"\n{ONE_CHANNEL_IN_FLIGHT} in flight on one fresh channel: {dict(tally)}")
    assert tally == {"OK": ONE_CHANNEL_IN_FLIGHT}


def test_overload_is_refused_with_overloaded_and_a_retry_delay(small_port: int) -> None:
    target = f"127.0.0.1:{small_port}"
    release = threading.Event()

    def never_sent() -> Iterator[bytes]:
        release.wait(CALL_TIMEOUT_S)  # bounded; set at the end
        yield from ()

    with grpc.insecure_channel(target) as holder_channel:
        # Client-streaming calls on a unary method whose request never comes: each stays in
        # progress (receiving) until released, so the server's 4 places are all taken.
        half_sent = holder_channel.stream_unary(
            "/memoria.v1.MemoryBlockService/GetMemoryBlock", None, None
        )
        held = [
            half_sent.future(never_sent(), metadata=_who(0), timeout=CALL_TIMEOUT_S)
            for _ in range(OVERLOAD_MAX_CALLS)
        ]
        try:
            probe = pb_grpc.MemoryBlockServiceStub(holder_channel)
            deadline = time.monotonic() + 10
            while True:  # until the held calls have all reached the server and stay there
                # A probe that arrived before the last held call took its place: hold again.
                held = [
                    h
                    if not h.done()
                    else half_sent.future(never_sent(), metadata=_who(0), timeout=CALL_TIMEOUT_S)
                    for h in held
                ]
                refused = _outcome(
                    lambda: probe.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=_who(1))
                )
                if refused != "OK" and not any(h.done() for h in held):
                    break
                assert time.monotonic() < deadline, "the held calls never filled the server"

            tally = _in_flight_on_one_channel(small_port, ONE_CHANNEL_IN_FLIGHT)
            print(f"\n{ONE_CHANNEL_IN_FLIGHT} in flight past the limit: {dict(tally)}")
            assert tally == {"RESOURCE_EXHAUSTED ERROR_REASON_OVERLOADED": ONE_CHANNEL_IN_FLIGHT}

            # Each refusal carries a RetryInfo, with the delay docs/api.md gives.
            with pytest.raises(grpc.RpcError) as caught:
                probe.RenderMemoryBlock(pb.RenderMemoryBlockRequest(), metadata=_who(2))
            assert isinstance(caught.value, grpc.Call)
            retry = [
                d for d in _details(caught.value) if isinstance(d, error_details_pb2.RetryInfo)
            ]
            assert [r.retry_delay.ToTimedelta().total_seconds() for r in retry] == [1.0]

            # The documented retry policy retries each refusal after the 1 s pushback: its
            # 5 attempts take at least 4 s, then the last refusal is the caller's.
            config = _documented_service_config()
            policy = json.loads(config)["methodConfig"][0]["retryPolicy"]
            options = [("grpc.service_config", config), ("grpc.enable_retries", 1), *FRESH]
            with grpc.insecure_channel(target, options=options) as retrying:
                stub = pb_grpc.MemoryBlockServiceStub(retrying)
                started = time.monotonic()
                outcome = _outcome(
                    lambda: stub.RenderMemoryBlock(
                        pb.RenderMemoryBlockRequest(), metadata=_who(2), timeout=CALL_TIMEOUT_S
                    )
                )
                elapsed = time.monotonic() - started
            print(f"through the documented retry policy: {outcome} after {elapsed:.1f} s")
            assert outcome == "RESOURCE_EXHAUSTED ERROR_REASON_OVERLOADED"
            assert elapsed >= policy["maxAttempts"] - 1
        finally:
            release.set()
        for call in held:  # their requests never came: cancelled, and their places free
            assert call.exception(timeout=CALL_TIMEOUT_S) is not None
        with grpc.insecure_channel(target) as channel:  # one call at a time fits again
            stub = pb_grpc.MemoryBlockServiceStub(channel)
            again = Counter(
                _outcome(
                    lambda: stub.RenderMemoryBlock(pb.RenderMemoryBlockRequest(), metadata=_who(3))
                )
                for _ in range(10)
            )
        assert again == {"OK": 10}
