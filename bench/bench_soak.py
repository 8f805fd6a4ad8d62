"""A bounded soak: the four hot RPCs at a steady open-loop rate against one real server.

What it answers
---------------
Issue 5, item 4: does a Memoria server stay steady under sustained mixed load? One real
``memoria serve`` process (the embedded default by default, or PostgreSQL with
``--database-url``) receives, for a few minutes, a fixed number of calls per second of each of

* ``RenderMemoryBlock``: the hot path, once per turn of every conversation;
* ``RewriteMemoryBlock``: the model editing one line of a principal's block (an effective
  write every time: a new version and an audit event);
* ``IndexTurn`` without ``wait``: a finished turn, with realistic text from
  ``search_corpus.py`` (questions and answers on everyday topics, 1-10 chunks);
* ``SearchConversations``: a real query about the principal's own past turns;

spread over many principals in several tenants (a few busy, many quiet: log-normal weights).
It reports, per RPC, every call's outcome (errors must be 0: exit status 1 otherwise), p50 and
p99 per time window (so a trend over time shows), the server's resident memory over the run
with its trend, the server's CPU, the indexing backlog at the end and whether every accepted
turn became searchable.

Open loop, and coordinated omission
-----------------------------------
A closed-loop client (send, wait for the answer, send the next) slows down when the server
does, so it offers less load exactly when the server struggles and never records the calls
it failed to send meanwhile ("coordinated omission"): its latencies look better than what
users would see. Here one scheduler thread fires each RPC at fixed intervals (``1/rate``, each
RPC with its own random phase) as non-blocking gRPC futures, whatever is still in flight, and
each call's latency is measured **from its scheduled send time** to its completion. A call the
client itself sent late (a busy scheduler on a busy machine) is therefore charged its
lateness, not excused; the report also shows latency from the actual send and how late sends
were, so the client's share can be told apart. All calls share one channel (one HTTP/2
connection, as from one upstream service). Each call has a deadline (``CALL_TIMEOUT_S``), so
calls in flight, and the run, are bounded even if the server stalls.

Phases
------
1. Setup: a fresh tenant prefix per run (``soak-<hex>``), every principal gets a block through
   ``RewriteMemoryBlock`` (so renders are real sections).
2. Warm-up (not measured, but errors count): the full mix, so the embedding model, caches,
   connection pools and allocator arenas reach their working size before the "start" memory
   reading is taken.
3. Measurement: ``--minutes`` of the mix, cut into windows (``--window`` seconds); once a
   second a sampler reads the server's RSS (``VmRSS`` in ``/proc/<pid>/status``), its CPU
   time and threads, and the indexing backlog.
4. Drain: the backlog when the load stops, then the time until the worker has indexed every
   accepted turn (bounded).
5. Searchability: every accepted turn carries a unique ticket token (``SOAK<n><run>``, one BM25
   term); a search for it must return that turn.
6. PostgreSQL only: ``ErasePrincipalData`` for every principal, so the shared database keeps
   none of the run's blocks or turns (the audit log is append-only and keeps its events).

The backlog is read from the server's own data, read-only, because the public API has no call
for it: the SQLite file (``memoria.sqlite3`` opened with ``mode=ro``) on the embedded default,
or PostgreSQL through ``--database-url`` (the service role, row-level security in force) in a
``READ ONLY`` transaction per tenant. ``pending`` turns are the backlog; ``failed`` ones count
as errors.

Memory growth: what is flagged, and why
---------------------------------------
Some growth is legitimate: the embedded Qdrant engine keeps the chunks indexed during the run
(vectors, keyword vectors, payload text) and PostgreSQL or SQLite caches fill. What must not
happen is growth that keeps its pace once everything is warm, which over days exhausts the
pod's memory limit. The report gives RSS after warm-up and at the end, split into its anonymous
part (heap and arenas, where a leak shows) and its file-backed part (mapped files), the
per-window means, and least-squares slopes over the measured phase and over its second half.
It flags growth when RSS *less the share of the data indexed meanwhile*
(``DATA_MIB_PER_1000_CHUNKS``, measured) keeps growing faster than
``RSS_SLOPE_LIMIT_MIB_PER_MIN`` over both (see there for why); a flag is reported, not an exit
status, like a missed target in the other benchmarks. A run shorter than ``MIN_TREND_S``
(``--quick``) reports the figures without a verdict. The warm-up is 20 s also with
``--quick`` because about 15-20 s into the load glibc hands back about 60 MiB that the
embedder's construction freed at start-up (``malloc_trim`` releases the same amount at once);
that one-off drop belongs before the "start" reading.

Rates
-----
The defaults (``DEFAULT_RATES``) come from measuring each RPC alone with this script on the
reference machine (2 shared cores), as server CPU per call: ``RenderMemoryBlock`` about
0.75 ms, ``RewriteMemoryBlock`` 2.5 ms, ``SearchConversations`` 6 ms (mostly the query
embedding) and ``IndexTurn`` about 100 ms per turn, nearly all of it the worker embedding the
turn's chunks. At the defaults (55 calls/s) that predicts about half of one core for the
server, and it measured 35-45%, plus about 5% for this client: the mix runs well inside the
machine, so the soak tests steadiness rather than saturation and leaves room for the
neighbours. Twice the defaults also held (server 70-80% of a core, backlog at most 2 turns,
0 errors), but with nothing to spare for other work on the machine. ``--rate RPC=N`` changes
one rate, ``--scale F`` all of them.

Usage (from the repository root)::

    .venv/bin/python bench/bench_soak.py                  # embedded default, 4 min (~4.5 wall)
    .venv/bin/python bench/bench_soak.py --quick          # 1 min measured (~1.5 min wall)
    eval "$(scripts/pg.sh start)"
    .venv/bin/python bench/bench_soak.py --quick --database-url "$MEMORIA_TEST_PG_APP_URL"

With ``--database-url`` (the service role's URL; loopback hosts only) the schema must be at
the newest migration; if it is not, the script migrates it first with ``--owner-url``
(default ``$MEMORIA_TEST_PG_OWNER_URL``), as ``memoria migrate`` would. Chunks go to an
embedded engine in a temporary data directory either way. Everything binds and targets
127.0.0.1 only; the server is stopped and the temporary directory removed before the script
exits, also on Ctrl-C, SIGTERM or an error. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import math
import os
import random
import secrets
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

# harness.py, procs.py and search_corpus.py sit beside this script (its folder is on sys.path).
from harness import Backlog, PostgresBacklog, SqliteBacklog, drain, seeded_block
from procs import (
    HOST,
    BudgetExceeded,
    Interrupted,
    Memory,
    ServerProcess,
    failure_outcome,
    machine_line,
    raise_on_sigterm,
    software_line,
)
from search_corpus import CorpusGenerator, Turn, describe
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2, memory_block_service_pb2
from memoria.v1 import memory_block_service_pb2_grpc as block_grpc
from server.adapters.sql import migrate
from server.adapters.sql.engine import sqlite_url
from server.runtime.settings import Settings

SERVICE = "memoria.v1.ConversationSearchService"  # SERVING once both stores answer
RPCS = ("render", "rewrite", "index", "search")
FULL_NAMES = {
    "render": "RenderMemoryBlock",
    "rewrite": "RewriteMemoryBlock",
    "index": "IndexTurn",
    "search": "SearchConversations",
}

SHORT_NAMES = {"render": "Render", "rewrite": "Rewrite", "index": "IndexTurn", "search": "Search"}

DEFAULT_RATES = {"render": 40.0, "rewrite": 5.0, "index": 4.0, "search": 6.0}
"""Calls per second of each RPC (see the module docstring, "Rates"): a finished turn every
quarter second, the hot path (render, on every turn of every conversation, also of callers
that index nothing) ten times as often, and an occasional write and search."""

SEED = 20250714
SERVER_START_TIMEOUT_S = 180.0
SERVER_STOP_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 10.0  # per call; a stalled server shows as DEADLINE_EXCEEDED errors
SAMPLE_S = 1.0  # how often RSS, CPU and the backlog are read
DRAIN_TIMEOUT_S = 120.0  # how long the backlog may take to empty after the load stops
CHECK_IN_FLIGHT = 4  # searches in flight during the searchability check
SEARCH_PAGE = 10

DATA_MIB_PER_1000_CHUNKS = 17.0
"""What indexed data legitimately adds to the server's RSS: measured with this script
(``--rate render=0 --rate rewrite=0 --rate search=0``, embedded default, 2 minutes): +8.7 MiB
for 522 chunks, about 11 MiB/1,000 file-backed (the embedded engine's mapped segment and WAL
files) and 5.5 anonymous (its in-memory indexes, SQLite's page cache). Without indexing (the
other three RPCs at their default rates) RSS grew 0.4-0.5 MiB/min, all anonymous."""

RSS_SLOPE_LIMIT_MIB_PER_MIN = 2.0
"""Flag when RSS, less the indexed data's share (DATA_MIB_PER_1000_CHUNKS), grows faster than
this over the measured phase and over its second half. Why 2 MiB/min: it is four times what
the server grew without indexing (0.4-0.5 MiB/min: caches still filling), so noise does not
trip it, and it is still a leak that matters: 2.8 GiB a day fills a pod's memory limit in a
day or two. Slower leaks need a longer soak (``--minutes 30``)."""

MIN_TREND_S = 180.0
"""No verdict on memory below this many measured seconds: right after the warm-up the caches
are still filling (a one-minute ``--quick`` run on PostgreSQL measured +2.1 MiB/min beyond the
data, the four-minute run on the same database +0.9, the fifteen-minute one on SQLite +0.6)."""


def log(message: str) -> None:
    """Progress goes to stderr; the report goes to stdout."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The plan and the workload
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Durations, rates and population of one run."""

    measure_s: float
    window_s: float
    warmup_s: float
    rates: dict[str, float]
    principals: int
    tenants: int


def weights(count: int, rng: random.Random) -> list[float]:
    """Activity of each principal: log-normal (sigma 1), a few busy ones and many quiet."""
    return [math.exp(rng.gauss(0, 1.0)) for _ in range(count)]


@dataclass
class Principal:
    """One principal: its identity, its block's lines and its conversation material."""

    tenant: str
    name: str
    metadata: tuple[tuple[str, str], ...]
    lines: list[str]
    queries: list[str] = field(default_factory=list)
    turns_sent: int = 0


