"""`scripts/qdrant.sh`, the local Qdrant server beside `make serve` (the twin of scripts/pg.sh):
`start` prints only the export line and finds its running server again, `status` says whether
it runs, a `memoria serve --qdrant-url "$MEMORIA_QDRANT_URL"` beside it indexes and finds a
turn, and `stop` stops it. The script's directory and port are the test's own
(MEMORIA_TEST_QDRANT_DIR, MEMORIA_TEST_QDRANT_PORT), so a developer's server is left alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import conversation_search_service_pb2_grpc as pb_grpc
from tests.conftest import REQUIRE_QDRANT
from tests.processes import MEMORIA, ROOT, clean_env, wait_for_port
from tests.qdrant_server import free_port_pair, qdrant_binary

pytestmark = pytest.mark.qdrant
SCRIPT = ROOT / "scripts" / "qdrant.sh"
START_TIMEOUT_S = 60.0


@pytest.fixture
def script_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The script's environment: this test's directory and port, the suite's Qdrant binary;
    whatever it started is stopped at the end."""
    binary = qdrant_binary()
    if binary is None:
        message = "no Qdrant binary (MEMORIA_TEST_QDRANT_BIN or ../shared/qdrant/qdrant)"
        if REQUIRE_QDRANT:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORIA_", "QDRANT"))}
    env |= {
        "MEMORIA_TEST_QDRANT_BIN": str(binary),
        "MEMORIA_TEST_QDRANT_DIR": str(tmp_path / "qdrant"),
        "MEMORIA_TEST_QDRANT_PORT": str(free_port_pair()),
    }
    try:
        yield env
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60)


def qdrant_sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=120
    )


def test_start_status_serve_beside_it_and_stop(script_env: dict[str, str], tmp_path: Path) -> None:
    port = script_env["MEMORIA_TEST_QDRANT_PORT"]
    url = f"http://127.0.0.1:{port}"
    assert qdrant_sh("status", script_env).returncode == 1
    started = qdrant_sh("start", script_env)
    assert started.returncode == 0, started.stderr
    assert started.stdout == f"export MEMORIA_QDRANT_URL={url}\n"
    assert qdrant_sh("env", script_env).stdout == started.stdout
    status = qdrant_sh("status", script_env)
    assert status.returncode == 0
    assert f"running on 127.0.0.1:{port}" in status.stderr
    again = qdrant_sh("start", script_env)  # finds its server again
    assert (again.returncode, again.stdout) == (0, started.stdout)
    assert "already running" in again.stderr

    log = tmp_path / "serve.log"
    port_file = tmp_path / "serve.port"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [
                str(MEMORIA),
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--port-file",
                str(port_file),
                "--qdrant-url",
                url,
                "--data-dir",
                str(tmp_path / "data"),
            ],
            cwd=tmp_path,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        grpc_port = wait_for_port(serve, port_file, log, timeout=START_TIMEOUT_S)
        who = (("x-memoria-tenant", "acme"), ("x-memoria-principal", "ana"))
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            search = pb_grpc.ConversationSearchServiceStub(channel)
            indexed = search.IndexTurn(
                pb.IndexTurnRequest(
                    conversation_id="c1",
                    turn_id="t1",
                    question="Which account got the refund?",
                    answer="acct-4821, on Monday.",
                    turn_time=Timestamp(seconds=1_800_000_000),
                    wait=True,
                ),
                metadata=who,
            )
            assert indexed.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
            hits = search.SearchConversations(
                pb.SearchConversationsRequest(query="acct-4821"), metadata=who
            ).hits
            assert [(h.conversation_id, h.turn_id) for h in hits] == [("c1", "t1")]
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert not (tmp_path / "data" / "chunks").exists()  # the chunks are in the Qdrant server

    stopped = qdrant_sh("stop", script_env)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == ""
    assert qdrant_sh("status", script_env).returncode == 1
    assert qdrant_sh("stop", script_env).returncode == 0  # stopping a stopped server is fine
