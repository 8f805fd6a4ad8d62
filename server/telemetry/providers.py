"""The process's tracer and meter providers, and OTLP export as the `OTEL_*` variables say.

`Telemetry` is what the composition root holds: the providers, and the methods that put the
span and metric wrappers (server/telemetry/wrappers.py) around the ports, the outbox gauges
(server/telemetry/outbox.py) and the RPC interceptor (server/rpc/telemetry.py) in place, each
returning its argument unchanged when telemetry is off. No global provider is installed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, suppress_instrumentation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from sqlalchemy import Engine

from server.domain.ports import ChunkIndex, Embedder, MemoryStore, TurnStore
from server.telemetry.outbox import OutboxGauges, OutboxReading
from server.telemetry.wrappers import (
    MeteredMemoryStore,
    TracedChunkIndex,
    TracedEmbedder,
    TracedTurnStore,
)

log = logging.getLogger(__name__)

SCOPE = "memoria"
"""Instrumentation scope of Memoria's own spans and metrics."""


@dataclass
class Telemetry:
    """The process's tracer and meter providers, each an SDK provider or a no-op.

    `enabled` is false when both are no-ops: the composition root then adds nothing.
    """

    tracer_provider: trace.TracerProvider = field(default_factory=trace.NoOpTracerProvider)
    meter_provider: metrics.MeterProvider = field(default_factory=metrics.NoOpMeterProvider)
    _shutdown: list[Callable[[], object]] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return not (
            isinstance(self.tracer_provider, trace.NoOpTracerProvider)
            and isinstance(self.meter_provider, metrics.NoOpMeterProvider)
        )

    @property
    def tracer(self) -> trace.Tracer:
        return self.tracer_provider.get_tracer(SCOPE)

    @property
    def meter(self) -> metrics.Meter:
        return self.meter_provider.get_meter(SCOPE)

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporters (once; later calls do nothing)."""
        steps, self._shutdown = self._shutdown, []
        for step in steps:
            try:
                step()
            except Exception:  # an unreachable collector must not stop the server stopping
                log.warning("telemetry shutdown failed", exc_info=True)

    # The composition root calls these; each returns its argument unchanged when off.

    def chunk_index(self, index: ChunkIndex, engine: str) -> ChunkIndex:
        """The chunk index with a span per call and the indexing counters."""
        return TracedChunkIndex(index, self.tracer, self.meter, engine) if self.enabled else index

    def embedder(self, embedder: Embedder) -> Embedder:
        """The embedder with a span per call."""
        return TracedEmbedder(embedder, self.tracer) if self.enabled else embedder

    def memory_store(self, store: MemoryStore) -> MemoryStore:
        """The block operations' store, recording the size of every block a rewrite wrote."""
        return MeteredMemoryStore(store, self.meter) if self.enabled else store

    def indexer_turns(self, turns: TurnStore) -> TurnStore:
        """The indexer's turn store: background batches become one trace each."""
        return TracedTurnStore(turns, self.tracer) if self.enabled else turns

    def observe_outbox(self, stats: Callable[[], OutboxReading]) -> None:
        """Outbox gauges, read through `stats` at most every OUTBOX_READ_INTERVAL_S."""
        if self.enabled:
            OutboxGauges(stats, self.meter)

    def untraced(self, probe: Callable[[], None]) -> Callable[[], None]:
        """`probe` with instrumentation suppressed: the health monitor's store checks run
        every few seconds outside any call, and would each start a trace of their own."""
        if not self.enabled:
            return probe

        def untraced_probe() -> None:
            with suppress_instrumentation():
                probe()

        return untraced_probe

    def interceptors(self) -> list[grpc.ServerInterceptor]:  # type: ignore[type-arg]
        """The RPC span and latency interceptor, to run before (outside) every other one."""
        from server.rpc.telemetry import TelemetryInterceptor

        if not self.enabled:
            return []
        interceptor = TelemetryInterceptor(self.tracer, self.meter)
        self._shutdown.insert(0, interceptor.stop)  # its last durations, before the meter stops
        return [interceptor]

    def instrument_sql(self, store: InstrumentableSql) -> None:
        """A client span per SQL statement of `store`.

        SQLAlchemy's statements: `EngineTracer` on this engine alone, which is what
        `SQLAlchemyInstrumentor().instrument(engine=...)` builds; the instrumentor itself
        would also patch `create_engine` process-wide, and instruments once per process.
        The hot paths' one-statement calls bypass SQLAlchemy's execution layer: the store
        runs each inside a span made here (`trace_calls`), with the attributes psycopg's
        instrumentation would give it, so a traced call runs the same code as an untraced
        one. Pool usage metrics are left out (a no-op counter): this engine's pool already
        held connections from the migration check, which would make its counts wrong.
        """
        if isinstance(self.tracer_provider, trace.NoOpTracerProvider):
            return
        from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

        tracer = self.tracer_provider.get_tracer("opentelemetry.instrumentation.sqlalchemy")
        usage = metrics.NoOpUpDownCounter("db.client.connections.usage")
        EngineTracer(tracer, store.engine, usage)  # type: ignore[no-untyped-call]
        calls = self.tracer_provider.get_tracer("memoria.sql")
        name = store.engine.url.database or "postgresql"

        def span(statement: str) -> AbstractContextManager[object]:
            if not is_instrumentation_enabled():  # the worker's idle polls, gauge reads
                return nullcontext()
            return calls.start_as_current_span(
                statement.split(" ", 1)[0],
                kind=trace.SpanKind.CLIENT,
                attributes={"db.system": "postgresql", "db.name": name, "db.statement": statement},
            )

        store.trace_calls(span)


