"""The port reservation and the refusal rule of `memoria serve --workers N`."""

from __future__ import annotations

import socket
from concurrent import futures

import grpc
import pytest

from server.config import Settings
from server.processes import refusal, reserve_port


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
    return Settings(**values)  # type: ignore[arg-type]


def test_one_process_needs_no_shared_store() -> None:
    assert refusal(_settings(workers=1)) is None


def test_several_processes_need_postgresql_and_a_qdrant_server() -> None:
    shared = _settings(
        workers=2, database_url="postgresql+psycopg://app@db/m", qdrant_url="http://q:6333"
    )
    assert refusal(shared) is None
    embedded = refusal(_settings(workers=2))
    assert embedded is not None
    assert "SQLite" in embedded
    assert "embedded Qdrant engine" in embedded
    qdrant_only = refusal(_settings(workers=3, database_url="postgresql+psycopg://app@db/m"))
    assert qdrant_only is not None
    assert "--workers 3" in qdrant_only
    assert "embedded Qdrant engine" in qdrant_only
    assert "SQLite" not in qdrant_only
