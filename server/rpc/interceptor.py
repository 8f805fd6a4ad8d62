"""The one server interceptor: authenticate every Memoria call, then map its errors.

Authentication runs before any handler, so a call without a confirmed identity touches no
store. The identity reaches the servicer through a context variable that lives only for the
call (gRPC runs each unary call on one pool thread). A refused ExecuteToolCall (an unconfirmed
identity, an unexpected error) also carries the words its model reads, as a LocalizedMessage
(server/rpc/tool_refusals.py).

It also gives every method, Memoria's and grpc's own (health, reflection), a clear answer to
request bytes that do not decode: the request deserializer is wrapped so a decode failure
yields a sentinel instead of grpc's "Exception deserializing request!" INTERNAL with a logged
traceback, and the wrapped behaviour answers INVALID_ARGUMENT with ErrorInfo reason
MALFORMED_REQUEST. For Memoria methods the caller is authenticated first (an unauthenticated
caller learns nothing about its bytes); health and reflection stay open, as they were, and
only gain the clear answer. Such calls are logged in at most one line per
MALFORMED_LOG_INTERVAL_S, never with a traceback, so hostile bytes cannot flood the log.

Only unary Memoria methods are served. The identity context variable holds for one call on
one thread, which a streaming method would outlive, so a non-unary Memoria method is refused
with UNAUTHENTICATED (its caller's identity cannot be confirmed for it) until the interceptor
supports it explicitly; tests/unit/test_interceptor.py and buf lint (UNARY_RPC) fail if the
contract gains one.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, Final, TypeAlias

import grpc
from opentelemetry import trace

from server.domain.errors import ErrorReason, MemoriaError
from server.domain.model import Identity
from server.rpc.auth import Authenticator, unauthenticated
from server.rpc.errors import internal_error, to_status
from server.rpc.ratelimit import RateLimitedLog
from server.rpc.tool_refusals import refusal_words

log = logging.getLogger(__name__)

_identity: ContextVar[Identity] = ContextVar("memoria_identity")

MEMORIA_PREFIX = "/memoria."
"""Only Memoria's own services are authenticated; health and reflection stay open."""

MALFORMED_LOG_INTERVAL_S = 60.0
"""At most one log line per this many seconds about undecodable requests."""


def current_identity() -> Identity:
    """The identity of the call being served (set by the interceptor before the handler)."""
    return _identity.get()


Behavior = Callable[[Any, grpc.ServicerContext], Any]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class _Malformed:
    """What a wrapped deserializer returns for bytes that do not decode."""

    def __repr__(self) -> str:
        return "MALFORMED"


MALFORMED: Final = _Malformed()


def tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer`, returning MALFORMED where it would raise.

    Any exception counts (protobuf raises DecodeError for invalid UTF-8, a truncated varint
    or random bytes): it can only come from the caller's bytes, and letting it through makes
    grpc answer INTERNAL and log a traceback.
    """
    if deserializer is None:
        return None
    decode = deserializer

    def deserialize(data: bytes) -> Any:
        try:
            return decode(data)
        except Exception:
            return MALFORMED

    return deserialize


def malformed_error() -> MemoriaError:
    """The error for a request whose bytes are not a message of the method's request type."""
    return MemoriaError(
        ErrorReason.MALFORMED_REQUEST,
        "the request bytes are not a valid message of this method's request type "
        "(for example a string field that is not UTF-8, or a truncated field)",
    )


class UnaryWrappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps the handler of every method it applies to, once per method.

    gRPC asks for a handler on every call, and building one per call showed up in the render
    path's profile, so handlers are kept by method. Subclasses say which unary methods they
    apply to and how they wrap one (`_applies`, `_wrap`), or replace `_wrap_handler` to see
    every handler.
    """

    def __init__(self) -> None:
        self._wrapped: dict[str, Handler] = {}

    def _applies(self, method: str) -> bool:
        return True

    def _wrap(self, behavior: Behavior, method: str) -> Behavior:
        raise NotImplementedError

    def _wrap_handler(self, handler: Handler, method: str) -> Handler:
        """The handler to serve `method` with (the default wraps unary ones it applies to)."""
        if not handler.unary_unary or not self._applies(method):
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self._wrap(handler.unary_unary, method),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method: str = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # an unknown method: grpc answers UNIMPLEMENTED
        wrapped = self._wrap_handler(handler, method)
        self._wrapped[method] = wrapped
        return wrapped


class MemoriaInterceptor(UnaryWrappingInterceptor):
    """Authenticates Memoria calls and turns exceptions into statuses with details."""

    def __init__(
        self,
        authenticator: Authenticator,
        *,
        on_store_unavailable: Callable[[], None] = lambda: None,
        malformed_log: RateLimitedLog | None = None,
    ):
        """`on_store_unavailable` is called when a call fails with STORE_UNAVAILABLE (the
        health monitor probes the stores at once rather than at its next tick)."""
        super().__init__()
        self._auth = authenticator
        self._on_store_unavailable = on_store_unavailable
        self._malformed_log = malformed_log or RateLimitedLog(log, MALFORMED_LOG_INTERVAL_S)

    def _wrap_handler(self, handler: Handler, method: str) -> Handler:
        if not method.startswith(MEMORIA_PREFIX):
            return _answer_malformed(handler, method, self._malformed_seen)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap(handler.unary_unary, method),
                request_deserializer=tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        log.error("%s is not a unary method: refusing every call to it", method)
        return _refusing(handler)

    def _malformed_seen(self, method: str) -> None:
        self._malformed_log.warning("undecodable request to %s refused", method)

    def _wrap(self, behavior: Behavior, method: str) -> Behavior:
        def wrapped(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                identity = self._auth.authenticate(_metadata(context))
                if request is MALFORMED:
                    self._malformed_seen(method)
                    raise malformed_error()
                token = _identity.set(identity)
                try:
                    return behavior(request, context)
                finally:
                    _identity.reset(token)
            except MemoriaError as error:
                if error.reason is ErrorReason.STORE_UNAVAILABLE:
                    self._on_store_unavailable()
                words = refusal_words(method, request, error)
                context.abort_with_status(to_status(error, words))
            except Exception:
                trace_id = _trace_id()
                log.exception("unexpected error in %s (trace_id=%s)", method, trace_id)
                internal = internal_error(trace_id)
                words = refusal_words(method, request, internal)
                context.abort_with_status(to_status(internal, words))

        return wrapped


def _answer_malformed(handler: Handler, method: str, seen: Callable[[str], None]) -> Handler:
    """`handler` (health, reflection: any cardinality) with MALFORMED_REQUEST for requests
    that do not decode, in place of grpc's INTERNAL."""
    deserializer = tolerant(handler.request_deserializer)
    serializer = handler.response_serializer

    def refuse(context: grpc.ServicerContext) -> None:
        seen(method)
        context.abort_with_status(to_status(malformed_error()))

    def checked(request: Any, context: grpc.ServicerContext) -> Any:
        if request is MALFORMED:
            refuse(context)
        return request

    def each_checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for request in requests:
            yield checked(request, context)

    if handler.unary_unary:
        unary_unary = handler.unary_unary
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: unary_unary(checked(request, context), context),
            request_deserializer=deserializer,
            response_serializer=serializer,
        )
    if handler.unary_stream:
        unary_stream = handler.unary_stream
        return grpc.unary_stream_rpc_method_handler(
            lambda request, context: unary_stream(checked(request, context), context),
            request_deserializer=deserializer,
            response_serializer=serializer,
        )
    if handler.stream_unary:
        stream_unary = handler.stream_unary
        return grpc.stream_unary_rpc_method_handler(
            lambda requests, context: stream_unary(each_checked(requests, context), context),
            request_deserializer=deserializer,
            response_serializer=serializer,
        )
    stream_stream = handler.stream_stream
    assert stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(
        lambda requests, context: stream_stream(each_checked(requests, context), context),
        request_deserializer=deserializer,
        response_serializer=serializer,
    )


def _refusing(handler: Handler) -> Handler:
    """A handler of `handler`'s cardinality that refuses every call with UNAUTHENTICATED
    before reading any request or calling the servicer."""
    status = to_status(
        unauthenticated(
            "this Memoria method is not unary, and only unary methods can authenticate "
            "their callers; it is refused until the server supports it"
        )
    )

    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort_with_status(status)

    deserializer = tolerant(handler.request_deserializer)
    serializer = handler.response_serializer
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            refuse, request_deserializer=deserializer, response_serializer=serializer
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            refuse, request_deserializer=deserializer, response_serializer=serializer
        )
    return grpc.stream_stream_rpc_method_handler(
        refuse, request_deserializer=deserializer, response_serializer=serializer
    )


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
