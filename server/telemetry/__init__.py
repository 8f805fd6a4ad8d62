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

Everything here is wired once by the composition root (`server/runtime/app.py`); no global tracer
or meter provider is installed, so several servers in one process (the tests) each keep
their own.

Layout: `providers.py` (the providers, OTLP set-up, and `Telemetry`, which the composition
root uses to put the rest in place), `logs.py` (the JSON log formatter), `wrappers.py` (spans
and metrics around the ports), `outbox.py` (the outbox gauges); the RPC interceptor lives
with the transport (server/rpc/telemetry.py). The names below are the package's interface.
"""

from server.telemetry.logs import JsonFormatter, configure_logging
from server.telemetry.providers import (
    DEFAULT_TRACE_RATIO,
    Telemetry,
    build_telemetry,
    default_sampler,
    service_resource,
    setup_telemetry,
)

__all__ = [
    "DEFAULT_TRACE_RATIO",
    "JsonFormatter",
    "Telemetry",
    "build_telemetry",
    "configure_logging",
    "default_sampler",
    "service_resource",
    "setup_telemetry",
]
