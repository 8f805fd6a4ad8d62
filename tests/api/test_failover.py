"""Failover (issue 22, item 1): the primary PostgreSQL is lost under load and its synchronous
standby promoted; nothing acknowledged is lost and no caller sees more than UNAVAILABLE.

Two clusters of Debian's PostgreSQL on loopback (tests/replication.py): a primary and a
streaming-replication standby it names in synchronous_standby_names, synchronous_commit=on.
Memoria's migrations and roles are applied as for the suite's PostgreSQL (the owner migrates,
the service runs as the non-superuser memoria_app under row-level security). Two real
`memoria serve` processes run on SQLAlchemy's multi-host URL of both servers with
`target_session_attrs=read-write`: A takes the load, B (no indexing thread) serves renders from
its read cache, which only the change notifications of A's writes can keep right.

Under a steady mixed load from a few client threads (the model's RewriteMemoryBlock with a
render after each, IndexTurn, SearchConversations; bounded in count and time), the primary's
processes are killed with SIGKILL; once A's health says NOT_SERVING and every kind of call has
met the outage, the standby is promoted (`pg_ctl promote`, what Patroni or CloudNativePG would
do). Then:

- every acknowledged rewrite (its text and etag) has exactly one audit event, and every
  acknowledged IndexTurn is listed exactly once; of the calls that failed, only one cut off at
  the kill per caller may have committed;
- no render after an acknowledged rewrite shows an older version, and B, whose cache held the
  old version, shows A's next write: both listeners are connected to the new primary;
- every failed call failed with UNAVAILABLE and ERROR_REASON_STORE_UNAVAILABLE (never
  INTERNAL);
- A's health went NOT_SERVING and came back to SERVING;
- the times from the kill to NOT_SERVING, to the promotion and to the first write served again
  are printed (`pytest -s`; bench/README.md, "Failover").
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import audit_service_pb2_grpc as audit_grpc
from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.adapters.sql.cache import LISTENER_APPLICATION_NAME
from tests.api.conftest import error_info
from tests.processes import MEMORIA, clean_env, failed_in_one_line, wait_for_port
from tests.replication import ReplicatedPostgres

pytestmark = pytest.mark.postgres

TENANT = "t-failover"
WRITERS = ("ana", "bo", "cy")
CALL_TIMEOUT_S = 15.0
START_TIMEOUT_S = 60.0
LOAD_DEADLINE_S = 90.0
"""No load thread runs longer than this, whatever happens to the test."""
MAX_CALLS = 600
"""Nor makes more calls than this."""
PAUSE_S = 0.02
"""Between two calls of a load thread: a steady trickle, not a busy loop."""
HEALTH_BOUND_S = 10.0
NOTIFY_BOUND_S = 5.0
"""How long B may take to hear of A's write (milliseconds when the listener is connected; its
read cache's entries would otherwise live for the default 60 s)."""
UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, "ERROR_REASON_STORE_UNAVAILABLE")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def who(principal: str, roles: str = "") -> tuple[tuple[str, str], ...]:
    md = (("x-memoria-tenant", TENANT), ("x-memoria-principal", principal))
    return (*md, ("x-memoria-roles", roles)) if roles else md


@dataclass
class Server:
    """One `memoria serve` process and a channel to it."""

    process: subprocess.Popen[bytes]
    log: Path
    port_file: Path
    port: int = 0
    channel: grpc.Channel | None = None

    @property
    def blocks(self) -> pb_grpc.MemoryBlockServiceStub:
        assert self.channel is not None
        return pb_grpc.MemoryBlockServiceStub(self.channel)

    @property
    def search(self) -> search_grpc.ConversationSearchServiceStub:
        assert self.channel is not None
        return search_grpc.ConversationSearchServiceStub(self.channel)


