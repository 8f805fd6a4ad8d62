"""Memoria on a real Qdrant server process (tests/qdrant_server.py): what `memoria serve` says
when the server is not there at start, the REST-only mode, and a server outage under a running
Memoria.

The outage test runs a Qdrant server of its own (the suite's serves other tests meanwhile) and
kills it with SIGKILL under a Memoria on SQLite: search health turns NOT_SERVING and searches
answer UNAVAILABLE with STORE_UNAVAILABLE, while blocks and audit keep serving and IndexTurn
keeps accepting turns durably; once the server is back on the same storage and ports, the
backlog is indexed and every turn is found exactly once. Every wait is a bounded poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as block_service_pb
from server.runtime.health import AUDIT_SERVICE, MEMORY_BLOCK_SERVICE, SEARCH_SERVICE
from tests.api.conftest import Api, expect_error, server_settings, serving
from tests.conftest import REQUIRE_QDRANT
from tests.postgres_server import free_port
from tests.processes import clean_env, failed_in_one_line
from tests.qdrant_server import QdrantEndpoint, QdrantProcess, qdrant_binary, scratch_dir

pytestmark = pytest.mark.qdrant

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_BOUND_S = 10.0
"""How soon health must follow the Qdrant server: the monitor probes every second."""
BACKLOG_BOUND_S = 60.0
"""How soon the backlog must be searchable after the restart (retries back off from 2 s)."""
CALL_TIMEOUT_S = 15.0


@pytest.fixture
def own_qdrant(tmp_path: Path) -> Iterator[QdrantProcess]:
    """A Qdrant server of this test's own, to kill and start again; stopped at the end."""
    binary = qdrant_binary()
    if binary is None:
        message = "the outage test needs a Qdrant binary (MEMORIA_TEST_QDRANT_BIN)"
        if REQUIRE_QDRANT:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with scratch_dir(tmp_path / "qdrant") as directory:
        server = QdrantProcess(binary, directory)
        try:
            server.start()
            yield server
        finally:
            server.stop()


def ts() -> Timestamp:
    stamp = Timestamp()
    stamp.FromSeconds(1_780_000_000)
    return stamp


def index_turn(
    api: Api, turn: str, answer: str, *, wait: bool, conversation: str = "trips"
) -> pb.IndexTurnResponse:
    response: pb.IndexTurnResponse = api.search.IndexTurn(
        pb.IndexTurnRequest(
            conversation_id=conversation,
            turn_id=turn,
            question=f"What about {turn}?",
            answer=answer,
            turn_time=ts(),
            wait=wait,
        ),
        metadata=api.who("ana"),
        timeout=CALL_TIMEOUT_S,
    )
    return response


def found(api: Api, query: str) -> list[str]:
    hits = api.search.SearchConversations(
        pb.SearchConversationsRequest(query=query, page_size=10),
        metadata=api.who("ana"),
        timeout=CALL_TIMEOUT_S,
    ).hits
    return [hit.turn_id for hit in hits]


