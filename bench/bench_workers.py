"""Render throughput with 1 and with 2 serving processes (`memoria serve --processes N`), side by
side in one run, on PostgreSQL.

What it measures
----------------
One Python process is bound by one core (the GIL). `--processes N` (formerly `--workers`) runs
N serving processes on one port (server/runtime/processes.py). This script starts two servers on the
same freshly seeded PostgreSQL database, one with `--processes 1` and one with `--processes 2`,
and drives each with ghz through several connections (the kernel gives each connection to one
process, so one connection would only ever reach one of them). In interleaved rounds it
measures, against each server, `RenderMemoryBlock` (the call made on every turn) and the no-op
health `Check`, and prints requests/s, latency, the server's CPU per call (all its processes)
and, per round, the 2-process server's requests/s as a ratio to the 1-process server's: **the
result**.

Both servers run the production configuration that allows several processes: PostgreSQL
and a Qdrant server: the real one of the tests (tests/qdrant_server.py: the binary of
MEMORIA_TEST_QDRANT_BIN or ../shared/qdrant/qdrant, on loopback). Render never touches the
chunk index; the Qdrant server only lets the servers start, and sits idle while they are
measured.

The data, the servers and the ghz runs are those of bench_blocks.py (imported from it): 3,000
principals with a block of 300-1,500 characters and 300 without, one tenant, trusted headers
on loopback, the read cache on (each process has its own).

Usage (from the repository root)::

    .venv/bin/python bench/bench_workers.py                  # about 2 minutes
    .venv/bin/python bench/bench_workers.py --rounds 5 --duration 8

Everything binds and targets 127.0.0.1 (the stand-in a random 127.x.y.z); every process the
script starts is stopped before it exits, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import grpc

# harness.py and procs.py sit beside this script (its folder is on sys.path).
from harness import (
    SERVER_START_TIMEOUT_S,
    SERVER_STOP_TIMEOUT_S,
    SERVICE,
    Database,
    Population,
    Rpc,
    check_answers,
    ghz_version,
    postgres_database,
    qdrant_process,
    rpcs,
    run_ghz,
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
    raise_on_sigterm,
    software_line,
)

GHZ_EXTRA_TIMEOUT_S = 30.0
WARMUP_PASSES = 3  # render calls per principal before measuring: fills every process's cache
ENDED: tuple[type[BaseException], ...] = (*RUN_ENDED, grpc.RpcError)
"""What ends the measuring early and still leaves a report (`failure_outcome`)."""


def process_tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system, all threads) of a process and each of its children."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    cpu: dict[int, float] = {}
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:  # exited meanwhile
            continue
        cpu[p] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of all cores so far, from /proc/stat (busy: not idle or iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    return total - values[3] - values[4], total


def children_cpu() -> float:
    """CPU seconds of this script's reaped children: after a ghz run, ghz's share is added."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Server:
    """One `memoria serve --processes N` under test."""

    workers: int
    process: ServerProcess

    @property
    def label(self) -> str:
        return f"{self.workers} worker" + ("s" if self.workers > 1 else "")


@dataclass(frozen=True)
class Run:
    """One ghz run of one RPC against one server in one round."""

    server: str
    rpc: str
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # all the server's processes, per call
    ghz_us: float  # the load generator, per call
    machine: float  # busy share of all the machine's cores during the run (anyone's work)
    split: tuple[float, ...]  # each serving process's share of that CPU (the parent's aside)
    errors: int