class Workload:
    """Builds every request of the run, in the scheduler thread only (so no locks).

    Principals are chosen by their activity weight for every RPC. A rewrite replaces one line
    of the principal's block with a fresh fact and a version number (so each is an effective
    write, as when the model edits a line). Turns come from ``search_corpus``'s generator in
    each principal's own conversation order, with a unique ticket token in the question so
    that the end of the run can search for every one. A search goes to a principal that has
    sent turns, with a query drawn from its own conversations.
    """

    def __init__(self, plan: Plan, run: str) -> None:
        self.run = run
        rng = random.Random(SEED)
        self._rng = random.Random(f"{SEED}:{run}")
        generator = CorpusGenerator(SEED)
        self.principals: list[Principal] = []
        for number in range(plan.principals):
            tenant = f"soak-{run}-t{number % plan.tenants}"
            name = f"p{number:04d}"
            meta = (("x-memoria-tenant", tenant), ("x-memoria-principal", name))
            self.principals.append(Principal(tenant, name, meta, seeded_block(rng).splitlines()))
        self._weights = weights(plan.principals, rng)
        total_s = plan.warmup_s + plan.measure_s
        turns_needed = int(plan.rates["index"] * total_s * 1.2) + 10
        share = sum(self._weights)
        self._turns: dict[int, deque[Turn]] = {}
        owners: list[int] = []
        for number, principal in enumerate(self.principals):
            count = max(1, round(turns_needed * self._weights[number] / share))
            corpus = generator.principal(principal.tenant, principal.name, count, tag=run)
            self._turns[number] = deque(corpus.turns)
            principal.queries = generator.queries(corpus, 24)
            owners += [number] * len(corpus.turns)
        self._rng.shuffle(owners)  # interleaves principals; each keeps its turns' order
        self._owners = deque(owners)
        self.turn_stats = describe(t for q in self._turns.values() for t in q)
        self._versions = Counter[int]()
        self._searchers: list[int] = []
        self.accepted: list[tuple[Principal, str, str, str]] = []  # filled by callbacks
        self._tickets = 0

    def tenants(self) -> list[str]:
        return sorted({p.tenant for p in self.principals})

    def _pick(self) -> int:
        return self._rng.choices(range(len(self.principals)), self._weights)[0]

    def block_text(self, number: int) -> str:
        """The principal's block with one line replaced by a fresh, versioned fact."""
        principal = self.principals[number]
        self._versions[number] += 1
        version = self._versions[number]
        lines = principal.lines
        fresh = seeded_block(self._rng).splitlines()[0]
        lines[self._rng.randrange(len(lines))] = f"{fresh} (noted v{version})"
        return "\n".join(lines)

    def render(self) -> tuple[Principal, Any]:
        principal = self.principals[self._pick()]
        return principal, memory_block_service_pb2.RenderMemoryBlockRequest()

    def rewrite(self, number: int | None = None) -> tuple[Principal, Any]:
        number = self._pick() if number is None else number
        request = memory_block_service_pb2.RewriteMemoryBlockRequest(
            text=self.block_text(number), writer=memory_block_pb2.WRITER_MODEL
        )
        return self.principals[number], request

    def index(self) -> tuple[Principal, Any, tuple[str, str, str]]:
        """The next turn, with its ticket token; (principal, request, (conv, turn, token))."""
        while self._owners and not self._turns[self._owners[0]]:
            self._owners.popleft()
        if not self._owners:  # cannot happen: 20% more turns are generated than planned
            raise RuntimeError("ran out of generated turns")
        number = self._owners.popleft()
        turn = self._turns[number].popleft()
        principal = self.principals[number]
        self._tickets += 1
        token = f"SOAK{self._tickets:05d}{self.run}"
        stamp = Timestamp()
        stamp.FromDatetime(datetime.now(UTC))
        request = search_pb.IndexTurnRequest(
            conversation_id=turn.conversation_id,
            turn_id=turn.turn_id,
            question=f"{turn.question} (ticket {token})",
            answer=turn.answer,
            turn_time=stamp,
        )
        if principal.turns_sent == 0:
            self._searchers.append(number)
        principal.turns_sent += 1
        return principal, request, (turn.conversation_id, turn.turn_id, token)

    def search(self) -> tuple[Principal, Any]:
        pool = self._searchers or list(range(len(self.principals)))
        principal = self.principals[self._rng.choice(pool)]
        query = self._rng.choice(principal.queries)
        return principal, search_pb.SearchConversationsRequest(query=query, page_size=SEARCH_PAGE)


