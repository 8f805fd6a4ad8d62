"""The interceptor: authentication before any handler, and errors that never leak."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc
import pytest

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import Identity
from server.rpc.auth import unauthenticated
from server.rpc.interceptor import MemoriaInterceptor, current_identity


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


class Details:
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


def test_health_and_reflection_are_not_intercepted() -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda req, ctx: "ok")

    class HealthDetails:
        method = "/grpc.health.v1.Health/Check"

    out = MemoriaInterceptor(Headers()).intercept_service(lambda _d: handler, HealthDetails())
    assert out is handler


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
    """So health follows an outage the moment a call meets it (server/health.py)."""
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
    assert context.status.code is grpc.StatusCode.UNAVAILABLE
    assert asked == ["STORE_UNAVAILABLE"]
