"""The real `memoria serve` command as a subprocess (DESIGN 4, 5 and 7).

Starts the installed CLI on 127.0.0.1:0 with a data dir (the embedded SQLite default) and a
port file, then checks what operators and tools rely on: health checking, server reflection,
persistence across a restart, a clean exit 0 on SIGTERM that reports NOT_SERVING for every
service to watchers while draining, and the explicit message size limit.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.adapters.qdrant.edge import QdrantEdgeChunkIndex
from tests.api.conftest import Metadata, shared_embedder
from tests.conftest import SQL_KINDS, PgDatabase
from tests.processes import MEMORIA, clean_env, wait_for_port

START_TIMEOUT_S = 30.0
GRACE_S = 2
EXIT_TIMEOUT_S = GRACE_S + 15.0
WHO: Metadata = (("x-memoria-tenant", "t-lifecycle"), ("x-memoria-principal", "alice"))
SERVING = health_pb2.HealthCheckResponse.SERVING
EVERY_SERVICE = (
    "",
    "memoria.v1.MemoryBlockService",
    "memoria.v1.AuditService",
    "memoria.v1.ConversationSearchService",
    "grpc.health.v1.Health",  # what liveness probes ask about (deploy/README.md)
)
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Server:
    """A `memoria serve` subprocess and a channel to it."""

    process: subprocess.Popen[bytes]
    port: int
    channel: grpc.Channel
    log: Path

    @property
    def blocks(self) -> pb_grpc.MemoryBlockServiceStub:
        return pb_grpc.MemoryBlockServiceStub(self.channel)

    def terminate(self) -> int:
        """SIGTERM, then the exit code (the process must exit within the grace period)."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=EXIT_TIMEOUT_S)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Launch(Protocol):
    """Starts `memoria serve` on a data dir (plus extra arguments and environment) and
    returns it once it serves."""

    def __call__(
        self, data_dir: Path, args: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> Server: ...


def _env() -> dict[str, str]:
    """This environment without MEMORIA_* settings, plus a short shutdown grace."""
    return clean_env(
        MEMORIA_SHUTDOWN_GRACE_SECONDS=str(GRACE_S),
        MEMORIA_PAGE_TOKEN_SECRET="lifecycle-test-secret-0123456789",
    )


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launch]:
    """Starts `memoria serve` on a data dir; every process started is killed at the end."""
    started: list[Server] = []

    def start(
        data_dir: Path, args: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> Server:
        run = len(started)
        port_file = tmp_path / f"port-{run}"
        log = tmp_path / f"server-{run}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(MEMORIA),
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(data_dir),
                    "--port-file",
                    str(port_file),
                    *args,
                ],
                cwd=tmp_path,
                env={**_env(), **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            port = wait_for_port(process, port_file, log, timeout=START_TIMEOUT_S)
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        except BaseException:
            process.kill()
            process.wait()
            raise
        server = Server(process, port, channel, log)
        started.append(server)
        grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.channel.close()
            if server.process.poll() is None:
                server.process.kill()
            server.process.wait()


def _rewrite(server: Server, text: str) -> pb.RewriteMemoryBlockResponse:
    request = pb.RewriteMemoryBlockRequest(text=text, writer=block_pb.WRITER_USER)
    return server.blocks.RewriteMemoryBlock(request, metadata=WHO)


def _get(server: Server) -> block_pb.MemoryBlock:
    return server.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=WHO).memory_block


def test_health_reports_serving(launch: Launch, tmp_path: Path) -> None:
    server = launch(tmp_path / "data")
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", "memoria.v1.MemoryBlockService", "memoria.v1.AuditService"):
        response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert response.status == SERVING, service

    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_services(launch: Launch, tmp_path: Path) -> None:
    server = launch(tmp_path / "data")
    reflection = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (response,) = list(reflection.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in response.list_services_response.service}
    assert {
        "memoria.v1.MemoryBlockService",
        "memoria.v1.AuditService",
        "memoria.v1.ConversationSearchService",
        "grpc.health.v1.Health",
    } <= names

    # The descriptors are served too, so grpcurl can call the service without proto files.
    by_symbol = reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="memoria.v1.MemoryBlockService"
    )
    (described,) = list(reflection.ServerReflectionInfo(iter([by_symbol]), timeout=5))
    assert described.file_descriptor_response.file_descriptor_proto


