"""What telemetry costs on the render hot path: the same server with it on and off, side by side.

What it measures
----------------
``RenderMemoryBlock`` runs on every turn of every conversation and is served from the
in-process read cache, so it is the call where a fixed per-call cost weighs most. Issue 5
asks that with telemetry on it keeps at least 0.9 of its throughput with telemetry off.

Two ``memoria serve`` processes run at once on the same seeded database (bench_blocks.py's
seed: 3,000 principals with a block, 300 without):

* ``off``: ``OTEL_SDK_DISABLED=true``, so no SDK, interceptor or wrapper exists (what an
  unset ``OTEL_EXPORTER_OTLP_ENDPOINT`` gives too, whatever this shell's environment holds);
* ``on``: what production runs with an endpoint set: the SDK with Memoria's default sampler
  (parent-based, 1 in 100 root traces kept; ``--traces-sampler always_on`` traces every
  call), a batch span processor
  and a periodic metric reader with the real OTLP/gRPC exporters, sending to a stand-in
  collector on 127.0.0.1 (``tests/otlp_stub.py``, in this driver's process) that accepts
  everything. Why a collector and not an in-memory or no-op exporter: encoding spans and
  metrics to protobuf and sending them is work the server process does in its exporter
  threads, on the same cores as the calls; an in-memory exporter would leave it out.
  Metrics are exported every 5 s instead of the default 60 s, so every run includes exports.

ghz drives each server through reflection, for ``--duration`` seconds per run, with 1 and 16
calls in flight; every round runs both servers at both levels, alternating which goes first.
The result, per level, is the median over rounds of on/off requests per second measured in
the same round; the server's CPU per call (``/proc``, all threads) is shown beside it.

Usage (from the repository root)::

    .venv/bin/python bench/bench_telemetry.py                 # PostgreSQL, about 2 minutes
    .venv/bin/python bench/bench_telemetry.py --rounds 6      # steadier medians
    .venv/bin/python bench/bench_telemetry.py --sqlite        # the embedded default instead

PostgreSQL as in bench_blocks.py (the durable cluster of ``harness.bench_pg_urls``, or the
tests' with ``MEMORIA_BENCH_PG=fast``; database ``memoria_bench``, dropped at the end).
Everything binds and targets 127.0.0.1 only; every process started here is stopped before it
exits, also on Ctrl-C or SIGTERM.
Exit status 0 when every run finished with no failed call and spans reached the collector;
a missed target is reported, not an exit status.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

# harness.py and procs.py sit beside this script (its folder is on sys.path); the harness
# provides the stand-in collector the "on" server exports to.
from harness import (
    SERVICE,
    TENANT,
    Database,
    GrpcCollectorStub,
    Population,
    check_answers,
    ghz_version,
    postgres_database,
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
    raise_on_sigterm,
    software_line,
)

TARGET = 0.9  # requests/s with telemetry on, as a ratio to off (issue 5)
SERVER_START_TIMEOUT_S = 30.0
SERVER_STOP_TIMEOUT_S = 10.0
GHZ_EXTRA_TIMEOUT_S = 30.0
WARMUP_REQUESTS = 2000  # every principal's block reaches the read cache of both servers
RENDER = f"{SERVICE}/RenderMemoryBlock"

OFF_ENV = {"OTEL_SDK_DISABLED": "true"}


def on_env(endpoint: str, sampler: str) -> dict[str, str]:
    """Telemetry exported by OTLP/gRPC to `endpoint`, with Memoria's defaults but the metric
    interval (5 s instead of 60 s, so each run pays for metric exports) and, if given, the
    sampler (`OTEL_TRACES_SAMPLER`, e.g. always_on)."""
    env = {
        "OTEL_SDK_DISABLED": "false",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        "OTEL_SERVICE_NAME": "memoria-bench",
        "OTEL_TRACES_SAMPLER": sampler,
    }
    return {key: value for key, value in env.items() if value}


@dataclass(frozen=True)
class RunResult:
    """One ghz run of render against one server at one concurrency in one round."""

    server: str
    concurrency: int
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    server_cpu_us: float
    errors: dict[str, int]


@dataclass
class Bench:
    """Interleaved rounds of render against the two servers."""

    ghz: str
    servers: dict[str, ServerProcess]
    principals: int
    concurrencies: list[int]
    duration_s: int
    deadline: float
    results: list[RunResult] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _runs: int = 0

    def _args(self, concurrency: int) -> list[str]:
        self._runs += 1
        offset = self._runs * 997 % self.principals
        principal = f"p{{{{mod (add .RequestNumber {offset}) {self.principals}}}}}"
        metadata = f'{{"x-memoria-tenant": "{TENANT}", "x-memoria-principal": "{principal}"}}'
        return ["--call", RENDER, "-d", "{}", "-m", metadata, "-c", str(concurrency)]

    def warm_up(self) -> None:
        for name, server in self.servers.items():
            args = [*self._args(max(self.concurrencies)), "-n", str(WARMUP_REQUESTS)]
            report = run_ghz(self.ghz, server.port, args, GHZ_EXTRA_TIMEOUT_S)
            codes = report.get("statusCodeDistribution") or {}
            if set(codes) != {"OK"}:
                raise RuntimeError(f"warm-up of {name} failed: {codes}")

    def measure(self, name: str, concurrency: int, rnd: int) -> None:
        if time.monotonic() + self.duration_s + 5 > self.deadline:
            raise BudgetExceeded(f"round {rnd} {name} c={concurrency}")
        server = self.servers[name]
        args = [
            *self._args(concurrency),
            "--connections",
            "1",
            "-z",
            f"{self.duration_s}s",
            "--duration-stop",
            "wait",
        ]
        cpu_before = server.cpu_seconds()
        report = run_ghz(self.ghz, server.port, args, self.duration_s + GHZ_EXTRA_TIMEOUT_S)
        cpu = server.cpu_seconds() - cpu_before
        codes: dict[str, int] = report.get("statusCodeDistribution") or {}
        calls = max(int(report.get("count") or 0), 1)
        result = RunResult(
            server=name,
            concurrency=concurrency,
            round=rnd,
            rps=float(report["rps"]),
            p50_ms=percentile_ms(report, 50),
            p99_ms=percentile_ms(report, 99),
            server_cpu_us=cpu / calls * 1e6,
            errors={code: n for code, n in codes.items() if code != "OK"},
        )
        self.results.append(result)
        if result.errors:
            self.problems.append(f"round {rnd} {name} c={concurrency}: {result.errors}")
        print(
            f"  round {rnd} c={concurrency:<3} {name:<4} rps={result.rps:8.1f} "
            f"p50={result.p50_ms:6.2f}ms p99={result.p99_ms:6.2f}ms "
            f"server-cpu={result.server_cpu_us:5.0f}us/call errors={sum(result.errors.values())}",
            file=sys.stderr,
            flush=True,
        )

    def run(self, rounds: int) -> None:
        for rnd in range(1, rounds + 1):
            for level, concurrency in enumerate(self.concurrencies):
                order = ["off", "on"] if (rnd + level) % 2 else ["on", "off"]
                for name in order:
                    self.measure(name, concurrency, rnd)


def print_report(bench: Bench) -> bool:
    """The table and the verdict per concurrency; True if every level met the target."""
    print()
    print(
        f"{'in-flight':>9} {'server':>6} {'rps':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'cpu us':>7} {'on/off':>7} {'per round':>20}"
    )
    met = True
    for concurrency in bench.concurrencies:
        runs = {
            name: [r for r in bench.results if r.server == name and r.concurrency == concurrency]
            for name in ("off", "on")
        }
        off_by_round = {r.round: r.rps for r in runs["off"]}
        ratios = [r.rps / off_by_round[r.round] for r in runs["on"] if r.round in off_by_round]
        ratio = statistics.median(ratios) if ratios else None
        for name in ("off", "on"):
            rs = runs[name]
            if not rs:
                continue
            shown = f"{ratio:.2f}" if name == "on" and ratio is not None else ""
            per_round = " ".join(f"{x:.2f}" for x in ratios) if name == "on" else ""
            print(
                f"{concurrency:>9} {name:>6} {statistics.median(r.rps for r in rs):>9.1f} "
                f"{statistics.median(r.p50_ms for r in rs):>7.2f} "
                f"{statistics.median(r.p99_ms for r in rs):>7.2f} "
                f"{statistics.median(r.server_cpu_us for r in rs):>7.0f} {shown:>7} "
                f"{per_round:>20}"
            )
        verdict = "not measured" if ratio is None else "PASS" if ratio >= TARGET else "FAIL"
        met = met and ratio is not None and ratio >= TARGET
        print(f"  in-flight {concurrency:>2}: render on/off >= {TARGET}: {verdict}")
    return met


@contextmanager
def collector() -> Iterator[GrpcCollectorStub]:
    stub = GrpcCollectorStub()
    try:
        yield stub
    finally:
        stub.stop()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--duration", type=int, default=5, help="seconds of load per ghz run")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    p.add_argument("--principals", type=int, default=3000, help="principals with a block")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="calls in flight")
    p.add_argument("--sqlite", action="store_true", help="the embedded SQLite default instead")
    p.add_argument(
        "--traces-sampler",
        default="",
        help="OTEL_TRACES_SAMPLER of the 'on' server (default: unset, Memoria's 1 in 100; "
        "OTEL_TRACES_SAMPLER_ARG passes through from this environment)",
    )
    p.add_argument("--time-budget", type=float, default=300.0, help="seconds for all runs")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration < 1 or args.principals < 1 or min(args.concurrency) < 1:
        p.error("--rounds, --duration, --principals and --concurrency must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    ghz = find_ghz()
    started = time.monotonic()
    population = Population(args.principals, 300)
    planned = args.rounds * len(args.concurrency) * 2 * args.duration
    print(f"ghz={ghz}; {planned}s of load planned", file=sys.stderr, flush=True)

    bench: Bench | None = None
    stub: GrpcCollectorStub | None = None
    outcome = ""
    facts: list[str] = []
    with ExitStack() as stack:
        try:
            stub = stack.enter_context(collector())
            databases: dict[str, Database] = {}
            if args.sqlite:  # one process owns an embedded data dir: one copy per server
                for name in ("off", "on"):
                    databases[name] = stack.enter_context(sqlite_database(population))
            else:
                databases["off"] = databases["on"] = stack.enter_context(
                    postgres_database(population)
                )
            facts.append(f"database: {databases['on'].description}")
            servers: dict[str, ServerProcess] = {}
            on = on_env(stub.endpoint, args.traces_sampler)
            for name, env in (("off", OFF_ENV), ("on", on)):
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
                server_args = databases[name].server_args
                if not args.sqlite:  # the embedded chunk index: one data dir per server
                    server_args = [*server_args, "--data-dir", str(workdir / "data")]
                server = ServerProcess(
                    server_args,
                    workdir,
                    service=SERVICE,
                    stop_timeout_s=SERVER_STOP_TIMEOUT_S,
                    env={"MEMORIA_PAGE_TOKEN_SECRET": "bench-only-not-a-secret", **env},
                )
                stack.callback(server.stop)
                servers[name] = server
            for name, server in servers.items():
                server.wait_serving(SERVER_START_TIMEOUT_S)
                check_answers(server.port, population)
                print(f"{name}: pid {server.proc.pid} on {HOST}:{server.port}", file=sys.stderr)
            bench = Bench(
                ghz,
                servers,
                population.total,
                args.concurrency,
                args.duration,
                deadline=started + args.time_budget,
            )
            bench.warm_up()
            bench.run(args.rounds)
        except RUN_ENDED as error:
            outcome = failure_outcome(error)
        # The servers stop (flushing their exporters) before the collector: counts are final.

    print()
    print(machine_line())
    print(
        software_line(
            f"opentelemetry-sdk {metadata.version('opentelemetry-sdk')}",
            f"ghz {ghz_version(ghz)}",
        )
    )
    for fact in facts:
        print(fact)
    sampler = args.traces_sampler or "unset (parent-based, 1 in 100 root traces kept)"
    print(
        "off: OTEL_SDK_DISABLED=true. on: OTLP/gRPC to a stand-in collector in the driver "
        f"process,\n  OTEL_TRACES_SAMPLER {sampler}, batch span processor, metrics every "
        "5 s.\ncpu us = the server process's CPU time per call (all threads, exporters "
        "included)."
    )
    if stub is not None:
        print(
            f"collector received: {stub.requests['traces']} trace exports "
            f"({stub.bytes['traces'] / 1e6:.1f} MB), {stub.requests['metrics']} metric exports"
        )
    met = False
    if bench is not None and bench.results:
        met = print_report(bench)
        for problem in bench.problems:
            print(f"ERRORS: {problem}")
    print()
    print(
        f"wall time {time.monotonic() - started:.0f}s"
        + (f"; PARTIAL RESULT ({outcome})" if outcome else "")
        + ("" if met else "; target missed" if not outcome else "")
    )
    sys.stdout.flush()
    exported = stub is not None and stub.requests["traces"] > 0
    ok = bench is not None and bench.results and not outcome and not bench.problems
    return 0 if ok and exported else 1


if __name__ == "__main__":
    sys.exit(main())
