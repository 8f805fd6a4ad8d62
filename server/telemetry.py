"""OpenTelemetry for Memoria: traces, metrics, and JSON logs that carry the trace id.

What is recorded (DESIGN 6):

- a span per RPC and the RPC latency histogram, by method and status code
  (`server/rpc/telemetry.py`);
- a span per SQL statement: SQLAlchemy's statements through the official SQLAlchemy
  instrumentation, and the hot paths' one-statement psycopg calls (`SqlMemoryStore.call`)
  through the official psycopg instrumentation on each connection of their pool (which then
  runs them through psycopg's cursor, not the prepared-statement path);
- a span per chunk index call (Qdrant) and per embedding call, from wrappers put around the
  ports in the composition root, so no adapter knows about telemetry;
- the outbox depth and the age of its oldest pending turn (observable gauges), chunks and
  turns indexed (counters), and the size of every block written by a rewrite (histogram).

Export is OTLP, configured only by the standard `OTEL_*` environment variables: on when
`OTEL_EXPORTER_OTLP_ENDPOINT` (or a signal's own endpoint) is set, over gRPC or HTTP as
`OTEL_EXPORTER_OTLP_PROTOCOL` says. Otherwise nothing is built at all: no SDK, no wrapper,
no interceptor, so telemetry that is off costs nothing per call.

Everything here is wired once by the composition root (`server/app.py`); no global tracer
or meter provider is installed, so several servers in one process (the tests) each keep
their own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import SpanKind
from sqlalchemy import event

from server.domain.model import (
    AcceptOutcome,
    AuditAction,
    AuditEvent,
    AuditQuery,
    Change,
    ConversationPurge,
    EncodedQuery,
    Erasure,
    IndexedChunk,
    NewAuditEvent,
    NewTurn,
    PrincipalMemory,
    RetrievalResult,
    SearchScope,
    StoredTurn,
    Tombstone,
    TurnKey,
)
from server.domain.ports import ChunkIndex, Embedder, MemoryStore, TurnBatch, TurnStore
from server.storage.sql import CURSOR_PATH, SqlMemoryStore
from server.storage.turns import OutboxStats

log = logging.getLogger(__name__)

SCOPE = "memoria"
"""Instrumentation scope of Memoria's own spans and metrics."""

T = TypeVar("T")


# --------------------------------------------------------------------------
# Providers
# --------------------------------------------------------------------------


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

    def observe_outbox(self, stats: Callable[[], OutboxStats]) -> None:
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

    def instrument_sql(self, store: SqlMemoryStore) -> None:
        """A client span per SQL statement of `store`, with the official instrumentations.

        SQLAlchemy's statements: `EngineTracer` on this engine alone, which is what
        `SQLAlchemyInstrumentor().instrument(engine=...)` builds; the instrumentor itself
        would also patch `create_engine` process-wide, and instruments once per process.
        The hot paths' psycopg calls bypass SQLAlchemy's execution layer, so each connection
        of their pool is instrumented by psycopg's instrumentation when it is opened.
        Pool usage metrics are left out (a no-op counter): this engine's pool already held
        connections from the migration check, which would make its counts wrong.
        """
        if isinstance(self.tracer_provider, trace.NoOpTracerProvider):
            return
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
        from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

        tracer = self.tracer_provider.get_tracer("opentelemetry.instrumentation.sqlalchemy")
        usage = metrics.NoOpUpDownCounter("db.client.connections.usage")
        EngineTracer(tracer, store.engine, usage)  # type: ignore[no-untyped-call]
        autocommit = store.autocommit_engine
        if autocommit is None:
            return
        provider = self.tracer_provider

        def instrument(dbapi_connection: Any, record: Any) -> None:
            PsycopgInstrumentor.instrument_connection(dbapi_connection, tracer_provider=provider)
            record.info[CURSOR_PATH] = True  # the store's calls go through the traced cursor

        event.listen(autocommit, "connect", instrument)


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


# --------------------------------------------------------------------------
# Logs
# --------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the trace and span ids
    of the span current when the line was logged (absent outside any span). `process`, when
    given, names the process on every line (`memoria serve --workers N` shares one stream)."""

    def __init__(self, process: str | None = None) -> None:
        super().__init__()
        self._process = process

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self._process is not None:
            line["process"] = self._process
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid:
            line["trace_id"] = trace.format_trace_id(span_context.trace_id)
            line["span_id"] = trace.format_span_id(span_context.span_id)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(level: str) -> None:
    """Structured logs on stderr: one JSON object per line (JsonFormatter), at `level`."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin chatter is not news


# --------------------------------------------------------------------------
# Spans and metrics around the ports (applied by the composition root)
# --------------------------------------------------------------------------


