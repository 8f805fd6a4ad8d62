"""Health through a real PostgreSQL outage (DESIGN 5; server/runtime/health.py).

The server runs on a PostgreSQL cluster of this test's own (scripts/pg.sh with its own
MEMORIA_PG_DIR and MEMORIA_PG_PORT: the suite's shared cluster serves other tests meanwhile),
which the test stops and starts again while watching `grpc.health.v1` and writing through the
API. It shows that the services go NOT_SERVING within seconds of the outage and SERVING again
once the database is back, that writes during the outage fail with UNAVAILABLE and
ERROR_REASON_STORE_UNAVAILABLE and change nothing, and that every write accepted before,
during the transitions and after is still there with exactly one audit event.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from server.runtime.health import (
    AUDIT_SERVICE,
    LIVENESS,
    MEMORY_BLOCK_SERVICE,
    OVERALL,
    SEARCH_SERVICE,
)
from server.runtime.settings import Settings
from tests.api.conftest import Api, error_info, expect_error, serving
from tests.api.test_audit_api import all_events
from tests.postgres_server import OwnPostgres

pytestmark = pytest.mark.postgres

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
EVERY_SERVICE = (OVERALL, MEMORY_BLOCK_SERVICE, AUDIT_SERVICE, SEARCH_SERVICE)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
STORE_UNAVAILABLE = "ERROR_REASON_STORE_UNAVAILABLE"
USER = block_pb.WRITER_USER
ADMIN_ROLE = "memoria-admin"

HEALTH_BOUND_S = 5.0
"""How soon health must follow the database: the monitor probes every second."""
CALL_TIMEOUT_S = 15.0
BLANKED = "(lines blanked by a delete)"


@pytest.fixture
def outage_api(own_postgres: OwnPostgres, tmp_path: Path) -> Iterator[Api]:
    """The real server (threads, pools, read cache and its listener, the indexing worker) on
    that cluster, with the embedded chunk index."""
    settings = Settings(
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        database_url=own_postgres.app_url,
        page_token_secret="test-page-token-secret-0123456789",
        shutdown_grace_seconds=1,
    )
    with serving(settings) as api:
        yield api


class Watches:
    """One health Watch stream per service, each read on a thread of its own into a queue, so
    that waiting for the next status has a deadline of its own."""

    def __init__(self, channel: grpc.Channel) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        self._queues: dict[str, queue.Queue[int]] = {name: queue.Queue() for name in EVERY_SERVICE}
        self._streams = {
            name: stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=600)
            for name in EVERY_SERVICE
        }
        for name, stream in self._streams.items():
            threading.Thread(
                target=self._read, args=(stream, self._queues[name]), daemon=True
            ).start()
        assert self.next_statuses(time.monotonic()) == dict.fromkeys(EVERY_SERVICE, SERVING)

    @staticmethod
    def _read(stream: Iterator[health_pb2.HealthCheckResponse], into: queue.Queue[int]) -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end of the test
            for response in stream:
                into.put(response.status)

    def next_statuses(self, since: float) -> dict[str, int]:
        """The next status each stream reports (the server sends changes only), each within
        HEALTH_BOUND_S of `since` (monotonic)."""
        statuses = {}
        for name, statuses_of in self._queues.items():
            remaining = since + HEALTH_BOUND_S - time.monotonic()
            try:
                statuses[name] = statuses_of.get(timeout=max(remaining, 0.0))
            except queue.Empty:
                raise AssertionError(
                    f"{name or 'overall'}: no new status within {HEALTH_BOUND_S} s"
                ) from None
        return statuses

    def cancel(self) -> None:
        for stream in self._streams.values():
            stream.cancel()


def until_status(watches: Watches, status: int, since: float) -> None:
    """Every service reports `status` next, within HEALTH_BOUND_S of `since`."""
    assert watches.next_statuses(since) == dict.fromkeys(EVERY_SERVICE, status)


def check_all(api: Api) -> dict[str, int]:
    health = health_pb2_grpc.HealthStub(api.channel)
    return {
        name: health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
        for name in EVERY_SERVICE
    }


# --- the writes, each recorded with its outcome ----------------------------------------------


@dataclass
class Ledger:
    """Every write sent, in order, with what the server answered."""

    accepted: list[tuple[str, str, str]] = field(default_factory=list)  # principal, action, text

    def rewrite(self, api: Api, principal: str, text: str) -> None:
        request = pb.RewriteMemoryBlockRequest(text=text, writer=USER)
        response = api.blocks.RewriteMemoryBlock(
            request, metadata=api.who(principal), timeout=CALL_TIMEOUT_S
        )
        assert response.changed
        self.accepted.append((principal, "rewritten", text))

    def disable(self, api: Api, principal: str) -> None:
        request = pb.UpdateMemorySettingsRequest(memory_enabled=False, writer=USER)
        api.blocks.UpdateMemorySettings(request, metadata=api.who(principal))
        self.accepted.append((principal, "settings", ""))

    def delete(self, api: Api, principal: str) -> None:
        request = pb.DeleteMemoryBlockRequest(writer=USER)
        assert api.blocks.DeleteMemoryBlock(request, metadata=api.who(principal)).deleted
        self.accepted.append((principal, "deleted", ""))

    def delete_conversation(self, api: Api, principal: str, conversation: str) -> None:
        request = search_pb.DeleteConversationRequest(conversation_id=conversation)
        api.search.DeleteConversation(request, metadata=api.who(principal))
        self.accepted.append((principal, "conversation", conversation))


def index_turn(api: Api, principal: str, conversation: str, turn: str, text: str) -> None:
    """Index a turn and wait until it is searchable (turns have no audit event)."""
    when = Timestamp()
    when.GetCurrentTime()
    request = search_pb.IndexTurnRequest(
        conversation_id=conversation,
        turn_id=turn,
        question=f"What about {text}?",
        answer=f"Noted: {text}.",
        turn_time=when,
        wait=True,
    )
    response = api.search.IndexTurn(request, metadata=api.who(principal), timeout=60)
    assert response.outcome == search_pb.INDEX_TURN_OUTCOME_INDEXED


def fails_unavailable(call: Callable[[], object]) -> None:
    expect_error(call, UNAVAILABLE, STORE_UNAVAILABLE)


_ACTIONS = {
    audit_pb.AUDIT_ACTION_BLOCK_REWRITTEN: "rewritten",
    audit_pb.AUDIT_ACTION_BLOCK_DELETED: "deleted",
    audit_pb.AUDIT_ACTION_SETTINGS_UPDATED: "settings",
    audit_pb.AUDIT_ACTION_CONVERSATION_DELETED: "conversation",
}


def recorded(api: Api) -> list[tuple[str, str, str]]:
    """The tenant's audit log, oldest first, in the Ledger's terms (a rewrite by its first
    added line; the tests write one-line blocks)."""
    admin = api.who("admin", roles=ADMIN_ROLE)
    events = all_events(api, admin, audit_pb.ListAuditEventsRequest(principal_id="-"))
    out = []
    for event in reversed(events):
        action = _ACTIONS[event.action]
        detail = event.conversation_id
        if action == "rewritten":
            detail = event.added_lines[0] if event.added_lines else BLANKED
        out.append((event.principal_id, action, detail))
    return out


class Racer:
    """Rewrites one principal's block again and again on a thread, each text new, and keeps
    what each call answered: it is writing when the database goes away and when it returns."""

    def __init__(self, api: Api, principal: str) -> None:
        self.api = api
        self.principal = principal
        self.ok: list[str] = []
        self.failed: list[tuple[str, grpc.StatusCode, str]] = []  # text, code, reason
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="racer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 120  # bounded whatever happens to the test
        n = 0
        while not self._done.is_set() and time.monotonic() < deadline:
            text = f"racer line {n}"
            n += 1
            request = pb.RewriteMemoryBlockRequest(text=text, writer=USER)
            try:
                self.api.blocks.RewriteMemoryBlock(
                    request, metadata=self.api.who(self.principal), timeout=CALL_TIMEOUT_S
                )
                self.ok.append(text)
            except grpc.RpcError as error:
                assert isinstance(error, grpc.Call)
                try:
                    reason = error_info(error).reason
                except AssertionError:  # no ErrorInfo: kept, and the test's check fails
                    reason = ""
                self.failed.append((text, error.code(), reason))
            self._done.wait(0.02)  # a steady trickle of writes, not a busy loop

    def wait_for_ok(self, count: int) -> None:
        """Bounded polling of the racer's own answers until `count` more are OK."""
        target = len(self.ok) + count
        deadline = time.monotonic() + 30
        while len(self.ok) < target:
            assert time.monotonic() < deadline, "the racer's writes are not accepted"
            time.sleep(0.01)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(CALL_TIMEOUT_S + 5)
        assert not self._thread.is_alive()


