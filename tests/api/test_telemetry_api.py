"""Telemetry end to end: a real server (SQLite or PostgreSQL) with an in-memory span exporter
and metric reader, called through the stubs; and the OTLP exporters against a stub collector."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.metrics.export import (
    HistogramDataPoint,
    InMemoryMetricReader,
    Metric,
    NumberDataPoint,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.adapters.sql.turns import SqlTurnStore
from server.runtime.app import Running
from server.telemetry import JsonFormatter, build_telemetry, setup_telemetry
from tests.api.conftest import Metadata, server_settings, start_server
from tests.api.test_search_api import ts
from tests.conftest import SQL_KINDS
from tests.otlp_stub import GrpcCollectorStub, HttpCollectorStub

BLOCKS = "memoria.v1.MemoryBlockService"
SEARCH = "memoria.v1.ConversationSearchService"


@dataclass
class Traced:
    """A running server whose telemetry goes to memory."""

    running: Running
    blocks: pb_grpc.MemoryBlockServiceStub
    search: search_grpc.ConversationSearchServiceStub
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    who: Metadata

    def span(self, name: str) -> ReadableSpan:
        (span,) = [s for s in self.spans.get_finished_spans() if s.name == name]
        return span

    def children(self, parent: ReadableSpan) -> list[ReadableSpan]:
        parent_id = parent.context.span_id
        return [
            s
            for s in self.spans.get_finished_spans()
            if s.parent is not None and s.parent.span_id == parent_id
        ]

    def collect(self) -> dict[str, Metric]:
        """One collection: every metric by name."""
        data = self.metrics.get_metrics_data()
        assert data is not None
        return {
            m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }

    def metric(self, name: str) -> Metric:
        metrics = self.collect()
        assert name in metrics, f"no metric {name}"
        return metrics[name]


def numbers(metric: Metric) -> list[NumberDataPoint]:
    """A counter's or gauge's points (any other kind fails the test)."""
    points = [p for p in metric.data.data_points if isinstance(p, NumberDataPoint)]
    assert len(points) == len(metric.data.data_points), f"{metric.name} is not a number"
    return points


def histograms(metric: Metric) -> list[HistogramDataPoint]:
    """A histogram's points (any other kind fails the test)."""
    points = [p for p in metric.data.data_points if isinstance(p, HistogramDataPoint)]
    assert len(points) == len(metric.data.data_points), f"{metric.name} is not a histogram"
    return points


@pytest.fixture(params=SQL_KINDS)
def traced(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Traced]:
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    telemetry = build_telemetry(
        span_processors=[SimpleSpanProcessor(spans)], metric_readers=[reader], sampler=ALWAYS_ON
    )
    # No background indexing: a turn is indexed by the call that waits for it, in its trace.
    settings = server_settings(request.param, request, tmp_path, index_worker_threads=0)
    running, channel = start_server(settings, telemetry=telemetry)
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    try:
        yield Traced(
            running,
            pb_grpc.MemoryBlockServiceStub(channel),
            search_grpc.ConversationSearchServiceStub(channel),
            spans,
            reader,
            (("x-memoria-tenant", tenant), ("x-memoria-principal", "ana")),
        )
    finally:
        channel.close()
        running.stop(0)


def is_sql(span: ReadableSpan) -> bool:
    attributes = span.attributes or {}
    return span.kind is SpanKind.CLIENT and (
        attributes.get("db.system") in ("sqlite", "postgresql")
        or attributes.get("db.system.name") in ("sqlite", "postgresql")
    )