# --------------------------------------------------------------------------------------------
# The calls: fired on schedule, recorded on completion
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One finished call. Times are time.perf_counter() seconds."""

    rpc: str
    phase: str  # "setup", "warmup" or "measure"
    scheduled: float
    sent: float
    done: float
    problem: str  # "" when the call succeeded with a sensible answer
    chunks: int = 0  # IndexTurn: the chunks the server split the turn into


class Recorder:
    """Collects finished calls from gRPC's callback thread; counts calls still in flight."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle = threading.Condition(self._lock)

    def started(self) -> None:
        with self._lock:
            self._in_flight += 1

    def finished(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> int:
        """Wait until no call is in flight (bounded); return how many still are."""
        with self._lock:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout_s)
            return self._in_flight


def _check_answer(rpc: str, reply: Any) -> str:
    """A problem with an OK answer, or "" (each RPC's answer must be what the load implies)."""
    if rpc == "render" and not reply.prompt_section:
        return "empty prompt section for a principal with a block"
    if rpc == "rewrite" and not reply.changed:
        return "rewrite changed nothing (every rewrite sends a new text)"
    if rpc == "index" and reply.outcome != search_pb.INDEX_TURN_OUTCOME_ACCEPTED:
        return f"IndexTurn outcome {search_pb.IndexTurnOutcome.Name(reply.outcome)}"
    return ""


