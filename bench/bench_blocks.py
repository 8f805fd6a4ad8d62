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
(issue 23 item 4: render at least 0.9 of the no-op, get 0.8, rewrite 0.3).

Why ratios: the reference machine has 2 shared cores, and ghz runs on them next to the server
and PostgreSQL, so absolute numbers move with the neighbours' load. Runs are interleaved
(every round runs every RPC at every concurrency, in a rotated order) and the ratio of each
RPC to the no-op measured in the same round is the result; the table shows medians over
rounds.

With ``--pooler`` the same run also starts a second server on the same database behind a
transaction-pooling PgBouncer (``scripts/pgbouncer.sh``, MEMORIA_DB_POOLER=transaction, its
read cache listening direct), measures render and rewrite through it in the same interleaved
rounds (labels ``render@pgb``, ``rewrite@pgb``), and prints each as a ratio to the direct
server's in the same round. Both servers listen for the other's writes, as two replicas do, so
every rewrite of either announces itself (NOTIFY): the direct figures of such a run are a
little below a run without ``--pooler``.

Usage (from the repository root)::

    .venv/bin/python bench/bench_blocks.py                   # PostgreSQL, about 2 minutes
    .venv/bin/python bench/bench_blocks.py --duration 3 --rounds 1
    .venv/bin/python bench/bench_blocks.py --sqlite          # the embedded default instead
    .venv/bin/python bench/bench_blocks.py --pooler          # and behind PgBouncer, as ratios

PostgreSQL is the benchmarks' durable cluster (fsync, synchronous_commit and full_page_writes
on; ``harness.bench_pg_urls``, started by ``scripts/pg.sh`` under ``.pg-bench/`` and left
running); ``MEMORIA_BENCH_PG=fast`` measures on the tests' cluster instead, and the report says
which. The database ``memoria_bench`` is dropped and created again on every run, and dropped
at the end.
Everything binds and targets 127.0.0.1 only. Every process the script starts (the server,
ghz) is stopped before it exits, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# harness.py and procs.py sit beside this script (its folder is on sys.path).
from harness import (
    SERVER_START_TIMEOUT_S,
    SERVER_STOP_TIMEOUT_S,
    SERVICE,
    Database,
    Population,
    Rpc,
    bench_pgbouncer_url,
    check_answers,
    ghz_version,
    postgres_database,
    rpc_args,
    rpcs,
    run_ghz,
    sqlite_database,
)
from procs import (
    HOST,
    RUN_ENDED,
    BudgetExceeded,
    ServerProcess,
    failure_outcome,
    find_ghz,
    machine_line,
    percentile_ms,
    process_tree_cpu_seconds,
    raise_on_sigterm,
    software_line,
)
from sqlalchemy.engine import make_url

from server.runtime.settings import Settings

GHZ_EXTRA_TIMEOUT_S = 30.0  # on top of a run's own duration
WARMUP_REQUESTS = 400

