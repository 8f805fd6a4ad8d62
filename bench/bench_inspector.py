"""What the inspector costs a render: a render naming its turn against a plain one.

What it measures
----------------
A render that names its turn also records the block version for that turn (the inspector,
server/domain/inspection.py); the record is queued in the process and written in batches by
one background thread (`BufferedInspectionStore`, server/adapters/sql/inspections.py). A
render without a turn reference must cost what it did, and one with must cost almost
nothing more. This script starts one real ``memoria serve`` process on the benchmark's
durable PostgreSQL (``harness.bench_pg_urls``, the default) or on the embedded SQLite
(``--sqlite``), seeds 50 principals with a realistic block, and drives it with ``ghz``
through reflection, interleaving in every round (the order reversed every other round):

* ``render``: ``MemoryBlockService.RenderMemoryBlock`` with no turn reference (the hot path);
* ``render+turn``: the same render naming a turn (one per run, in a conversation new to
  the run), so every call queues a record and the writer inserts one row per call;
* ``section``: ``ModelToolService.RenderPromptSection`` with no turn (what the turn adapters
  call);
* ``section+turn``: the same naming a turn, as ``render+turn``.

at 1 and 16 calls in flight, and prints requests/s, p50 and p99, the server's CPU per call
(all its threads, the background writer's included), ghz's CPU per call, and the ratio
of each ``+turn`` case's requests/s to its plain twin's measured in the same round
(medians over rounds; the ratio's range over rounds beside it). Ratios, because ghz and
the server share the machine's cores with whatever else runs; interleaving keeps both
sides under the same load.

With ``--pin`` the server runs on CPU 0 only and ghz on the others, so ghz's CPU per call
(a deployment's callers run on other machines) no longer takes from the server's. One core
also spares the server's threads the cross-core hand-offs of the GIL: a plain render at 16 in
flight served about 1.5 times the requests pinned (bench/README.md, "Latest figures").

Usage (from the repository root)::

    .venv/bin/python bench/bench_inspector.py                 # durable PostgreSQL, ~9 min
    .venv/bin/python bench/bench_inspector.py --sqlite        # the embedded default
    .venv/bin/python bench/bench_inspector.py --duration 2 --rounds 1   # quicker, noisier
    .venv/bin/python bench/bench_inspector.py --pin           # server and ghz on separate CPUs

Everything binds 127.0.0.1; the server and ghz are stopped before the script exits.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import (
    TENANT,
    Population,
    check_answers,
    ghz_version,
    postgres_database,
    run_ghz,
    sqlite_database,
)
from procs import (
    ServerProcess,
    find_ghz,
    machine_line,
    percentile_ms,
    raise_on_sigterm,
    software_line,
)

PRINCIPALS = 50
CONCURRENCY = (1, 16)
BLOCKS = "memoria.v1.MemoryBlockService"
TOOLS = "memoria.v1.ModelToolService"
CASES: dict[str, tuple[str, bool]] = {
    "render": (f"{BLOCKS}/RenderMemoryBlock", False),
    "render+turn": (f"{BLOCKS}/RenderMemoryBlock", True),
    "section": (f"{TOOLS}/RenderPromptSection", False),
    "section+turn": (f"{TOOLS}/RenderPromptSection", True),
}
"""Each case: the method, and whether every call names a turn."""


def request_data(with_turn: bool, tag: str) -> str:
    """ghz's request data: "{}", or one request naming turn 1 of conversation `tag` (every
    call records a render: records are rows, one per render, however many a turn has). One
    static request on both sides, so ghz pays the same per call for either: an array of
    requests, one per turn, measured at up to about 100 microseconds more of ghz's CPU per call,
    taken from the same 2 cores as the server's."""
    if not with_turn:
        return "{}"
    return json.dumps({"turn": {"conversation_id": tag, "turn_id": "1"}})


def ghz_args(call: str, data: str, concurrency: int, seconds: float) -> list[str]:
    """One run's ghz arguments: principals p0..p49 in turn, one connection."""
    principal = f"p{{{{mod .RequestNumber {PRINCIPALS}}}}}"
    metadata = json.dumps({"x-memoria-tenant": TENANT, "x-memoria-principal": principal})
    return [
        "--call",
        call,
        "-d",
        data,
        "-m",
        metadata,
        "-c",
        str(concurrency),
        "--connections",
        "1",
        "-z",
        f"{seconds}s",
        "--duration-stop=wait",
    ]