def health_of(api: Api, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(api.channel)
    status: int = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
    return status


def poll(what: str, done: Callable[[], bool], bound: float) -> float:
    """Poll `done` until it holds, within `bound` seconds; return the seconds it took."""
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < bound, f"{what}: not within {bound}s"
        time.sleep(0.05)  # polling the server's public state, bounded
    return time.monotonic() - started


def searchable(api: Api, query: str, turn: str) -> Callable[[], bool]:
    """The turn is the best hit for a rare token of its own (the keyword side ranks it first)."""

    def check() -> bool:
        try:
            return found(api, query)[:1] == [turn]
        except grpc.RpcError:  # still UNAVAILABLE: the channel reconnects
            return False

    return check


def test_a_qdrant_outage_fails_search_loudly_and_loses_no_accepted_turn(
    own_qdrant: QdrantProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    endpoint = own_qdrant.endpoint
    settings = server_settings(
        "sqlite",
        request,
        tmp_path,
        qdrant_url=endpoint.url,
        qdrant_grpc_port=endpoint.grpc_port,
        qdrant_collection="outage",
    )
    with serving(settings) as api:
        ana = api.who("ana")
        index_turn(api, "before", "We fly to Lisbon with TAP on flight TP1234.", wait=True)
        assert found(api, "TP1234")[:1] == ["before"]

        own_qdrant.kill()
        took = poll(
            "search NOT_SERVING",
            lambda: health_of(api, SEARCH_SERVICE) == NOT_SERVING,
            HEALTH_BOUND_S,
        )
        expect_error(
            lambda: found(api, "TP1234"),
            grpc.StatusCode.UNAVAILABLE,
            "ERROR_REASON_STORE_UNAVAILABLE",
        )
        # Blocks and audit do not need the chunk index: they keep serving.
        assert health_of(api, MEMORY_BLOCK_SERVICE) == SERVING
        assert health_of(api, AUDIT_SERVICE) == SERVING
        api.blocks.RewriteMemoryBlock(
            block_service_pb.RewriteMemoryBlockRequest(
                text="Flies with TAP", writer=block_pb.WRITER_USER
            ),
            metadata=ana,
            timeout=CALL_TIMEOUT_S,
        )
        rendered = api.blocks.RenderMemoryBlock(
            block_service_pb.RenderMemoryBlockRequest(), metadata=ana, timeout=CALL_TIMEOUT_S
        )
        assert "Flies with TAP" in rendered.prompt_section
        events = api.audit.ListAuditEvents(
            audit_pb.ListAuditEventsRequest(), metadata=ana, timeout=CALL_TIMEOUT_S
        ).events
        assert [e.action for e in events] == [audit_pb.AUDIT_ACTION_BLOCK_REWRITTEN]
        # Turns are still accepted durably (they wait in the outbox), one or several.
        for turn, answer in [
            ("during1", "The hotel in Porto is Casa XZ7781."),
            ("during2", "The train to Faro leaves at platform QW55."),
        ]:
            accepted = index_turn(api, turn, answer, wait=False)
            assert accepted.outcome == pb.INDEX_TURN_OUTCOME_ACCEPTED

        own_qdrant.start()  # the same storage and ports
        back = poll(
            "search SERVING again",
            lambda: health_of(api, SEARCH_SERVICE) == SERVING,
            HEALTH_BOUND_S,
        )
        indexed = poll(
            "the backlog searchable", searchable(api, "QW55", "during2"), BACKLOG_BOUND_S
        )
        poll("the backlog searchable", searchable(api, "XZ7781", "during1"), BACKLOG_BOUND_S)
        # Every turn is there once: the one from before the outage survived the kill.
        # (The search returns only turns that match, so the count says all three are there.)
        hits = found(api, "TP1234")
        assert hits[0] == "before" and len(hits) == len(set(hits))
        assert api.running.index.count(api.tenant, "ana", "trips") == 3
        print(f"NOT_SERVING after {took:.1f}s; SERVING {back:.1f}s after restart; ", end="")
        print(f"backlog searchable {back + indexed:.1f}s after restart")


def test_rest_only_mode_indexes_and_searches(
    qdrant: QdrantEndpoint,
    qdrant_collection: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """MEMORIA_QDRANT_PREFER_GRPC=false: every call over REST to the URL's port. The gRPC port
    given is one nothing listens on, so a call over gRPC would fail."""
    settings = server_settings(
        "sqlite",
        request,
        tmp_path,
        qdrant_url=qdrant.url,
        qdrant_grpc_port=free_port(),
        qdrant_prefer_grpc=False,
        qdrant_collection=qdrant_collection,
    )
    with serving(settings) as api:
        index_turn(api, "rest", "The locker code is RQ4471.", wait=True)
        assert found(api, "RQ4471") == ["rest"]  # the only turn in this collection
        assert health_of(api, SEARCH_SERVICE) == SERVING


def test_an_unreachable_qdrant_at_start_is_one_line_and_a_failed_exit(tmp_path: Path) -> None:
    """The real `memoria serve` process, pointed at a port nothing listens on."""
    port = free_port()
    last, _ = failed_in_one_line(
        [
            *("serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")),
            *("--qdrant-url", f"http://127.0.0.1:{port}", "--qdrant-grpc-port", str(port)),
        ],
        tmp_path,
        clean_env(),
    )
    assert last.startswith(
        f"memoria serve: cannot reach the Qdrant server at http://127.0.0.1:{port} "
        f"(gRPC port {port}): "
    )
    assert "Connection refused" in last
    # It names what to change, as this command spells it.
    assert last.endswith(
        "; check MEMORIA_QDRANT_URL (or --qdrant-url), "
        "MEMORIA_QDRANT_GRPC_PORT (or --qdrant-grpc-port)"
    )
