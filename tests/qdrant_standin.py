"""A stand-in for a Qdrant server, for tests and benchmarks only: Qdrant's gRPC API (the calls
Memoria makes) served from one process over qdrant-client's local mode.

Why: `memoria serve --workers N` runs only on stores several processes can share, PostgreSQL
and a Qdrant server, and no Qdrant server can run on this machine (no package of it is
reachable; building it from source would take most of a CI run). Every test that needs
several serving processes starts this instead. Memoria runs unchanged against it: the same
`--qdrant-url`, the same `QdrantServerChunkIndex` and qdrant-client over gRPC, so chunks
written through one serving process are found through another, as with a real server.

What it is not: a Qdrant server. It implements only what `QdrantServerChunkIndex` calls
(collection exists/create/get, payload indexes, batch update, grouped query, delete, count,
and the REST root that qdrant-client reads for its version check), with local mode's
semantics (pure Python, one call at a time). The contract tests of the server adapter
(tests/contract/test_chunk_index.py) use local mode too; this only puts it behind a socket.

qdrant-client always speaks gRPC to port 6334 of the URL's host, so the stand-in serves gRPC
on 6334 of a random loopback address (127.x.y.z: all of 127.0.0.0/8 is this machine) and its
REST root on a free port of the same address. Run it as
`python -m tests.qdrant_standin --url-file FILE`; it writes the URL to give to
`--qdrant-url` once it serves, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import random
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import grpc
from qdrant_client import QdrantClient
from qdrant_client import grpc as qg
from qdrant_client.conversions.conversion import GrpcToRest, RestToGrpc
from qdrant_client.grpc import (
    collections_service_pb2_grpc,
    points_service_pb2_grpc,
    qdrant_pb2_grpc,
)

# The version of the qdrant-client whose local mode serves: the client checks it against its own.
VERSION = importlib.metadata.version("qdrant-client")
GRPC_PORT = 6334  # where qdrant-client looks, whatever the URL says
ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 30.0
T = TypeVar("T")


class _Store:
    """qdrant-client's local mode behind one lock (it is not thread-safe)."""

    def __init__(self) -> None:
        self.client = QdrantClient(location=":memory:")
        self.lock = threading.Lock()

    def call(self, context: grpc.ServicerContext, work: Callable[[QdrantClient], T]) -> T:
        with self.lock:
            try:
                return work(self.client)
            except (ValueError, KeyError) as error:  # local mode: unknown collection, bad input
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
                raise  # not reached: abort raises


_DONE = qg.UpdateResult(operation_id=0, status=qg.UpdateStatus.Completed)


class _Collections(collections_service_pb2_grpc.CollectionsServicer):  # type: ignore[misc]
    def __init__(self, store: _Store) -> None:
        self._store = store

    def CollectionExists(self, request: Any, context: grpc.ServicerContext) -> Any:
        exists = self._store.call(context, lambda c: c.collection_exists(request.collection_name))
        return qg.CollectionExistsResponse(result=qg.CollectionExists(exists=exists), time=0)

    def Create(self, request: Any, context: grpc.ServicerContext) -> Any:
        vectors = GrpcToRest.convert_vectors_config(request.vectors_config)
        sparse = {
            name: GrpcToRest.convert_sparse_vector_params(params)
            for name, params in request.sparse_vectors_config.map.items()
        }
        metadata = GrpcToRest.convert_payload(request.metadata) if request.metadata else None

        def create(client: QdrantClient) -> bool:  # one step, as two replicas may race here
            if client.collection_exists(request.collection_name):
                return False
            return client.create_collection(
                request.collection_name,
                vectors_config=vectors,
                sparse_vectors_config=sparse or None,
                metadata=metadata,
            )

        if not self._store.call(context, create):
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "collection already exists")
        return qg.CollectionOperationResponse(result=True, time=0)

    def Get(self, request: Any, context: grpc.ServicerContext) -> Any:
        info = self._store.call(context, lambda c: c.get_collection(request.collection_name))
        return qg.GetCollectionInfoResponse(result=RestToGrpc.convert_collection_info(info), time=0)


