"""Memory block RPCs against a no-op, on one real server: the hot path's cost in one table.

What it measures
----------------
``RenderMemoryBlock`` runs on every turn of every conversation (DESIGN 2), so its cost per
call bounds what one replica can serve. This script starts the real ``memoria serve`` process
on a freshly seeded PostgreSQL database (a few thousand principals in one tenant, each with a
realistic block of 300-1,500 characters, plus a few hundred with none) and drives it with
``ghz`` through server reflection. In one run, against the same server process, it measures:

* ``no-op``: ``grpc.health.v1.Health/Check``, served by the same process, thread pool and
  interceptor chain. It is the ceiling that the gRPC framework itself allows on this machine.
  It skips authentication (the interceptor only authenticates ``/memoria.`` methods), so the
  gap to it includes the identity check, the store and the domain work.
* ``get``: ``GetMemoryBlock``, one read transaction (tenant scope + one select) per call.
* ``render``: ``RenderMemoryBlock``, the same read plus building the prompt section.
* ``rewrite``: ``RewriteMemoryBlock`` with a fresh text on every call, so every call is an
  effective write: advisory lock, upsert of the block and an appended audit event, in one
  transaction.

each with 1 and 16 calls in flight, and prints requests/s, p50 and p99 latency and each RPC's
requests/s as a ratio to the no-op at the same number of calls in flight, with the targets
(render and get at least 0.6 of the no-op, rewrite at least 0.3).

Why ratios: the reference machine has 2 shared cores, and ghz runs on them next to the server
and PostgreSQL, so absolute numbers move with the neighbours' load. Runs are interleaved
(every round runs every RPC at every concurrency, in a rotated order) and the ratio of each
RPC to the no-op measured in the same round is the result; the table shows medians over
rounds.

Usage (from the repository root)::

    .venv/bin/python bench/bench_blocks.py                   # PostgreSQL, about 2 minutes
    .venv/bin/python bench/bench_blocks.py --duration 3 --rounds 1
    .venv/bin/python bench/bench_blocks.py --sqlite          # the embedded default instead

PostgreSQL comes from MEMORIA_TEST_PG_OWNER_URL / MEMORIA_TEST_PG_APP_URL when both are set,
else from ``scripts/pg.sh start`` (which it leaves running: it is shared with the tests). The
database ``memoria_bench`` is dropped and created again on every run, and dropped at the end.
Everything binds and targets 127.0.0.1 only. Every process the script starts (the server,
ghz) is stopped before it exits, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.engine import make_url

from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.config import Settings
from server.domain.text import sanitize
from server.storage import migrate
from server.storage.engine import create_store_engine, sqlite_url
from server.storage.tables import memory_blocks

# procs.py sits beside this script; the repository root holds tests/, whose helper finds the
# throwaway PostgreSQL exactly as the tests do.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from procs import (
    HOST,
    RUN_ENDED,
    BudgetExceeded,
    ServerProcess,
    failure_outcome,
    find_ghz,
    machine_line,
    parent_pid,
    percentile_ms,
    process_tree_cpu_seconds,
    raise_on_sigterm,
    software_line,
)

from tests.postgres_server import pg_urls

TENANT = "bench"
DB_NAME = "memoria_bench"
APP_ROLE = "memoria_app"
SERVICE = "memoria.v1.MemoryBlockService"

SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
GHZ_EXTRA_TIMEOUT_S = 30.0  # on top of a run's own duration
WARMUP_REQUESTS = 400
SEED = 20240601  # the seeded blocks are the same on every run

# Targets from the issue: requests/s of each RPC as a ratio to the no-op's.
TARGETS = {"render": 0.6, "get": 0.6, "rewrite": 0.3}


# --------------------------------------------------------------------------
# The data: principals and their blocks
# --------------------------------------------------------------------------

_NAMES = ["Ana", "José", "Mei", "Tomasz", "Zoë", "Kwame", "Priya", "Lars", "Fatima", "Diego"]
_CITIES = ["Porto", "São Paulo", "Zürich", "Kraków", "Osaka", "Nairobi", "Málaga", "Leeds"]
_LINE_TEMPLATES = [
    "Prefers to be called {name}; first name only, no titles, informal tone is fine.",
    "Lives in {city} with a partner and a {pet} called {name2}; moved there in {year}.",
    "Works as a {job} at a mid-sized {org}; usually online {hours} local time.",
    "Likes {food} and {drink}; avoids {avoid} (mild allergy, not life-threatening).",
    "Speaks {lang} natively and English at work; answer in English unless asked otherwise.",
    "Current project: migrating a {system} to {target}; deadline end of {month}.",
    "Prefers short answers with code first, then a two-line explanation; no emojis.",
    "Has two kids ({age1} and {age2}); school runs at 8:15, so no calls before 9:00.",
    "Training for a {race} in {month}; runs Tuesdays, Thursdays and long runs on Sundays.",
    "Reads mostly {genre}; finished '{book}' last month and wants similar suggestions.",
    "Uses {editor} with vim keys on a {os} laptop; dislikes GUI-only instructions.",
    "Birthday on {day} {month}; partner's birthday on {day2} {month2}.",
    "Manages a team of {team} engineers; 1:1s on Wednesdays, planning on Mondays.",
    "Asked to be reminded that the {thing} renewal is due every {month2}.",
]
_FILL = {
    "pet": ["cat", "dog", "parrot", "rabbit"],
    "job": ["data engineer", "nurse", "teacher", "product designer", "accountant", "SRE"],
    "org": ["hospital", "bank", "logistics company", "school district", "startup"],
    "hours": ["09:00-17:30", "07:00-15:00", "12:00-20:00"],
    "food": ["ramen", "bacalhau", "falafel", "pierogi", "dal", "tacos"],
    "drink": ["green tea", "espresso", "mate", "kombucha"],
    "avoid": ["peanuts", "shellfish", "gluten", "dairy"],
    "lang": ["Portuguese", "Polish", "Japanese", "Swahili", "German", "Spanish"],
    "system": ["monolith", "cron-based ETL", "billing service", "search cluster"],
    "target": ["Kubernetes", "PostgreSQL 16", "a managed queue", "Go"],
    "month": ["March", "June", "September", "November"],
    "month2": ["January", "April", "July", "October"],
    "race": ["half marathon", "10k", "trail race"],
    "genre": ["science fiction", "history", "crime novels", "poetry"],
    "book": ["The Dispossessed", "SPQR", "The Big Sleep", "Piranesi"],
    "editor": ["Neovim", "VS Code", "Emacs", "Helix"],
    "os": ["Linux", "macOS"],
    "thing": ["passport", "car insurance", "domain name"],
}


def seeded_block(rng: random.Random) -> str:
    """A realistic block: 300-1,500 characters of short facts, one per line, some non-ASCII."""
    goal = rng.randint(300, 1500)
    lines: list[str] = []
    size = -1
    while size < goal:
        values = {key: rng.choice(options) for key, options in _FILL.items()}
        values |= {
            "name": rng.choice(_NAMES),
            "name2": rng.choice(_NAMES),
            "city": rng.choice(_CITIES),
            "year": str(rng.randint(2005, 2024)),
            "age1": str(rng.randint(2, 9)),
            "age2": str(rng.randint(10, 17)),
            "day": str(rng.randint(1, 28)),
            "day2": str(rng.randint(1, 28)),
            "team": str(rng.randint(3, 12)),
        }
        line = rng.choice(_LINE_TEMPLATES).format(**values)
        lines.append(line)
        size += len(line) + 1
    # Stored blocks are sanitized on write; seed exactly what the server would have stored.
    return sanitize("\n".join(lines)[:1500])


def rewrite_text(run_tag: str, variant: int) -> str:
    """One of the texts the rewrites of a ghz run send: about 900 characters.

    About the mean size of the seeded blocks, so that the blocks rewritten in one round leave
    the reads of the next rounds at the same size. `run_tag` differs per ghz run, so a run's
    first rewrite of a principal never repeats the text an earlier run left there.
    """
    fixed = [
        "likes tea",
        "lives in Porto",
        "Works as a data engineer at a mid-sized hospital; usually online 09:00-17:30.",
        "Prefers short answers with code first, then a two-line explanation; no emojis.",
        "Has two kids (4 and 12); school runs at 8:15, so no calls before 9:00.",
        "Training for a half marathon in June; runs Tuesdays, Thursdays and Sundays.",
        "Reads mostly science fiction; finished 'The Dispossessed' and wants more like it.",
        "Uses Neovim with vim keys on a Linux laptop; dislikes GUI-only instructions.",
        "Manages a team of 7 engineers; 1:1s on Wednesdays, planning on Mondays.",
        "Current project: migrating a billing service to PostgreSQL 16; deadline in June.",
        "Speaks Portuguese natively and English at work; answer in English by default.",
        "Asked to be reminded that the passport renewal is due every April.",
    ]
    return "\n".join([f"fact {run_tag}-{variant}", *fixed])


def rewrite_variants(principals: int) -> int:
    """How many texts a run cycles through: ghz sends request n the text n mod this and the
    principal n mod `principals`, so a principal's next rewrite in the run gets a different
    text exactly when `principals` is not a multiple of it."""
    return next(k for k in range(7, 7 + principals + 1) if principals % k)


@dataclass(frozen=True)
class Population:
    """Principals p0..p(with_block-1) have a block; the next `without_block` have none."""

    with_block: int
    without_block: int

    @property
    def total(self) -> int:
        return self.with_block + self.without_block


def seed(engine: Engine, population: Population, postgres: bool) -> None:
    """Insert every seeded block in one bulk insert (as the schema owner on PostgreSQL)."""
    rng = random.Random(SEED)
    now = datetime.now(UTC)
    rows = [
        {
            "tenant_id": TENANT,
            "principal_id": f"p{i}",
            "text": seeded_block(rng),
            "etag": secrets.token_hex(8),
            "update_time": now,
        }
        for i in range(population.with_block)
    ]
    with engine.begin() as conn:
        if postgres:
            # Row-level security is FORCEd, so it binds the owner too: scope the transaction.
            conn.execute(text("SELECT set_config('app.tenant_id', :t, true)"), {"t": TENANT})
        conn.execute(insert(memory_blocks), rows)
    if postgres:
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))  # planner statistics as on a database in use
            conn.commit()


# --------------------------------------------------------------------------
# The databases
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    """Where the server under test keeps its data, and how to describe it."""

    server_args: list[str]
    description: str
    owner_url: str  # to check the data afterwards, bypassing the server
    postmaster_pid: int | None = None  # a local PostgreSQL's, to count its CPU per call

    def audit_events(self) -> tuple[int, set[str]]:
        """Audit events in the bench tenant (one per effective rewrite) and their principals."""
        engine = create_engine(self.owner_url)
        try:
            with engine.begin() as conn:
                if engine.dialect.name == "postgresql":
                    conn.execute(
                        text("SELECT set_config('app.tenant_id', :t, true)"), {"t": TENANT}
                    )
                query = text(
                    "SELECT principal_id, count(*) FROM audit_events WHERE tenant_id = :t "
                    "GROUP BY principal_id"
                )
                rows = conn.execute(query, {"t": TENANT}).all()
        finally:
            engine.dispose()
        return sum(int(n) for _, n in rows), {str(p) for p, _ in rows}


def _check_loopback(url: str) -> None:
    host = make_url(url).host
    if host not in (HOST, "localhost"):
        raise SystemExit(f"refusing to benchmark against a non-loopback database host {host!r}")


def _drop_database(admin: Engine, timeout_s: float = 10.0) -> None:
    """Drop the bench database once the last session has gone.

    The owner may not terminate the service role's sessions (DROP ... WITH (FORCE) then fails),
    and a stopped server's backends take a moment to exit, so wait for them (bounded).
    """
    deadline = time.monotonic() + timeout_s
    with admin.connect() as conn:
        sessions = text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d")
        while conn.execute(sessions, {"d": DB_NAME}).scalar_one() and time.monotonic() < deadline:
            time.sleep(0.1)
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)'))


@contextmanager
def postgres_database(population: Population) -> Iterator[Database]:
    """A fresh `memoria_bench` database, migrated and seeded; dropped again afterwards."""
    owner_url, app_url = pg_urls()
    _check_loopback(owner_url)
    _check_loopback(app_url)
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    owner_db = make_url(owner_url).set(database=DB_NAME).render_as_string(hide_password=False)
    app_db = make_url(app_url).set(database=DB_NAME).render_as_string(hide_password=False)
    try:
        with admin.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
            postmaster = parent_pid(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        _drop_database(admin)  # left over from an interrupted run
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{DB_NAME}"'))
            conn.execute(text(f'GRANT CONNECT ON DATABASE "{DB_NAME}" TO {APP_ROLE}'))
        owner = create_store_engine(owner_db, pool_size=1)
        try:
            migrate.upgrade(owner, app_role=APP_ROLE)
            started = time.monotonic()
            seed(owner, population, postgres=True)
            seeded_s = time.monotonic() - started
        finally:
            owner.dispose()
        yield Database(
            ["--database-url", app_db],
            f"PostgreSQL {version} on {make_url(app_url).host}:{make_url(app_url).port}, "
            f"database {DB_NAME} as {APP_ROLE} (RLS in force); seeded in {seeded_s:.1f}s",
            owner_db,
            postmaster,
        )
    finally:
        try:
            _drop_database(admin)
        except Exception as error:  # best effort: the report matters more than the cleanup
            print(f"WARNING: could not drop {DB_NAME}: {error}", file=sys.stderr)
        admin.dispose()


@contextmanager
def sqlite_database(population: Population) -> Iterator[Database]:
    """The embedded default in a temporary data directory, migrated and seeded."""
    with tempfile.TemporaryDirectory(prefix="memoria-bench-") as tmp:
        data_dir = Path(tmp)
        engine = create_store_engine(sqlite_url(data_dir), pool_size=1)
        try:
            migrate.upgrade(engine)
            started = time.monotonic()
            seed(engine, population, postgres=False)
            seeded_s = time.monotonic() - started
            with engine.connect() as conn:
                version = conn.execute(text("SELECT sqlite_version()")).scalar_one()
        finally:
            engine.dispose()
        yield Database(
            ["--data-dir", str(data_dir)],
            f"SQLite {version} (embedded default, WAL) in {data_dir}; seeded in {seeded_s:.1f}s",
            sqlite_url(data_dir),
        )


# --------------------------------------------------------------------------
# The server under test
# --------------------------------------------------------------------------


def check_answers(port: int, population: Population) -> None:
    """Prove that the seed is visible through the server before measuring anything."""
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        stub = pb_grpc.MemoryBlockServiceStub(channel)

        def render(principal: str) -> pb.RenderMemoryBlockResponse:
            meta = (("x-memoria-tenant", TENANT), ("x-memoria-principal", principal))
            reply: pb.RenderMemoryBlockResponse = stub.RenderMemoryBlock(
                pb.RenderMemoryBlockRequest(), metadata=meta, timeout=5
            )
            return reply

        if population.with_block and not render("p0").prompt_section.startswith("Personal"):
            raise RuntimeError("p0 renders no section: the seeded blocks are not visible")
        if population.without_block and render(f"p{population.with_block}").prompt_section:
            raise RuntimeError("a principal without a block rendered a section")


# --------------------------------------------------------------------------
# ghz
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rpc:
    """One benchmarked call: its label, method, request template and principals it spreads over."""

    label: str
    call: str
    principals: int
    writes: bool = False

    def data(self, run_tag: str) -> str:
        """ghz's request data. A rewrite's is a JSON array, which ghz sends round-robin (request
        n gets element n mod its length) and parses once per run. A template (e.g. the request
        number inside the text) would be rendered and parsed again for every call: measured
        at about 25 microseconds of ghz CPU per call, taken from the same 2 cores as the
        server's, that the no-op's static "{}" does not pay."""
        if not self.writes:
            return "{}"
        texts = range(rewrite_variants(self.principals))
        return json.dumps(
            [{"text": rewrite_text(run_tag, i), "writer": "WRITER_MODEL"} for i in texts]
        )

    def metadata(self, offset: int) -> str:
        # Consecutive requests go to consecutive principals, starting at a different one in
        # every run; `add` and `mod` are sprig functions, which ghz templates include.
        principal = f"p{{{{mod (add .RequestNumber {offset}) {self.principals}}}}}"
        return json.dumps({"x-memoria-tenant": TENANT, "x-memoria-principal": principal})


def rpcs(population: Population) -> list[Rpc]:
    """The four calls: reads spread over every principal, rewrites over those with a block.

    Rewriting only principals that have a block keeps the data set's shape from round to round.
    """
    return [
        Rpc("no-op", "grpc.health.v1.Health/Check", population.total),
        Rpc("get", f"{SERVICE}/GetMemoryBlock", population.total),
        Rpc("render", f"{SERVICE}/RenderMemoryBlock", population.total),
        Rpc("rewrite", f"{SERVICE}/RewriteMemoryBlock", population.with_block, writes=True),
    ]


@dataclass(frozen=True)
class RunResult:
    """One ghz run: one RPC at one concurrency in one round."""

    rpc: str
    concurrency: int
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    ok: int
    server_cpu_us: float  # server CPU time per call, microseconds (all threads)
    db_cpu_us: float | None  # the local PostgreSQL's (all its processes), None if not known
    ghz_cpu_us: float  # the load generator's
    errors: dict[str, int] = field(default_factory=dict)  # status code -> count, non-OK only

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


def run_ghz(ghz: str, port: int, args: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run ghz against 127.0.0.1:port with JSON output; return the parsed report."""
    cmd = [ghz, "--insecure", "--connect-timeout", "5s", "-O", "json", *args, f"{HOST}:{port}"]
    # A new session keeps Ctrl-C away from ghz; run() kills it when this driver is interrupted.
    out = subprocess.run(
        cmd, capture_output=True, timeout=timeout_s, check=False, start_new_session=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"ghz failed ({out.returncode}): {out.stderr.decode()[-2000:]}")
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def rpc_args(rpc: Rpc, concurrency: int, run_tag: str, offset: int) -> list[str]:
    return [
        "--call",
        rpc.call,
        "-d",
        rpc.data(run_tag),
        "-m",
        rpc.metadata(offset),
        "-c",
        str(concurrency),
        "--connections",
        "1",
    ]


