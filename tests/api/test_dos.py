"""No caller can starve the others (issue 16, item 1): a victim keeps being served under attack.

The real `memoria serve` runs in a subprocess (so the attacker and the victim in this process
do not share the server's GIL). An attacker without credentials, on raw sockets that speak just
enough HTTP/2, holds open:

- half-sent unary requests: HEADERS, then a DATA frame announcing a 100-byte message and
  carrying 10 bytes of it (the receive of each would hold a handler thread of the sync server),
  10 on each of 20 connections, and 300 on one greedy connection that ignores HTTP/2's cap of
  64 streams (the server refuses the rest);
- reflection streams that send nothing after their headers (long-lived streams);
- idle TCP connections that send nothing at all, and connections that finish the HTTP/2
  preface and then stay silent.

Meanwhile a well-behaved caller on its own connection makes unary calls: every one must
succeed, each within a bound. Then the server's limits reap what the attacker holds: a
half-sent request is answered once the receive bound passes, and idle connections are
closed. The figures (streams held, victim p50/p99, failures) are printed (`pytest -s`).
Loopback only; bounded in count and time; everything is closed at the end.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from tests.api.conftest import Metadata
from tests.processes import MEMORIA

START_TIMEOUT_S = 60.0
WHO: Metadata = (("x-memoria-tenant", "t-dos"), ("x-memoria-principal", "victim"))

HALF_SENT_CONNECTIONS = 20
HALF_SENT_PER_CONNECTION = 10  # 200 half-sent requests, within the per-connection limit
GREEDY_HALF_SENT = 300  # on one connection: past its cap of 64 streams and MAX_RECEIVING
REFLECTION_STREAMS = 16
IDLE_CONNECTIONS = 100  # plain TCP, nothing sent
SILENT_CONNECTIONS = 100  # HTTP/2 preface, then nothing
VICTIM_CALLS = 60
VICTIM_BOUND_S = 1.0
RECEIVE_TIMEOUT_S = 2
MAX_RECEIVING = 64  # below the 200 half-sent requests: fair shares refuse the attacker's
CONNECTION_IDLE_S = 2

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, DATA, SETTINGS = 0x1, 0x0, 0x4
END_HEADERS, ACK = 0x4, 0x1


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name (RFC 7541 6.2.2)."""
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _headers(path: str) -> bytes:
    # :method POST (static index 3), :scheme http (index 6), then literals.
    return (
        b"\x83\x86"
        + _literal(b":path", path.encode())
        + _literal(b":authority", b"localhost")
        + _literal(b"content-type", b"application/grpc")
        + _literal(b"te", b"trailers")
    )


