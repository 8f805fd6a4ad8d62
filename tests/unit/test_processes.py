"""The port reservation and the refusal rule of `memoria serve --processes N`, its old names
(`--workers`, MEMORIA_WORKERS) kept as aliases, and pinning a process to one CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent import futures

import grpc
import pytest

from server.runtime.cli import _parser
from server.runtime.cli import _settings as _cli_settings
from server.runtime.processes import refusal, reserve_port
from server.runtime.settings import Settings


def _grpc_server(reuseport: int) -> grpc.Server:
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=1), options=[("grpc.so_reuseport", reuseport)]
    )


def test_port_zero_is_reserved_for_the_group_only() -> None:
    reserved, port = reserve_port("127.0.0.1:0")
    servers = [_grpc_server(1), _grpc_server(1)]
    try:
        assert port > 0
        with socket.socket() as other, pytest.raises(OSError):  # a program without SO_REUSEPORT
            other.bind(("127.0.0.1", port))
        for server in servers:  # the children
            assert server.add_insecure_port(f"127.0.0.1:{port}") == port
            server.start()
        # The reservation never listens: every connection reaches a child.
        for _ in range(20):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        for server in servers:
            server.stop(0).wait()
        reserved.close()


def test_a_fixed_port_already_served_is_refused() -> None:
    server = _grpc_server(1)  # even one that would share it: two groups must not mix
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(OSError):
            reserve_port(f"127.0.0.1:{port}")
    finally:
        server.stop(0).wait()


def _settings(**values: object) -> Settings:
    return Settings(**values)


def test_one_process_needs_no_shared_store() -> None:
    assert refusal(_settings(processes=1)) is None


def test_several_processes_need_postgresql_and_a_qdrant_server() -> None:
    shared = _settings(
        processes=2, database_url="postgresql+psycopg://app@db/m", qdrant_url="http://q:6333"
    )
    assert refusal(shared) is None
    embedded = refusal(_settings(processes=2))
    assert embedded is not None
    assert "SQLite" in embedded
    assert "embedded Qdrant engine" in embedded
    qdrant_only = refusal(_settings(processes=3, database_url="postgresql+psycopg://app@db/m"))
    assert qdrant_only is not None
    assert "--processes 3" in qdrant_only
    assert "embedded Qdrant engine" in qdrant_only
    assert "SQLite" not in qdrant_only


def serve_settings(*argv: str) -> Settings:
    """The settings `memoria serve ARGV` would run with."""
    return _cli_settings(_parser().parse_args(["serve", *argv]))


def test_processes_and_its_old_name_workers_are_one_flag() -> None:
    assert serve_settings().serve.processes == 1
    assert serve_settings("--processes", "3").serve.processes == 3
    assert serve_settings("--workers", "2").serve.processes == 2


def test_memoria_workers_still_sets_the_serving_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("MEMORIA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("MEMORIA_WORKERS", "2")
    assert Settings().serve.processes == 2
    assert serve_settings("--processes", "4").serve.processes == 4  # the flag wins, as ever
    monkeypatch.setenv("MEMORIA_PROCESSES", "3")
    assert Settings().serve.processes == 3  # the new name wins over the old
    environ = {"MEMORIA_WORKERS": "2", "MEMORIA_PROCESSES": "2", "MEMORIA_PROCESSS": "2"}
    assert Settings.unknown_env(environ) == ["MEMORIA_PROCESSS"]
    assert Settings.unknown_env({"MEMORIA_BENCH_PG": "fast"}) == []  # the benchmarks' own


_PIN = """
import json, os, sys, threading
from server.runtime.processes import pin_this_process
stop = threading.Event()
before = threading.Thread(target=stop.wait)
before.start()
cpu = pin_this_process(None if sys.argv[1] == "-" else int(sys.argv[1]))
after = threading.Thread(target=stop.wait)
after.start()
print(json.dumps([cpu, *(sorted(os.sched_getaffinity(t)) for t in
      (0, before.native_id, after.native_id))]))
stop.set()
"""


@pytest.mark.parametrize("index", [None, 1, 2, 3])
def test_pin_this_process_puts_every_thread_on_one_cpu(index: int | None) -> None:
    """Threads started before the pin and after it (they inherit it) share the one CPU: the
    first allowed for a single process, the i-th (round robin) for process i. In a child
    process: pinning this one would pin the rest of the suite."""
    allowed = sorted(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", _PIN, "-" if index is None else str(index)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    cpu, main_thread, before, after = json.loads(out.stdout)
    assert cpu == allowed[((index or 1) - 1) % len(allowed)]
    assert main_thread == before == after == [cpu]