def test_a_postgresql_outage_turns_health_not_serving_and_loses_no_accepted_write(
    outage_api: Api, own_postgres: OwnPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    api = outage_api
    caplog.set_level(logging.INFO, logger="server.runtime.health")
    ledger = Ledger()
    assert check_all(api) == dict.fromkeys(EVERY_SERVICE, SERVING)

    # Before: accepted writes of every kind that has an audit event, and an indexed turn.
    ledger.rewrite(api, "ana", "ana before")
    ledger.rewrite(api, "bo", "bo before")
    ledger.rewrite(api, "dee", "dee before")
    index_turn(api, "ana", "trips", "before", "the Lisbon trip")
    index_turn(api, "ana", "old", "old", "an old chat")
    watches = Watches(api.channel)

    # 1. An outage with no traffic: the monitor's own probes find it.
    stopped = time.monotonic()
    own_postgres.stop()
    until_status(watches, NOT_SERVING, stopped)
    assert api.running.monitor.down == {"sql store"}  # the embedded chunk index is fine
    liveness = health_pb2.HealthCheckRequest(service=LIVENESS)  # no store outage touches it
    assert health_pb2_grpc.HealthStub(api.channel).Check(liveness, timeout=5).status == SERVING

    # Writes while the database is down fail retryably and change nothing.
    fails_unavailable(lambda: ledger.rewrite(api, "ana", "ana during"))
    fails_unavailable(lambda: ledger.rewrite(api, "cy", "cy during"))
    fails_unavailable(lambda: ledger.delete(api, "bo"))
    fails_unavailable(lambda: ledger.disable(api, "dee"))
    fails_unavailable(lambda: ledger.delete_conversation(api, "ana", "old"))
    fails_unavailable(lambda: index_turn(api, "ana", "trips", "during", "the Porto trip"))
    assert check_all(api) == dict.fromkeys(EVERY_SERVICE, NOT_SERVING)

    restarted = time.monotonic()
    own_postgres.start()
    until_status(watches, SERVING, restarted)

    # After: the same kinds of write are accepted again at once.
    ledger.rewrite(api, "ana", "ana after")
    ledger.rewrite(api, "cy", "cy after")
    ledger.delete(api, "bo")
    ledger.disable(api, "dee")
    ledger.delete_conversation(api, "ana", "old")
    index_turn(api, "ana", "trips", "after", "the Faro trip")

    # 2. An outage while a writer is writing: calls in flight when it starts and ends.
    racer = Racer(api, "racer")
    try:
        racer.wait_for_ok(3)
        stopped = time.monotonic()
        own_postgres.stop()
        until_status(watches, NOT_SERVING, stopped)
        restarted = time.monotonic()
        own_postgres.start()
        until_status(watches, SERVING, restarted)
        racer.wait_for_ok(3)
    finally:
        racer.stop()
        watches.cancel()

    # Every failed write failed as a retryable store outage (never INTERNAL, say).
    assert racer.failed, "no write met the outage"
    assert {(code, reason) for _, code, reason in racer.failed} == {
        (UNAVAILABLE, STORE_UNAVAILABLE)
    }

    # Read back: every accepted write is there, nothing of the refused ones.
    def text(principal: str) -> str:
        request = pb.GetMemoryBlockRequest()
        block = api.blocks.GetMemoryBlock(request, metadata=api.who(principal)).memory_block
        return block.text

    assert (text("ana"), text("bo"), text("cy"), text("dee")) == (
        "ana after",
        "",
        "cy after",
        "dee before",
    )
    settings = api.blocks.GetMemorySettings(pb.GetMemorySettingsRequest(), metadata=api.who("dee"))
    assert not settings.settings.memory_enabled
    hits = api.search.SearchConversations(
        search_pb.SearchConversationsRequest(query="trip", page_size=10), metadata=api.who("ana")
    ).hits
    assert sorted(h.turn_id for h in hits) == ["after", "before"]

    # The audit log holds exactly one event per accepted write, in order. Of the racer's
    # refused writes, none may appear, except that the one cut off at the very moment the
    # database stopped may have committed before its answer was lost (its retry, an
    # identical rewrite, would change nothing).
    events = recorded(api)
    racer_events = [detail for who, _, detail in events if who == "racer"]
    # A block's delete blanks the lines of its principal's earlier events (bo's here).
    deleted = {who for who, action, _ in ledger.accepted if action == "deleted"}
    assert [event for event in events if event[0] != "racer"] == [
        (who, action, BLANKED if action == "rewritten" and who in deleted else detail)
        for who, action, detail in ledger.accepted
    ]
    assert len(ledger.accepted) == 8  # every kind of write, before and after the outage
    assert len(racer_events) == len(set(racer_events))  # no write recorded twice
    assert set(racer.ok) <= set(racer_events)
    unanswered = set(racer_events) - set(racer.ok)
    assert unanswered <= {t for t, _, _ in racer.failed}
    assert len(unanswered) <= 1, unanswered
    assert text("racer") == racer_events[-1]  # the block is the last recorded write

    # Each transition was logged once, not once per probe.
    messages = [r.getMessage() for r in caplog.records if r.name == "server.runtime.health"]
    assert sum("sql store unreachable" in m for m in messages) == 2, messages
    assert sum("sql store reachable again" in m for m in messages) == 2, messages
    assert check_all(api) == dict.fromkeys(EVERY_SERVICE, SERVING)