def measure(
    ghz: str, server: Server, rpc: Rpc, args: argparse.Namespace, rnd: int, tag: int
) -> Run:
    offset = random.Random(tag).randrange(100_000)
    ghz_args = [
        "--call",
        rpc.call,
        "-d",
        rpc.data(f"r{tag}"),
        "-m",
        rpc.metadata(offset),
        "-c",
        str(args.concurrency),
        "--connections",
        str(args.connections),
        "-z",
        f"{args.duration}s",
        "--duration-stop",
        "wait",
    ]
    pid = server.process.proc.pid
    before, ghz_before, (busy_before, total_before) = (
        process_tree_cpu(pid),
        children_cpu(),
        machine_cpu(),
    )
    report = run_ghz(ghz, server.process.port, ghz_args, args.duration + GHZ_EXTRA_TIMEOUT_S)
    after, ghz_after, (busy_after, total_after) = (
        process_tree_cpu(pid),
        children_cpu(),
        machine_cpu(),
    )
    used = {p: after[p] - before.get(p, 0.0) for p in after}
    codes: dict[str, int] = report.get("statusCodeDistribution") or {}
    calls = max(int(report.get("count") or 0), 1)
    serving = [used[p] for p in sorted(used) if p != pid] or [used.get(pid, 0.0)]
    total = sum(used.values())
    run = Run(
        server=server.label,
        rpc=rpc.label,
        round=rnd,
        rps=float(report["rps"]),
        p50_ms=percentile_ms(report, 50),
        p99_ms=percentile_ms(report, 99),
        cpu_us=total / calls * 1e6,
        ghz_us=(ghz_after - ghz_before) / calls * 1e6,
        machine=(busy_after - busy_before) / max(total_after - total_before, 1),
        split=tuple(u / max(sum(serving), 1e-9) for u in serving),
        errors=sum(n for code, n in codes.items() if code != "OK"),
    )
    if run.errors:
        print(f"WARNING: {run}: {report.get('errorDistribution')}", file=sys.stderr)
    print(
        f"  round {rnd} {server.label:<9} {rpc.label:<7} rps={run.rps:8.1f} "
        f"p50={run.p50_ms:6.2f}ms p99={run.p99_ms:6.2f}ms cpu={run.cpu_us:5.0f}us/call "
        f"ghz={run.ghz_us:4.0f}us/call machine={run.machine:.0%} "
        f"split={'/'.join(f'{s:.0%}' for s in run.split)} errors={run.errors}",
        file=sys.stderr,
        flush=True,
    )
    return run


def warm_up(ghz: str, server: Server, calls: Sequence[Rpc], args: argparse.Namespace) -> None:
    """Every principal rendered a few times over many connections (each process keeps its
    own read cache), and the no-op; every call must answer OK."""
    for rpc in calls:
        count = WARMUP_PASSES * rpc.principals if rpc.label != "no-op" else 2000
        report = run_ghz(
            ghz,
            server.process.port,
            [
                "--call",
                rpc.call,
                "-d",
                rpc.data("warm"),
                "-m",
                rpc.metadata(0),
                "-c",
                str(args.concurrency),
                "--connections",
                str(args.connections),
                "-n",
                str(count),
            ],
            120,
        )
        codes = report.get("statusCodeDistribution") or {}
        if set(codes) != {"OK"}:
            raise RuntimeError(f"warm-up of {rpc.label} on {server.label} failed: {codes}")