class _Points(points_service_pb2_grpc.PointsServicer):  # type: ignore[misc]
    def __init__(self, store: _Store) -> None:
        self._store = store

    def CreateFieldIndex(self, request: Any, context: grpc.ServicerContext) -> Any:
        # Local mode keeps no payload indexes (it warns once and filters without them).
        return qg.PointsOperationResponse(result=_DONE, time=0)

    def UpdateBatch(self, request: Any, context: grpc.ServicerContext) -> Any:
        operations = [GrpcToRest.convert_points_update_operation(o) for o in request.operations]
        results = self._store.call(
            context, lambda c: c.batch_update_points(request.collection_name, operations)
        )
        return qg.UpdateBatchResponse(result=[_DONE for _ in results], time=0)

    def QueryGroups(self, request: Any, context: grpc.ServicerContext) -> Any:
        result = self._store.call(
            context,
            lambda c: c.query_points_groups(
                request.collection_name,
                group_by=request.group_by,
                query=GrpcToRest.convert_query(request.query),
                using=request.using if request.HasField("using") else None,
                query_filter=(
                    GrpcToRest.convert_filter(request.filter)
                    if request.HasField("filter")
                    else None
                ),
                limit=request.limit,
                group_size=request.group_size,
                with_payload=GrpcToRest.convert_with_payload_selector(request.with_payload),
            ),
        )
        return qg.QueryGroupsResponse(result=RestToGrpc.convert_groups_result(result), time=0)

    def Delete(self, request: Any, context: grpc.ServicerContext) -> Any:
        selector = GrpcToRest.convert_points_selector(request.points)
        self._store.call(context, lambda c: c.delete(request.collection_name, selector))
        return qg.PointsOperationResponse(result=_DONE, time=0)

    def Count(self, request: Any, context: grpc.ServicerContext) -> Any:
        where = GrpcToRest.convert_filter(request.filter) if request.HasField("filter") else None
        result = self._store.call(
            context, lambda c: c.count(request.collection_name, count_filter=where, exact=True)
        )
        return qg.CountResponse(result=RestToGrpc.convert_count_result(result), time=0)


class _Root(qdrant_pb2_grpc.QdrantServicer):  # type: ignore[misc]
    def HealthCheck(self, request: Any, context: grpc.ServicerContext) -> Any:
        return qg.HealthCheckReply(title="qdrant stand-in", version=VERSION)


class _RestRoot(BaseHTTPRequestHandler):
    """GET / as a Qdrant server answers it: qdrant-client reads the version from it."""

    def do_GET(self) -> None:
        body = json.dumps({"title": "qdrant stand-in", "version": VERSION})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


def _bind_grpc(store: _Store) -> tuple[grpc.Server, str]:
    """A gRPC server on port 6334 of a free random loopback address."""
    rng = random.SystemRandom()
    for _ in range(50):
        host = f"127.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.{rng.randrange(1, 255)}"
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)]
        )
        collections_service_pb2_grpc.add_CollectionsServicer_to_server(_Collections(store), server)
        points_service_pb2_grpc.add_PointsServicer_to_server(_Points(store), server)
        qdrant_pb2_grpc.add_QdrantServicer_to_server(_Root(), server)
        try:
            server.add_insecure_port(f"{host}:{GRPC_PORT}")
        except RuntimeError:  # taken on that address: try another
            continue
        return server, host
    raise SystemExit(f"no loopback address with port {GRPC_PORT} free")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url-file", type=Path, required=True)
    args = parser.parse_args(argv)
    # Local mode warns that payload indexes do nothing; that is known and not news here.
    warnings.filterwarnings("ignore", category=UserWarning, module="qdrant_client")
    store = _Store()
    server, host = _bind_grpc(store)
    rest = ThreadingHTTPServer((host, 0), _RestRoot)
    threading.Thread(target=rest.serve_forever, daemon=True).start()
    server.start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    partial = args.url_file.with_suffix(".partial")
    partial.write_text(f"http://{host}:{rest.server_address[1]}")
    partial.rename(args.url_file)  # whole or absent for the reader
    stopped.wait()
    server.stop(0).wait()
    rest.shutdown()


@contextlib.contextmanager
def qdrant_standin(workdir: Path) -> Iterator[str]:
    """Run the stand-in in a subprocess; yields the URL for `--qdrant-url`. Always stopped."""
    url_file = workdir / "qdrant-standin.url"
    log = (workdir / "qdrant-standin.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.qdrant_standin", "--url-file", str(url_file)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (url_file.exists() and url_file.read_text().startswith("http://")):
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                output = (workdir / "qdrant-standin.log").read_text(errors="replace")
                raise RuntimeError(f"the Qdrant stand-in did not start:\n{output}")
            time.sleep(0.05)  # polling a file the child writes once, bounded
        yield url_file.read_text()
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


if __name__ == "__main__":
    main()