class TracedChunkIndex:
    """A `ChunkIndex` with a client span per Qdrant call, counting what upserts index."""

    def __init__(self, index: ChunkIndex, tracer: trace.Tracer, meter: metrics.Meter, engine: str):
        self._index = index
        self._tracer = tracer
        self._attributes = {"db.system.name": "qdrant", "memoria.qdrant.engine": engine}
        self._turns = meter.create_counter(
            "memoria.index.turns", unit="{turn}", description="Turns written to the chunk index"
        )
        self._chunks = meter.create_counter(
            "memoria.index.chunks",
            unit="{chunk}",
            description="Chunks written to the chunk index",
        )

    def _span(self, operation: str) -> AbstractContextManager[trace.Span]:
        return self._tracer.start_as_current_span(
            f"qdrant {operation}",
            kind=SpanKind.CLIENT,
            attributes={**self._attributes, "db.operation.name": operation},
        )

    def upsert_turn(
        self, key: TurnKey, turn_time: datetime, chunks: Sequence[IndexedChunk]
    ) -> None:
        with self._span("upsert_turn") as span:
            span.set_attribute("memoria.chunk_count", len(chunks))
            self._index.upsert_turn(key, turn_time, chunks)
        self._turns.add(1)
        self._chunks.add(len(chunks))

    def search(self, scope: SearchScope, query: EncodedQuery, turns: int) -> RetrievalResult:
        with self._span("search"):
            return self._index.search(scope, query, turns)

    def delete_conversation(self, tenant_id: str, principal_id: str, conversation_id: str) -> None:
        with self._span("delete_conversation"):
            self._index.delete_conversation(tenant_id, principal_id, conversation_id)

    def delete_principal(self, tenant_id: str, principal_id: str) -> None:
        with self._span("delete_principal"):
            self._index.delete_principal(tenant_id, principal_id)

    def count(self, tenant_id: str, principal_id: str, conversation_id: str | None = None) -> int:
        with self._span("count"):
            return self._index.count(tenant_id, principal_id, conversation_id)

    def turn_chunks(
        self, tenant_id: str, principal_id: str, turns: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[str, ...]]:
        with self._span("turn_chunks"):
            return self._index.turn_chunks(tenant_id, principal_id, turns)

    def check(self) -> None:
        """The health monitor's probe: not traced (a trace every few seconds is noise)."""
        self._index.check()

    def close(self) -> None:
        self._index.close()


class TracedEmbedder:
    """An `Embedder` with a span per call (the model runs in this process)."""

    def __init__(self, embedder: Embedder, tracer: trace.Tracer):
        self._embedder = embedder
        self._tracer = tracer

    @property
    def model_id(self) -> str:
        return self._embedder.model_id

    @property
    def dimension(self) -> int:
        return self._embedder.dimension

    def embed_documents(self, texts: Sequence[str]) -> list[tuple[tuple[float, ...], ...]]:
        with self._tracer.start_as_current_span(
            "embed documents",
            attributes={"memoria.text_count": len(texts), "memoria.char_count": _chars(texts)},
        ) as span:
            vectors = self._embedder.embed_documents(texts)
            span.set_attribute("memoria.window_count", sum(len(v) for v in vectors))
            return vectors

    def embed_query(self, text: str) -> tuple[float, ...]:
        with self._tracer.start_as_current_span(
            "embed query", attributes={"memoria.char_count": len(text)}
        ):
            return self._embedder.embed_query(text)


def _chars(texts: Iterable[str]) -> int:
    return sum(len(t) for t in texts)


class MeteredMemoryStore:
    """A `MemoryStore` that records the size of each block a rewrite wrote.

    Only `apply` is wrapped; reads go straight to the wrapped store's bound method, so the
    render path pays nothing for it.
    """

    def __init__(self, store: MemoryStore, meter: metrics.Meter):
        self._store = store
        self.read: Callable[..., PrincipalMemory] = store.read
        self._sizes = meter.create_histogram(
            "memoria.block.size",
            unit="{char}",
            description="Characters (code points) of each block written by a rewrite",
            explicit_bucket_boundaries_advisory=(100, 250, 500, 1000, 1500, 2000, 3000, 4000),
        )

    def apply(self, tenant_id: str, change: Change) -> bool:
        applied = self._store.apply(tenant_id, change)
        if applied and change.event.action is AuditAction.BLOCK_REWRITTEN:
            self._sizes.record(change.event.char_count)
        return applied

    def list_audit(self, tenant_id: str, query: AuditQuery) -> list[AuditEvent]:
        return self._store.list_audit(tenant_id, query)


