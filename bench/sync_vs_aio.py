"""Sync vs. asyncio gRPC Python server: throughput of a no-op RPC on this machine.

Why this exists
---------------
The project has to pick one server flavour for its gRPC service:

* **sync**: ``grpc.server(ThreadPoolExecutor(max_workers=N))``, where every RPC
  handler runs on a pool thread (and so holds the GIL while it runs Python);
* **aio**: ``grpc.aio.server()``, where handlers are coroutines on one asyncio
  event loop.

The choice fixes the per-request overhead of the framework itself, which is the
ceiling for every RPC the service will ever serve. This script measures exactly
that overhead, and nothing else: both servers serve only the standard health
service (``grpc.health.v1.Health/Check``, a dictionary lookup) plus server
reflection, so that ``ghz`` can call it without any ``.proto`` file.

What it does
------------
Each server runs in its own child process (``--serve sync|aio --port N``),
bound to 127.0.0.1 only; the driver passes ``--port 0`` so that the child binds
a free port itself (no race) and reports it on stdout. The driver starts a
server, waits until it answers (a short ``ghz`` warm-up run through reflection,
which also warms the connection), runs ``ghz`` against it at concurrency 1 and
16 for a fixed duration, and stops it. Modes are interleaved (sync-16, sync-32,
aio, then again in a rotated order) for several rounds, because this machine is
small and shared, and every number in the summary is the median over rounds.
The sync server is measured with 16 and with 32 worker threads.

With ``--db`` each Check first runs ``SELECT 1`` on the tests' PostgreSQL (scripts/pg.sh):
the sync server on a blocking psycopg connection per thread, the asyncio one awaiting
psycopg's async connections (at most ``DB_CONNECTIONS``). That is the shape of a write: does
a database round trip per call favour the event loop, which never hands the GIL over while it
waits? (Measured here, 16 in flight: no. With 4 threads 9,234 calls/s bare and 6,019 with
the round trip; the asyncio server 6,876 and 4,170.)

Reflection: stock grpc-python reflection cannot answer ghz's lookup of a method
symbol (see ``_add_reflection``), so the servers here use a small subclass that
can; the project's own server needs the same fix to be load-tested this way.

Caveats: ghz runs on the same cores as the server (2 on the reference
machine), so absolute numbers are lower than on a dedicated box; the *ratio*
between modes is the result to use. ghz sends all requests over one HTTP/2
connection (its default), like a single upstream client would.

Usage::

    python bench/sync_vs_aio.py                # full run, about 1.5 minutes
    python bench/sync_vs_aio.py --rounds 2 --duration 3
    python bench/sync_vs_aio.py --python /path/to/venv/bin/python
    python bench/sync_vs_aio.py --db --sync-workers 4 8   # a PostgreSQL round trip per call

It gets the ``ghz`` binary by running ``bench/ghz.sh`` (which installs it on
first use). Child servers need ``grpcio``, ``grpcio-health-checking`` and
``grpcio-reflection``; the driver itself needs only the standard library.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from procs import find_ghz, percentile_ms, stop_process  # bench/, the script's own folder

HOST = "127.0.0.1"  # the only address this script ever binds or targets
CALL = "grpc.health.v1.Health/Check"

SERVER_START_TIMEOUT_S = 20.0
SERVER_STOP_TIMEOUT_S = 5.0
GHZ_EXTRA_TIMEOUT_S = 30.0  # on top of the run's own duration
WARMUP_REQUESTS = 1000
DB_ENV = "MEMORIA_BENCH_DB_CONNINFO"  # set for the children by --db
DB_CONNECTIONS = 8  # per child: the sync server's threads each hold one, aio shares them


# --------------------------------------------------------------------------
# Child: the servers under test
# --------------------------------------------------------------------------


def _add_reflection(server: Any, aio: bool) -> None:
    """Enable server reflection (v1alpha, the only one grpcio-reflection has).

    Stock grpc-python reflection cannot resolve a *method* symbol such as
    ``grpc.health.v1.Health.Check`` (grpc/grpc#34743), which ``ghz --call`` asks
    for; the servers here use the service's own fix (server/rpc/reflection.py).
    It only affects the one reflection lookup ghz makes per run, never the
    measured Check path.
    """
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from server.rpc.reflection import MethodSymbolFallback as MethodSymbolFix

    class SyncServicer(MethodSymbolFix, reflection.ReflectionServicer):  # type: ignore[misc]
        pass

    class AioServicer(MethodSymbolFix, reflection.aio.ReflectionServicer):  # type: ignore[misc]
        pass

    names = [
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    servicer = AioServicer(names) if aio else SyncServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)


def _announce(port: int) -> None:
    import grpc

    # The driver waits for this exact line on stdout.
    print(f"READY {port} {grpc.__version__} {platform.python_version()}", flush=True)


def _sync_health() -> Any:
    """The health servicer; with --db, each Check first runs `SELECT 1` on PostgreSQL over a
    connection of the handler's thread (a blocking round trip, as the service's writes are)."""
    from grpc_health.v1 import health

    conninfo = os.environ.get(DB_ENV)
    if not conninfo:
        return health.HealthServicer()
    import threading

    import psycopg

    local = threading.local()
    dsn: str = conninfo
    base: Any = health.HealthServicer

    class DbHealth(base):  # type: ignore[misc]
        def Check(self, request: Any, context: Any) -> Any:
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = psycopg.connect(dsn, autocommit=True)
            conn.execute("SELECT 1").fetchone()
            return super().Check(request, context)

    return DbHealth()


def _aio_health() -> Any:
    """As `_sync_health`, on psycopg's async connections: the round trip is awaited."""
    from grpc_health.v1 import health

    conninfo = os.environ.get(DB_ENV)
    if not conninfo:
        return health.aio.HealthServicer()
    import asyncio

    import psycopg

    pool: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    opened = 0
    dsn: str = conninfo
    base: Any = getattr(health, "aio").HealthServicer  # noqa: B009 (no stubs for health.aio)

    class DbHealth(base):  # type: ignore[misc]
        async def Check(self, request: Any, context: Any) -> Any:
            nonlocal opened
            if pool.empty() and opened < DB_CONNECTIONS:
                opened += 1
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            else:
                conn = await pool.get()
            try:
                await (await conn.execute("SELECT 1")).fetchone()
            finally:
                pool.put_nowait(conn)
            return await super().Check(request, context)

    return DbHealth()


