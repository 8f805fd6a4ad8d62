"""The interceptor: authentication before any handler, and errors that never leak."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterator, Mapping
from concurrent import futures
from typing import Any, cast

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import Identity
from server.rpc.auth import unauthenticated
from server.rpc.interceptor import (
    MALFORMED,
    MemoriaInterceptor,
    current_identity,
    tolerant,
)
from server.rpc.ratelimit import RateLimitedLog


class Aborted(Exception):
    """Stands in for grpc's abort, which raises to end the call."""


class FakeContext:
    def __init__(self, metadata: list[tuple[str, str]]):
        self._metadata = metadata
        self.status: grpc.Status | None = None

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata

    def abort_with_status(self, status: grpc.Status) -> None:
        self.status = status
        raise Aborted


class Headers:
    def authenticate(self, metadata: Mapping[str, str]) -> Identity:
        if "x-principal" not in metadata:
            raise unauthenticated("no principal")
        return Identity("t", metadata["x-principal"])


class Details(grpc.HandlerCallDetails):
    method = "/memoria.v1.MemoryBlockService/GetMemoryBlock"


def wrapped(behavior: Any) -> Any:
    handler = grpc.unary_unary_rpc_method_handler(behavior)
    out = MemoriaInterceptor(Headers()).intercept_service(lambda _d: handler, Details())
    assert out is not None
    return out.unary_unary


def test_unauthenticated_call_never_reaches_the_handler() -> None:
    calls: list[object] = []
    context = FakeContext([])
    with pytest.raises(Aborted):
        wrapped(lambda req, ctx: calls.append(req))("request", context)
    assert calls == []
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.UNAUTHENTICATED


def test_handler_sees_the_identity_only_during_the_call() -> None:
    seen = wrapped(lambda req, ctx: current_identity())("r", FakeContext([("x-principal", "ana")]))
    assert seen == Identity("t", "ana")
    with pytest.raises(LookupError):
        current_identity()


def test_domain_errors_become_their_status() -> None:
    def fail(req: object, ctx: object) -> None:
        raise MemoriaError(ErrorReason.ETAG_MISMATCH, "changed")

    context = FakeContext([("x-principal", "ana")])
    with pytest.raises(Aborted):
        wrapped(fail)("r", context)
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.ABORTED


def test_unexpected_errors_are_internal_and_do_not_leak(caplog: pytest.LogCaptureFixture) -> None:
    def crash(req: object, ctx: object) -> None:
        raise RuntimeError("password=hunter2 in a stack trace")

    context = FakeContext([("x-principal", "ana")])
    with caplog.at_level(logging.ERROR), pytest.raises(Aborted):
        wrapped(crash)("r", context)
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.INTERNAL
    assert "hunter2" not in context.status.details
    assert "hunter2" not in str(context.status.trailing_metadata)
    trace_id = context.status.details.rsplit(" ", 1)[-1]
    assert trace_id in caplog.text  # the log has the reference, and the exception


def test_duplicate_identity_headers_are_refused() -> None:
    context = FakeContext([("x-principal", "ana"), ("x-principal", "bob")])
    with pytest.raises(Aborted):
        wrapped(lambda req, ctx: None)("r", context)
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.UNAUTHENTICATED


class HealthDetails(grpc.HandlerCallDetails):
    method = "/grpc.health.v1.Health/Check"


def test_health_and_reflection_are_not_authenticated() -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: f"ok {req}")
    out = MemoriaInterceptor(Headers()).intercept_service(lambda _d: handler, HealthDetails())
    assert out is not None and out.unary_unary is not None
    assert out.unary_unary("r", cast(grpc.ServicerContext, FakeContext([]))) == "ok r"