@pytest.fixture
def servers(
    replicated_postgres: ReplicatedPostgres, tmp_path: Path
) -> Iterator[tuple[Server, Server]]:
    """A (the load) and B (renders only, no indexing thread) on the multi-host URL."""
    started: list[Server] = []
    try:
        for name, extra in (("a", {}), ("b", {"MEMORIA_INDEX_WORKER_THREADS": "0"})):
            log = tmp_path / f"server-{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [
                        *(str(MEMORIA), "serve", "--listen", "127.0.0.1:0"),
                        *("--data-dir", str(tmp_path / name)),
                        *("--port-file", str(tmp_path / f"port-{name}")),
                    ],
                    cwd=tmp_path,
                    env=clean_env(
                        MEMORIA_DATABASE_URL=replicated_postgres.app_url,
                        MEMORIA_PAGE_TOKEN_SECRET="failover-test-secret-0123456789",
                        MEMORIA_SHUTDOWN_GRACE_SECONDS="1",
                        **extra,
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            started.append(Server(process, log, tmp_path / f"port-{name}"))
        for server in started:
            server.port = wait_for_port(
                server.process, server.port_file, server.log, timeout=START_TIMEOUT_S
            )
            server.channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        yield started[0], started[1]
        for server in started:
            assert server.process.poll() is None, server.log.read_text(errors="replace")
            assert "Traceback" not in server.log.read_text(errors="replace")
    finally:
        for server in started:
            if server.channel is not None:
                server.channel.close()
            server.process.kill()
            server.process.wait()


# --- the load -----------------------------------------------------------------------------


@dataclass
class Caller:
    """One load thread: calls `step(n)` again and again until told to stop (or its bounds are
    reached), keeping every failure's status and reason and when each success ended."""

    name: str
    step: Callable[[int], None]
    failed: list[tuple[int, grpc.StatusCode, str]] = field(default_factory=list)
    succeeded: list[tuple[int, float, float]] = field(default_factory=list)  # n, start, end
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + LOAD_DEADLINE_S
        for n in range(MAX_CALLS):
            if self._stop.is_set() or time.monotonic() > deadline:
                return
            began = time.monotonic()
            try:
                self.step(n)
                self.succeeded.append((n, began, time.monotonic()))
            except grpc.RpcError as error:
                assert isinstance(error, grpc.Call)
                try:
                    reason = error_info(error).reason
                except AssertionError:  # no ErrorInfo: kept, and the test's check fails
                    reason = ""
                self.failed.append((n, error.code(), reason))
            self._stop.wait(PAUSE_S)

    def successes(self, since: float, at_least: int) -> bool:
        """Whether at least `at_least` calls begun after `since` (monotonic) succeeded."""
        return sum(began > since for _, began, _ in self.succeeded) >= at_least

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(CALL_TIMEOUT_S + 5)
        assert not self._thread.is_alive()


class Writer:
    """The model rewriting one principal's block through A, each text new, and rendering it
    right after every acknowledged rewrite: the render must not show an older version."""

    def __init__(self, a: Server, principal: str) -> None:
        self.a = a
        self.principal = principal
        self.acked: dict[str, str] = {}  # text -> etag of every acknowledged rewrite
        self.stale_renders: list[tuple[str, str]] = []  # (acknowledged, rendered)
        self.caller = Caller(f"writer-{principal}", self.rewrite)

    def text(self, n: int) -> str:
        return f"{self.principal} fact {n}"

    def rewrite(self, n: int) -> None:
        text = self.text(n)
        request = pb.RewriteMemoryBlockRequest(
            text=text,
            writer=block_pb.WRITER_MODEL,
            turn=block_pb.TurnReference(conversation_id="chat", turn_id=f"w{n}"),
        )
        response = self.a.blocks.RewriteMemoryBlock(
            request, metadata=who(self.principal), timeout=CALL_TIMEOUT_S
        )
        assert response.changed and response.memory_block.text == text
        self.acked[text] = response.memory_block.etag
        rendered = self.a.blocks.RenderMemoryBlock(
            pb.RenderMemoryBlockRequest(), metadata=who(self.principal), timeout=CALL_TIMEOUT_S
        )
        # A later write of this principal can only come from this thread: the render shows
        # exactly this version.
        if rendered.etag != response.memory_block.etag or text not in rendered.prompt_section:
            self.stale_renders.append((text, rendered.prompt_section))


def index_turn(a: Server, principal: str, turn: str, *, wait: bool) -> int:
    when = Timestamp()
    when.GetCurrentTime()
    request = search_pb.IndexTurnRequest(
        conversation_id="trips",
        turn_id=turn,
        question=f"Where did trip {turn} go?",
        answer=f"Trip {turn} went to Lisbon by train.",
        turn_time=when,
        wait=wait,
    )
    response = a.search.IndexTurn(request, metadata=who(principal), timeout=CALL_TIMEOUT_S * 4)
    return int(response.outcome)


class HealthLog:
    """A's overall health through a Watch stream, read on a thread into a queue."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.statuses: queue.Queue[tuple[int, float]] = queue.Queue()
        self._stream = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=600
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # cancelled at the end of the test
            for response in self._stream:
                self.statuses.put((response.status, time.monotonic()))

    def next(self) -> tuple[int, float]:
        """The next status reported (the server sends changes only) and when it came."""
        try:
            return self.statuses.get(timeout=HEALTH_BOUND_S)
        except queue.Empty:
            raise AssertionError(f"no new health status within {HEALTH_BOUND_S} s") from None

    def cancel(self) -> None:
        self._stream.cancel()


def wait_until(condition: Callable[[], bool], bound: float, what: str) -> None:
    """Bounded polling of state the test cannot be told about."""
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {bound} s"
        time.sleep(0.01)


# --- reading back -------------------------------------------------------------------------


def rewrite_events(a: Server, principal: str) -> list[str]:
    """The added line of each of the principal's rewrite events, oldest first."""
    assert a.channel is not None
    stub = audit_grpc.AuditServiceStub(a.channel)
    request = audit_pb.ListAuditEventsRequest(
        principal_id=principal, actions=[audit_pb.AUDIT_ACTION_BLOCK_REWRITTEN], page_size=100
    )
    texts: list[str] = []
    while True:
        page = stub.ListAuditEvents(request, metadata=who("admin", "memoria-admin"), timeout=10)
        texts.extend(event.added_lines[0] for event in page.events)
        if not page.next_page_token:
            return list(reversed(texts))
        request.page_token = page.next_page_token


def listed_turns(a: Server, principal: str) -> list[str]:
    request = search_pb.ListConversationTurnsRequest(conversation_id="trips", page_size=100)
    turns: list[str] = []
    while True:
        page = a.search.ListConversationTurns(request, metadata=who(principal), timeout=10)
        turns.extend(turn.turn_id for turn in page.turns)
        if not page.next_page_token:
            return turns
        request.page_token = page.next_page_token


def block(server: Server, principal: str) -> block_pb.MemoryBlock:
    request = pb.GetMemoryBlockRequest()
    response = server.blocks.GetMemoryBlock(request, metadata=who(principal), timeout=10)
    return response.memory_block


def shows(server: Server, principal: str, text: str) -> bool:
    return block(server, principal).text == text


def listeners(cluster: ReplicatedPostgres, port: int) -> int:
    """The read caches' listener connections on the server at `port`."""
    with cluster.superuser(port) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"{LISTENER_APPLICATION_NAME} %",),
        ).fetchone()
    assert row is not None
    count = row[0]
    assert isinstance(count, int)
    return count


