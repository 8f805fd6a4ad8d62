"""The chunk index's tracing wrapper: every operation of every role gets a client span of its
own name (an operation added to the ports is traced with no change to the wrapper), writes
carry their chunk count, the health probe and the shutdown are not traced, and every answer
is the wrapped index's."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from server.domain.model import (
    EncodedQuery,
    IndexedChunk,
    Owner,
    SearchScope,
    SparseVector,
    TurnKey,
)
from server.domain.ports import ChunkIndex
from server.telemetry.wrappers import TracedChunkIndex
from tests.fakes import InMemoryChunkIndex

T0 = datetime(2026, 12, 1, tzinfo=UTC)
KEY = TurnKey("t", "ana", "c1", "u1")
UNIT = (1.0, 0.0, 0.0, 0.0)


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def traced(spans: InMemorySpanExporter, reader: InMemoryMetricReader) -> ChunkIndex:
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    meter = MeterProvider(metric_readers=[reader])
    wrapper = TracedChunkIndex(
        InMemoryChunkIndex(), tracer.get_tracer("test"), meter.get_meter("test"), "embedded"
    )
    return wrapper  # most roles come through its __getattr__


def role_operations() -> set[str]:
    """Every operation the ports name for the chunk index (the public functions of each role
    `ChunkIndex` is made of)."""
    return {
        name
        for role in ChunkIndex.__mro__
        if role.__module__ == "server.domain.ports"
        for name, member in vars(role).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def test_every_operation_but_the_probe_and_the_shutdown_gets_a_span_of_its_name(
    traced: ChunkIndex, spans: InMemorySpanExporter
) -> None:
    chunk = IndexedChunk(0, "heron", (UNIT,), SparseVector((7,), (1.0,)))
    query = EncodedQuery(UNIT, SparseVector((7,), (1.0,)))
    traced.upsert_turn(KEY, T0, [chunk])
    result = traced.search(SearchScope("t", "ana"), query, 5)
    assert [h.turn_id for h in result.keyword] == ["u1"]  # the wrapped index's answer
    (stale,) = traced.stale_keyword_chunks(2, 10)
    assert traced.count_stale_keyword_chunks(2, Owner("t")) == 1
    traced.set_keyword_vectors([(stale, SparseVector((8,), (1.0,)))], 2)
    assert [p.turn_id for p in traced.conversation_places("t", "ana", "c1")] == ["u1"]
    assert traced.places_near("t", "ana", "c1", T0, 4)[0][0].turn_id == "u1"
    assert traced.turn_chunks("t", "ana", [("c1", "u1")]) == {("c1", "u1"): ("heron",)}
    assert traced.chunk_windows("t", "ana", "c1", [("u1", 0)]) == {("u1", 0): (UNIT,)}
    traced.set_dense_context([(KEY, 0, (UNIT,), UNIT)])
    assert traced.count("t", "ana") == 1
    traced.delete_before("t", "ana", T0)
    assert traced.count("t", "ana") == 1  # a turn at the cutoff is kept
    traced.delete_conversation("t", "ana", "c1")
    traced.delete_principal("t", "ana")
    traced.check()
    traced.close()
    named = {s.name.removeprefix("qdrant "): s for s in spans.get_finished_spans()}
    assert set(named) == role_operations() - set(TracedChunkIndex.UNTRACED)
    assert {"check", "close"} <= role_operations()
    for operation, span in named.items():
        assert span.kind is SpanKind.CLIENT
        assert span.attributes is not None
        assert span.attributes["db.operation.name"] == operation
        assert span.attributes["memoria.qdrant.engine"] == "embedded"
    for write in ("upsert_turn", "set_keyword_vectors"):
        attributes = named[write].attributes
        assert attributes is not None and attributes["memoria.chunk_count"] == 1


def test_upserts_count_turns_and_chunks(traced: ChunkIndex, reader: InMemoryMetricReader) -> None:
    chunks = [IndexedChunk(i, "heron", (UNIT,), SparseVector((7,), (1.0,))) for i in range(3)]
    traced.upsert_turn(KEY, T0, chunks)
    data = reader.get_metrics_data()
    assert data is not None
    sums = {
        metric.name: metric.data.data_points[0].value  # type: ignore[union-attr]
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert sums == {"memoria.index.turns": 1, "memoria.index.chunks": 3}
