"""`memoria serve --workers 2`: two serving processes on one port (server/runtime/processes.py).

The group runs on the suite's PostgreSQL and the suite's real Qdrant server (a collection of
this module's own, on the server's non-standard ports), since the embedded stores allow one
process. Which process serves a connection is read from /proc:
the server side of every established connection to the port is a socket that one of the
children holds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from tests.api.conftest import Metadata
from tests.api.test_lifecycle import START_TIMEOUT_S, _env
from tests.conftest import PgDatabase, PooledDatabase
from tests.processes import MEMORIA, wait_for_port
from tests.qdrant_server import QdrantEndpoint

GRACE_S = 2
EXIT_TIMEOUT_S = GRACE_S + 20.0
SERVING_LINE = re.compile(r"worker (\d+) \(pid (\d+)\) is serving")
MAX_CONNECTIONS = 32  # the kernel picks a child per connection: 32 all on one is 2^-31


@pytest.fixture(scope="module")
def qdrant_env(qdrant: QdrantEndpoint) -> Iterator[dict[str, str]]:
    """The real server and a collection of this module's own, dropped at the end."""
    collection = f"test_workers_{uuid.uuid4().hex[:8]}"
    yield qdrant.env() | {"MEMORIA_QDRANT_COLLECTION": collection}
    client = qdrant.client()
    try:
        client.delete_collection(collection)
    finally:
        client.close()


@dataclass
class Group:
    """A `memoria serve --workers 2` process tree and the connections opened to it."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    channels: list[grpc.Channel] = field(default_factory=list)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> dict[int, int]:
        """Worker index -> pid of the newest process serving in that slot, from the log."""
        return {int(i): int(pid) for i, pid in SERVING_LINE.findall(self.output())}

    def connect(self) -> tuple[grpc.Channel, int]:
        """A new connection (its own subchannel) and the pid of the child that accepted it."""
        before = server_sockets(self.port)
        channel = grpc.insecure_channel(
            f"127.0.0.1:{self.port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        self.channels.append(channel)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == SERVING
        new = server_sockets(self.port) - before
        owners = {pid for pid in self.children().values() if new & sockets_of(pid)}
        assert len(owners) == 1, (new, owners, self.children())
        return channel, owners.pop()

    def connect_to(self, pid: int) -> grpc.Channel:
        """A connection that the given child accepted (the kernel chooses: try a few)."""
        for _ in range(MAX_CONNECTIONS):
            channel, owner = self.connect()
            if owner == pid:
                return channel
        raise AssertionError(f"no connection of {MAX_CONNECTIONS} reached pid {pid}")

    def wait_for_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := re.search(pattern, self.output()):
                return found
            time.sleep(0.05)  # polling the log the group writes, bounded
        raise AssertionError(f"{pattern!r} never logged:\n{self.output()}")


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def server_sockets(port: int) -> set[int]:
    """Inodes of the established TCP sockets whose local end is 127.0.0.1:port (gRPC listens
    on a dual-stack socket, so they are in tcp6 as ::ffff:127.0.0.1)."""
    local = {f"0100007F:{port:04X}", f"0000000000000000FFFF00000100007F:{port:04X}"}
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[1] in local and cols[3] == "01":  # 01: ESTABLISHED
                inodes.add(int(cols[9]))
    return inodes


def sockets_of(pid: int) -> set[int]:
    """Inodes of the sockets a process holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def serve_two(port_file: Path, database_url: str, qdrant_url: str | None = None) -> list[str]:
    """The command of a group of two on port 0 (without `qdrant_url`, the Qdrant server comes
    from the environment)."""
    return [
        str(MEMORIA),
        "serve",
        "--workers",
        "2",
        "--listen",
        "127.0.0.1:0",
        "--port-file",
        str(port_file),
        "--database-url",
        database_url,
        *(["--qdrant-url", qdrant_url] if qdrant_url else []),
    ]


