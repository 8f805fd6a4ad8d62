"""The benchmarks' shared harness: seeded data, the databases, the block RPCs, ghz.

Every benchmark that drives memory block RPCs against a real server imports these from here
(and the process helpers from procs.py), never from another benchmark or from tests/:

- the data: principals with realistic blocks (`Population`, `seeded_block`, `seed`);
- the databases: `postgres_database` (a fresh database on the benchmark's PostgreSQL) and
  `sqlite_database` (the embedded default in a temporary data dir);
- the calls: `Rpc`, `rpcs` (no-op, get, render, rewrite), `rpc_args`, `run_ghz`,
  `ghz_version`, and `check_answers` (the seed is visible before anything is measured);
- the indexing backlog, read from the server's own data: `SqliteBacklog`, `PostgresBacklog`
  and `drain` (the public API has no call for it).

PostgreSQL for figures is durable: `bench_pg_urls` starts (or finds) a cluster of the
benchmarks' own under `.pg-bench/` through `scripts/pg.sh` with MEMORIA_PG_DURABLE=1, so
fsync, synchronous_commit and full_page_writes are on, as on a server a user runs (the tests'
cluster turns them off; with them on, rewrite at 16 in flight measured x0.27 instead of
x0.33). MEMORIA_BENCH_PG=fast uses the tests' cluster instead (MEMORIA_TEST_PG_* or
`scripts/pg.sh start`), for a quick look; every report names the durability it ran with.

The Qdrant server launcher and the stand-in OTLP collector are the test suite's own
(tests/qdrant_server.py, tests/otlp_stub.py): `qdrant_process` and `GrpcCollectorStub` are
re-exported here so that one copy serves both and no benchmark imports tests/ itself.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import grpc
from procs import HOST, parent_pid
from sqlalchemy import Engine, create_engine, insert, text
from sqlalchemy.engine import make_url

from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.adapters.sql import migrate
from server.adapters.sql.engine import create_store_engine, sqlite_url
from server.adapters.sql.tables import memory_blocks
from server.domain.text import sanitize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests/
# Re-exported: the suite's own launcher and stand-in collector, one copy for both.
from tests.otlp_stub import GrpcCollectorStub as GrpcCollectorStub
from tests.qdrant_server import qdrant_process as qdrant_process

ROOT = Path(__file__).resolve().parent.parent

TENANT = "bench"
DB_NAME = "memoria_bench"
APP_ROLE = "memoria_app"
SERVICE = "memoria.v1.MemoryBlockService"

SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
SEED = 20240601  # the seeded blocks are the same on every run

DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")


# --------------------------------------------------------------------------
# The benchmark's PostgreSQL
# --------------------------------------------------------------------------


def bench_pg_port() -> int:
    """The durable cluster's port: MEMORIA_BENCH_PG_PORT, else 13432 plus a number from the
    checkout's path (0-999), away from the tests' cluster (12432-13431) and a system one."""
    given = os.environ.get("MEMORIA_BENCH_PG_PORT")
    return int(given) if given else 13432 + zlib.crc32(str(ROOT).encode()) % 1000


def bench_pg_urls() -> tuple[str, str]:
    """(owner URL, service-role URL) of the PostgreSQL the benchmarks measure on.

    By default a durable cluster of their own (`.pg-bench/`, `bench_pg_port()`), started by
    `scripts/pg.sh start` with MEMORIA_PG_DURABLE=1 if it is not running, and left running
    (stop it with `MEMORIA_PG_DIR=.pg-bench MEMORIA_PG_PORT=<port> scripts/pg.sh stop`).
    MEMORIA_BENCH_PG=fast: the tests' cluster (MEMORIA_TEST_PG_* when both are set).
    """
    if _bench_pg_mode() == "fast":
        owner = os.environ.get("MEMORIA_TEST_PG_OWNER_URL")
        app = os.environ.get("MEMORIA_TEST_PG_APP_URL")
        if owner and app:
            return owner, app
    urls = _start("pg.sh")
    return urls["MEMORIA_TEST_PG_OWNER_URL"], urls["MEMORIA_TEST_PG_APP_URL"]


def bench_pgbouncer_url() -> str:
    """The service role's URL through a transaction-pooling PgBouncer (`scripts/pgbouncer.sh`,
    started if it is not running, and left running) in front of `bench_pg_urls`' PostgreSQL:
    by default its own, on 18432 plus a number from the checkout's path (0-999), away from the
    tests' (16432-17431); MEMORIA_BENCH_PG=fast: the tests' PgBouncer."""
    return _start("pgbouncer.sh")["MEMORIA_TEST_PGBOUNCER_URL"]


def _bench_pg_mode() -> str:
    mode = os.environ.get("MEMORIA_BENCH_PG", "durable")
    if mode not in ("durable", "fast"):
        raise SystemExit(f"MEMORIA_BENCH_PG must be durable or fast, not {mode!r}")
    return mode


def _start(script: str) -> dict[str, str]:
    """`scripts/<script> start` for the benchmark's PostgreSQL (see bench_pg_urls); its exports."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PG", "MEMORIA_PG_", "MEMORIA_PGBOUNCER_"))
    }
    if _bench_pg_mode() == "durable":
        env |= {
            "MEMORIA_PG_DURABLE": "1",
            "MEMORIA_PG_DIR": str(ROOT / ".pg-bench"),
            "MEMORIA_PG_PORT": str(bench_pg_port()),
            "MEMORIA_PGBOUNCER_PORT": str(18432 + zlib.crc32(str(ROOT).encode()) % 1000),
        }
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / script), "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        start_new_session=True,  # a Ctrl-C of the driver does not reach the server
    )
    if out.returncode != 0:
        raise SystemExit(f"scripts/{script} start failed:\n{out.stderr[-2000:]}")
    return dict(
        line.removeprefix("export ").split("=", 1)
        for line in out.stdout.splitlines()
        if line.startswith("export ")
    )


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
    app_url: str = ""  # PostgreSQL: the service role's URL of this database (direct)

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


