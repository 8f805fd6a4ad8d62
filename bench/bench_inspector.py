"""What the inspector costs a render: RenderMemoryBlock with a turn reference against without.

What it measures
----------------
A render that names its turn also records the block version for that turn (one INSERT in its
own transaction, which checks the conversation's tombstone in the same statement; see
server/adapters/sql/inspections.py). A render without a turn reference must cost what it did. This
script starts one real ``memoria serve`` process (the embedded SQLite default), gives 50
principals a block of about 600 characters, and drives it with ``ghz`` through reflection,
interleaving in every round:

* ``plain``: ``RenderMemoryBlock`` with no turn reference (the hot path as before);
* ``turn``: the same render naming a new turn on every call (conversation ``c-<n>``, turn
  ``1``), so every call writes one record, the worst case (a turn renders once).

at 1 and 8 calls in flight, and prints requests/s, p50 and p99 and the ratio turn/plain of
requests/s measured in the same round (medians over rounds). Ratios, because ghz and the
server share the machine's cores with whatever else runs; interleaving keeps both sides under
the same load.

Usage (from the repository root)::

    .venv/bin/python bench/bench_inspector.py                    # SQLite, about 1 minute
    .venv/bin/python bench/bench_inspector.py --duration 3 --rounds 2

Everything binds 127.0.0.1; the server and ghz are stopped before the script exits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from procs import (
    HOST,
    ServerProcess,
    find_ghz,
    machine_line,
    percentile_ms,
    raise_on_sigterm,
)

TENANT = "bench"
PRINCIPALS = 50
CALL = "memoria.v1.MemoryBlockService.RenderMemoryBlock"
BLOCK = "\n".join(
    f"Fact {i}: the person prefers option {i * 7} for task kind {i}." for i in range(12)
)


def ghz(binary: str, port: int, data: str, concurrency: int, seconds: float) -> dict[str, Any]:
    """One ghz run of RenderMemoryBlock with request `data` (a ghz template)."""
    metadata = json.dumps(
        {"x-memoria-tenant": TENANT, "x-memoria-principal": "p-{{mod .RequestNumber 50}}"}
    )
    cmd = [
        binary,
        "--insecure",
        "--connect-timeout",
        "5s",
        "-O",
        "json",
        "--call",
        CALL,
        "-d",
        data,
        "-m",
        metadata,
        "-c",
        str(concurrency),
        "-z",
        f"{seconds}s",
        f"{HOST}:{port}",
    ]
    out = subprocess.run(cmd, capture_output=True, timeout=seconds + 60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"ghz failed: {out.stderr.decode()[-2000:]}")
    report: dict[str, Any] = json.loads(out.stdout)
    # When the duration ends ghz closes the connection under the calls still in flight, which
    # it counts as Unavailable or Canceled: at most one per call in flight. Anything else is a
    # failure.
    codes = dict(report.get("statusCodeDistribution", {}))
    codes.pop("OK", None)
    cut = {"Unavailable", "Canceled"}
    if set(codes) - cut or sum(codes.values()) > concurrency:
        raise RuntimeError(f"ghz saw errors: {codes}")
    return report


def seed(port: int) -> None:
    """A block for each principal, written through the API."""
    with grpc.insecure_channel(f"{HOST}:{port}") as channel:
        stub = pb_grpc.MemoryBlockServiceStub(channel)
        for i in range(PRINCIPALS):
            md = (("x-memoria-tenant", TENANT), ("x-memoria-principal", f"p-{i}"))
            request = pb.RewriteMemoryBlockRequest(text=BLOCK, writer=block_pb.WRITER_USER)
            stub.RewriteMemoryBlock(request, metadata=md)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per ghz run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    raise_on_sigterm()
    binary = find_ghz()
    with tempfile.TemporaryDirectory(prefix="memoria-bench-inspector-") as tmp:
        workdir = Path(tmp)
        server = ServerProcess(
            ["--data-dir", str(workdir / "data")],
            workdir,
            service="memoria.v1.MemoryBlockService",
            stop_timeout_s=10,
        )
        try:
            server.wait_serving(120)
            seed(server.port)
            plain = "{}"
            cases = {
                "plain": lambda r: plain,
                "turn": lambda r: json.dumps(
                    {"turn": {"conversation_id": f"c-r{r}-{{{{.RequestNumber}}}}", "turn_id": "1"}}
                ),
            }
            results: dict[tuple[str, int], list[dict[str, Any]]] = {}
            for round_ in range(args.rounds):
                for concurrency in (1, 8):
                    order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
                    for name in order:
                        report = ghz(
                            binary, server.port, cases[name](round_), concurrency, args.duration
                        )
                        results.setdefault((name, concurrency), []).append(report)
        finally:
            server.stop()
    print(machine_line())
    print(f"store: SQLite (embedded default); rounds {args.rounds}, {args.duration:g} s each")
    print(f"{'case':<6} {'conc':>4} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'turn/plain':>10}")
    for concurrency in (1, 8):
        ratios = [
            t["rps"] / p["rps"]
            for t, p in zip(
                results[("turn", concurrency)], results[("plain", concurrency)], strict=True
            )
        ]
        for name in cases:
            runs = results[(name, concurrency)]
            rps = statistics.median(r["rps"] for r in runs)
            p50 = statistics.median(percentile_ms(r, 50) for r in runs)
            p99 = statistics.median(percentile_ms(r, 99) for r in runs)
            ratio = f"{statistics.median(ratios):.2f}" if name == "turn" else ""
            print(f"{name:<6} {concurrency:>4} {rps:>8.0f} {p50:>7.2f} {p99:>7.2f} {ratio:>10}")


if __name__ == "__main__":
    main()
