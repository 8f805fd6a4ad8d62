"""Block RPCs on Citus with one worker and with two, under the same client load; and where
one tenant's rows live (issue 22 item 3).

What it measures
----------------
Two databases on the cluster of ``scripts/citus.sh`` (a coordinator and two workers on
loopback): one whose coordinator knows only the first worker (all 32 shards of every table
there), one that knows both (16 each). Both are migrated (0014 distributes every table by
tenant) and seeded alike: ``--tenants`` tenants of ``--principals`` principals, each with a
realistic block. A ``memoria serve`` runs on each, and ``ghz`` drives ``RenderMemoryBlock`` and
``RewriteMemoryBlock`` (a real change every call) spread over every tenant and principal, with
the same concurrency, the servers' read caches off (every render reads the database), in
interleaved rounds (every round measures both databases, in a
rotated order). The report gives each RPC's requests/s on each and the ratio two / one
(medians over rounds), and checks in the two-worker database that every tenant's shards of
every table sit on one node (`get_shard_id_for_distribution_column` and `citus_shards`), and
how the tenants spread over the two workers.

What it cannot show here: the three nodes, the server and ghz share this machine's cores, so
a second worker adds no CPU, only a second PostgreSQL to schedule; on separate machines the
second worker's CPU and disk are what it buys. The ratio here says what the split costs or
gains on one machine, nothing more. The cluster runs with fsync off (the tests' settings).

Usage (from the repository root; about a minute)::

    .venv/bin/python bench/bench_citus.py
    .venv/bin/python bench/bench_citus.py --duration 3 --rounds 1

Everything binds and targets 127.0.0.1 only; the two databases are dropped at the end, and
every process started here is stopped, also on Ctrl-C, SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

# harness.py and procs.py sit beside this script (its folder is on sys.path).
from harness import (
    SERVER_START_TIMEOUT_S,
    SERVER_STOP_TIMEOUT_S,
    SERVICE,
    ghz_version,
    rewrite_text,
    run_ghz,
    seeded_block,
)
from procs import (
    RUN_ENDED,
    ServerProcess,
    failure_outcome,
    find_ghz,
    machine_line,
    raise_on_sigterm,
    software_line,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from server.adapters.sql import migrate
from server.adapters.sql.database import scope_to_tenant
from server.adapters.sql.engine import create_store_engine

ROOT = Path(__file__).resolve().parent.parent
CITUS = ROOT / "scripts" / "citus.sh"
RPCS = ("render", "rewrite")
GHZ_EXTRA_TIMEOUT_S = 30.0


def citus(*args: str, workers: int = 2) -> str:
    """scripts/citus.sh with `args` (MEMORIA_CITUS_WORKERS=workers); its stdout."""
    env = {**os.environ, "MEMORIA_CITUS_WORKERS": str(workers)}
    done = subprocess.run(
        ["bash", str(CITUS), *args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"citus.sh {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def tenant(i: int) -> str:
    return f"t{i}"


@contextmanager
def citus_database(workers: int, tenants: int, principals: int) -> Iterator[str]:
    """A migrated, seeded database on the cluster whose coordinator knows `workers` workers;
    the service role's URL. Dropped at the end."""
    urls = dict(
        line.removeprefix("export ").split("=", 1)
        for line in citus("start").splitlines()
        if line.startswith("export ")
    )
    name = f"memoria_bench_citus{workers}_{uuid.uuid4().hex[:6]}"
    citus("createdb", name, workers=workers)
    try:
        owner_url = make_url(urls["MEMORIA_TEST_CITUS_OWNER_URL"]).set(database=name)
        app_url = make_url(urls["MEMORIA_TEST_CITUS_APP_URL"]).set(database=name)
        owner = create_store_engine(owner_url.render_as_string(hide_password=False), pool_size=1)
        try:
            migrate.upgrade(owner, app_role="memoria_app")
        finally:
            owner.dispose()
        app = app_url.render_as_string(hide_password=False)
        seed(app, tenants, principals)
        yield app
    finally:
        citus("dropdb", name)