class InstrumentableSql(Protocol):
    """What `Telemetry.instrument_sql` needs of a SQL store (server/adapters/sql/blocks.py's
    SqlMemoryStore is one): its SQLAlchemy engine, and a hook around its one-statement
    calls."""

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine every other statement runs on."""
        ...

    def trace_calls(self, span: Callable[[str], AbstractContextManager[object]]) -> None:
        """Run each one-statement call inside `span(statement)`."""
        ...


DEFAULT_TRACE_RATIO = 0.01
"""Share of calls whose trace is kept when `OTEL_TRACES_SAMPLER` is unset (parent-based: a
caller's sampling decision is always followed, so distributed traces stay whole). Measured by
bench/bench_telemetry.py on the cached render path: every call traced kept about 0.6-0.75 of
its throughput, one in ten about 0.8-0.87, one in a hundred 0.88-0.93 (the target is 0.9). A
sampled span costs tens of microseconds in the SDK and its exporter, next to a render's
~200. Metrics count every call whatever is sampled; raise the ratio with
OTEL_TRACES_SAMPLER=parentbased_traceidratio and OTEL_TRACES_SAMPLER_ARG."""


def default_sampler(environ: Mapping[str, str] = os.environ) -> Sampler | None:
    """None when `OTEL_TRACES_SAMPLER` is set (the SDK then reads it and its argument), else
    parent-based with root traces kept at DEFAULT_TRACE_RATIO."""
    if environ.get("OTEL_TRACES_SAMPLER"):
        return None
    return ParentBased(TraceIdRatioBased(DEFAULT_TRACE_RATIO))


def build_telemetry(
    *,
    span_processors: Sequence[SpanProcessor] = (),
    metric_readers: Sequence[MetricReader] = (),
    sampler: Sampler | None = None,
    resource: Resource | None = None,
) -> Telemetry:
    """SDK providers feeding these processors and readers; a signal with none stays a no-op.

    `sampler` defaults to `default_sampler()`.
    """
    resource = resource or service_resource()
    telemetry = Telemetry()
    if span_processors:
        tracer_provider = TracerProvider(
            sampler=sampler or default_sampler(), resource=resource, shutdown_on_exit=False
        )
        for processor in span_processors:
            tracer_provider.add_span_processor(processor)
        telemetry.tracer_provider = tracer_provider
        telemetry._shutdown.append(tracer_provider.shutdown)
    if metric_readers:
        meter_provider = MeterProvider(
            metric_readers=metric_readers, resource=resource, shutdown_on_exit=False
        )
        telemetry.meter_provider = meter_provider
        telemetry._shutdown.append(meter_provider.shutdown)
    return telemetry


def service_resource() -> Resource:
    """The resource from `OTEL_RESOURCE_ATTRIBUTES` / `OTEL_SERVICE_NAME`, named `memoria`
    unless those name it."""
    resource = Resource.create({})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "memoria"}))
    return resource


PROTOCOLS = ("grpc", "http/protobuf")


def setup_telemetry(environ: Mapping[str, str] = os.environ) -> Telemetry:
    """Telemetry as the standard `OTEL_*` variables configure it (no-op unless an OTLP
    endpoint is set, or when `OTEL_SDK_DISABLED=true`).

    A signal is exported when `OTEL_EXPORTER_OTLP_ENDPOINT` or its own
    `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` is set and its `OTEL_{TRACES,METRICS}_EXPORTER`
    is not `none`. The exporters read the rest themselves (headers, timeout, compression,
    certificates), as the batch span processor and periodic reader read their intervals.
    """
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Telemetry()
    processors: list[SpanProcessor] = []
    readers: list[MetricReader] = []
    if _exporting(environ, "TRACES"):
        processors.append(BatchSpanProcessor(_span_exporter(_protocol(environ, "TRACES"))))
    if _exporting(environ, "METRICS"):
        readers.append(
            PeriodicExportingMetricReader(_metric_exporter(_protocol(environ, "METRICS")))
        )
    telemetry = build_telemetry(span_processors=processors, metric_readers=readers)
    if telemetry.enabled:
        log.info(
            "telemetry: exporting %s by OTLP",
            " and ".join(s for s, on in (("traces", processors), ("metrics", readers)) if on),
        )
    return telemetry


def _exporting(environ: Mapping[str, str], signal: str) -> bool:
    if environ.get(f"OTEL_{signal}_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    )


def _protocol(environ: Mapping[str, str], signal: str) -> str:
    """The signal's OTLP protocol; http/protobuf by default, as the specification says."""
    protocol = (
        environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol not in PROTOCOLS:
        raise SystemExit(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported: use one of {PROTOCOLS}"
        )
    return protocol


def _span_exporter(protocol: str) -> Any:
    # Imported only when used: each exporter pulls in its transport.
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def _metric_exporter(protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()