class Client:
    """The stubs on one channel, and how one call is fired and recorded."""

    def __init__(self, channel: grpc.Channel, workload: Workload, recorder: Recorder) -> None:
        blocks = block_grpc.MemoryBlockServiceStub(channel)
        search = search_grpc.ConversationSearchServiceStub(channel)
        self.search_stub = search
        self._methods: dict[str, Any] = {
            "render": blocks.RenderMemoryBlock,
            "rewrite": blocks.RewriteMemoryBlock,
            "index": search.IndexTurn,
            "search": search.SearchConversations,
        }
        self.workload = workload
        self.recorder = recorder

    def fire(self, rpc: str, phase: str, scheduled: float) -> None:
        """Build the request and send it as a future; its callback records the outcome."""
        ticket: tuple[str, str, str] | None = None
        if rpc == "index":
            principal, request, ticket = self.workload.index()
        else:
            principal, request = getattr(self.workload, rpc)()
        self._send(rpc, phase, scheduled, principal, request, ticket)

    def _send(
        self,
        rpc: str,
        phase: str,
        scheduled: float,
        principal: Principal,
        request: Any,
        ticket: tuple[str, str, str] | None = None,
    ) -> None:
        recorder = self.recorder
        accepted = self.workload.accepted
        recorder.started()
        sent = time.perf_counter()

        def done(future: grpc.Future[Any]) -> None:
            finished = time.perf_counter()
            chunks = 0
            try:
                reply = future.result()
                problem = _check_answer(rpc, reply)
                if not problem and ticket is not None:
                    accepted.append((principal, *ticket))
                    chunks = reply.chunk_count
            except grpc.RpcError as error:
                problem = f"{error.code().name}: {error.details()}"
            except Exception as error:  # cancelled, or a bug here: count it
                problem = f"{type(error).__name__}: {error}"
            recorder.finished(Call(rpc, phase, scheduled, sent, finished, problem, chunks))

        future = self._methods[rpc].future(
            request, metadata=principal.metadata, timeout=CALL_TIMEOUT_S
        )
        future.add_done_callback(done)

    def setup_blocks(self, in_flight: int = 8) -> None:
        """Give every principal a block (rewrites, `in_flight` at a time), before the load."""
        for number in range(len(self.workload.principals)):
            while self.recorder.wait_idle(0) >= in_flight:
                time.sleep(0.001)
            principal, request = self.workload.rewrite(number)
            now = time.perf_counter()
            self._send("rewrite", "setup", now, principal, request)
        if self.recorder.wait_idle(CALL_TIMEOUT_S + 5):
            raise RuntimeError("setup rewrites did not finish")


def run_schedule(client: Client, rates: dict[str, float], phase: str, seconds: float) -> float:
    """Fire every RPC at its rate for `seconds`, open loop (see the module docstring).

    One thread: a heap would do, but with four RPCs a scan of their next times is as cheap.
    Returns the phase's start (perf_counter), which the windows are measured from.
    """
    rng = random.Random(f"{SEED}:{phase}")
    start = time.perf_counter() + 0.05
    end = start + seconds
    intervals = {rpc: 1.0 / rate for rpc, rate in rates.items() if rate > 0}
    # Each RPC's own phase, so that the RPCs do not all fire at the same instants.
    next_at = {rpc: start + rng.random() * interval for rpc, interval in intervals.items()}
    while next_at:
        rpc = min(next_at, key=next_at.__getitem__)
        at = next_at[rpc]
        if at >= end:
            del next_at[rpc]
            continue
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        client.fire(rpc, phase, at)
        next_at[rpc] = at + intervals[rpc]
    return start


# --------------------------------------------------------------------------------------------
# The server's state: memory, CPU, threads and the indexing backlog (Memory in procs.py,
# the backlogs in harness.py)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One reading of the server, at time.perf_counter() `at`."""

    at: float
    memory: Memory
    cpu_s: float
    threads: int
    pending: int
    failed: int

    @property
    def rss_mib(self) -> float:
        return self.memory.rss


class Sampler:
    """Reads the server every SAMPLE_S seconds in a thread of its own, until stopped."""

    def __init__(self, server: ServerProcess, backlog: Backlog) -> None:
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._server = server
        self._backlog = backlog
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def read(self) -> Sample:
        counts = self._backlog.counts()
        return Sample(
            time.perf_counter(),
            Memory.of(self._server.proc.pid),
            self._server.cpu_seconds(),
            self._server.os_threads(),
            counts["pending"],
            counts["failed"],
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.read())
            except Exception as error:  # a locked file, a lost connection: note it
                self.errors.append(f"{type(error).__name__}: {error}")
            self._stop.wait(SAMPLE_S)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# --------------------------------------------------------------------------------------------
# After the load: drain, searchability, cleanup
# --------------------------------------------------------------------------------------------