def seed(app_url: str, tenants: int, principals: int) -> None:
    """Every tenant's principals with a block, one transaction per tenant (as the service)."""
    rng = random.Random(7)
    now = datetime.now(UTC)
    engine = create_engine(app_url)
    try:
        for t in range(tenants):
            rows = [
                {"p": f"p{p}", "x": seeded_block(rng), "e": uuid.uuid4().hex[:16]}
                for p in range(principals)
            ]
            with engine.begin() as conn:
                scope_to_tenant(conn, tenant(t), citus=True)
                conn.execute(
                    text(
                        "INSERT INTO memory_blocks (tenant_id, principal_id, text, etag, "
                        "update_time) VALUES (:t, :p, :x, :e, :now)"
                    ),
                    [{**row, "t": tenant(t), "now": now} for row in rows],
                )
    finally:
        engine.dispose()


def versions(app_url: str) -> str:
    """The coordinator's PostgreSQL and Citus versions, as the report states them."""
    engine = create_engine(app_url)
    try:
        with engine.connect() as conn:
            server = conn.execute(text("SHOW server_version")).scalar_one()
            citus_ = conn.execute(text("SELECT citus_version()")).scalar_one()
    finally:
        engine.dispose()
    return f"versions: PostgreSQL {server}; {citus_}"


def placement(app_url: str, tenants: int) -> str:
    """Where each tenant's shards are (two-worker database, as the owner): one node per
    tenant, and how many tenants each node holds."""
    url = make_url(app_url).set(username="memoria_owner", password="memoria_owner")
    engine = create_engine(url)
    per_node: dict[str, int] = {}
    split: list[str] = []
    try:
        with engine.connect() as conn:
            for t in range(tenants):
                nodes = conn.execute(
                    text(
                        "SELECT DISTINCT nodename || ':' || nodeport FROM citus_shards "
                        "WHERE shardid = "
                        "get_shard_id_for_distribution_column(table_name, CAST(:t AS text))"
                    ),
                    {"t": tenant(t)},
                ).scalars()
                found = sorted(nodes)
                if len(found) != 1:
                    split.append(f"{tenant(t)} on {found}")
                for node in found:
                    per_node[node] = per_node.get(node, 0) + 1
    finally:
        engine.dispose()
    spread = ", ".join(f"{node}: {count} tenants" for node, count in sorted(per_node.items()))
    verdict = "every tenant's rows (all 6 tables) on one node" if not split else f"SPLIT: {split}"
    return f"placement (two workers): {verdict}; {spread}"


def ghz_args(rpc: str, tenants: int, principals: int, concurrency: int, tag: str) -> list[str]:
    """ghz's arguments: requests spread over tenants (request n: tenant n mod T, principal
    (n / T) mod P); a rewrite's texts sent round-robin (parsed once per run)."""
    meta = json.dumps(
        {
            "x-memoria-tenant": f"t{{{{mod .RequestNumber {tenants}}}}}",
            "x-memoria-principal": f"p{{{{mod (div .RequestNumber {tenants}) {principals}}}}}",
        }
    )
    if rpc == "render":
        call, data = f"{SERVICE}/RenderMemoryBlock", "{}"
    else:
        call = f"{SERVICE}/RewriteMemoryBlock"
        data = json.dumps(
            [{"text": rewrite_text(tag, i), "writer": "WRITER_MODEL"} for i in range(64)]
        )
    return ["--call", call, "-d", data, "-m", meta, "-c", str(concurrency), "--connections", "1"]


