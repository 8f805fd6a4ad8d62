"""Memoria on a three-node Qdrant cluster on loopback, one node killed and restarted under
indexing and search (tests/qdrant_server.py starts the nodes).

The collection: one for all tenants, `tenant_id` keyword index marked `is_tenant` (as on a
single server), 3 shards with replication factor 2, so every shard keeps a replica while one
node is down. Custom shard keys per large tenant are not used: Memoria's tenants are many and
small, and `is_tenant` already stores each tenant's points together on every shard.

What must hold (issue 15, item 2): every accepted turn is eventually searchable exactly once;
a search during the failure answers correctly (a turn confirmed indexed is found) or fails
loudly with STORE_UNAVAILABLE, never with a turn missing as if the result were complete; health
reports what is true (the node Memoria talks to stays up, so search stays SERVING as long as
searches succeed). Every wait is a bounded poll.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import conversation_search_service_pb2 as pb
from server.runtime.health import SEARCH_SERVICE
from tests.api.conftest import Api, error_info, server_settings, serving
from tests.api.test_qdrant_server import CALL_TIMEOUT_S, found, index_turn
from tests.conftest import REQUIRE_QDRANT
from tests.qdrant_server import QdrantProcess, qdrant_binary, qdrant_cluster, scratch_dir

pytestmark = pytest.mark.qdrant

SERVING = health_pb2.HealthCheckResponse.SERVING
RECOVERY_BOUND_S = 90.0
STORE_UNAVAILABLE = "ERROR_REASON_STORE_UNAVAILABLE"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[QdrantProcess]]:
    if qdrant_binary() is None:
        message = "the cluster test needs a Qdrant binary (MEMORIA_TEST_QDRANT_BIN)"
        if REQUIRE_QDRANT:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with scratch_dir(tmp_path / "cluster") as directory, qdrant_cluster(directory) as nodes:
        yield nodes


def token(turn: str) -> str:
    """A rare token of the turn's own, which the keyword side ranks first."""
    return f"QX{turn.replace('-', '')}Z"


def index_alone(api: Api, turn: str, *, wait: bool) -> pb.IndexTurnResponse:
    """Index the turn with its token, in a conversation of its own: a chunk's keyword vector
    also holds its conversation neighbours' words (server/domain/context.py), and each shard
    of a cluster weighs a term by its own IDF, so on a collection this small a neighbour
    holding the token at half weight could outrank the turn and blur what is checked here
    (that a confirmed turn is found, first, or the search fails loudly)."""
    return index_turn(
        api, turn, f"The reference is {token(turn)}.", wait=wait, conversation=f"c-{turn}"
    )


class Observed:
    """What the calls during the failure saw."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.health: Counter[int] = Counter()

    def search_for(self, api: Api, turn: str) -> None:
        """A turn confirmed indexed is the first hit, or the search fails loudly."""
        try:
            hits = found(api, token(turn))
        except grpc.RpcError as error:
            assert isinstance(error, grpc.Call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
            assert error_info(error).reason == STORE_UNAVAILABLE
            self.outcomes["search unavailable"] += 1
            return
        assert hits[:1] == [turn], f"{turn} missing from a result presented as complete: {hits}"
        assert len(hits) == len(set(hits))
        self.outcomes["search correct"] += 1

    def index(self, api: Api, turn: str) -> bool:
        """Index with wait; True if confirmed searchable, False if only accepted."""
        try:
            response = index_alone(api, turn, wait=True)
        except grpc.RpcError as error:
            assert isinstance(error, grpc.Call)
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
            assert error_info(error).reason == STORE_UNAVAILABLE
            self.outcomes["index accepted, not yet searchable"] += 1
            return False
        assert response.outcome == pb.INDEX_TURN_OUTCOME_INDEXED
        self.outcomes["index searchable"] += 1
        return True

    def check_health(self, api: Api) -> None:
        stub = health_pb2_grpc.HealthStub(api.channel)
        request = health_pb2.HealthCheckRequest(service=SEARCH_SERVICE)
        self.health[stub.Check(request, timeout=CALL_TIMEOUT_S).status] += 1


def poll(what: str, done: Callable[[], bool], bound: float) -> float:
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < bound, f"{what}: not within {bound}s"
        time.sleep(0.1)  # polling the cluster's public state, bounded
    return time.monotonic() - started


def test_a_node_killed_and_restarted_under_indexing_and_search(
    cluster: list[QdrantProcess], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    entry, _, victim = cluster
    settings = server_settings(
        "sqlite",
        request,
        tmp_path,
        qdrant_url=entry.endpoint.url,
        qdrant_grpc_port=entry.endpoint.grpc_port,
        qdrant_collection="cluster",
        qdrant_shard_number=3,
        qdrant_replication_factor=2,
    )
    with serving(settings) as api:
        turns = [f"before-{i}" for i in range(6)]
        for turn in turns:
            index_alone(api, turn, wait=True)
        seen = Observed()
        for turn in turns:
            seen.search_for(api, turn)
        assert seen.outcomes == Counter({"search correct": 6})

        victim.kill()
        confirmed = list(turns)
        for i in range(12):
            turn = f"during-{i}"
            turns.append(turn)
            if seen.index(api, turn):
                confirmed.append(turn)
            for earlier in confirmed[-4:]:
                seen.search_for(api, earlier)
            seen.check_health(api)

        victim.start()  # the same storage and ports: it rejoins and its replicas recover
        recovery = poll(
            "every accepted turn searchable",
            lambda: all(_first_hit(api, token(t)) == t for t in turns),
            RECOVERY_BOUND_S,
        )
        # Exactly once: one chunk per turn, however the writes were retried.
        assert api.running.index.count(api.tenant, "ana") == len(turns)
        replicas = poll(
            "every replica Active again, no transfer running",
            lambda: _all_replicas_active(entry) and _all_replicas_active(victim),
            RECOVERY_BOUND_S,
        )
        # The restarted node's replicas hold what was written while it was down: with the
        # third node killed, every shard it shared with the victim is served by the victim.
        cluster[1].kill()
        alone = poll(
            "every turn searchable without the third node",
            lambda: all(_first_hit(api, token(t)) == t for t in turns),
            RECOVERY_BOUND_S,
        )
        assert api.running.index.count(api.tenant, "ana") == len(turns)
        print(
            f"during the failure: {dict(seen.outcomes)}; health {dict(seen.health)}; "
            f"all {len(turns)} turns searchable {recovery:.1f}s after the restart, every "
            f"replica Active {replicas:.1f}s later; with the third node killed instead, all "
            f"found within {alone:.1f}s"
        )
        # The entry node answered throughout: health said SERVING, as searches succeeded.
        if seen.outcomes["search unavailable"] == 0:
            assert set(seen.health) == {SERVING}


def _first_hit(api: Api, query: str) -> str | None:
    try:
        hits = found(api, query)
    except grpc.RpcError:
        return None
    return hits[0] if hits else None


def _all_replicas_active(node: QdrantProcess) -> bool:
    """The node's view of the collection: every local and remote replica Active, no shard
    transfer under way (Qdrant's own /collections/{name}/cluster report)."""
    try:
        info = httpx.get(f"{node.endpoint.url}/collections/cluster/cluster", timeout=5).json()
    except httpx.HTTPError:
        return False
    result = info["result"]
    states = [r["state"] for r in (*result["local_shards"], *result["remote_shards"])]
    return not result["shard_transfers"] and len(states) == 6 and set(states) == {"Active"}
