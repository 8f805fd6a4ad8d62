"""Composition root: builds the stores, the domain services and the servers once, and starts
them (`start` for `memoria serve`; `memoria worker` is server/runtime/builders/worker.py). Each
part is built in server/runtime/builders/."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health

from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.cache import PostgresChangeListener
from server.adapters.sql.inspections import BufferedInspectionStore
from server.domain.ports import ChunkIndex, Embedder
from server.rpc.limits import AdmissionInterceptor
from server.rpc.web import WebServer
from server.runtime.builders.grpc_server import SERVICE_NAMES, build_grpc_server
from server.runtime.builders.http import build_web
from server.runtime.builders.ports import refuse_taken_ports
from server.runtime.builders.services import build_services
from server.runtime.builders.stores import Stores, build_read_cache, build_stores
from server.runtime.builders.worker import build_index_worker
from server.runtime.health import HealthMonitor, store_dependencies
from server.runtime.settings import Settings
from server.runtime.worker import IndexWorker
from server.telemetry import Telemetry


@dataclass
class Running:
    """A started server: its port, health servicer and what to close on stop."""

    server: grpc.Server
    port: int
    health: health.HealthServicer
    stores: Stores
    listener: PostgresChangeListener | None
    worker: IndexWorker
    monitor: HealthMonitor
    admission: AdmissionInterceptor
    web: WebServer | None = None
    """The HTTP port (Connect, gRPC-Web, the settings page) when MEMORIA_HTTP_LISTEN is set."""
    inspections: BufferedInspectionStore | None = None
    """The inspector's record writer, closed (what is queued written) before the store."""
    _stopped: threading.Event = field(default_factory=threading.Event)

    @property
    def store(self) -> SqlMemoryStore:
        return self.stores.store

    @property
    def index(self) -> ChunkIndex:
        return self.stores.search.index

    def stop(self, grace: float) -> None:
        """Report NOT_SERVING, drain in-flight calls for up to `grace` seconds, close stores."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        if self.web is not None:
            self.web.stop()  # browser calls in flight finish first: they are gRPC calls
        self.server.stop(grace).wait()
        self.admission.stop()
        self.monitor.stop()  # before the stores close, so no probe reports them down
        self.worker.stop()
        if self.inspections is not None:
            self.inspections.close()
        if self.listener is not None:
            self.listener.stop()
        self.stores.close()

    def wait(self) -> None:
        self.server.wait_for_termination()


def build_monitor(stores: Stores, health_servicer: health.HealthServicer) -> HealthMonitor:
    """The health monitor: probes of the stores set the services' statuses."""
    return HealthMonitor(
        health_servicer,
        store_dependencies(
            stores.telemetry.untraced(stores.db.check),
            stores.search.index.check,
            stores.space.check if stores.space is not None else None,
        ),
        SERVICE_NAMES,
    )


def start(
    settings: Settings,
    *,
    embedder: Embedder | None = None,
    index: ChunkIndex | None = None,
    telemetry: Telemetry | None = None,
) -> Running:
    """Build everything and start serving on `serve.listen`. `embedder` and `index` replace
    the ones the settings describe (the process keeps owning what it built); `telemetry`
    replaces the one the OTEL_* environment describes (server/telemetry/)."""
    refuse_taken_ports(settings)
    stores = build_stores(settings, embedder=embedder, index=index, telemetry=telemetry)
    reads, listener = build_read_cache(settings, stores.store)
    worker = build_index_worker(settings, stores)
    services = build_services(settings, stores, reads, worker)
    health_servicer = health.HealthServicer()
    monitor = build_monitor(stores, health_servicer)
    grpc_server = build_grpc_server(settings, services, health_servicer, monitor, stores.telemetry)
    web = build_web(settings, grpc_server.port)  # bound before anything starts
    monitor.start()  # the first statuses come from a probe of the stores (runtime/health.py)
    grpc_server.admission.start()
    grpc_server.server.start()
    worker.start()
    if web is not None:
        web.start()
    return Running(
        server=grpc_server.server,
        port=grpc_server.port,
        health=health_servicer,
        stores=stores,
        listener=listener,
        worker=worker,
        monitor=monitor,
        admission=grpc_server.admission,
        web=web,
        inspections=services.inspections,
    )
