"""The telemetry interceptor: a server span and a latency measurement for every unary RPC.

Why not the official `opentelemetry-instrumentation-grpc` server interceptor: with this
server it records the wrong status. Memoria's interceptor ends every failed call with
`context.abort_with_status()`, and the official interceptor's context wrapper records a
status only in `abort()` and `set_code()`, so every refused call (ABORTED, INVALID_ARGUMENT,
UNAUTHENTICATED ...) would show as OK. It also builds a new handler and parses the peer
address on every call, and has no latency histogram. This one reads the status the call
really ended with (`context.code()`, which `abort_with_status` sets), builds each method's
handler and attribute sets once, and feeds the span and the histogram from one measurement.

It runs first (outermost), so the span covers authentication and the handler, and is the
current span while they run: SQL, Qdrant and embedding spans become its children, and log
lines carry its trace id. A caller's W3C `traceparent` (any propagator set by
`OTEL_PROPAGATORS`) makes the span a child of the caller's. Streaming calls (reflection,
health Watch) are passed through untouched.

Attributes follow the current RPC semantic conventions: `rpc.system.name` ("grpc"),
`rpc.method` (fully qualified, e.g. "memoria.v1.MemoryBlockService/RenderMemoryBlock") and
`rpc.response.status_code` (the status name, e.g. "OK", "ABORTED").
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from time import perf_counter
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from server.rpc.interceptor import Behavior, UnaryWrappingInterceptor

DURATION_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Histogram buckets from 100 us (a cached render takes ~300 us) to 10 s."""

SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
"""Codes that mark a server span as an error (semantic conventions); a refused request
(INVALID_ARGUMENT, ABORTED ...) is the caller's error and leaves the span status unset."""


class TelemetryInterceptor(UnaryWrappingInterceptor):
    """A SERVER span and one `rpc.server.call.duration` measurement per unary call.

    Durations are queued on the call path and recorded into the SDK histogram by a
    background thread every DRAIN_INTERVAL_S and right before every metric collection, so
    the histogram a reader collects is complete. Why: recording into the SDK histogram costs
    about 5 us per call in a tight loop but measured about 14 us of a request thread's CPU
    in the server, next to a cached render's ~16 us of handler work (docs/decisions.md).
    """

    DRAIN_INTERVAL_S = 1.0

    def __init__(self, tracer: trace.Tracer, meter: metrics.Meter) -> None:
        super().__init__()
        self._tracer = tracer
        self._duration = meter.create_histogram(
            "rpc.server.call.duration",
            unit="s",
            description="Duration of incoming RPCs, by method and status code",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        # The SDK runs observable callbacks just before it reads the synchronous instruments:
        # this one records the queued durations and observes nothing (so it exports nothing).
        meter.create_observable_gauge(
            "memoria.rpc.duration_queue", callbacks=[self._drain_for_collection]
        )
        self._queue: deque[tuple[float, Mapping[str, str]]] = deque()
        self._stop = threading.Event()
        self._drainer = threading.Thread(
            target=self._drain_periodically, name="telemetry-rpc-durations", daemon=True
        )
        self._drainer.start()
        # The propagators' header names: most calls carry none, and then skip extraction.
        self._propagation_fields = frozenset(propagate.get_global_textmap().fields)

    def stop(self) -> None:
        """Stop the background drain and record what is queued (before the meter shuts down)."""
        self._stop.set()
        self._drainer.join()
        self._drain()

    def _drain(self) -> None:
        record, queue = self._duration.record, self._queue
        while True:
            try:
                seconds, attributes = queue.popleft()  # atomic: appends may go on meanwhile
            except IndexError:
                return
            record(seconds, attributes)

    def _drain_periodically(self) -> None:
        while not self._stop.wait(self.DRAIN_INTERVAL_S):
            self._drain()

    def _drain_for_collection(self, _options: CallbackOptions) -> Iterable[Observation]:
        self._drain()
        return ()

    def _wrap(self, behavior: Behavior, method: str) -> Behavior:
        name = method.lstrip("/")
        start_span = self._tracer.start_span
        queue = self._queue.append
        fields = self._propagation_fields
        extract = propagate.extract
        attributes = {"rpc.system.name": "grpc", "rpc.method": name}
        # One attribute set per status code, built now: nothing is assembled per call.
        by_code = {
            code: {**attributes, "rpc.response.status_code": code.name} for code in grpc.StatusCode
        }

        def traced(request: Any, context: grpc.ServicerContext) -> Any:
            started = perf_counter()
            metadata = context.invocation_metadata()
            parent = None
            for key, _value in metadata:
                if key in fields:  # a caller's trace context: continue its trace
                    parent = extract(dict(metadata))
                    break
            span = start_span(name, parent, SpanKind.SERVER, attributes)
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            code = grpc.StatusCode.UNKNOWN
            try:
                response = behavior(request, context)
                code = _code(context) or grpc.StatusCode.OK
                return response
            except BaseException:
                # An abort (Memoria's interceptor maps every error to one) has set the code.
                code = _code(context) or grpc.StatusCode.UNKNOWN
                raise
            finally:
                otel_context.detach(token)
                if span.is_recording():  # most calls' spans are not sampled: no work for them
                    span.set_attribute("rpc.response.status_code", code.name)
                    if code in SERVER_ERRORS:
                        span.set_status(Status(StatusCode.ERROR, code.name))
                    span.end()
                queue((perf_counter() - started, by_code[code]))

        return traced


def _code(context: grpc.ServicerContext) -> grpc.StatusCode | None:
    """The status the call ends with so far: None until the handler or an abort sets one."""
    code: grpc.StatusCode | None = context.code()  # type: ignore[attr-defined]  # not in grpc-stubs
    return code