def to_result(
    report: dict[str, Any], rpc: Rpc, concurrency: int, rnd: int, cpu: CpuSeconds
) -> RunResult:
    codes: dict[str, int] = report.get("statusCodeDistribution") or {}
    calls = max(int(report.get("count") or 0), 1)
    return RunResult(
        rpc=rpc.label,
        concurrency=concurrency,
        round=rnd,
        rps=float(report["rps"]),
        p50_ms=percentile_ms(report, 50),
        p99_ms=percentile_ms(report, 99),
        ok=codes.get("OK", 0),
        server_cpu_us=cpu.server / calls * 1e6,
        db_cpu_us=None if cpu.database is None else cpu.database / calls * 1e6,
        ghz_cpu_us=cpu.ghz / calls * 1e6,
        errors={code: n for code, n in codes.items() if code != "OK"},
    )


@dataclass(frozen=True)
class CpuSeconds:
    """CPU time used during one run by the server, the database (if local) and ghz."""

    server: float
    database: float | None
    ghz: float


def children_cpu_seconds() -> float:
    """CPU time of this driver's finished children (each ghz run, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Bench:
    """The measuring loop: interleaved rounds against one running server."""

    ghz: str
    server: ServerProcess
    calls: list[Rpc]
    concurrencies: list[int]
    duration_s: int
    deadline: float
    postmaster_pid: int | None = None
    results: list[RunResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rewrites_ok: int = 0  # every OK rewrite must have appended exactly one audit event
    _runs: int = 0

    def _tag(self) -> tuple[str, int]:
        self._runs += 1
        return f"r{self._runs}", random.Random(self._runs).randrange(100_000)

    def warm_up(self) -> None:
        """Every RPC once at the highest concurrency: fills pools and proves each call works."""
        for rpc in self.calls:
            tag, offset = self._tag()
            args = rpc_args(rpc, max(self.concurrencies), tag, offset)
            report = run_ghz(
                self.ghz,
                self.server.port,
                [*args, "-n", str(WARMUP_REQUESTS)],
                GHZ_EXTRA_TIMEOUT_S,
            )
            codes = report.get("statusCodeDistribution") or {}
            if rpc.writes:
                self.rewrites_ok += codes.get("OK", 0)
            if set(codes) != {"OK"}:
                errors = report.get("errorDistribution")
                raise RuntimeError(f"warm-up of {rpc.label} failed: {codes} {errors}")

    def measure(self, rpc: Rpc, concurrency: int, rnd: int) -> RunResult:
        if time.monotonic() + self.duration_s + 5 > self.deadline:
            raise BudgetExceeded(f"round {rnd} {rpc.label} c={concurrency}")
        tag, offset = self._tag()
        # -z with --duration-stop=wait: at the deadline ghz stops sending and lets the calls
        # in flight finish and count, instead of cancelling them (the default "close" reports
        # each as Unavailable). So any non-OK status here is a real error.
        args = [
            *rpc_args(rpc, concurrency, tag, offset),
            "-z",
            f"{self.duration_s}s",
            "--duration-stop",
            "wait",
        ]
        before = self._cpu_seconds()
        report = run_ghz(self.ghz, self.server.port, args, self.duration_s + GHZ_EXTRA_TIMEOUT_S)
        after = self._cpu_seconds()
        cpu = CpuSeconds(
            server=after.server - before.server,
            database=(
                None
                if after.database is None or before.database is None
                else after.database - before.database
            ),
            ghz=after.ghz - before.ghz,
        )
        result = to_result(report, rpc, concurrency, rnd, cpu)
        self.results.append(result)
        if rpc.writes:
            self.rewrites_ok += result.ok
        if result.errors:
            problem = (
                f"round {rnd} {rpc.label} c={concurrency}: {result.error_count} non-OK calls "
                f"{result.errors} {report.get('errorDistribution')}"
            )
            self.problems.append(problem)
            print(f"WARNING: {problem}", file=sys.stderr, flush=True)
        print(
            f"  round {rnd} c={concurrency:<3} {rpc.label:<8} rps={result.rps:8.1f} "
            f"p50={result.p50_ms:7.2f}ms p99={result.p99_ms:7.2f}ms "
            f"cpu us/call: server={result.server_cpu_us:.0f} db={_us(result.db_cpu_us)} "
            f"ghz={result.ghz_cpu_us:.0f} errors={result.error_count}",
            file=sys.stderr,
            flush=True,
        )
        return result

    def _cpu_seconds(self) -> CpuSeconds:
        database = None
        if self.postmaster_pid is not None:
            try:
                database = process_tree_cpu_seconds(self.postmaster_pid)
            except OSError:
                self.postmaster_pid = None  # not readable here: report n/a
        return CpuSeconds(self.server.cpu_seconds(), database, children_cpu_seconds())

    def run(self, rounds: int) -> None:
        """Each round: each concurrency, every RPC in an order rotated by round and level."""
        for rnd in range(1, rounds + 1):
            for level, concurrency in enumerate(self.concurrencies):
                shift = (rnd - 1 + level) % len(self.calls)
                for rpc in self.calls[shift:] + self.calls[:shift]:
                    self.measure(rpc, concurrency, rnd)


def check_writes(database: Database, bench: Bench, population: Population) -> str:
    """Every OK rewrite appended one event, to a seeded principal: the templates worked."""
    events, principals = database.audit_events()
    expected = {f"p{i}" for i in range(population.with_block)}
    if events != bench.rewrites_ok:
        bench.problems.append(
            f"{bench.rewrites_ok} OK rewrites but {events} audit events: "
            "some rewrites were not effective writes"
        )
    if not principals <= expected or len(principals) < min(events, population.with_block) // 2:
        bench.problems.append(
            f"rewrites reached {len(principals)} principals, some not seeded: "
            f"{sorted(principals - expected)[:3]}; is ghz templating the metadata?"
        )
    return (
        f"audit events written: {events} for {bench.rewrites_ok} OK rewrites, "
        f"over {len(principals)} principals"
    )


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Medians over rounds of one RPC at one concurrency."""

    rps: float
    p50_ms: float
    p99_ms: float
    ratio: float | None  # median over rounds of (this rps / no-op rps in the same round)
    round_ratios: list[float]  # each round's, in round order
    server_cpu_us: float
    db_cpu_us: float | None
    ghz_cpu_us: float
    runs: int
    errors: int