class TracedTurnStore:
    """The indexer's `TurnStore`: each batch of work becomes one trace, idle polls none.

    The background worker claims every second whether there is work or not. Outside any
    span (the worker's loop) its claim statements run with instrumentation suppressed, and a
    span is started only when the claim brought turns or purges: the embedding, Qdrant and
    SQL spans of the batch are its children. A claim made inside a span (an IndexTurn that
    waits) is traced as usual, as part of that call.
    """

    def __init__(self, turns: TurnStore, tracer: trace.Tracer):
        self._turns = turns
        self._tracer = tracer

    def claim(
        self, limit: int, now: datetime, only: TurnKey | None = None
    ) -> AbstractContextManager[TurnBatch]:
        claim = self._turns.claim(limit, now, only)
        return self._traced(claim, "index turns", lambda batch: len(batch.turns))

    def claim_purges(self, limit: int) -> AbstractContextManager[list[ConversationPurge]]:
        return self._traced(self._turns.claim_purges(limit), "purge conversations", len)

    @contextmanager
    def _traced(
        self, claim: AbstractContextManager[T], name: str, count: Callable[[T], int]
    ) -> Iterator[T]:
        background = not trace.get_current_span().get_span_context().is_valid
        with ExitStack() as stack:
            if background:
                with suppress_instrumentation():
                    work = stack.enter_context(claim)
            else:
                work = stack.enter_context(claim)
            items = count(work)
            if items or not background:
                span = stack.enter_context(self._tracer.start_as_current_span(name))
                span.set_attribute("memoria.item_count", items)
            yield work

    def accept_turn(self, turn: NewTurn) -> AcceptOutcome:
        return self._turns.accept_turn(turn)

    def deleted_conversations(self, tenant_id: str, principal_id: str) -> frozenset[str]:
        return self._turns.deleted_conversations(tenant_id, principal_id)

    def delete_conversation(
        self, tenant_id: str, principal_id: str, conversation_id: str, event: NewAuditEvent
    ) -> int | None:
        return self._turns.delete_conversation(tenant_id, principal_id, conversation_id, event)

    def erase_principal(
        self, tenant_id: str, principal_id: str, event: NewAuditEvent, purge: Callable[[], None]
    ) -> Erasure:
        return self._turns.erase_principal(tenant_id, principal_id, event, purge)

    def list_turns(
        self, tenant_id: str, principal_id: str, after_row_id: int, limit: int
    ) -> list[StoredTurn]:
        return self._turns.list_turns(tenant_id, principal_id, after_row_id, limit)

    def list_tombstones(
        self, tenant_id: str, principal_id: str, offset: int, limit: int
    ) -> list[Tombstone]:
        return self._turns.list_tombstones(tenant_id, principal_id, offset, limit)


# --------------------------------------------------------------------------
# Outbox gauges
# --------------------------------------------------------------------------


OUTBOX_READ_INTERVAL_S = 15.0
"""The outbox is read at most this often, however many readers collect (the default export
interval is 60 s): one aggregate over the pending turns' partial index, never per call."""


class OutboxGauges:
    """`memoria.outbox.depth` and `memoria.outbox.oldest_pending_age`, observed on collection."""

    def __init__(
        self,
        stats: Callable[[], OutboxStats],
        meter: metrics.Meter,
        *,
        interval_s: float = OUTBOX_READ_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._stats = stats
        self._interval_s = interval_s
        self._clock = clock
        self._now = now
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._last: OutboxStats | None = None
        meter.create_observable_gauge(
            "memoria.outbox.depth",
            callbacks=[self._depth],
            unit="{turn}",
            description="Accepted turns waiting to be indexed",
        )
        meter.create_observable_gauge(
            "memoria.outbox.oldest_pending_age",
            callbacks=[self._age],
            unit="s",
            description="Seconds since the oldest turn still waiting was accepted (0: none)",
        )

    def _read(self) -> OutboxStats | None:
        with self._lock:
            now = self._clock()
            if self._read_at is None or now - self._read_at >= self._interval_s:
                self._read_at = now
                try:
                    # Its SQL is not traced: a statement every interval, outside any call.
                    with suppress_instrumentation():
                        self._last = self._stats()
                except Exception:  # the store is down: report nothing rather than a guess
                    log.warning("outbox gauges: the turn store could not be read", exc_info=True)
                    self._last = None
            return self._last

    def _depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._read()
        return [] if stats is None else [Observation(stats.pending)]

    def _age(self, _options: CallbackOptions) -> Iterable[Observation]:
        stats = self._read()
        if stats is None:
            return []
        oldest = stats.oldest_accept_time
        age = 0.0 if oldest is None else max((self._now() - oldest).total_seconds(), 0.0)
        return [Observation(age)]
