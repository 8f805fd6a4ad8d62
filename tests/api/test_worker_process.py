"""`memoria worker`: indexing in a process of its own, beside a server that does not index.

Runs on the suite's PostgreSQL and the suite's real Qdrant server (a collection of this
test's own), the stores several processes can share. The worker is killed with SIGKILL while
it embeds a 10-chunk turn; a new worker indexes the turn exactly once (10 chunks, no
duplicates).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import conversation_search_service_pb2_grpc as pb_grpc
from server.adapters.qdrant.server import QdrantServerChunkIndex
from tests.api.conftest import Metadata, shared_embedder
from tests.api.test_lifecycle import START_TIMEOUT_S, _env
from tests.conftest import PgDatabase
from tests.processes import MEMORIA, wait_for_port
from tests.qdrant_server import QdrantEndpoint

pytestmark = [pytest.mark.postgres, pytest.mark.qdrant]
WHO: Metadata = (("x-memoria-tenant", "t-worker-process"), ("x-memoria-principal", "alice"))


@pytest.fixture
def stores(postgres: PgDatabase, qdrant: QdrantEndpoint, qdrant_collection: str) -> dict[str, str]:
    return qdrant.env() | {
        "MEMORIA_DATABASE_URL": postgres.app_url,
        "MEMORIA_QDRANT_COLLECTION": qdrant_collection,
        "MEMORIA_LOG_LEVEL": "DEBUG",
    }


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def spawn(
    started: list[subprocess.Popen[bytes]], args: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    (tmp := log.parent).mkdir(exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(MEMORIA), *args],
            cwd=tmp,
            env={**_env(), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    started.append(process)
    return process


def wait_for_line(log: Path, needle: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while needle not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{needle!r} never logged:\n{log.read_text()}"
        time.sleep(0.01)  # polling a log the process writes, bounded


def test_a_separate_worker_indexes_and_survives_a_kill_mid_turn(
    stores: dict[str, str],
    qdrant: QdrantEndpoint,
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    server_env = {**stores, "MEMORIA_INDEX_WORKER_THREADS": "0"}
    port_file, server_log = tmp_path / "port", tmp_path / "serve.log"
    server = spawn(
        processes,
        ["serve", "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
        server_env,
        server_log,
    )
    port = wait_for_port(server, port_file, server_log, timeout=START_TIMEOUT_S)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ConversationSearchServiceStub(channel)
    when = Timestamp()
    when.GetCurrentTime()
    answer = " ".join(f"paragraph {i} about the otter census." for i in range(1300))
    accepted = stub.IndexTurn(
        pb.IndexTurnRequest(
            conversation_id="otters",
            turn_id="t1",
            question="Census notes?",
            answer=answer,
            turn_time=when,
        ),
        metadata=WHO,
    )
    assert (accepted.outcome, accepted.chunk_count) == (pb.INDEX_TURN_OUTCOME_ACCEPTED, 10)
    # The server has no indexing threads: until a worker runs, the turn is only queued.
    assert not stub.SearchConversations(
        pb.SearchConversationsRequest(query="otter census"), metadata=WHO
    ).hits

    first_log = tmp_path / "worker-1.log"
    first = spawn(processes, ["worker"], stores, first_log)
    wait_for_line(first_log, "indexing turns")
    first.kill()  # mid-turn: embedding 10 chunks; its claim dies with its connection
    first.wait()

    second_log = tmp_path / "worker-2.log"
    spawn(processes, ["worker"], stores, second_log)
    deadline = time.monotonic() + 60
    hits: list[pb.SearchHit] = []
    while not hits:
        assert time.monotonic() < deadline, second_log.read_text()
        hits = list(
            stub.SearchConversations(
                pb.SearchConversationsRequest(query="otter census"), metadata=WHO
            ).hits
        )
        time.sleep(0.1)  # polling the public API for the worker, bounded
    assert [(h.conversation_id, h.turn_id) for h in hits] == [("otters", "t1")]
    channel.close()

    embedder = shared_embedder()
    index = QdrantServerChunkIndex(
        qdrant.client(),
        stores["MEMORIA_QDRANT_COLLECTION"],
        embedder.dimension,
        embedder.model_id,
    )
    try:
        assert index.count("t-worker-process", "alice", "otters") == 10
    finally:
        index.close()
    # qdrant-client 1.20 would warn that it is "incompatible" with server 1.18 in every
    # process; Memoria's own check (server/adapters/qdrant/server.py) logs a tested version
    # once, at info level.
    for log in (server_log, first_log, second_log):
        text = log.read_text(errors="replace")
        assert "check_compatibility" not in text
        assert "Qdrant server 1.18." in text