def test_rpc_span_has_method_and_status_and_its_sql_statements_as_children(
    traced: Traced,
) -> None:
    traced.blocks.RewriteMemoryBlock(
        pb.RewriteMemoryBlockRequest(text="Likes tea", writer=block_pb.WRITER_MODEL),
        metadata=traced.who,
    )
    rpc = traced.span(f"{BLOCKS}/RewriteMemoryBlock")
    assert rpc.kind is SpanKind.SERVER
    assert rpc.attributes is not None
    assert rpc.attributes["rpc.method"] == f"{BLOCKS}/RewriteMemoryBlock"
    assert rpc.attributes["rpc.system.name"] == "grpc"
    assert rpc.attributes["rpc.response.status_code"] == "OK"
    assert rpc.status.status_code is StatusCode.UNSET
    sql = [s for s in traced.children(rpc) if is_sql(s)]
    assert sql, [s.name for s in traced.spans.get_finished_spans()]
    assert all(s.context.trace_id == rpc.context.trace_id for s in sql)
    statements = " ".join(str((s.attributes or {}).get("db.statement", "")) for s in sql)
    if traced.running.store.db.autocommit_engine is not None:  # PostgreSQL's raw psycopg path
        assert "memoria_write(" in statements


def test_refused_calls_carry_their_status_code(traced: Traced) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        traced.blocks.RewriteMemoryBlock(
            pb.RewriteMemoryBlockRequest(text="x" * 5000, writer=block_pb.WRITER_MODEL),
            metadata=traced.who,
        )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError):
        traced.blocks.GetMemoryBlock(pb.GetMemoryBlockRequest())  # no identity
    rewrite = traced.span(f"{BLOCKS}/RewriteMemoryBlock")
    assert rewrite.attributes is not None
    assert rewrite.attributes["rpc.response.status_code"] == "INVALID_ARGUMENT"
    assert rewrite.status.status_code is StatusCode.UNSET  # the caller's error, not ours
    get = traced.span(f"{BLOCKS}/GetMemoryBlock")
    assert get.attributes is not None
    assert get.attributes["rpc.response.status_code"] == "UNAUTHENTICATED"
    assert not traced.children(get)  # refused before any store was touched


def test_latency_histogram_by_method_and_status_code(traced: Traced) -> None:
    for _ in range(3):
        traced.blocks.RenderMemoryBlock(pb.RenderMemoryBlockRequest(), metadata=traced.who)
    with pytest.raises(grpc.RpcError):
        traced.blocks.RenderMemoryBlock(pb.RenderMemoryBlockRequest())
    metric = traced.metric("rpc.server.call.duration")
    assert metric.unit == "s"
    points: Sequence[Any] = metric.data.data_points
    by_key = {
        (p.attributes["rpc.method"], p.attributes["rpc.response.status_code"]): p for p in points
    }
    ok = by_key[(f"{BLOCKS}/RenderMemoryBlock", "OK")]
    assert isinstance(ok, HistogramDataPoint)
    assert ok.count == 3
    assert 0 < ok.sum < 3  # seconds
    assert by_key[(f"{BLOCKS}/RenderMemoryBlock", "UNAUTHENTICATED")].count == 1


def test_search_has_qdrant_and_embedding_spans_and_indexing_is_counted(traced: Traced) -> None:
    traced.search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id="c1",
            turn_id="t1",
            question="Which account did the refund go to?",
            answer="To acct-4821, on 2026-11-02.",
            turn_time=ts(),
            wait=True,
        ),
        metadata=traced.who,
    )
    hits = traced.search.SearchConversations(
        search_pb.SearchConversationsRequest(query="acct-4821"), metadata=traced.who
    ).hits
    assert [h.turn_id for h in hits] == ["t1"]

    search = traced.span(f"{SEARCH}/SearchConversations")
    children = {s.name: s for s in traced.children(search)}
    assert {"embed query", "qdrant search"} <= set(children)
    qdrant = children["qdrant search"]
    assert qdrant.kind is SpanKind.CLIENT
    assert qdrant.attributes is not None
    assert qdrant.attributes["db.system.name"] == "qdrant"

    index_turn = traced.span(f"{SEARCH}/IndexTurn")
    (batch,) = [s for s in traced.children(index_turn) if s.name == "index turns"]
    names = {s.name for s in traced.children(batch)}
    assert {"embed documents", "qdrant upsert_turn"} <= names

    turns = numbers(traced.metric("memoria.index.turns"))
    chunks = numbers(traced.metric("memoria.index.chunks"))
    assert sum(p.value for p in turns) == 1
    assert sum(p.value for p in chunks) == 1