def summarize(results: Sequence[RunResult], label: str, concurrency: int) -> Summary | None:
    runs = [r for r in results if r.rpc == label and r.concurrency == concurrency]
    if not runs:
        return None
    noop = {r.round: r.rps for r in results if r.rpc == "no-op" and r.concurrency == concurrency}
    ratios = [r.rps / noop[r.round] for r in runs if noop.get(r.round)]
    return Summary(
        rps=statistics.median(r.rps for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        ratio=statistics.median(ratios) if ratios else None,
        round_ratios=ratios,
        server_cpu_us=statistics.median(r.server_cpu_us for r in runs),
        db_cpu_us=(
            statistics.median(r.db_cpu_us for r in runs if r.db_cpu_us is not None)
            if all(r.db_cpu_us is not None for r in runs)
            else None
        ),
        ghz_cpu_us=statistics.median(r.ghz_cpu_us for r in runs),
        runs=len(runs),
        errors=sum(r.error_count for r in runs),
    )


def print_report(bench: Bench) -> None:
    print()
    print(
        f"{'rpc':<8} {'in-flight':>9} {'rps':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'x no-op':>8} {'cpu us':>7} {'db us':>6} {'ghz us':>6} {'runs':>5} {'errors':>6}"
    )
    summaries: dict[tuple[str, int], Summary] = {}
    for concurrency in bench.concurrencies:
        for rpc in bench.calls:
            s = summarize(bench.results, rpc.label, concurrency)
            if s is None:
                continue
            summaries[(rpc.label, concurrency)] = s
            ratio = f"{s.ratio:.2f}" if s.ratio is not None else "n/a"
            print(
                f"{rpc.label:<8} {concurrency:>9} {s.rps:>9.1f} {s.p50_ms:>8.2f} "
                f"{s.p99_ms:>8.2f} {ratio:>8} {s.server_cpu_us:>7.0f} {_us(s.db_cpu_us):>6} "
                f"{s.ghz_cpu_us:>6.0f} {s.runs:>5} {s.errors:>6}"
            )
    print()
    print("Targets (requests/s as a ratio to the no-op at the same calls in flight):")
    for concurrency in bench.concurrencies:
        for label, target in TARGETS.items():
            s = summaries.get((label, concurrency))
            if s is None or s.ratio is None:
                print(f"  in-flight {concurrency:>2}: {label} >= {target}: not measured")
                continue
            verdict = "PASS" if s.ratio >= target else "FAIL"
            rounds = " ".join(f"{r:.2f}" for r in s.round_ratios)
            print(
                f"  in-flight {concurrency:>2}: {label} >= {target}: {verdict} (x{s.ratio:.2f}; "
                f"per round {rounds})"
            )


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def ghz_version(ghz: str) -> str:
    """The pin bench/ghz.sh recorded (a `go install` build reports itself as "dev"), one line."""
    stamp = Path(ghz).with_name(".ghz.version")
    if stamp.exists():
        text = stamp.read_text()
    else:
        out = subprocess.run([ghz, "--version"], capture_output=True, text=True, check=False)
        text = out.stdout or out.stderr
    return (text.strip().splitlines() or ["?"])[0]


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--duration", type=int, default=5, help="seconds of load per ghz run")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    p.add_argument("--principals", type=int, default=3000, help="principals with a block")
    p.add_argument(
        "--empty-principals", type=int, default=300, help="principals with no block (reads only)"
    )
    p.add_argument("--sqlite", action="store_true", help="the embedded SQLite default instead")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="calls in flight")
    p.add_argument(
        "--only",
        nargs="+",
        choices=["no-op", "get", "render", "rewrite"],
        help="measure only these RPCs (ratios need no-op); useful while profiling",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=300.0,
        help="seconds; no ghz run starts that would end past it (ghz install not counted)",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration < 1 or args.principals < 1 or args.empty_principals < 0:
        p.error("--rounds, --duration, --principals must be >= 1, --empty-principals >= 0")
    if min(args.concurrency) < 1:
        p.error("--concurrency must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    ghz = find_ghz()  # may take a minute the first time: not part of the budget
    started = time.monotonic()
    population = Population(args.principals, args.empty_principals)
    calls = [r for r in rpcs(population) if not args.only or r.label in args.only]
    # What the server derives from this environment (a dict, as in server/__main__.py, since
    # mypy does not see the environment-filled defaults of a pydantic BaseSettings).
    overrides: dict[str, Any] = {"listen": f"{HOST}:0"}
    settings = Settings(**overrides)
    planned = args.rounds * len(args.concurrency) * len(calls) * args.duration
    print(
        f"ghz={ghz}; {args.rounds} rounds x {args.concurrency} in flight x "
        f"{[c.label for c in calls]} x {args.duration}s = {planned}s of load",
        file=sys.stderr,
        flush=True,
    )

    bench: Bench | None = None
    outcome = ""
    facts: list[str] = []
    with ExitStack() as stack:
        try:
            make_db = sqlite_database if args.sqlite else postgres_database
            database = stack.enter_context(make_db(population))
            facts.append(f"database: {database.description}")
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            server = ServerProcess(
                database.server_args,
                workdir,
                service=SERVICE,
                stop_timeout_s=SERVER_STOP_TIMEOUT_S,
                env={"MEMORIA_PAGE_TOKEN_SECRET": "bench-only-not-a-secret"},
            )
            stack.callback(server.stop)
            server.wait_serving(SERVER_START_TIMEOUT_S)
            print(f"server pid {server.proc.pid} on {HOST}:{server.port}", file=sys.stderr)
            check_answers(server.port, population)
            bench = Bench(
                ghz,
                server,
                calls,
                args.concurrency,
                args.duration,
                deadline=started + args.time_budget,
                postmaster_pid=database.postmaster_pid,
            )
            bench.warm_up()
            facts.append(f"server OS threads after warm-up: {server.os_threads()}")
            bench.run(args.rounds)
            if any(c.writes for c in calls):
                facts.append(check_writes(database, bench, population))
        except RUN_ENDED as error:
            outcome = failure_outcome(error)

    print()
    print(machine_line())
    print(software_line(f"ghz {ghz_version(ghz)}"))
    print(
        f"server: memoria serve, sync gRPC with {settings.threads} worker threads, "
        f"db pool {settings.db_pool_size}, auth trusted-headers (loopback)"
    )
    for fact in facts:
        print(fact)
    print(
        f"load: ghz on the same machine (it shares the {os.cpu_count()} cores with the server "
        "and the database), one HTTP/2 connection, "
        f"{args.duration}s per run, {args.rounds} interleaved rounds, medians shown;\n"
        f"  principals: {population.with_block} with a block of 300-1,500 chars and "
        f"{population.without_block} without, one tenant; reads spread over all of them, "
        "rewrites over those with a block, each rewrite a real change (one audit event)."
    )
    print(
        "no-op = grpc.health.v1.Health/Check in the same server: the interceptor passes it "
        "through\n  without authentication, so the ratio includes the identity check.\n"
        "cpu us = the server process's CPU time per call (all threads); db us = the local\n"
        "  PostgreSQL's (all its processes; n/a for SQLite, inside the server); ghz us = ghz's."
    )
    if bench is not None:
        print_report(bench)
        for problem in bench.problems:
            print(f"ERRORS: {problem}")
    print()
    elapsed = time.monotonic() - started
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({outcome})" if outcome else ""))
    sys.stdout.flush()
    return 0 if bench is not None and bench.results and not outcome and not bench.problems else 1


if __name__ == "__main__":
    sys.exit(main())