@pytest.fixture
def group(
    request: pytest.FixtureRequest, tmp_path: Path, postgres: PgDatabase, qdrant_env: dict[str, str]
) -> Iterator[Group]:
    """`memoria serve --workers 2` on port 0 with a port file; always stopped at the end.
    Parametrized "pgbouncer", both processes reach PostgreSQL through the transaction-pooling
    PgBouncer, and each one's read cache listens on a direct connection."""
    port_file = tmp_path / "port"
    log = tmp_path / "group.log"
    env = _env() | qdrant_env | {"MEMORIA_SHUTDOWN_GRACE_SECONDS": str(GRACE_S)}
    database_url = postgres.app_url
    if getattr(request, "param", "postgres") == "pinned":
        env |= {"MEMORIA_PIN_CPU": "true"}
    if getattr(request, "param", "postgres") == "pgbouncer":
        pooled: PooledDatabase = request.getfixturevalue("pgbouncer")
        database_url = pooled.pooled_url
        env |= {"MEMORIA_DB_POOLER": "transaction", "MEMORIA_DATABASE_LISTEN_URL": postgres.app_url}
    with log.open("wb") as out:
        process = subprocess.Popen(
            serve_two(port_file, database_url),
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running: Group | None = None
    try:
        running = Group(
            process, wait_for_port(process, port_file, log, timeout=START_TIMEOUT_S), log
        )
        yield running
    finally:
        if running is not None:
            for channel in running.channels:
                channel.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()  # the children die with it (PR_SET_PDEATHSIG)
                process.wait()


def _who() -> Metadata:
    return (("x-memoria-tenant", f"t-{uuid.uuid4().hex[:10]}"), ("x-memoria-principal", "ana"))


@pytest.mark.postgres
@pytest.mark.qdrant
@pytest.mark.parametrize(
    "group",
    ["postgres", pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)],
    indirect=True,
)
def test_two_processes_serve_one_port_on_shared_stores(group: Group) -> None:
    children = group.children()
    assert sorted(children) == [1, 2], group.output()
    assert all(parent_of(pid) == group.process.pid for pid in children.values())
    one, two = children[1], children[2]
    assert one != two

    first = group.connect_to(one)
    second = group.connect_to(two)
    who = _who()

    # A block written through one process is read through the other (PostgreSQL; the
    # other's read cache hears the write through LISTEN/NOTIFY, as a replica's would).
    write = pb.RewriteMemoryBlockRequest(text="Name: Ana\nLikes tea", writer=block_pb.WRITER_USER)
    etag = pb_grpc.MemoryBlockServiceStub(first).RewriteMemoryBlock(write, metadata=who)
    reader = pb_grpc.MemoryBlockServiceStub(second)
    block = reader.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=who).memory_block
    assert (block.text, block.etag) == ("Name: Ana\nLikes tea", etag.memory_block.etag)
    rewrite = pb.RewriteMemoryBlockRequest(text="Name: Ana B.", writer=block_pb.WRITER_USER)
    pb_grpc.MemoryBlockServiceStub(first).RewriteMemoryBlock(rewrite, metadata=who)
    deadline = time.monotonic() + 10
    while reader.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=who).memory_block.text != (
        "Name: Ana B."
    ):
        assert time.monotonic() < deadline, "the other process kept a stale block"
        time.sleep(0.02)  # the notification is asynchronous (milliseconds), bounded

    # A turn indexed through one process is found through the other (one chunk index).
    when = Timestamp()
    when.GetCurrentTime()
    search_grpc.ConversationSearchServiceStub(first).IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id="c-1",
            turn_id="1",
            question="Which account did the refund go to?",
            answer="To acct-4821, on 2 November.",
            turn_time=when,
            wait=True,
        ),
        metadata=who,
    )
    hits = (
        search_grpc.ConversationSearchServiceStub(second)
        .SearchConversations(search_pb.SearchConversationsRequest(query="acct-4821"), metadata=who)
        .hits
    )
    assert [(h.conversation_id, h.turn_id) for h in hits] == [("c-1", "1")]


def thread_cpus(pid: int) -> set[int]:
    """The CPUs any thread of process `pid` may run on (/proc, each thread's list)."""
    cpus: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        listed = re.search(r"^Cpus_allowed_list:\s*(\S+)$", status, re.M)
        assert listed is not None, status
        for part in listed.group(1).split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    return cpus