def test_block_sizes_and_outbox_gauges(traced: Traced) -> None:
    # The outbox gauges cover the whole database, which other tests' turns may share.
    pending_before = SqlTurnStore(traced.running.store.db).outbox_stats().pending
    traced.search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id="c1", turn_id="t1", question="q", answer="a", turn_time=ts()
        ),
        metadata=traced.who,
    )  # no wait, and no background worker here: it stays queued
    for text in ("Likes tea", "Likes tea\nLives in Porto"):
        traced.blocks.RewriteMemoryBlock(
            pb.RewriteMemoryBlockRequest(text=text, writer=block_pb.WRITER_MODEL),
            metadata=traced.who,
        )
    metrics = traced.collect()
    sizes = histograms(metrics["memoria.block.size"])
    assert [(p.count, p.sum) for p in sizes] == [(2, 9 + 24)]
    (depth,) = numbers(metrics["memoria.outbox.depth"])
    (age,) = numbers(metrics["memoria.outbox.oldest_pending_age"])
    assert depth.value == pending_before + 1
    assert age.value >= 0
    if pending_before == 0:  # then the oldest pending turn is this test's
        assert age.value < 60


def test_json_log_lines_carry_the_trace_id_of_their_span(traced: Traced) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    indexer_log = logging.getLogger("server.domain.indexing")
    indexer_log.addHandler(handler)
    level = indexer_log.level
    indexer_log.setLevel(logging.DEBUG)
    try:
        traced.search.IndexTurn(
            search_pb.IndexTurnRequest(
                conversation_id="c1",
                turn_id="t1",
                question="q",
                answer="a",
                turn_time=ts(),
                wait=True,
            ),
            metadata=traced.who,
        )
    finally:
        indexer_log.removeHandler(handler)
        indexer_log.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (line,) = [x for x in lines if x["message"].startswith("indexing turns")]
    assert line["logger"] == "server.domain.indexing"
    assert line["level"] == "DEBUG"
    batch = traced.span("index turns")
    assert line["trace_id"] == f"{batch.context.trace_id:032x}"
    assert line["span_id"] == f"{batch.context.span_id:016x}"
    rpc = traced.span(f"{SEARCH}/IndexTurn")
    assert batch.context.trace_id == rpc.context.trace_id


def test_log_lines_outside_any_span_have_no_trace_id() -> None:
    record = logging.LogRecord("memoria", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello x"
    assert "trace_id" not in line


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_otlp_export_goes_to_the_configured_endpoint(
    protocol: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collector = GrpcCollectorStub(keep=True) if protocol == "grpc" else HttpCollectorStub(keep=True)
    request.addfinalizer(collector.stop)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "memoria-test")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    running, channel = start_server(
        server_settings("sqlite", request, tmp_path), telemetry=setup_telemetry()
    )
    try:
        pb_grpc.MemoryBlockServiceStub(channel).RenderMemoryBlock(
            pb.RenderMemoryBlockRequest(),
            metadata=(("x-memoria-tenant", "t"), ("x-memoria-principal", "p")),
        )
    finally:
        channel.close()
        running.stop(0)  # flushes the batch span processor and the metric reader
    assert collector.requests["metrics"] >= 1
    names = set()
    for body in collector.bodies("traces"):
        export = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert service["service.name"] == "memoria-test"
            names |= {s.name for ss in resource_spans.scope_spans for s in ss.spans}
    assert f"{BLOCKS}/RenderMemoryBlock" in names


def test_nothing_is_set_up_without_an_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", raising=False)
    telemetry = setup_telemetry()
    assert not telemetry.enabled
    assert telemetry.interceptors() == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not setup_telemetry().enabled