def test_a_killed_primary_and_a_promoted_standby_lose_nothing_acknowledged(
    replicated_postgres: ReplicatedPostgres, servers: tuple[Server, Server]
) -> None:
    a, b = servers
    cluster = replicated_postgres
    # A URL naming the standby alone is refused at start in one line (issue 22 item 4): every
    # write would fail there, and its read cache would hear nobody's writes.
    standby_only = (
        f"postgresql+psycopg://memoria_app:memoria_app@127.0.0.1:{cluster.standby_port}/memoria"
    )
    refusal, _ = failed_in_one_line(
        ["serve", "--listen", "127.0.0.1:0", "--data-dir", str(a.log.parent / "standby-only")],
        a.log.parent,
        clean_env(MEMORIA_DATABASE_URL=standby_only),
    )
    assert "reaches a standby" in refusal and "target_session_attrs=read-write" in refusal, refusal
    # Both read caches are on (their listeners connect once the servers are up).
    wait_until(lambda: listeners(cluster, cluster.primary_port) == 2, 15, "listeners")
    for principal in WRITERS:  # B caches each (still empty) block
        block(b, principal)
    health = HealthLog(a.channel)  # type: ignore[arg-type]
    assert health.next()[0] == SERVING

    writers = [Writer(a, principal) for principal in WRITERS]
    turns_acked: list[str] = []

    def index(n: int) -> None:
        assert index_turn(a, "ana", f"t{n}", wait=False) == search_pb.INDEX_TURN_OUTCOME_ACCEPTED
        turns_acked.append(f"t{n}")

    def search(n: int) -> None:
        request = search_pb.SearchConversationsRequest(query="Lisbon train", page_size=5)
        a.search.SearchConversations(request, metadata=who("ana"), timeout=CALL_TIMEOUT_S)

    def render_on_b(n: int) -> None:
        request = pb.RenderMemoryBlockRequest()
        b.blocks.RenderMemoryBlock(request, metadata=who(WRITERS[n % 3]), timeout=CALL_TIMEOUT_S)

    callers = [
        *(writer.caller for writer in writers),
        Caller("indexer", index),
        Caller("searcher", search),
        Caller("b-renders", render_on_b),
    ]
    for caller in callers:
        caller.start()
    try:
        for caller in callers:  # the load is under way before the primary goes
            wait_until(partial(caller.successes, 0, 3), 30, f"{caller.name} warm-up")

        killed = cluster.kill_primary()  # when SIGKILL went to the primary's last process
        status, down_at = health.next()
        assert status == NOT_SERVING
        # Every kind of call meets the outage before the standby takes over.
        wait_until(lambda: all(c.failed for c in callers), 15, "every caller meets the outage")
        promoting = time.monotonic()
        cluster.promote()
        promoted = time.monotonic()
        status, up_at = health.next()
        assert status == SERVING
        for caller in callers:  # and goes on on the new primary
            wait_until(partial(caller.successes, promoted, 3), 30, f"{caller.name} after")
    finally:
        for caller in callers:
            caller.stop()
        health.cancel()

    # Nobody saw more than a retryable store outage; somebody did see it.
    failures = [(c.name, code, reason) for c in callers for _, code, reason in c.failed]
    assert {(code, reason) for _, code, reason in failures} == {UNAVAILABLE}, failures

    # Every acknowledged rewrite has exactly one audit event, and its etag is the block's
    # when it was the last; only a rewrite cut off at the kill may have committed unanswered.
    acked_total = 0
    for writer in writers:
        events = rewrite_events(a, writer.principal)
        assert len(events) == len(set(events)), "a rewrite recorded twice"
        assert set(writer.acked) <= set(events), set(writer.acked) - set(events)
        unanswered = set(events) - set(writer.acked)
        failed_texts = {writer.text(n) for n, _, _ in writer.caller.failed}
        assert unanswered <= failed_texts and len(unanswered) <= 1, unanswered
        assert not writer.stale_renders, writer.stale_renders
        last = block(a, writer.principal)
        assert last.text == events[-1]
        if last.text in writer.acked:
            assert last.etag == writer.acked[last.text]
        acked_total += len(writer.acked)

    # Every acknowledged turn is listed exactly once, and indexing goes on.
    listed = listed_turns(a, "ana")
    assert len(listed) == len(set(listed))
    assert set(turns_acked) <= set(listed), set(turns_acked) - set(listed)
    indexer = callers[len(writers)]
    assert set(listed) - set(turns_acked) <= {f"t{n}" for n, _, _ in indexer.failed}
    assert index_turn(a, "ana", "final", wait=True) == search_pb.INDEX_TURN_OUTCOME_INDEXED

    # Both read caches listen on the new primary, and B's cache, which holds each block's
    # latest version, gives way to A's next write.
    wait_until(lambda: listeners(cluster, cluster.standby_port) == 2, 15, "listeners")
    for writer in writers:
        cached = block(b, writer.principal)
        assert cached.text == block(a, writer.principal).text
        latest = f"{writer.principal} after the failover"
        request = pb.RewriteMemoryBlockRequest(text=latest, writer=block_pb.WRITER_USER)
        a.blocks.RewriteMemoryBlock(request, metadata=who(writer.principal), timeout=10)
        wait_until(partial(shows, b, writer.principal, latest), NOTIFY_BOUND_S, "B's cache")

    first_write = min(
        began for writer in writers for _, began, _ in writer.caller.succeeded if began > killed
    )
    first_write_done = min(
        end for writer in writers for _, began, end in writer.caller.succeeded if began > killed
    )
    print(
        f"\nfailover: {acked_total} rewrites and {len(turns_acked)} turns acknowledged, all "
        f"found once; {len(failures)} calls failed UNAVAILABLE; from the kill: NOT_SERVING "
        f"{down_at - killed:.2f} s, pg_ctl promote started {promoting - killed:.2f} s (returned "
        f"{promoted - killed:.2f} s), SERVING {up_at - killed:.2f} s, first write served "
        f"{first_write_done - killed:.2f} s (sent {first_write - killed:.2f} s); from the "
        f"start of the promotion to the first write served: {first_write_done - promoting:.2f} s"
    )
