"""The one server interceptor: authenticate every Memoria call, then map its errors.

Authentication runs before any handler, so a call without a confirmed identity touches no
store. The identity reaches the servicer through a context variable that lives only for the
call (gRPC runs each unary call on one pool thread).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import grpc
from opentelemetry import trace

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import Identity
from server.rpc.auth import Authenticator, unauthenticated
from server.rpc.errors import internal_status, to_status

log = logging.getLogger(__name__)

_identity: ContextVar[Identity] = ContextVar("memoria_identity")

MEMORIA_PREFIX = "/memoria."
"""Only Memoria's own services are authenticated; health and reflection stay open."""


def current_identity() -> Identity:
    """The identity of the call being served (set by the interceptor before the handler)."""
    return _identity.get()


Behavior = Callable[[Any, grpc.ServicerContext], Any]


class UnaryWrappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps the behaviour of every unary method it applies to, once per method.

    gRPC asks for a handler on every call, and building one per call showed up in the render
    path's profile, so wrapped handlers are kept by method. Subclasses say which methods they
    apply to and how they wrap one.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def _applies(self, method: str) -> bool:
        return True

    def _wrap(self, behavior: Behavior, method: str) -> Behavior:
        raise NotImplementedError

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: str = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = continuation(handler_call_details)
        if handler is None or not handler.unary_unary or not self._applies(method):
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._wrap(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._wrapped[method] = wrapped
        return wrapped


class MemoriaInterceptor(UnaryWrappingInterceptor):
    """Authenticates Memoria calls and turns exceptions into statuses with details."""

    def __init__(
        self,
        authenticator: Authenticator,
        *,
        on_store_unavailable: Callable[[], None] = lambda: None,
    ):
        """`on_store_unavailable` is called when a call fails with STORE_UNAVAILABLE (the
        health monitor probes the stores at once rather than at its next tick)."""
        super().__init__()
        self._auth = authenticator
        self._on_store_unavailable = on_store_unavailable

    def _applies(self, method: str) -> bool:
        return method.startswith(MEMORIA_PREFIX)

    def _wrap(self, behavior: Behavior, method: str) -> Behavior:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                identity = self._auth.authenticate(_metadata(context))
                token = _identity.set(identity)
                try:
                    return behavior(request, context)
                finally:
                    _identity.reset(token)
            except MemoriaError as error:
                if error.reason is ErrorReason.STORE_UNAVAILABLE:
                    self._on_store_unavailable()
                context.abort_with_status(to_status(error))
            except Exception:
                trace_id = _trace_id()
                log.exception("unexpected error in %s (trace_id=%s)", method, trace_id)
                context.abort_with_status(internal_status(trace_id))

        return wrapped


def _trace_id() -> str:
    """The call's trace id when telemetry traces it (the log line and the trace then share
    it), else a fresh random one: either way 32 hex digits that find the log line."""
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        return trace.format_trace_id(span_context.trace_id)
    return uuid.uuid4().hex


def _metadata(context: grpc.ServicerContext) -> dict[str, str]:
    """Call metadata as a dict; a header sent twice with different values is refused."""
    result: dict[str, str] = {}
    for key, value in context.invocation_metadata():
        if isinstance(value, bytes):
            continue  # binary (-bin) headers never carry identity
        if key in result and result[key] != value:
            raise unauthenticated(f"header {key} was sent more than once")
        result[key] = value
    return result