class Attacker:
    """Raw sockets holding streams and connections open; closed by `close`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sockets: list[socket.socket] = []

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.sockets.append(sock)
        return sock

    def _h2(self) -> socket.socket:
        sock = self._connect()
        # The client preface, empty SETTINGS, and the ACK of the server's SETTINGS (sent
        # ahead: the server closes a connection whose SETTINGS go unacknowledged).
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, b"") + _frame(SETTINGS, ACK, 0, b""))
        return sock

    def half_sent(self, connections: int, per_connection: int) -> int:
        path = "/memoria.v1.MemoryBlockService/GetMemoryBlock"
        partial = b"\x00" + struct.pack(">I", 100) + b"\x08" * 10  # 10 of 100 bytes
        for _ in range(connections):
            sock = self._h2()
            frames = b""
            for i in range(per_connection):
                stream = 1 + 2 * i
                frames += _frame(HEADERS, END_HEADERS, stream, _headers(path))
                frames += _frame(DATA, 0, stream, partial)
            sock.sendall(frames)
        return connections * per_connection

    def reflection(self, streams: int) -> int:
        path = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        for _ in range(streams):
            self._h2().sendall(_frame(HEADERS, END_HEADERS, 1, _headers(path)))
        return streams

    def idle(self, count: int) -> None:
        for _ in range(count):
            self._connect()

    def silent(self, count: int) -> None:
        for _ in range(count):
            self._h2()

    def wait_closed(self, timeout: float) -> int:
        """Wait (select, bounded by `timeout`) until the server has closed every connection;
        return how many it left open."""
        deadline = time.monotonic() + timeout
        for sock in self.sockets:
            sock.setblocking(False)
        still_open = set(self.sockets)
        while still_open and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select(list(still_open), [], [], left)
            for sock in readable:
                try:
                    while sock.recv(65536):
                        pass  # the server's frames (SETTINGS, GOAWAY, RST_STREAM)
                except BlockingIOError:
                    continue  # read everything for now, not closed yet
                except OSError:
                    pass  # reset by the server: closed
                still_open.discard(sock)  # recv returned b"": closed by the server
        return len(still_open)

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def server_port(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_RECEIVE_TIMEOUT_SECONDS=str(RECEIVE_TIMEOUT_S),
        MEMORIA_MAX_RECEIVING_CALLS=str(MAX_RECEIVING),
        MEMORIA_CONNECTION_IDLE_SECONDS=str(CONNECTION_IDLE_S),
        MEMORIA_HANDSHAKE_TIMEOUT_SECONDS=str(CONNECTION_IDLE_S),
        MEMORIA_SHUTDOWN_GRACE_SECONDS="1",
    )
    port_file = tmp_path / "port"
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                *(str(MEMORIA), "serve", "--listen", "127.0.0.1:0"),
                *("--data-dir", str(tmp_path / "d"), "--port-file", str(port_file)),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip().isdigit()):
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "no port file"
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
        yield int(port_file.read_text()), log
        assert process.poll() is None, "the server must survive the attack"
    finally:
        process.kill()
        process.wait()


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def test_a_victim_is_served_while_an_attacker_holds_streams_and_connections(
    server_port: tuple[int, Path],
) -> None:
    port, log = server_port
    victim_channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(victim_channel).result(timeout=10)
    victim = pb_grpc.MemoryBlockServiceStub(victim_channel)
    victim.RewriteMemoryBlock(
        pb.RewriteMemoryBlockRequest(text="Preferred name: Vic", writer=block_pb.WRITER_USER),
        metadata=WHO,
        timeout=10,
    )
    attacker = Attacker(port)
    try:
        half_sent = attacker.half_sent(HALF_SENT_CONNECTIONS, HALF_SENT_PER_CONNECTION)
        half_sent += attacker.half_sent(1, GREEDY_HALF_SENT)
        reflection = attacker.reflection(REFLECTION_STREAMS)
        attacker.idle(IDLE_CONNECTIONS)
        attacker.silent(SILENT_CONNECTIONS)
        held = len(attacker.sockets)

        latencies: list[float] = []
        failures: list[str] = []
        for _ in range(VICTIM_CALLS):
            started = time.monotonic()
            try:
                got = victim.GetMemoryBlock(
                    pb.GetMemoryBlockRequest(), metadata=WHO, timeout=VICTIM_BOUND_S
                )
                assert got.memory_block.text == "Preferred name: Vic"
            except grpc.RpcError as error:
                assert isinstance(error, grpc.Call)
                failures.append(error.code().name)
            latencies.append(time.monotonic() - started)
        p50, p99 = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
        print(
            f"\nattack: {half_sent} half-sent requests on {HALF_SENT_CONNECTIONS + 1} connections, "
            f"{reflection} silent reflection streams, {IDLE_CONNECTIONS} idle TCP and "
            f"{SILENT_CONNECTIONS} silent HTTP/2 connections ({held} sockets); victim: "
            f"{VICTIM_CALLS} calls, p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
            f"failures {failures}"
        )
        assert failures == []
        assert p99 < VICTIM_BOUND_S

        # The limits reap what the attacker holds: after the receive bound and the idle bound
        # (plus the monitor's tick), no half-sent request or idle connection is left open.
        still_open = attacker.wait_closed(RECEIVE_TIMEOUT_S + CONNECTION_IDLE_S + 10)
        print(f"attacker connections still open after the bounds: {still_open} of {held}")
        assert still_open == 0
        output = log.read_text(errors="replace")
        # Past MAX_RECEIVING waiting requests, the attacker's connections were refused.
        assert "refused calls of connections holding too many unsent requests" in output
        assert "Traceback" not in output
    finally:
        attacker.close()
        victim_channel.close()