def measure(ghz: str, port: int, args: list[str], duration: int) -> tuple[float, dict[str, int]]:
    """requests/s and the calls that did not answer OK, by status, of one ghz run."""
    # --duration-stop=wait: the calls in flight at the deadline finish and count (ghz's default
    # cancels them, each reported as Unavailable), so any non-OK status is a real error.
    run = [*args, "-z", f"{duration}s", "--duration-stop", "wait"]
    report = run_ghz(ghz, port, run, duration + GHZ_EXTRA_TIMEOUT_S)
    codes = report.get("statusCodeDistribution") or {}
    failed = {code: int(n) for code, n in codes.items() if code != "OK"}
    for message, n in (report.get("errorDistribution") or {}).items():
        failed[message[:120]] = int(n)
    return float(report["rps"]), failed


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--tenants", type=int, default=64)
    p.add_argument("--principals", type=int, default=30, help="per tenant, each with a block")
    p.add_argument("--duration", type=int, default=5, help="seconds of load per ghz run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--concurrency", type=int, default=16, help="calls in flight")
    args = p.parse_args(argv)
    if min(args.tenants, args.principals, args.duration, args.rounds, args.concurrency) < 1:
        p.error("every number must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    raise_on_sigterm()
    ghz = find_ghz()
    started = time.monotonic()
    rps: dict[tuple[int, str], list[float]] = {}
    errors: dict[str, int] = {}
    facts: list[str] = []
    outcome = ""
    with ExitStack() as stack:
        try:
            servers: dict[int, ServerProcess] = {}
            for workers in (1, 2):
                url = stack.enter_context(citus_database(workers, args.tenants, args.principals))
                if workers == 2:
                    facts.append(versions(url))
                    facts.append(placement(url, args.tenants))
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                server = ServerProcess(
                    ["--database-url", url, "--data-dir", str(workdir / "data")],
                    workdir,
                    service=SERVICE,
                    stop_timeout_s=SERVER_STOP_TIMEOUT_S,
                    # No read cache: every render reads the database, which is what differs.
                    env={
                        "MEMORIA_PAGE_TOKEN_SECRET": "bench-only-not-a-secret",
                        "MEMORIA_READ_CACHE_ENTRIES": "0",
                    },
                )
                stack.callback(server.stop)
                server.wait_serving(SERVER_START_TIMEOUT_S)
                servers[workers] = server
            for server in servers.values():  # warm up: pools, plans, caches
                for rpc in RPCS:
                    warm = ghz_args(rpc, args.tenants, args.principals, args.concurrency, "w")
                    measure(ghz, server.port, warm, 1)
            for rnd in range(args.rounds):
                order = [(w, r) for w in (1, 2) for r in RPCS]
                order = order[rnd % len(order) :] + order[: rnd % len(order)]
                for workers, rpc in order:
                    tag = f"r{rnd}w{workers}"
                    call = ghz_args(rpc, args.tenants, args.principals, args.concurrency, tag)
                    got, failed = measure(ghz, servers[workers].port, call, args.duration)
                    rps.setdefault((workers, rpc), []).append(got)
                    for what, n in failed.items():
                        errors[what] = errors.get(what, 0) + n
                    print(f"round {rnd} {workers} worker(s) {rpc}: {got:.0f}/s", file=sys.stderr)
        except RUN_ENDED as error:
            outcome = failure_outcome(error)

    print()
    print(machine_line())
    print(software_line(f"ghz {ghz_version(ghz)}"))
    print(
        "cluster: scripts/citus.sh, a coordinator and two workers on this machine (fsync off); "
        "one database registers one worker, the other both"
    )
    print(
        f"load: ghz, one HTTP/2 connection, {args.concurrency} in flight, {args.duration}s per "
        f"run, {args.rounds} interleaved rounds, medians; {args.tenants} tenants x "
        f"{args.principals} principals, spread over all of them; each rewrite a real change"
    )
    for fact in facts:
        print(fact)
    print(f"{'rpc':<10}{'1 worker /s':>14}{'2 workers /s':>14}{'2 / 1':>8}")
    for rpc in RPCS:
        one, two = rps.get((1, rpc)), rps.get((2, rpc))
        if not one or not two:
            continue
        a, b = statistics.median(one), statistics.median(two)
        print(f"{rpc:<10}{a:>14.0f}{b:>14.0f}{b / a:>8.2f}")
    if errors:
        print(f"ERRORS: calls that did not answer OK: {errors}")
    elapsed = time.monotonic() - started
    print(f"wall time {elapsed:.0f}s" + (f"; PARTIAL RESULT ({outcome})" if outcome else ""))
    return 0 if rps and not outcome and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