def test_internal_errors_carry_the_trace_id_of_the_calls_span(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    def crash(req: object, ctx: object) -> None:
        raise RuntimeError("boom")

    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("test")
    context = FakeContext([("x-principal", "ana")])
    with (
        tracer.start_as_current_span("call") as span,
        caplog.at_level(logging.ERROR),
        pytest.raises(Aborted),
    ):
        wrapped(crash)("r", context)
    assert context.status is not None
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert context.status.details.endswith(trace_id)  # the trace holds the call's spans
    assert trace_id in caplog.text


def test_a_store_unavailable_call_asks_for_a_health_probe() -> None:
    """So health follows an outage the moment a call meets it (server/runtime/health.py)."""
    asked: list[str] = []

    def fail(reason: ErrorReason) -> Any:
        def behavior(req: object, ctx: object) -> None:
            raise MemoriaError(reason, "failed")

        handler = grpc.unary_unary_rpc_method_handler(behavior)
        interceptor = MemoriaInterceptor(
            Headers(), on_store_unavailable=lambda: asked.append(reason.name)
        )
        out = interceptor.intercept_service(lambda _d: handler, Details())
        assert out is not None
        return out.unary_unary

    for reason in (ErrorReason.ETAG_MISMATCH, ErrorReason.STORE_UNAVAILABLE):
        context = FakeContext([("x-principal", "ana")])
        with pytest.raises(Aborted):
            fail(reason)("r", context)
        assert context.status is not None
    assert context.status is not None  # the last call's
    assert context.status.code is grpc.StatusCode.UNAVAILABLE
    assert asked == ["STORE_UNAVAILABLE"]


# --- undecodable requests -------------------------------------------------------------------


def reason_of(status: grpc.Status) -> str:
    """The ErrorInfo reason in a status's details."""
    details = dict(status.trailing_metadata)["grpc-status-details-bin"]
    for detail in status_pb2.Status.FromString(details).details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    raise AssertionError("no ErrorInfo")


@pytest.mark.parametrize(
    "data",
    [b"\x0a\x02\xff\xfe", b"\x08\xff", b"\x0a\x05ab", b"\xff\xff\xff\xff"],
    ids=["invalid-utf8", "truncated-varint", "truncated-string", "random"],
)
def test_a_tolerant_deserializer_turns_undecodable_bytes_into_the_sentinel(data: bytes) -> None:
    from memoria.v1 import conversation_search_service_pb2 as pb

    decode = tolerant(pb.IndexTurnRequest.FromString)
    assert decode is not None
    assert decode(data) is MALFORMED
    assert decode(pb.IndexTurnRequest(turn_id="t").SerializeToString()).turn_id == "t"


def intercepted(handler: Any, method: str = Details.method, **kwargs: Any) -> Any:
    class Call(grpc.HandlerCallDetails):
        pass

    Call.method = method
    out = MemoriaInterceptor(Headers(), **kwargs).intercept_service(lambda _d: handler, Call())
    assert out is not None
    return out


def test_an_undecodable_memoria_request_is_malformed_after_authentication() -> None:
    calls: list[object] = []
    out = intercepted(grpc.unary_unary_rpc_method_handler(lambda req, ctx: calls.append(req)))
    context = FakeContext([("x-principal", "ana")])
    with pytest.raises(Aborted):
        out.unary_unary(MALFORMED, context)
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(context.status) == "ERROR_REASON_MALFORMED_REQUEST"
    anonymous = FakeContext([])
    with pytest.raises(Aborted):
        out.unary_unary(MALFORMED, anonymous)
    assert anonymous.status is not None
    assert anonymous.status.code is grpc.StatusCode.UNAUTHENTICATED  # learns nothing more
    assert calls == []


@pytest.mark.parametrize("kind", ["unary_unary", "unary_stream", "stream_unary", "stream_stream"])
def test_grpcs_own_methods_answer_undecodable_requests_as_malformed(kind: str) -> None:
    """Health and reflection (any cardinality) answer MALFORMED_REQUEST, not INTERNAL."""
    seen: list[object] = []

    def behavior(request: Any, context: object) -> Any:
        requests = request if kind.startswith("stream") else iter([request])
        seen.extend(requests)
        return "done"

    handler = getattr(grpc, f"{kind}_rpc_method_handler")(behavior)
    out = intercepted(handler, HealthDetails.method)
    wrapped_behavior = getattr(out, kind)
    request: Any = iter(["fine", MALFORMED, "never"]) if kind.startswith("stream") else MALFORMED
    context = FakeContext([])
    with pytest.raises(Aborted):
        wrapped_behavior(request, context)
    assert context.status is not None
    assert context.status.code is grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(context.status) == "ERROR_REASON_MALFORMED_REQUEST"
    assert seen == (["fine"] if kind.startswith("stream") else [])


def test_undecodable_requests_are_logged_at_most_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    limited = RateLimitedLog(logging.getLogger("test.malformed"), 60.0, clock=lambda: now[0])
    out = intercepted(grpc.unary_unary_rpc_method_handler(lambda r, c: None), malformed_log=limited)
    with caplog.at_level(logging.WARNING, logger="test.malformed"):
        for _ in range(100):
            with pytest.raises(Aborted):
                out.unary_unary(MALFORMED, FakeContext([("x-principal", "ana")]))
        now[0] = 61.0
        with pytest.raises(Aborted):
            out.unary_unary(MALFORMED, FakeContext([("x-principal", "ana")]))
    lines = [r.getMessage() for r in caplog.records if r.name == "test.malformed"]
    assert len(lines) == 2
    assert "99 more" in lines[1]
    assert all(r.exc_info is None for r in caplog.records)  # never a traceback


# --- non-unary Memoria methods --------------------------------------------------------------


STREAMING_METHOD = "/memoria.v1.MemoryBlockService/WatchMemoryBlock"


class StreamingOnly(grpc.GenericRpcHandler):  # type: ignore[type-arg]  # not generic at run time
    """A server-streaming Memoria method (the contract has none) whose handler records calls."""

    def __init__(self) -> None:
        self.calls = 0

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        if handler_call_details.method != STREAMING_METHOD:
            return None

        def watch(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            self.calls += 1
            yield b"secret"

        return grpc.unary_stream_rpc_method_handler(watch)


def test_a_streaming_memoria_method_is_refused_before_its_handler_runs() -> None:
    """A real server with a streaming method: it must not run unauthenticated (or at all)."""
    streaming = StreamingOnly()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[MemoriaInterceptor(Headers())],
        handlers=[streaming],
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(STREAMING_METHOD, None, None)
            for metadata in ((), (("x-principal", "ana"),)):
                with pytest.raises(grpc.RpcError) as caught:
                    list(call(b"", metadata=metadata, timeout=10))
                error = caught.value
                assert isinstance(error, grpc.Call)
                assert error.code() is grpc.StatusCode.UNAUTHENTICATED
                status = rpc_status.from_call(error)
                assert status is not None
                info = error_details_pb2.ErrorInfo()
                assert status.details[0].Unpack(info)
                assert info.reason == "ERROR_REASON_UNAUTHENTICATED"
    finally:
        server.stop(0).wait()
    assert streaming.calls == 0


def test_every_method_of_the_contract_is_unary() -> None:
    """The interceptor serves unary Memoria methods only; a streaming one in the contract
    would be refused at run time, so it must not get there unnoticed (buf lint's UNARY_RPC
    says the same for proto/)."""
    import memoria.v1

    modules = [
        importlib.import_module(f"memoria.v1.{info.name}")
        for info in pkgutil.iter_modules(memoria.v1.__path__)
        if info.name.endswith("_pb2")
    ]
    methods = [
        method
        for module in modules
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]
    assert len(methods) >= 11
    streaming = [m.full_name for m in methods if m.client_streaming or m.server_streaming]
    assert streaming == []
