"""The gRPC server: its admission limits, interceptors, connection limits, servicers and
port."""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from memoria.v1 import (
    audit_service_pb2,
    audit_service_pb2_grpc,
    conversation_search_service_pb2,
    conversation_search_service_pb2_grpc,
    memory_block_service_pb2,
    memory_block_service_pb2_grpc,
    model_tool_service_pb2,
    model_tool_service_pb2_grpc,
)
from server.adapters.thread_names import name_os_thread
from server.rpc.interceptor import MemoriaInterceptor
from server.rpc.limits import AdmissionInterceptor, Limits
from server.rpc.model_tools import ModelToolServicer
from server.rpc.reflection import enable_reflection
from server.rpc.servicers import AuditServicer, ConversationSearchServicer, MemoryBlockServicer
from server.runtime.builders.access import build_authenticator
from server.runtime.builders.services import Services
from server.runtime.health import HealthMonitor
from server.runtime.settings import Settings, StartupRefusal
from server.telemetry import Telemetry

SERVICE_NAMES = (
    memory_block_service_pb2.DESCRIPTOR.services_by_name["MemoryBlockService"].full_name,
    audit_service_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name,
    conversation_search_service_pb2.DESCRIPTOR.services_by_name[
        "ConversationSearchService"
    ].full_name,
    model_tool_service_pb2.DESCRIPTOR.services_by_name["ModelToolService"].full_name,
)
"""Memoria's own services, whose health the monitor reports and reflection describes."""


@dataclass
class GrpcServer:
    """A built gRPC server bound to its port, not started yet."""

    server: grpc.Server
    port: int
    admission: AdmissionInterceptor


def _limits(settings: Settings) -> Limits:
    """Admission (server/rpc/limits.py): requests are received under a time bound on a pool
    large enough for the waiting, while at most `threads` calls execute at once (the measured
    optimum, settings.py) and at most `max_calls` are in progress; long-lived streams run on a
    pool of their own."""
    limits = settings.limits
    return Limits(
        executing=settings.serve.threads,
        max_calls=limits.max_calls,
        max_receiving=limits.max_receiving_calls,
        max_streams=limits.max_streams,
        receive_timeout=limits.receive_timeout_seconds,
        stream_idle_timeout=limits.stream_idle_seconds,
    )


def _options(settings: Settings) -> list[tuple[str, int]]:
    limits = settings.limits
    return [
        ("grpc.max_receive_message_length", limits.max_receive_message_bytes),
        ("grpc.max_send_message_length", limits.max_send_message_bytes),
        # Off for one process: a second server on the same port then fails to start instead
        # of silently sharing its traffic. On for `--processes N`, whose processes all listen
        # on the port (server/runtime/processes.py).
        ("grpc.so_reuseport", 1 if settings.serve.processes > 1 else 0),
        # One connection cannot hold more streams than this (HTTP/2 SETTINGS; a client queues
        # its own calls beyond it), idle connections are closed, a connection must finish its
        # handshake soon, and the number of connections is capped.
        ("grpc.max_concurrent_streams", limits.max_streams_per_connection),
        # Off: grpc's "overload protection" counts a connection's streams until the server
        # has freed them, not until they ended, and refuses a new one past the cap with
        # RST_STREAM REFUSED_STREAM (UNAVAILABLE, no details) while its client, which counts
        # ended streams out, is within the cap: 153 to 330 of 400 calls in flight on one fresh
        # channel were lost that way (issue 23). Off, 2,000 in flight on one fresh channel are
        # all answered (the client queues past the cap) and admission refuses overload.
        ("grpc.http.overload_protection", 0),
        ("grpc.max_connection_idle_ms", int(limits.connection_idle_seconds * 1000)),
        ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout_seconds * 1000)),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
    ]


def build_grpc_server(
    settings: Settings,
    services: Services,
    health_servicer: health.HealthServicer,
    monitor: HealthMonitor,
    telemetry: Telemetry,
) -> GrpcServer:
    """The server with every servicer added, bound to `serve.listen`.

    Sync server with a thread pool, not grpc.aio: the handlers block on SQLAlchemy/psycopg,
    and a comparison driver (docs/decisions.md) measured the frameworks within about 15% of
    each other on a no-op (sync ahead with one call in flight, aio ahead with 16). One code
    path, no event loop around blocking drivers."""
    limits = _limits(settings)
    admission = AdmissionInterceptor(limits)
    pool_threads = limits.pool_threads
    server = grpc.server(
        # Named "rpc_N" at the OS level too, so their CPU is told apart from the indexing
        # worker's (top -H, bench/bench_turn_cost.py).
        futures.ThreadPoolExecutor(
            max_workers=pool_threads, thread_name_prefix="rpc", initializer=name_os_thread
        ),
        interceptors=[
            admission,  # outermost: it wraps the handlers the others built
            *telemetry.interceptors(),
            MemoriaInterceptor(
                build_authenticator(settings), on_store_unavailable=monitor.probe_soon
            ),
        ],
        options=_options(settings),
        # No grpc limit of its own (maximum_concurrent_rpcs): it refuses without a reason
        # (RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!") and saves nothing, as the
        # transport has made the call before it counts it. Calls past `max_calls` are refused
        # with a reason by a spare thread at once; those waiting for a thread are bounded by
        # the connections times their streams.
        maximum_concurrent_rpcs=None,
    )
    _add_servicers(server, services, health_servicer)
    return GrpcServer(server, _bind(server, settings.serve.listen), admission)


def _add_servicers(
    server: grpc.Server, services: Services, health_servicer: health.HealthServicer
) -> None:
    memory_block_service_pb2_grpc.add_MemoryBlockServiceServicer_to_server(
        MemoryBlockServicer(services.blocks), server
    )
    audit_service_pb2_grpc.add_AuditServiceServicer_to_server(AuditServicer(services.audit), server)
    conversation_search_service_pb2_grpc.add_ConversationSearchServiceServicer_to_server(
        ConversationSearchServicer(
            services.conversations.intake,
            services.conversations.search,
            services.conversations.removal,
            services.inspector,
            services.exporter,
            services.listing,
        ),
        server,
    )
    model_tool_service_pb2_grpc.add_ModelToolServiceServicer_to_server(
        ModelToolServicer(services.tool_calls), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection((*SERVICE_NAMES, health.SERVICE_NAME), server)


def _bind(server: grpc.Server, listen: str) -> int:
    """The bound port. gRPC says only "Failed to bind" (a RuntimeError, or port 0 from older
    versions): a port another process holds, or an address not on this machine."""
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError:
        port = 0
    if port == 0:
        raise StartupRefusal(
            f"cannot listen on {listen}: the port is in use or the address is not this machine's",
            "listen",
        )
    return port