def _drop_database(admin: Engine, name: str, timeout_s: float = 10.0) -> None:
    """Drop the bench database once the last session has gone.

    The owner may not terminate the service role's sessions (DROP ... WITH (FORCE) then fails),
    and a stopped server's backends take a moment to exit, so wait for them (bounded).
    """
    deadline = time.monotonic() + timeout_s
    with admin.connect() as conn:
        sessions = text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d")
        while conn.execute(sessions, {"d": name}).scalar_one() and time.monotonic() < deadline:
            time.sleep(0.1)
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextmanager
def postgres_database(population: Population, name: str = DB_NAME) -> Iterator[Database]:
    """A fresh database `name` on the benchmark's PostgreSQL (`bench_pg_urls`), migrated and
    seeded; dropped again afterwards. Its description names the server's durability."""
    owner_url, app_url = bench_pg_urls()
    _check_loopback(owner_url)
    _check_loopback(app_url)
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    owner_db = make_url(owner_url).set(database=name).render_as_string(hide_password=False)
    app_db = make_url(app_url).set(database=name).render_as_string(hide_password=False)
    try:
        with admin.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
            durability = ", ".join(
                f"{setting}={conn.execute(text(f'SHOW {setting}')).scalar_one()}"
                for setting in DURABILITY_SETTINGS
            )
            postmaster = parent_pid(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        _drop_database(admin, name)  # left over from an interrupted run
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
            conn.execute(text(f'GRANT CONNECT ON DATABASE "{name}" TO {APP_ROLE}'))
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
            f"database {name} as {APP_ROLE} (RLS in force); {durability} "
            f"({'durable' if durability.count('=on') == 3 else 'NOT durable: test settings'}); "
            f"seeded in {seeded_s:.1f}s",
            owner_db,
            postmaster,
            app_db,
        )
    finally:
        try:
            _drop_database(admin, name)
        except Exception as error:  # best effort: the report matters more than the cleanup
            print(f"WARNING: could not drop {name}: {error}", file=sys.stderr)
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


class Backlog(Protocol):
    """Turn counts by status (pending, indexed, failed) for the run's tenants, read-only."""

    description: str

    def counts(self) -> Counter[str]: ...

    def close(self) -> None: ...


class SqliteBacklog:
    """The embedded default's SQLite file, opened read-only (``mode=ro``)."""

    def __init__(self, path: Path, tenant_prefix: str) -> None:
        self.description = f"the server's SQLite file, opened read-only ({path.name}, mode=ro)"
        self._path = path
        self._prefix = tenant_prefix
        self._conn: sqlite3.Connection | None = None

    def counts(self) -> Counter[str]:
        if self._conn is None:
            uri = f"file:{self._path}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
        rows = self._conn.execute(
            "SELECT status, count(*) FROM conversation_turns WHERE tenant_id LIKE ? "
            "GROUP BY status",
            (self._prefix + "%",),
        ).fetchall()
        return Counter({str(s): int(n) for s, n in rows})

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class PostgresBacklog:
    """PostgreSQL as the service role: a READ ONLY transaction, tenant set for RLS."""

    def __init__(self, url: str, tenants: Sequence[str]) -> None:
        self.description = (
            "PostgreSQL as the service role (--database-url), a READ ONLY transaction with "
            "app.tenant_id set per tenant (row-level security in force)"
        )
        self._engine = create_engine(url, pool_size=1, max_overflow=0)
        self._tenants = list(tenants)

    def counts(self) -> Counter[str]:
        total: Counter[str] = Counter()
        with self._engine.connect() as conn, conn.begin():
            conn.execute(text("SET TRANSACTION READ ONLY"))
            for tenant in self._tenants:
                conn.execute(text("SELECT set_config('app.tenant_id', :t, true)"), {"t": tenant})
                rows = conn.execute(
                    text(
                        "SELECT status, count(*) FROM conversation_turns WHERE tenant_id = :t "
                        "GROUP BY status"
                    ),
                    {"t": tenant},
                ).all()
                total.update({str(s): int(n) for s, n in rows})
        return total

    def close(self) -> None:
        self._engine.dispose()


def drain(backlog: Backlog, timeout_s: float) -> tuple[Counter[str], float | None]:
    """Wait until no turn is pending (bounded); (final counts, seconds taken or None)."""
    started = time.perf_counter()
    while True:
        counts = backlog.counts()
        if not counts["pending"]:
            return counts, time.perf_counter() - started
        if time.perf_counter() - started > timeout_s:
            return counts, None
        time.sleep(0.2)


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


def ghz_version(ghz: str) -> str:
    """The pin bench/ghz.sh recorded (a `go install` build reports itself as "dev"), one line."""
    stamp = Path(ghz).with_name(".ghz.version")
    if stamp.exists():
        text = stamp.read_text()
    else:
        out = subprocess.run([ghz, "--version"], capture_output=True, text=True, check=False)
        text = out.stdout or out.stderr
    return (text.strip().splitlines() or ["?"])[0]