def check_searchable(client: Client, deadline: float) -> tuple[int, list[str]]:
    """Search for every accepted turn's ticket token; return (checked, problems)."""
    accepted = list(client.workload.accepted)
    problems: list[str] = []
    lock = threading.Lock()
    slots = threading.Semaphore(CHECK_IN_FLIGHT)
    checked = 0
    for principal, conversation, turn, token in accepted:
        if time.monotonic() > deadline:
            problems.append(f"time budget: checked {checked} of {len(accepted)} turns")
            break
        slots.acquire()
        checked += 1
        request = search_pb.SearchConversationsRequest(query=token, page_size=SEARCH_PAGE)
        future = client.search_stub.SearchConversations.future(
            request, metadata=principal.metadata, timeout=CALL_TIMEOUT_S
        )

        def done(
            f: grpc.Future[search_pb.SearchConversationsResponse],
            want: tuple[str, str] = (conversation, turn),
        ) -> None:
            try:
                hits = {(h.conversation_id, h.turn_id) for h in f.result().hits}
                problem = "" if want in hits else f"{'/'.join(want)} not found by its token"
            except grpc.RpcError as error:
                problem = f"{'/'.join(want)}: {error.code().name}: {error.details()}"
            except Exception as error:  # count it, and always free the slot
                problem = f"{'/'.join(want)}: {type(error).__name__}: {error}"
            with lock:
                if problem:
                    problems.append(problem)
            slots.release()

        future.add_done_callback(done)
    for _ in range(CHECK_IN_FLIGHT):  # all answered
        slots.acquire()
    return checked, problems


def erase_all(client: Client) -> tuple[int, list[str]]:
    """ErasePrincipalData for every principal (PostgreSQL: leave the shared database clean)."""
    problems = []
    for principal in client.workload.principals:
        try:
            client.search_stub.ErasePrincipalData(
                search_pb.ErasePrincipalDataRequest(),
                metadata=principal.metadata,
                timeout=CALL_TIMEOUT_S,
            )
        except grpc.RpcError as error:
            problems.append(f"{principal.name}: {error.code().name}: {error.details()}")
    return len(client.workload.principals) - len(problems), problems


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


def _loopback_only(url: str) -> None:
    host = make_url(url).host
    if host not in (HOST, "localhost", "::1"):
        raise SystemExit(f"refusing to soak a non-loopback database host {host!r}")


@contextmanager
def postgres(url: str, owner_url: str | None) -> Iterator[str]:
    """Check (and if needed migrate) the schema of `url`'s database; yield a description."""
    _loopback_only(url)
    engine: Engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
        migrated = ""
        if not migrate.is_current(engine):
            target = make_url(url)
            owner = make_url(owner_url) if owner_url else None
            same = owner is not None and (owner.host, owner.port, owner.database) == (
                target.host,
                target.port,
                target.database,
            )
            if owner_url is None or not same:
                raise SystemExit(
                    "the schema is not at the newest migration; run `memoria migrate` or pass "
                    "--owner-url (the schema owner's URL of the same database)"
                )
            owner_engine = create_engine(owner_url, pool_size=1, max_overflow=0)
            try:
                migrate.upgrade(owner_engine, app_role=target.username)
            finally:
                owner_engine.dispose()
            migrated = "; migrated to the newest revision first"
        target = make_url(url)
        yield (
            f"PostgreSQL {version} on {target.host}:{target.port}, database {target.database} "
            f"as {target.username} (RLS in force){migrated}"
        )
    finally:
        engine.dispose()


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


def pct(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1-99) of `values` (statistics.quantiles, inclusive); nan if none."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute; nan with under 3 points."""
    if len(points) < 3:
        return float("nan")
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    return statistics.linear_regression(xs, ys).slope * 60


@dataclass
class Findings:
    """What the report concluded, for the exit status and the closing lines."""

    errors: int = 0
    problems: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def print_totals(calls: Sequence[Call], plan: Plan, findings: Findings) -> None:
    """Per RPC over the measured phase: rate, calls, errors, latency (and the client's share)."""
    print()
    print(
        f"{'rpc':<20} {'rate/s':>7} {'calls':>7} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'p99 from send':>14} {'p99 send lag':>13}"
    )
    for rpc in RPCS:
        mine = [c for c in calls if c.rpc == rpc and c.phase == "measure"]
        ok = [c for c in mine if not c.problem]
        latencies = [(c.done - c.scheduled) * 1e3 for c in ok]
        from_send = [(c.done - c.sent) * 1e3 for c in ok]
        lag = [(c.sent - c.scheduled) * 1e3 for c in mine]
        errors = len(mine) - len(ok)
        print(
            f"{FULL_NAMES[rpc]:<20} {plan.rates[rpc]:>7g} {len(mine):>7} {errors:>6} "
            f"{pct(latencies, 50):>8.2f} {pct(latencies, 99):>8.2f} "
            f"{max(latencies, default=float('nan')):>8.1f} {pct(from_send, 99):>14.2f} "
            f"{pct(lag, 99):>13.2f}"
        )
    everyone = Counter((c.phase, c.rpc) for c in calls if c.problem)
    findings.errors = sum(everyone.values())
    if findings.errors:
        print(
            "errors by phase and RPC: "
            + ", ".join(f"{p}/{r} {n}" for (p, r), n in everyone.items())
        )
        for problem, n in Counter(c.problem for c in calls if c.problem).most_common(5):
            print(f"  {n} x {problem[:200]}")
    else:
        setup_warm = sum(1 for c in calls if c.phase != "measure")
        print(f"(no errors, also none among the {setup_warm} setup and warm-up calls)")


