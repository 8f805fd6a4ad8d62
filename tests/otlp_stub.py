"""A stand-in OpenTelemetry collector on 127.0.0.1: OTLP over gRPC or over HTTP.

It accepts every export and answers success, counting the requests and bytes of each signal
(and keeping the raw requests when asked, for tests to decode). The telemetry test proves
with it that the real exporters send to `OTEL_EXPORTER_OTLP_ENDPOINT` over either protocol;
bench/bench_telemetry.py points the measured server at it so that the exporter's real work
(encoding, sending, retries) is part of what telemetry costs.
"""

from __future__ import annotations

import http.server
import threading
from collections import Counter
from concurrent import futures
from typing import Any

import grpc

HOST = "127.0.0.1"

_SERVICES = {
    "traces": "opentelemetry.proto.collector.trace.v1.TraceService",
    "metrics": "opentelemetry.proto.collector.metrics.v1.MetricsService",
    "logs": "opentelemetry.proto.collector.logs.v1.LogsService",
}


class _Received:
    """What arrived, by signal; safe to update from the server's threads."""

    def __init__(self, keep: bool) -> None:
        self._lock = threading.Lock()
        self._keep = keep
        self.requests: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.kept: list[tuple[str, bytes]] = []

    def add(self, signal: str, body: bytes) -> None:
        with self._lock:
            self.requests[signal] += 1
            self.bytes[signal] += len(body)
            if self._keep:
                self.kept.append((signal, body))

    def bodies(self, signal: str) -> list[bytes]:
        with self._lock:
            return [body for kind, body in self.kept if kind == signal]


class GrpcCollectorStub(_Received):
    """OTLP/gRPC on 127.0.0.1:<free port>; requests stay undecoded bytes (cheap to receive)."""

    def __init__(self, *, keep: bool = False) -> None:
        super().__init__(keep)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        for signal, service in _SERVICES.items():
            handler = grpc.unary_unary_rpc_method_handler(self._export(signal))
            self._server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {"Export": handler}),)
            )
        self.port = self._server.add_insecure_port(f"{HOST}:0")
        self._server.start()
        self.endpoint = f"http://{HOST}:{self.port}"

    def _export(self, signal: str) -> Any:
        def export(request: bytes, _context: grpc.ServicerContext) -> bytes:
            self.add(signal, request)
            return b""  # an empty Export*ServiceResponse: everything accepted

        return export

    def stop(self) -> None:
        self._server.stop(0).wait()


class HttpCollectorStub(_Received):
    """OTLP/HTTP (protobuf) on 127.0.0.1:<free port>: POST /v1/traces, /v1/metrics, /v1/logs."""

    def __init__(self, *, keep: bool = False) -> None:
        super().__init__(keep)
        received = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                signal = self.path.rstrip("/").rsplit("/", 1)[-1]
                received.add(signal, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the counts are the record

        self._server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://{HOST}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