def checked(report: dict[str, Any]) -> dict[str, Any]:
    """The report, unless a call failed: with --duration-stop=wait, ghz lets the calls in
    flight at the deadline finish and count (as bench_blocks.py), so any non-OK status is a
    real error."""
    codes = dict(report.get("statusCodeDistribution", {}))
    if set(codes) != {"OK"}:
        raise RuntimeError(f"ghz saw errors: {codes} {report.get('errorDistribution')}")
    return report


def _children_cpu_seconds() -> float:
    """User + system CPU of this driver's finished children (each ghz run, once reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    # Many rounds: one round's turn/plain ratio at 16 in flight ranges 0.68-1.21 on the
    # reference machine, so medians of 4-12 rounds of the same inspector code ran 0.85-0.96;
    # 20 rounds of 3 s (about 9 minutes a store) gave 0.87 on both stores (bench/README.md).
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per ghz run")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--sqlite", action="store_true", help="the embedded SQLite default")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the server on CPU 0, ghz on the others (the client's cost apart from the server's)",
    )
    args = parser.parse_args(argv)
    raise_on_sigterm()
    binary = find_ghz()
    make_db = sqlite_database if args.sqlite else postgres_database
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    cpu_us: dict[tuple[str, int], list[float]] = {}
    ghz_us: dict[tuple[str, int], list[float]] = {}
    with make_db(Population(PRINCIPALS, 0)) as db, tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(db.server_args, Path(tmp), service=BLOCKS, stop_timeout_s=10)
        try:
            server.wait_serving(120)
            pinned = server.pin_apart() if args.pin else "not pinned: ghz shares the CPUs"
            check_answers(server.port, Population(PRINCIPALS, 0))
            for call, with_turn in CASES.values():  # warm up every path (not measured)
                args_ = ghz_args(call, request_data(with_turn, "warm-up"), 4, 1)
                checked(run_ghz(binary, server.port, args_, 60))
            for round_ in range(args.rounds):
                for concurrency in CONCURRENCY:
                    order = list(CASES) if round_ % 2 == 0 else list(reversed(CASES))
                    for name in order:
                        call, with_turn = CASES[name]
                        data = request_data(with_turn, f"c-{round_}-{concurrency}-{len(name)}")
                        before = server.cpu_seconds()
                        client_before = _children_cpu_seconds()
                        report = checked(
                            run_ghz(
                                binary,
                                server.port,
                                ghz_args(call, data, concurrency, args.duration),
                                args.duration + 60,
                            )
                        )
                        spent = server.cpu_seconds() - before
                        client = _children_cpu_seconds() - client_before
                        results.setdefault((name, concurrency), []).append(report)
                        calls = max(1, int(report.get("count", 0)))
                        cpu_us.setdefault((name, concurrency), []).append(spent / calls * 1e6)
                        ghz_us.setdefault((name, concurrency), []).append(client / calls * 1e6)
        finally:
            server.stop()
        description = db.description
    print(machine_line())
    print(software_line(ghz_version(binary)))
    print(f"database: {description}")
    print(f"rounds {args.rounds}, {args.duration:g} s per run, {PRINCIPALS} principals; {pinned}")
    header = f"{'case':<13} {'conc':>4} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7}"
    print(f"{header} {'cpu us':>7} {'ghz us':>7} turn/plain (per round)")
    median: Callable[[Any], float] = statistics.median
    for concurrency in CONCURRENCY:
        for name in CASES:
            runs = results[(name, concurrency)]
            rps = median(r["rps"] for r in runs)
            p50 = median(percentile_ms(r, 50) for r in runs)
            p99 = median(percentile_ms(r, 99) for r in runs)
            ratio = ""
            if name.endswith("+turn"):
                plain = results[(name.removesuffix("+turn"), concurrency)]
                ratios = [t["rps"] / p["rps"] for t, p in zip(runs, plain, strict=True)]
                ratio = f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            cpu = median(cpu_us[(name, concurrency)])
            client = median(ghz_us[(name, concurrency)])
            row = f"{name:<13} {concurrency:>4} {rps:>7.0f} {p50:>7.2f} {p99:>7.2f}"
            print(f"{row} {cpu:>7.0f} {client:>7.0f} {ratio}")


if __name__ == "__main__":
    main()
