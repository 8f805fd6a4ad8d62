"""A small real OpenAI-compatible embeddings server for tests, on 127.0.0.1 in a thread.

`POST /v1/embeddings` answers the vectors of the real local model (all-MiniLM-L6-v2, one
vector per input: what sentence-transformers computes for it), so search over them means
something. The `data` list comes back in reverse order with the right `index` fields, as the
API allows, so a client that does not sort by index gets the vectors wrong.

A test tells it to misbehave through `faults`: each request takes the next fault queued (none
left: it answers normally). Every request is recorded (inputs, headers, body) so a test can
check what was sent. It speaks HTTP/1.0 and closes each connection after its answer, so no
client keeps a socket of it open after a test.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from server.domain.ports import Embedder

SECRET_BODY = "the-endpoint-said-this-and-it-quotes-the-input"
"""Text in every error body: it must never reach a log line, an error or a gRPC status."""


@dataclass(frozen=True)
class Fault:
    """How one request misbehaves.

    `status`: answer this HTTP status (with an OpenAI-style error body). `retry_after`: and
    this Retry-After header. `hang`: answer nothing until the server stops (beyond any client
    timeout). `dimension`: cut each vector to this length. `scale`: multiply each vector
    (not unit length). `body`: answer exactly these bytes with status 200. `drop`: close the
    connection without an answer.
    """

    status: int | None = None
    retry_after: str | None = None
    hang: bool = False
    dimension: int | None = None
    scale: float | None = None
    body: bytes | None = None
    drop: bool = False


@dataclass
class Request:
    """What one request carried."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def inputs(self) -> list[str]:
        inputs: list[str] = self.body["input"]
        return inputs


@dataclass
class EmbeddingEndpoint:
    """The running server: its base URL, the queued faults and the requests it saw."""

    base_url: str
    model: Embedder
    faults: deque[Fault] = field(default_factory=deque)
    requests: list[Request] = field(default_factory=list)
    failing: Fault | None = None
    """A fault every request gets (after the queued ones) until set back to None."""
    stopped: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_fault(self) -> Fault | None:
        with self.lock:
            return self.faults.popleft() if self.faults else self.failing


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test's assertions say what matters."""

    def do_POST(self) -> None:
        endpoint = self.server.endpoint
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        with endpoint.lock:
            endpoint.requests.append(
                Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
        fault = endpoint.next_fault()
        if self.path != "/v1/embeddings":
            self._answer(404, {"error": {"message": SECRET_BODY, "type": "not_found"}})
            return
        if fault is not None and fault.drop:
            self.close_connection = True
            self.connection.shutdown(2)
            return
        if fault is not None and fault.hang:
            endpoint.stopped.wait(30)  # until the test's server stops (bounded regardless)
            return
        if fault is not None and fault.status is not None:
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            error = {"message": SECRET_BODY, "type": "test_error", "code": str(fault.status)}
            self._answer(fault.status, {"error": error}, headers)
            return
        if fault is not None and fault.body is not None:
            self._send(200, fault.body, {})
            return
        inputs: list[str] = body["input"]
        data = []
        for index, text in enumerate(inputs):
            vector = list(endpoint.model.embed_query(text))
            if fault is not None and fault.dimension is not None:
                vector = vector[: fault.dimension]
            if fault is not None and fault.scale is not None:
                vector = [x * fault.scale for x in vector]
            data.append({"object": "embedding", "index": index, "embedding": vector})
        data.reverse()
        self._answer(200, {"object": "list", "data": data, "model": body["model"]})

    def _answer(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers or {})

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: EmbeddingEndpoint


@contextmanager
def embedding_endpoint(model: Embedder) -> Iterator[EmbeddingEndpoint]:
    """An endpoint serving `model`'s vectors at `<base_url>/embeddings`; stopped on exit."""
    server = _Server(("127.0.0.1", 0), _Handler)
    endpoint = EmbeddingEndpoint(f"http://127.0.0.1:{server.server_address[1]}/v1", model)
    server.endpoint = endpoint
    thread = threading.Thread(target=server.serve_forever, name="embedding-endpoint")
    thread.start()
    try:
        yield endpoint
    finally:
        endpoint.stopped.set()  # releases hanging requests
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