def print_report(runs: Sequence[Run], labels: Sequence[str], servers: Sequence[Server]) -> None:
    print()
    print(
        f"{'rpc':<7} {'server':<9} {'rps':>9} {'p50 ms':>7} {'p99 ms':>7} {'cpu us':>7} "
        f"{'ghz us':>6} {'machine':>7} {'x 1 worker':>10} {'cpu split':>10} {'runs':>5} "
        f"{'errors':>6}"
    )
    base = servers[0].label
    for rpc in labels:
        for server in servers:
            mine = [r for r in runs if r.rpc == rpc and r.server == server.label]
            if not mine:
                continue
            one = {r.round: r.rps for r in runs if r.rpc == rpc and r.server == base}
            ratios = [r.rps / one[r.round] for r in mine if one.get(r.round)]
            splits = [max(r.split) for r in mine]
            split = f"max {statistics.median(splits):.0%}" if server.workers > 1 else "-"
            print(
                f"{rpc:<7} {server.label:<9} {statistics.median(r.rps for r in mine):>9.1f} "
                f"{statistics.median(r.p50_ms for r in mine):>7.2f} "
                f"{statistics.median(r.p99_ms for r in mine):>7.2f} "
                f"{statistics.median(r.cpu_us for r in mine):>7.0f} "
                f"{statistics.median(r.ghz_us for r in mine):>6.0f} "
                f"{statistics.median(r.machine for r in mine):>7.0%} "
                f"{statistics.median(ratios):>10.2f} {split:>10} {len(mine):>5} "
                f"{sum(r.errors for r in mine):>6}"
            )
        per_round = sorted(
            r.rps / b.rps
            for r in runs
            for b in runs
            if r.rpc == b.rpc == rpc and r.round == b.round and b.server == base != r.server
        )
        print(f"{'':<7} 2 workers / 1 worker per round: {', '.join(f'{x:.2f}' for x in per_round)}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--duration", type=int, default=5, help="seconds of load per ghz run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--concurrency", type=int, default=16, help="calls in flight")
    p.add_argument(
        "--connections", type=int, default=16, help="HTTP/2 connections ghz spreads them over"
    )
    p.add_argument(
        "--processes",
        "--workers",
        dest="workers",
        type=int,
        default=2,
        help="serving processes of the second server (--workers: the same)",
    )
    p.add_argument("--principals", type=int, default=3000, help="principals with a block")
    p.add_argument("--empty-principals", type=int, default=300, help="principals without one")
    p.add_argument(
        "--only", nargs="+", choices=["no-op", "get", "render"], default=["no-op", "render"]
    )
    p.add_argument("--time-budget", type=float, default=400.0, help="seconds (ghz install aside)")
    args = p.parse_args(argv)
    if min(args.duration, args.rounds, args.concurrency, args.principals) < 1:
        p.error("--duration, --rounds, --concurrency and --principals must be >= 1")
    if not 1 <= args.connections <= args.concurrency:
        p.error("--connections must be between 1 and --concurrency (ghz spreads calls over them)")
    if args.workers < 2:
        p.error("--processes must be >= 2 (the first server has 1)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    ghz = find_ghz()
    started = time.monotonic()
    population = Population(args.principals, args.empty_principals)
    calls = [r for r in rpcs(population) if r.label in args.only]
    runs: list[Run] = []
    facts: list[str] = []
    outcome = ""
    servers: list[Server] = []
    with ExitStack() as stack:
        try:
            database: Database = stack.enter_context(postgres_database(population))
            facts.append(f"database: {database.description}")
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
            qdrant = stack.enter_context(qdrant_process(workdir / "qdrant")).endpoint
            for workers in (1, args.workers):
                serverdir = workdir / f"workers-{workers}"
                serverdir.mkdir()
                flags = [
                    *("--qdrant-url", qdrant.url, "--qdrant-grpc-port", str(qdrant.grpc_port)),
                    *("--processes", str(workers)),
                ]
                process = ServerProcess(
                    [*database.server_args, *flags],
                    serverdir,
                    service=SERVICE,
                    stop_timeout_s=SERVER_STOP_TIMEOUT_S,
                    env={"MEMORIA_PAGE_TOKEN_SECRET": "bench-only-not-a-secret"},
                )
                stack.callback(process.stop)
                process.wait_serving(SERVER_START_TIMEOUT_S * 2)
                check_answers(process.port, population)
                servers.append(Server(workers, process))
                print(
                    f"{servers[-1].label}: pid {process.proc.pid} on {HOST}:{process.port}",
                    file=sys.stderr,
                )
            for server in servers:
                warm_up(ghz, server, calls, args)
            deadline = started + args.time_budget
            tag = 0
            for rnd in range(1, args.rounds + 1):
                order = [(rpc, server) for rpc in calls for server in servers]
                shift = (rnd - 1) % len(order)
                for rpc, server in order[shift:] + order[:shift]:
                    if time.monotonic() + args.duration + 5 > deadline:
                        raise BudgetExceeded(f"round {rnd}")
                    tag += 1
                    runs.append(measure(ghz, server, rpc, args, rnd, tag))
        except ENDED as error:
            outcome = failure_outcome(error)

    print()
    print(machine_line())
    print(software_line(f"ghz {ghz_version(ghz)}"))
    for fact in facts:
        print(fact)
    print(
        f"servers: memoria serve --processes 1 and --processes {args.workers} on one database, "
        "--qdrant-url the Qdrant stand-in (idle: render does not touch it)\n"
        f"load: ghz on the same machine, {args.concurrency} calls in flight over "
        f"{args.connections} connections, {args.duration}s per run, {args.rounds} interleaved "
        "rounds, medians shown\n"
        "cpu us = CPU of all the server's processes per call; ghz us = the load generator's;\n"
        "machine = busy share of all the cores during the run (server, ghz, PostgreSQL and any "
        "neighbour);\ncpu split = the busiest serving process's share of the server's CPU "
        "(50% is an even split)"
    )
    if runs:
        print_report(runs, [c.label for c in calls], servers)
    print()
    elapsed = time.monotonic() - started
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({outcome})" if outcome else ""))
    sys.stdout.flush()
    return 0 if runs and not outcome and not any(r.errors for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