@pytest.mark.postgres
@pytest.mark.qdrant
@pytest.mark.parametrize("group", ["pinned"], indirect=True)
def test_pinned_processes_each_run_on_one_cpu(group: Group) -> None:
    """MEMORIA_PIN_CPU: every thread of process i (gRPC's, the pools', the cache listener's)
    on the i-th CPU this test may use, so two processes on two CPUs; and they serve."""
    allowed = sorted(os.sched_getaffinity(0))
    children = group.children()
    assert sorted(children) == [1, 2], group.output()
    for index, pid in children.items():
        assert thread_cpus(pid) == {allowed[(index - 1) % len(allowed)]}, group.output()
    if len(allowed) > 1:
        assert thread_cpus(children[1]) != thread_cpus(children[2])
    assert thread_cpus(group.process.pid) == set(allowed)  # the supervisor is not pinned
    for pid in children.values():
        group.connect_to(pid)  # a health check answered SERVING by each
    assert "serving on CPU" in group.output()


@pytest.mark.postgres
@pytest.mark.qdrant
def test_a_killed_process_is_started_again(group: Group) -> None:
    victim = group.children()[1]
    os.kill(victim, signal.SIGKILL)
    group.wait_for_log(
        rf"worker 1 \(pid {victim}\) exited with status -9 after [0-9.]+s; restarting in"
    )
    found = group.wait_for_log(rf"worker 1 \(pid (?!{victim}\))(\d+)\) is serving")
    replacement = int(found.group(1))
    assert parent_of(replacement) == group.process.pid
    # The new process serves on the same port; the other one never stopped.
    channel = group.connect_to(replacement)
    who = _who()
    request = pb.RenderMemoryBlockRequest()
    assert pb_grpc.MemoryBlockServiceStub(channel).RenderMemoryBlock(request, metadata=who)
    assert group.process.poll() is None


@pytest.mark.postgres
@pytest.mark.qdrant
def test_sigterm_drains_every_process_and_exits_zero(group: Group) -> None:
    children = group.children()
    watches = []
    for pid in children.values():
        health = health_pb2_grpc.HealthStub(group.connect_to(pid))
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=EXIT_TIMEOUT_S)
        assert next(watch).status == SERVING
        watches.append(watch)

    group.process.send_signal(signal.SIGTERM)
    # Each child got the signal: a watch in flight on each is told, not cut off.
    for watch in watches:
        assert next(watch).status == NOT_SERVING
        watch.cancel()  # the drain ends as soon as the last in-flight call does

    assert group.process.wait(timeout=EXIT_TIMEOUT_S) == 0, group.output()
    for index, pid in children.items():
        assert f"worker {index} (pid {pid}) exited with status 0" in group.output()
        assert not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ((), ("SQLite", "embedded Qdrant engine")),
        (("--database-url", "postgresql+psycopg://app@127.0.0.1:1/x"), ("embedded Qdrant",)),
        (("--qdrant-url", "http://127.0.0.1:1"), ("SQLite",)),
    ],
    ids=["embedded", "postgres-embedded-qdrant", "sqlite-qdrant-server"],
)
def test_workers_are_refused_on_the_embedded_stores(
    tmp_path: Path, flags: tuple[str, ...], named: tuple[str, ...]
) -> None:
    """One process owns each embedded store, so a group on them is refused before it starts,
    with the reason; MEMORIA_WORKERS, the old name of MEMORIA_PROCESSES, is read like the flag."""
    done = subprocess.run(
        [str(MEMORIA), "serve", "--data-dir", str(tmp_path / "data"), *flags],
        cwd=tmp_path,
        env=_env() | {"MEMORIA_WORKERS": "2"},
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 1
    message = done.stderr.decode()
    assert "--processes 2 needs stores that several processes can share" in message
    for store in named:
        assert store in message
    assert not (tmp_path / "data").exists()  # nothing was opened


def test_a_worker_failing_at_start_stops_the_group_with_an_error(tmp_path: Path) -> None:
    """A first start that fails is a configuration problem: reported at once, not retried."""
    nowhere = "127.0.0.1:1"  # nothing listens on port 1
    done = subprocess.run(
        serve_two(
            tmp_path / "port", f"postgresql+psycopg://app@{nowhere}/nothing", f"http://{nowhere}"
        ),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert re.search(
        rb"worker \d \(pid \d+\) exited with status 1 before the group served", done.stderr
    )
    assert not (tmp_path / "port").exists()