def print_windows(
    calls: Sequence[Call], samples: Sequence[Sample], start: float, plan: Plan
) -> list[tuple[int, float]]:
    """p50/p99 per RPC per window, with errors, RSS, backlog and server CPU; returns each
    window's (index, mean RSS)."""
    windows = max(1, math.ceil(plan.measure_s / plan.window_s - 1e-9))
    print()
    header = f"{'window s':<10}" + "".join(f"{SHORT_NAMES[r]:>18}" for r in RPCS)
    print(
        header
        + f"{'errors':>7} {'RSS MiB':>8} {'anon':>6} {'pending':>8} {'cpu %':>6} {'threads':>7}"
    )
    print(f"{'':<10}" + f"{'p50 / p99 ms':>18}" * len(RPCS))
    rss_by_window: list[tuple[int, float]] = []
    for w in range(windows):
        begin, finish = w * plan.window_s, min((w + 1) * plan.window_s, plan.measure_s)
        lo, hi = start + begin, start + finish
        mine = [c for c in calls if c.phase == "measure" and lo <= c.scheduled < hi]
        cells = []
        for rpc in RPCS:
            lat = [(c.done - c.scheduled) * 1e3 for c in mine if c.rpc == rpc and not c.problem]
            cells.append(f"{pct(lat, 50):7.2f} / {pct(lat, 99):7.2f}")
        inside = [s for s in samples if lo <= s.at < hi]
        rss = statistics.fmean(s.memory.rss for s in inside) if inside else float("nan")
        anon = statistics.fmean(s.memory.anon for s in inside) if inside else float("nan")
        pending = inside[-1].pending if inside else -1
        threads = inside[-1].threads if inside else -1
        cpu = (
            (inside[-1].cpu_s - inside[0].cpu_s) / (inside[-1].at - inside[0].at) * 100
            if len(inside) > 1
            else float("nan")
        )
        errors = sum(1 for c in mine if c.problem)
        print(
            f"{f'{begin:g}-{finish:g}':<10}"
            + "".join(f"{cell:>18}" for cell in cells)
            + f"{errors:>7} {rss:>8.1f} {anon:>6.1f} {pending:>8} {cpu:>6.0f} {threads:>7}"
        )
        rss_by_window.append((w, rss))
    print(
        "(latency from each call's scheduled send time; RSS and its anonymous part: means of "
        "the window's samples; pending: turns not yet indexed at the window's end; cpu: the "
        "server process, % of one core)"
    )
    return rss_by_window


def print_memory(
    samples: Sequence[Sample],
    calls: Sequence[Call],
    start: float,
    plan: Plan,
    rss_by_window: Sequence[tuple[int, float]],
    start_memory: Memory,
    findings: Findings,
) -> None:
    """RSS after warm-up and at the end (with its anonymous and file-backed parts), its slope
    over the whole measured phase and its second half, first against last window, and the
    verdict (see RSS_SLOPE_LIMIT_MIB_PER_MIN)."""
    measured = [s for s in samples if start <= s.at <= start + plan.measure_s]
    if len(measured) < 3 or not rss_by_window:
        print("server RSS: too few samples")
        return
    end = measured[-1].memory
    half_s = plan.measure_s / 2

    def slopes(value: Callable[[Memory], float]) -> tuple[float, float]:
        points = [(s.at - start, value(s.memory)) for s in measured]
        return slope_per_min(points), slope_per_min([p for p in points if p[0] >= half_s])

    slope, late_slope = slopes(lambda m: m.rss)
    anon_slope, anon_late = slopes(lambda m: m.anon)
    file_slope, file_late = slopes(lambda m: m.file)
    first, last = rss_by_window[0][1], rss_by_window[-1][1]
    print()
    print(
        f"server RSS: {start_memory.rss:.1f} MiB after warm-up (anon {start_memory.anon:.1f}, "
        f"file {start_memory.file:.1f}), {end.rss:.1f} MiB at the end (anon {end.anon:.1f}, "
        f"file {end.file:.1f}): {end.rss - start_memory.rss:+.1f} MiB "
        f"({(end.rss - start_memory.rss) / start_memory.rss:+.1%}); "
        f"peak {max(s.rss_mib for s in measured):.1f} MiB; first window {first:.1f} MiB, last "
        f"{last:.1f} MiB ({(last - first) / first:+.1%})"
    )
    print(
        f"  slope over the measured phase / its second half, MiB/min: RSS {slope:+.2f} / "
        f"{late_slope:+.2f}, anon {anon_slope:+.2f} / {anon_late:+.2f}, file {file_slope:+.2f} "
        f"/ {file_late:+.2f} ({len(measured)} samples, least squares)"
    )
    # RSS less the data's share: each sample minus DATA_MIB_PER_1000_CHUNKS per chunk accepted
    # so far (the worker indexes a turn within about a second of its acceptance).
    accepted = sorted((c.done, c.chunks) for c in calls if c.chunks)
    times = [t for t, _ in accepted]
    totals = list(itertools.accumulate(n for _, n in accepted))

    def chunks_by(moment: float) -> int:
        i = bisect.bisect_right(times, moment)
        return totals[i - 1] if i else 0

    base = chunks_by(start)
    chunks = chunks_by(start + plan.measure_s) - base
    residual = [
        (s.at - start, s.memory.rss - DATA_MIB_PER_1000_CHUNKS * (chunks_by(s.at) - base) / 1e3)
        for s in measured
    ]
    rest, rest_late = (
        slope_per_min(residual),
        slope_per_min([p for p in residual if p[0] >= half_s]),
    )
    print(
        f"  {chunks} chunks indexed meanwhile, at {DATA_MIB_PER_1000_CHUNKS:g} MiB per 1,000 "
        f"(measured; see DATA_MIB_PER_1000_CHUNKS) about "
        f"{DATA_MIB_PER_1000_CHUNKS * chunks / 1e3:.1f} MiB; RSS less that share: "
        f"{rest:+.2f} / {rest_late:+.2f} MiB/min"
    )
    judged = plan.measure_s >= MIN_TREND_S
    flagged = judged and min(rest, rest_late) > RSS_SLOPE_LIMIT_MIB_PER_MIN
    verdict = "FLAG: growth trend" if flagged else "no growth trend"
    if not judged:
        verdict = f"no verdict: under {MIN_TREND_S:.0f}s measured, caches are still filling"
    print(
        f"  {verdict} (flagged when RSS less the data's share grows faster than "
        f"{RSS_SLOPE_LIMIT_MIB_PER_MIN:g} MiB/min over the phase and over its second half)"
    )
    threads = [s.threads for s in measured]
    print(
        f"  server threads: {threads[0]} at the start, {threads[-1]} at the end, max {max(threads)}"
    )
    if flagged:
        findings.flags.append(f"RSS growth beyond the data's: {rest_late:+.2f} MiB/min")