# Targets of issue 23 item 4 (durable PostgreSQL, 16 in flight; earlier issues asked render and
# get >= 0.6): requests/s of each RPC as a ratio to the no-op's.
TARGETS = {"render": 0.9, "get": 0.8, "rewrite": 0.3}
POOLED = "@pgb"
"""Label suffix of a call served by the server behind PgBouncer (--pooler)."""
POOLED_RPCS = ("render", "rewrite")


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
    pooled: ServerProcess | None = None  # --pooler: the server behind PgBouncer (POOLED labels)
    results: list[RunResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rewrites_ok: int = 0  # every OK rewrite must have appended exactly one audit event
    _runs: int = 0

    def _tag(self) -> tuple[str, int]:
        self._runs += 1
        return f"r{self._runs}", random.Random(self._runs).randrange(100_000)

    def server_for(self, rpc: Rpc) -> ServerProcess:
        """The server a call is measured on: the pooled one for POOLED labels."""
        if rpc.label.endswith(POOLED):
            assert self.pooled is not None
            return self.pooled
        return self.server

    def warm_up(self) -> None:
        """Every RPC once at the highest concurrency: fills pools and proves each call works."""
        for rpc in self.calls:
            tag, offset = self._tag()
            args = rpc_args(rpc, max(self.concurrencies), tag, offset)
            report = run_ghz(
                self.ghz,
                self.server_for(rpc).port,
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
        server = self.server_for(rpc)
        before = self._cpu_seconds(server)
        report = run_ghz(self.ghz, server.port, args, self.duration_s + GHZ_EXTRA_TIMEOUT_S)
        after = self._cpu_seconds(server)
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
            f"  round {rnd} c={concurrency:<3} {rpc.label:<11} rps={result.rps:8.1f} "
            f"p50={result.p50_ms:7.2f}ms p99={result.p99_ms:7.2f}ms "
            f"cpu us/call: server={result.server_cpu_us:.0f} db={_us(result.db_cpu_us)} "
            f"ghz={result.ghz_cpu_us:.0f} errors={result.error_count}",
            file=sys.stderr,
            flush=True,
        )
        return result

    def _cpu_seconds(self, server: ServerProcess) -> CpuSeconds:
        database = None
        if self.postmaster_pid is not None:
            try:
                database = process_tree_cpu_seconds(self.postmaster_pid)
            except OSError:
                self.postmaster_pid = None  # not readable here: report n/a
        return CpuSeconds(server.cpu_seconds(), database, children_cpu_seconds())

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
        f"{'rpc':<11} {'in-flight':>9} {'rps':>9} {'p50 ms':>8} {'p99 ms':>8} "
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
                f"{rpc.label:<11} {concurrency:>9} {s.rps:>9.1f} {s.p50_ms:>8.2f} "
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


def print_pooled_report(bench: Bench) -> None:
    """--pooler: each pooled call's requests/s as a ratio to the direct server's in the same
    round (medians over rounds; per round in parentheses)."""
    print()
    print("Through PgBouncer (transaction pooling) / direct, requests/s in the same round:")
    for concurrency in bench.concurrencies:
        for label in POOLED_RPCS:
            direct = {
                r.round: r.rps
                for r in bench.results
                if r.rpc == label and r.concurrency == concurrency
            }
            ratios = [
                r.rps / direct[r.round]
                for r in bench.results
                if r.rpc == label + POOLED and r.concurrency == concurrency and direct.get(r.round)
            ]
            if not ratios:
                print(f"  in-flight {concurrency:>2}: {label}: not measured")
                continue
            rounds = " ".join(f"{r:.2f}" for r in ratios)
            print(
                f"  in-flight {concurrency:>2}: {label}: x{statistics.median(ratios):.2f} "
                f"(per round {rounds})"
            )


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


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
    p.add_argument(
        "--pooler",
        action="store_true",
        help="also render and rewrite through a second server behind PgBouncer (transaction "
        "pooling), reported as ratios to the direct server's",
    )
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
    if args.pooler and args.sqlite:
        p.error("--pooler needs PostgreSQL, not --sqlite")
    return args


def start_pooled_server(stack: ExitStack, database: Database) -> ServerProcess:
    """A second `memoria serve` on `database` through the benchmark's PgBouncer (transaction
    pooling), its read cache listening on the direct URL; stopped with `stack`."""
    name = make_url(database.app_url).database
    pooled_url = make_url(bench_pgbouncer_url()).set(database=name)
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pooled-")))
    server = ServerProcess(
        # A data dir of its own: the embedded chunk index under the default one is the first
        # server's.
        [
            "--database-url",
            pooled_url.render_as_string(hide_password=False),
            "--data-dir",
            str(workdir / "data"),
        ],
        workdir,
        service=SERVICE,
        stop_timeout_s=SERVER_STOP_TIMEOUT_S,
        env={
            "MEMORIA_PAGE_TOKEN_SECRET": "bench-only-not-a-secret",
            "MEMORIA_DB_POOLER": "transaction",
            "MEMORIA_DATABASE_LISTEN_URL": database.app_url,
        },
    )
    stack.callback(server.stop)
    server.wait_serving(SERVER_START_TIMEOUT_S)
    print(f"pooled server pid {server.proc.pid} on {HOST}:{server.port}", file=sys.stderr)
    return server


def pooled_description(server: ServerProcess) -> str:
    """Where the pooled server's connections go, for the report."""
    version = subprocess.run(
        ["/usr/sbin/pgbouncer", "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return (
        f"memoria serve (pid {server.proc.pid}) through {version[0] if version else 'PgBouncer'} "
        "(pool_mode=transaction, scripts/pgbouncer.sh) on the same database, "
        "MEMORIA_DB_POOLER=transaction, its read cache listening direct; its db us counts "
        "PostgreSQL's processes, not PgBouncer's"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    ghz = find_ghz()  # may take a minute the first time: not part of the budget
    started = time.monotonic()
    population = Population(args.principals, args.empty_principals)
    calls = [r for r in rpcs(population) if not args.only or r.label in args.only]
    if args.pooler:
        calls += [replace(r, label=r.label + POOLED) for r in calls if r.label in POOLED_RPCS]
    # What the server derives from this environment (a dict, as in server/runtime/cli.py, since
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
            pooled = None
            if args.pooler:
                pooled = start_pooled_server(stack, database)
                facts.append(f"pooled server: {pooled_description(pooled)}")
                check_answers(pooled.port, population)
            bench = Bench(
                ghz,
                server,
                calls,
                args.concurrency,
                args.duration,
                deadline=started + args.time_budget,
                postmaster_pid=database.postmaster_pid,
                pooled=pooled,
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
        f"server: memoria serve, sync gRPC with {settings.serve.threads} worker threads, "
        f"db pool {settings.store.db_pool_size}, auth trusted-headers (loopback)"
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
        if bench.pooled is not None:
            print_pooled_report(bench)
        for problem in bench.problems:
            print(f"ERRORS: {problem}")
    print()
    elapsed = time.monotonic() - started
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({outcome})" if outcome else ""))
    sys.stdout.flush()
    return 0 if bench is not None and bench.results and not outcome and not bench.problems else 1


if __name__ == "__main__":
    sys.exit(main())
