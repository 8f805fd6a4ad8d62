"""Two server configurations side by side: the same RPCs, alternating, paired per round.

What it answers
---------------
Does a setting (an environment variable of ``memoria serve``, e.g. ``MEMORIA_THREADS=4``)
make the server faster or slower? Two runs of ``bench_blocks.py`` made one after the other
differ by 10-30% on this shared machine whatever the change, so this script runs both
configurations at once: two ``memoria serve`` processes, ``A`` and ``B``, each on its own copy
of ``bench_blocks.py``'s seeded PostgreSQL database (so neither's writes or cache touch the
other's), and for every round and RPC one ghz run against each, in alternating order. The
result per RPC is the median over rounds of B's requests/s divided by A's in the same round,
with every round's ratio and each server's CPU time per call beside it. With the no-op and the
rewrite both measured, it also prints each server's rewrite/no-op ratio per round, the number
``bench_blocks.py`` reports.

Usage (from the repository root)::

    .venv/bin/python bench/bench_ab.py --b MEMORIA_THREADS=8          # A: defaults
    .venv/bin/python bench/bench_ab.py --a MEMORIA_THREADS=4 --b MEMORIA_THREADS=2 \\
        --only no-op render rewrite --rounds 6
    .venv/bin/python bench/bench_ab.py --b PYTHONPATH=/path/to/other/checkout   # other code

``PYTHONPATH`` pointing at another checkout serves that checkout's ``server`` package (the
``memoria`` script puts PYTHONPATH ahead of this repository's editable install), which is how
two versions of the code are compared. An empty A and B (an A/A run) shows the noise.

PostgreSQL as in ``bench_blocks.py`` (the durable cluster of ``harness.bench_pg_urls``); the two
databases ``memoria_bench_a`` and ``memoria_bench_b`` are created afresh and dropped at the
end. Everything binds and targets 127.0.0.1 only; both servers and every ghz run are stopped
before the script exits, also on Ctrl-C, SIGTERM or an error, and no run starts that would end
after ``--time-budget``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

# harness.py and procs.py sit beside this script (its folder is on sys.path).
import harness as blocks
from procs import (
    RUN_ENDED,
    BudgetExceeded,
    ServerProcess,
    failure_outcome,
    find_ghz,
    machine_line,
    raise_on_sigterm,
)

WARMUP_REQUESTS = 1500


@dataclass(frozen=True)
class Side:
    label: str
    env: dict[str, str]
    server: ServerProcess


@dataclass(frozen=True)
class Run:
    side: str
    rpc: str
    round: int
    rps: float
    server_cpu_us: float


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="A's environment")
    p.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="B's environment")
    p.add_argument("--only", nargs="+", default=["no-op", "rewrite"], help="RPCs to run")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=int, default=5, help="seconds per ghz run")
    p.add_argument("--concurrency", type=int, default=16, help="calls in flight")
    p.add_argument("--principals", type=int, default=3000)
    p.add_argument("--empty-principals", type=int, default=300)
    p.add_argument("--time-budget", type=float, default=600, help="seconds")
    return p.parse_args(argv)


def measure(
    ghz: str, side: Side, rpc: blocks.Rpc, args: argparse.Namespace, tag: str, extra: list[str]
) -> tuple[float, float]:
    """One ghz run; (requests/s, server CPU µs per call). Any non-OK call is an error."""
    rng = random.Random(tag)
    ghz_args = [
        *blocks.rpc_args(rpc, args.concurrency, tag, rng.randrange(100_000)),
        *extra,
    ]
    before = side.server.cpu_seconds()
    report = blocks.run_ghz(ghz, side.server.port, ghz_args, args.duration + 60)
    cpu = side.server.cpu_seconds() - before
    codes = report.get("statusCodeDistribution") or {}
    if set(codes) != {"OK"}:
        raise RuntimeError(f"{side.label} {rpc.label}: {codes} {report.get('errorDistribution')}")
    return float(report["rps"]), cpu / max(int(report.get("count") or 0), 1) * 1e6


def report(runs: Sequence[Run], labels: Sequence[str]) -> None:
    print(
        f"{'rpc':<8} {'A rps':>9} {'A cpu us':>9} {'B rps':>9} {'B cpu us':>9} {'B/A':>6}"
        "  per round"
    )
    for label in labels:
        a = [r for r in runs if r.rpc == label and r.side == "A"]
        b = [r for r in runs if r.rpc == label and r.side == "B"]
        pairs = [(x, y) for x in a for y in b if x.round == y.round]
        if not pairs:
            continue
        ratios = [y.rps / x.rps for x, y in pairs]
        print(
            f"{label:<8} {statistics.median(x.rps for x in a):>9.0f} "
            f"{statistics.median(x.server_cpu_us for x in a):>9.0f} "
            f"{statistics.median(y.rps for y in b):>9.0f} "
            f"{statistics.median(y.server_cpu_us for y in b):>9.0f} "
            f"{statistics.median(ratios):>6.3f}  {' '.join(f'{r:.2f}' for r in ratios)}"
        )
    if "no-op" in labels and "rewrite" in labels:
        for side in ("A", "B"):
            noop = {r.round: r.rps for r in runs if r.side == side and r.rpc == "no-op"}
            ratios = [
                r.rps / noop[r.round]
                for r in runs
                if r.side == side and r.rpc == "rewrite" and r.round in noop
            ]
            if ratios:
                print(
                    f"rewrite / no-op, {side}: median {statistics.median(ratios):.3f}; "
                    f"per round {' '.join(f'{r:.2f}' for r in ratios)}"
                )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    started = time.monotonic()
    deadline = started + args.time_budget
    population = blocks.Population(args.principals, args.empty_principals)
    calls = [c for c in blocks.rpcs(population) if c.label in args.only]
    if not calls:
        raise SystemExit(f"--only names none of {[c.label for c in blocks.rpcs(population)]}")
    ghz = find_ghz()
    runs: list[Run] = []
    outcome = ""
    with ExitStack() as stack:
        try:
            sides: list[Side] = []
            for label, env in (("A", parse_env(args.a)), ("B", parse_env(args.b))):
                name = f"memoria_bench_{label.lower()}"
                database = stack.enter_context(blocks.postgres_database(population, name))
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ab-")))
                server = ServerProcess(
                    [*database.server_args, "--data-dir", str(workdir)],
                    workdir,
                    service=blocks.SERVICE,
                    stop_timeout_s=blocks.SERVER_STOP_TIMEOUT_S,
                    env={"MEMORIA_PAGE_TOKEN_SECRET": "bench-only-not-a-secret", **env},
                )
                stack.callback(server.stop)
                server.wait_serving(blocks.SERVER_START_TIMEOUT_S)
                sides.append(Side(label, env, server))
                print(f"{label}: pid {server.proc.pid}, env {env}", file=sys.stderr, flush=True)
            for side in sides:
                for rpc in calls:
                    measure(
                        ghz,
                        side,
                        rpc,
                        args,
                        f"warm-{side.label}-{rpc.label}",
                        ["-n", str(WARMUP_REQUESTS)],
                    )
            for rnd in range(1, args.rounds + 1):
                for index, rpc in enumerate(calls):
                    order = sides if (rnd + index) % 2 else sides[::-1]
                    for side in order:
                        if time.monotonic() + args.duration + 5 > deadline:
                            raise BudgetExceeded(f"round {rnd} {rpc.label} {side.label}")
                        rps, cpu = measure(
                            ghz,
                            side,
                            rpc,
                            args,
                            f"r{rnd}-{side.label}-{rpc.label}",
                            ["-z", f"{args.duration}s", "--duration-stop", "wait"],
                        )
                        runs.append(Run(side.label, rpc.label, rnd, rps, cpu))
                        print(
                            f"  round {rnd} {side.label} {rpc.label:<8} rps={rps:8.1f} "
                            f"server-cpu={cpu:5.0f}us/call",
                            file=sys.stderr,
                            flush=True,
                        )
        except RUN_ENDED as error:
            outcome = failure_outcome(error)
    print()
    print(machine_line())
    print(
        f"A: {parse_env(args.a) or 'defaults'}; B: {parse_env(args.b) or 'defaults'}; "
        f"{args.concurrency} in flight, {args.duration}s runs, medians over rounds"
    )
    report(runs, [c.label for c in calls])
    print(f"wall time {time.monotonic() - started:.0f}s" + (f"; {outcome}" if outcome else ""))
    return 0 if runs and not outcome else 1


if __name__ == "__main__":
    sys.exit(main())