def write_samples(path: Path, samples: Sequence[Sample], start: float) -> None:
    """The sampler's readings as CSV (seconds from the measured phase's start; negative in
    the warm-up), to plot RSS, CPU and the backlog over time."""
    rows = ["seconds,rss_mib,anon_mib,file_mib,cpu_s,threads,pending,failed"]
    rows += [
        f"{s.at - start:.2f},{s.memory.rss:.2f},{s.memory.anon:.2f},{s.memory.file:.2f},"
        f"{s.cpu_s:.2f},{s.threads},{s.pending},{s.failed}"
        for s in samples
    ]
    path.write_text("\n".join(rows) + "\n")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_rate(value: str) -> tuple[str, float]:
    rpc, _, rate = value.partition("=")
    if rpc not in RPCS or not rate:
        raise argparse.ArgumentTypeError(f"expected RPC=N with RPC one of {', '.join(RPCS)}")
    return rpc, float(rate)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 minute, 15 s windows")
    p.add_argument("--minutes", type=float, help="measured minutes (default 4; quick 1)")
    p.add_argument("--window", type=float, help="seconds per window (default 30; quick 15)")
    p.add_argument("--warmup", type=float, default=20.0, help="warm-up seconds (default 20)")
    p.add_argument("--principals", type=int, default=500, help="principals (default 500)")
    p.add_argument("--tenants", type=int, default=5, help="tenants (default 5)")
    p.add_argument(
        "--rate",
        type=parse_rate,
        action="append",
        default=[],
        metavar="RPC=N",
        help=f"calls/s of one RPC ({', '.join(RPCS)}); defaults {DEFAULT_RATES}",
    )
    p.add_argument("--scale", type=float, default=1.0, help="multiply every rate")
    p.add_argument("--samples-csv", type=Path, help="write the per-second server samples here")
    p.add_argument("--database-url", help="PostgreSQL (service role) instead of SQLite")
    p.add_argument(
        "--owner-url",
        default=os.environ.get("MEMORIA_TEST_PG_OWNER_URL"),
        help="schema owner's URL, to migrate if needed (default $MEMORIA_TEST_PG_OWNER_URL)",
    )
    return p.parse_args(argv)