def test_a_block_persists_across_a_restart(launch: Launch, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = launch(data_dir)
    saved = _rewrite(first, "Name: Ada\nLikes tea").memory_block
    assert _get(first).text == "Name: Ada\nLikes tea"
    assert first.terminate() == 0, first.output()

    second = launch(data_dir)
    block = _get(second)
    assert block.text == "Name: Ada\nLikes tea"
    assert block.etag == saved.etag
    assert block.update_time == saved.update_time
    assert (data_dir / "memoria.sqlite3").exists()
    assert second.terminate() == 0, second.output()


def test_sigterm_reports_not_serving_drains_and_exits_zero(launch: Launch, tmp_path: Path) -> None:
    server = launch(tmp_path / "data")
    assert _rewrite(server, "before shutdown").changed
    health = health_pb2_grpc.HealthStub(server.channel)
    watches = [
        health.Watch(health_pb2.HealthCheckRequest(service=name), timeout=EXIT_TIMEOUT_S)
        for name in EVERY_SERVICE
    ]
    assert [next(watch).status for watch in watches] == [SERVING] * len(EVERY_SERVICE)

    server.process.send_signal(signal.SIGTERM)
    # The watches are calls in flight when SIGTERM arrives: they are not cut off, they are told.
    assert [next(watch).status for watch in watches] == [NOT_SERVING] * len(EVERY_SERVICE)
    # Nothing turns a service back to SERVING while the server drains for the grace period
    # (the store monitor still runs then): each watch just ends when the drain does.
    for watch in watches:
        later: list[int] = []
        with contextlib.suppress(grpc.RpcError):
            later.extend(response.status for response in watch)
        assert later == []

    assert server.process.wait(timeout=EXIT_TIMEOUT_S) == 0, server.output()
    with pytest.raises(grpc.RpcError) as caught:
        server.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=WHO, timeout=5)
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_sigterm_with_no_calls_exits_zero_at_once(launch: Launch, tmp_path: Path) -> None:
    server = launch(tmp_path / "data")
    started = time.monotonic()
    assert server.terminate() == 0, server.output()
    assert time.monotonic() - started < GRACE_S + 5
    assert "stopped" in server.output()


def test_a_message_over_the_receive_limit_is_refused_and_the_server_keeps_serving(
    launch: Launch, tmp_path: Path
) -> None:
    server = launch(tmp_path / "data")
    _rewrite(server, "still here")

    with pytest.raises(grpc.RpcError) as caught:
        _rewrite(server, "x" * (2 << 20))
    assert isinstance(caught.value, grpc.Call)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    assert _get(server).text == "still here"
    assert _rewrite(server, "still serving").changed
    health = health_pb2_grpc.HealthStub(server.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING


@pytest.mark.parametrize("kind", SQL_KINDS)
def test_a_worker_killed_mid_turn_indexes_it_once_after_restart(
    launch: Launch, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """SIGKILL (no cleanup of any kind) while the in-process worker embeds a 10-chunk turn;
    after a restart the turn is indexed exactly once: 10 chunks, no duplicates."""
    args: tuple[str, ...] = ()
    if kind == "postgres":
        db: PgDatabase = request.getfixturevalue("postgres")
        args = ("--database-url", db.app_url)
    data_dir = tmp_path / "data"
    env = {"MEMORIA_LOG_LEVEL": "DEBUG"}
    server = launch(data_dir, args, env)
    stub = search_grpc.ConversationSearchServiceStub(server.channel)
    tenant = f"t-kill-{kind}"
    who = (("x-memoria-tenant", tenant), ("x-memoria-principal", "alice"))
    answer = " ".join(f"paragraph {i} about the heron survey." for i in range(1300))
    when = Timestamp()
    when.GetCurrentTime()
    accepted = stub.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id="birds",
            turn_id="t1",
            question="Survey notes?",
            answer=answer,
            turn_time=when,
        ),
        metadata=who,
    )
    assert accepted.chunk_count == 10
    _wait_for_line(server, "indexing turns")
    server.process.kill()  # mid-turn: the worker is embedding 10 chunks
    server.process.wait()
    server.channel.close()

    restarted = launch(data_dir, args, env)
    stub = search_grpc.ConversationSearchServiceStub(restarted.channel)
    deadline = time.monotonic() + 60
    hits: list[search_pb.SearchHit] = []
    while not hits and time.monotonic() < deadline:
        hits = list(
            stub.SearchConversations(
                search_pb.SearchConversationsRequest(query="heron survey"), metadata=who
            ).hits
        )
        if not hits:
            time.sleep(0.2)  # polling the public API for the background worker, bounded
    assert [(h.conversation_id, h.turn_id) for h in hits] == [("birds", "t1")]
    assert restarted.terminate() == 0
    embedder = shared_embedder()
    index = QdrantEdgeChunkIndex(data_dir / "chunks", embedder.dimension, embedder.model_id)
    try:
        assert index.count(tenant, "alice", "birds") == 10
    finally:
        index.close()


def _wait_for_line(server: Server, needle: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in server.output():
            return
        time.sleep(0.01)
    raise AssertionError(f"{needle!r} never logged:\n{server.output()}")


def test_worker_refuses_the_embedded_stores(tmp_path: Path) -> None:
    """The embedded SQLite and Qdrant engine belong to the one serving process."""
    done = subprocess.run(
        [str(MEMORIA), "worker"], cwd=tmp_path, env=_env(), capture_output=True, timeout=60
    )
    assert done.returncode != 0
    assert b"needs --database-url and --qdrant-url" in done.stderr


def test_compact_refuses_a_data_dir_a_server_holds(launch: Launch, tmp_path: Path) -> None:
    """`memoria compact` is an offline step: it cannot open the index a server is serving."""
    data_dir = tmp_path / "data"
    server = launch(data_dir)
    held = subprocess.run(
        [str(MEMORIA), "compact", "--data-dir", str(data_dir)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        timeout=60,
    )
    assert held.returncode != 0
    assert b"already open in another process" in held.stderr
    assert server.terminate() == 0
    done = subprocess.run(
        [str(MEMORIA), "compact", "--data-dir", str(data_dir)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