def serve_sync(port: int, max_workers: int) -> None:
    """Serve Health/Check + reflection with the thread-pool (sync) server."""
    import grpc
    from grpc_health.v1 import health_pb2_grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=max_workers))
    health_pb2_grpc.add_HealthServicer_to_server(_sync_health(), server)
    _add_reflection(server, aio=False)
    bound = server.add_insecure_port(f"{HOST}:{port}")
    if bound == 0:
        raise SystemExit(f"could not bind {HOST}:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=None))
    _announce(bound)
    server.wait_for_termination()


async def _serve_aio(port: int) -> None:
    import asyncio

    import grpc
    from grpc_health.v1 import health_pb2_grpc

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(_aio_health(), server)
    _add_reflection(server, aio=True)
    bound = server.add_insecure_port(f"{HOST}:{port}")
    if bound == 0:
        raise SystemExit(f"could not bind {HOST}:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    _announce(bound)
    await stop.wait()
    await server.stop(grace=None)


def serve_aio(port: int) -> None:
    """Serve Health/Check + reflection with the asyncio server."""
    import asyncio

    asyncio.run(_serve_aio(port))


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """One server configuration under test."""

    kind: str  # "sync" or "aio"
    max_workers: int | None = None  # sync only

    @property
    def label(self) -> str:
        return f"sync-{self.max_workers}" if self.kind == "sync" else "aio"

    def serve_args(self) -> list[str]:
        args = ["--serve", self.kind]
        if self.max_workers is not None:
            args += ["--max-workers", str(self.max_workers)]
        return args


@dataclass(frozen=True)
class RunResult:
    """One ghz run against one server instance."""

    mode: str
    concurrency: int
    round: int
    rps: float
    p50_ms: float
    p99_ms: float
    ok: int
    errors: int


class BudgetExceeded(Exception):
    """Raised when the next step would not fit in the time budget."""


class ServerProcess:
    """A child server process, started and stopped by the driver."""

    def __init__(self, python: str, mode: Mode, port: int, db: str | None = None) -> None:
        # Closed in stop(); kept open so a failed start can show the child's stderr.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        cmd = [python, str(Path(__file__).resolve()), *mode.serve_args()]
        cmd += ["--port", str(port)]
        env = {**os.environ, DB_ENV: db} if db else None
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, env=env
        )
        self.port = port
        self.versions = "?"

    def wait_ready(self, timeout_s: float) -> None:
        """Wait for the child's READY line (the port is bound and serving)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            if self.proc.poll() is not None:
                break
            readable, _, _ = select.select([self.proc.stdout], [], [], min(remaining, 0.2))
            if not readable:
                continue
            line = self.proc.stdout.readline().decode(errors="replace").split()
            if not line:  # EOF: the child is exiting
                self.proc.wait(timeout=SERVER_STOP_TIMEOUT_S)
                break
            if line[0] == "READY" and len(line) >= 4:
                self.port = int(line[1])
                self.versions = f"grpcio {line[2]}, python {line[3]}"
                return
        raise RuntimeError(f"server did not become ready:\n{self.stderr_text()}")

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_process(self.proc, SERVER_STOP_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def run_ghz(ghz: str, port: int, args: Sequence[str], timeout_s: float) -> dict[str, Any]:
    """Run ghz against HOST:port with JSON output and return the parsed report."""
    cmd = [
        ghz,
        "--insecure",
        "--call",
        CALL,
        "-d",
        "{}",
        "--connect-timeout",
        "5s",
        "--disable-template-functions",
        "--disable-template-data",
        "-O",
        "json",
        *args,
        f"{HOST}:{port}",
    ]
    out = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"ghz failed ({out.returncode}): {out.stderr.decode()[-2000:]}")
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def to_result(report: dict[str, Any], mode: Mode, concurrency: int, rnd: int) -> RunResult:
    codes: dict[str, int] = report.get("statusCodeDistribution") or {}
    ok = codes.get("OK", 0)
    return RunResult(
        mode=mode.label,
        concurrency=concurrency,
        round=rnd,
        rps=float(report["rps"]),
        p50_ms=percentile_ms(report, 50),
        p99_ms=percentile_ms(report, 99),
        ok=ok,
        errors=sum(codes.values()) - ok,
    )


def measure_mode(
    ghz: str,
    python: str,
    mode: Mode,
    concurrencies: Sequence[int],
    duration_s: int,
    rnd: int,
    deadline: float,
    db: str | None = None,
) -> tuple[list[RunResult], str]:
    """Start one server, warm it up, run ghz at each concurrency, stop it."""
    needed = len(concurrencies) * (duration_s + 1) + 5
    if time.monotonic() + needed > deadline:
        raise BudgetExceeded(f"{mode.label} round {rnd} needs ~{needed}s")
    server = ServerProcess(python, mode, port=0, db=db)
    results: list[RunResult] = []
    try:
        server.wait_ready(SERVER_START_TIMEOUT_S)
        # Warm-up, and proof that the server answers Check through reflection.
        warm = run_ghz(
            ghz,
            server.port,
            ["-c", str(max(concurrencies)), "-n", str(WARMUP_REQUESTS)],
            timeout_s=GHZ_EXTRA_TIMEOUT_S,
        )
        if (warm.get("statusCodeDistribution") or {}).get("OK", 0) == 0:
            raise RuntimeError(f"{mode.label}: warm-up got no OK answers: {warm}")
        for c in concurrencies:
            report = run_ghz(
                ghz,
                server.port,
                ["-c", str(c), "-z", f"{duration_s}s"],
                timeout_s=duration_s + GHZ_EXTRA_TIMEOUT_S,
            )
            res = to_result(report, mode, c, rnd)
            results.append(res)
            if res.errors > c:  # more than the calls cut off by -z: a real problem
                print(
                    f"WARNING: {res.mode} c={c}: {res.errors} failed calls: "
                    f"{report.get('errorDistribution')}",
                    file=sys.stderr,
                    flush=True,
                )
            print(
                f"  round {rnd} {res.mode:>8} c={c:<3} rps={res.rps:9.1f} "
                f"p50={res.p50_ms:7.3f}ms p99={res.p99_ms:7.3f}ms errors={res.errors}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        server.stop()
    return results, server.versions


def print_tables(results: Sequence[RunResult], modes: Sequence[Mode], concs: Sequence[int]) -> None:
    print()
    print("All runs:")
    head = ("round", "mode", "conc", "rps", "p50 ms", "p99 ms", "errors")
    print("{:>5}  {:<8} {:>4} {:>10} {:>8} {:>8} {:>6}".format(*head))
    for r in results:
        print(
            f"{r.round:>5}  {r.mode:<8} {r.concurrency:>4} {r.rps:>10.1f} "
            f"{r.p50_ms:>8.3f} {r.p99_ms:>8.3f} {r.errors:>6}"
        )

    medians: dict[tuple[str, int], tuple[float, float, float, int]] = {}
    print()
    print("Median over rounds:")
    print(f"{'mode':<8} {'conc':>4} {'rps':>10} {'p50 ms':>8} {'p99 ms':>8} {'rounds':>6}")
    for c in concs:
        for m in modes:
            runs = [r for r in results if r.mode == m.label and r.concurrency == c]
            if not runs:
                continue
            med = (
                statistics.median(r.rps for r in runs),
                statistics.median(r.p50_ms for r in runs),
                statistics.median(r.p99_ms for r in runs),
                len(runs),
            )
            medians[(m.label, c)] = med
            print(f"{m.label:<8} {c:>4} {med[0]:>10.1f} {med[1]:>8.3f} {med[2]:>8.3f} {med[3]:>6}")

    print()
    print(
        "errors = non-OK calls. ghz -z cuts the calls in flight at the deadline and\n"
        "counts them as Unavailable, so up to <conc> errors per run are expected."
    )

    print()
    print("Ratio aio/sync of the medians (rps > 1: aio faster; latency < 1: aio faster):")
    for c in concs:
        aio = medians.get(("aio", c))
        for m in modes:
            sync = medians.get((m.label, c))
            if m.kind != "sync" or aio is None or sync is None:
                continue
            print(
                f"  c={c:<3} aio/{m.label:<8} rps x{aio[0] / sync[0]:.2f}   "
                f"p50 x{aio[1] / sync[1]:.2f}   p99 x{aio[2] / sync[2]:.2f}"
            )


def drive(args: argparse.Namespace) -> int:
    ghz = find_ghz()  # may take a minute the first time: not part of the budget
    db = _db_conninfo() if args.db else None
    start = time.monotonic()
    deadline = start + args.time_budget
    modes = [Mode("sync", w) for w in args.sync_workers] + [Mode("aio")]
    concs: list[int] = args.concurrency
    planned = args.rounds * len(modes) * len(concs) * args.duration
    print(
        f"ghz={ghz}\npython={args.python}\n"
        f"host={platform.node()} cpus={os.cpu_count()} "
        f"rounds={args.rounds} duration={args.duration}s concurrency={concs} "
        f"modes={[m.label for m in modes]} (~{planned}s of load, budget {args.time_budget}s)"
        + (", each Check after a PostgreSQL SELECT 1" if db else ""),
        file=sys.stderr,
        flush=True,
    )

    results: list[RunResult] = []
    versions = "?"
    truncated = ""
    try:
        for rnd in range(1, args.rounds + 1):
            # Rotate the order each round so no mode always runs first/last.
            shift = (rnd - 1) % len(modes)
            for mode in itertools.chain(modes[shift:], modes[:shift]):
                runs, versions = measure_mode(
                    ghz, args.python, mode, concs, args.duration, rnd, deadline, db
                )
                results += runs
    except BudgetExceeded as exc:
        truncated = f"time budget reached, stopped early: {exc}"
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        truncated = f"failed: {exc}"
    except KeyboardInterrupt:
        truncated = "interrupted"

    print(f"\nservers: {versions}; cpus: {os.cpu_count()}; {args.duration}s per run")
    if db:
        print("each Check first ran SELECT 1 on PostgreSQL (sync: blocking, one connection per")
        print(f"  thread; aio: awaited on psycopg's async connections, at most {DB_CONNECTIONS})")
    print_tables(results, modes, concs)
    elapsed = time.monotonic() - start
    print()
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({truncated})" if truncated else ""))
    return 0 if results and not truncated else 1


def _db_conninfo() -> str:
    """The service role's libpq conninfo of the tests' PostgreSQL (127.0.0.1 only)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from sqlalchemy.engine import make_url

    from tests.postgres_server import pg_urls

    url = make_url(pg_urls()[1])
    if url.host not in (HOST, "localhost"):
        raise SystemExit(f"refusing a non-loopback database host {url.host!r}")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--serve", choices=["sync", "aio"], help="(child mode) run one server")
    p.add_argument(
        "--port", type=int, default=0, help="(child mode) port on 127.0.0.1, 0 = any free"
    )
    p.add_argument("--max-workers", type=int, default=16, help="(child mode, sync) pool size")
    p.add_argument("--python", default=sys.executable, help="interpreter for the child servers")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per mode")
    p.add_argument("--duration", type=int, default=4, help="seconds of load per ghz run")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--sync-workers", type=int, nargs="+", default=[16, 32])
    p.add_argument(
        "--db",
        action="store_true",
        help="each Check first runs SELECT 1 on the tests' PostgreSQL (scripts/pg.sh)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=115.0,
        help="seconds; no server is started past it (the ghz install is not counted)",
    )
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration < 1:
        p.error("--rounds and --duration must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve == "sync":
        serve_sync(args.port, args.max_workers)
        return 0
    if args.serve == "aio":
        serve_aio(args.port)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