def make_plan(args: argparse.Namespace) -> Plan:
    rates = DEFAULT_RATES | dict(args.rate)
    plan = Plan(
        measure_s=60 * (args.minutes or (1.0 if args.quick else 4.0)),
        window_s=args.window or (15.0 if args.quick else 30.0),
        warmup_s=args.warmup,
        rates={rpc: rates[rpc] * args.scale for rpc in RPCS},
        principals=args.principals,
        tenants=args.tenants,
    )
    if plan.measure_s <= 0 or plan.window_s <= 0 or plan.principals < plan.tenants < 1:
        raise SystemExit("--minutes, --window, --principals and --tenants must be positive")
    return plan


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = make_plan(args)
    raise_on_sigterm()
    started = time.monotonic()
    run = secrets.token_hex(3)
    settings = Settings(listen=f"{HOST}:0")  # the server's defaults, for the report
    findings = Findings()
    facts: list[str] = []
    outcome = ""
    recorder = Recorder()
    samples: list[Sample] = []
    measure_start = 0.0
    start_memory = Memory(float("nan"), float("nan"), float("nan"))
    backlog_desc = ""
    client: Client | None = None
    client_cpu = 0.0
    with ExitStack() as stack:
        try:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-soak-")))
            data_dir = tmp / "data"
            server_args = ["--data-dir", str(data_dir)]
            if args.database_url:
                store = stack.enter_context(postgres(args.database_url, args.owner_url))
                server_args += ["--database-url", args.database_url]
            else:
                store = "SQLite (embedded default, WAL) in a temporary data directory"
            log("generating the workload")
            workload = Workload(plan, run)
            facts.append(f"store: {store}; chunks in the embedded Qdrant engine")
            facts.append(
                f"population: {plan.principals} principals in {plan.tenants} tenants "
                f"(soak-{run}-t*), activity log-normal; turns to send: {workload.turn_stats}"
            )
            server = ServerProcess(
                server_args, tmp, service=SERVICE, stop_timeout_s=SERVER_STOP_TIMEOUT_S
            )
            stack.callback(server.stop)
            startup = server.wait_serving(SERVER_START_TIMEOUT_S)
            facts.append(f"server pid {server.proc.pid} SERVING {startup:.1f}s after start")
            backlog: Backlog = (
                PostgresBacklog(args.database_url, workload.tenants())
                if args.database_url
                else SqliteBacklog(Path(sqlite_url(data_dir).removeprefix("sqlite:///")), "soak-")
            )
            stack.callback(backlog.close)
            backlog_desc = backlog.description
            channel = stack.enter_context(grpc.insecure_channel(f"{HOST}:{server.port}"))
            client = Client(channel, workload, recorder)
            sampler = Sampler(server, backlog)
            stack.callback(sampler.stop)

            log(f"setup: a block for each of {plan.principals} principals")
            client.setup_blocks()
            sampler.start()
            log(f"warm-up {plan.warmup_s:.0f}s at {plan.rates}")
            run_schedule(client, plan.rates, "warmup", plan.warmup_s)
            cpu_before = time.process_time()
            start_memory = Memory.of(server.proc.pid)
            log(f"measuring {plan.measure_s:.0f}s (RSS after warm-up {start_memory.rss:.1f} MiB)")
            wall = time.perf_counter()
            measure_start = run_schedule(client, plan.rates, "measure", plan.measure_s)
            client_cpu = (time.process_time() - cpu_before) / (time.perf_counter() - wall)
            left = recorder.wait_idle(CALL_TIMEOUT_S + 5)
            if left:
                findings.problems.append(f"{left} calls never finished")
            end_counts = backlog.counts()
            sampler.stop()
            samples = sampler.samples
            if sampler.errors:
                facts.append(f"sampler errors: {len(sampler.errors)} ({sampler.errors[0]})")
            log("load stopped; waiting for the indexing backlog to drain")
            final, drained = drain(backlog, DRAIN_TIMEOUT_S)
            accepted = len(workload.accepted)
            facts.append(
                f"indexing backlog when the load stopped: {end_counts['pending']} turns pending, "
                f"{end_counts['failed']} failed, {end_counts['indexed']} indexed "
                f"(read from {backlog_desc})"
            )
            if drained is None:
                findings.problems.append(
                    f"backlog not drained after {DRAIN_TIMEOUT_S:.0f}s: {dict(final)}"
                )
            else:
                facts.append(f"backlog drained {drained:.1f}s after the load stopped")
            if final["failed"]:
                findings.problems.append(f"{final['failed']} turns failed to index")
            if final["indexed"] != accepted:
                findings.problems.append(
                    f"{accepted} turns accepted but {final['indexed']} indexed"
                )
            log(f"checking that all {accepted} accepted turns are searchable")
            checked, unsearchable = check_searchable(client, time.monotonic() + 180)
            facts.append(
                f"searchable: {checked - len(unsearchable)} of {accepted} accepted turns found "
                f"by a search for their ticket token"
                + (f" (checked {checked})" if checked != accepted else "")
            )
            findings.problems += unsearchable[:10]
            if args.database_url:
                erased, erase_problems = erase_all(client)
                facts.append(f"cleanup: ErasePrincipalData for {erased} principals")
                findings.problems += erase_problems[:5]
        except (
            BudgetExceeded,
            KeyboardInterrupt,
            Interrupted,
            RuntimeError,
            grpc.RpcError,
            OSError,
            sqlite3.Error,
            SQLAlchemyError,
        ) as error:
            outcome = failure_outcome(error)

    print()
    print(machine_line())
    print(
        f"{software_line()}; server defaults: {settings.serve.threads} gRPC threads, "
        f"{settings.indexing.worker_threads} index worker thread(s), "
        f"embedding threads {settings.embedding.threads}"
    )
    print(
        f"load: open loop, {' '.join(f'{FULL_NAMES[r]} {plan.rates[r]:g}/s' for r in RPCS)} "
        f"({sum(plan.rates.values()):g} calls/s); warm-up {plan.warmup_s:.0f}s, measured "
        f"{plan.measure_s:.0f}s in {plan.window_s:.0f}s windows; client CPU "
        f"{client_cpu:.0%} of one core"
    )
    for fact in facts:
        print(fact)
    if measure_start:
        print_totals(recorder.calls, plan, findings)
        rss_windows = print_windows(recorder.calls, samples, measure_start, plan)
        print_memory(
            samples, recorder.calls, measure_start, plan, rss_windows, start_memory, findings
        )
    if args.samples_csv and samples:
        write_samples(args.samples_csv, samples, measure_start)
        print(f"per-second samples written to {args.samples_csv}")
    print()
    elapsed = time.monotonic() - started
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({outcome})" if outcome else ""))
    for problem in findings.problems:
        print(f"PROBLEM: {problem}")
    for flag in findings.flags:
        print(f"FLAG: {flag}")
    failed = bool(outcome or findings.errors or findings.problems)
    print("result: " + ("FAIL" if failed else "PASS (0 errors, every accepted turn searchable)"))
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
