"""The one table from domain errors to gRPC statuses with google.rpc details.

Every error carries an ErrorInfo (reason = the contract's ErrorReason value name, domain
"memoria.v1"); invalid fields add a BadRequest; every RESOURCE_EXHAUSTED adds a RetryInfo, whose
`retry_delay` tells a client when to try again, and the `grpc-retry-pushback-ms` trailer tells
a gRPC retry policy the same, or not to retry a full disk (docs/api.md, "Retries").
Unexpected exceptions become INTERNAL with a generic message and a trace id that points to the
server log, never the exception text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from memoria.v1 import error_reason_pb2
from server.domain.errors import ErrorReason, Internal, MemoriaError

ERROR_DOMAIN = "memoria.v1"
LOCALE = "en-US"
"""The locale of a LocalizedMessage: the model's words are written in English."""

STATUS_OF: Mapping[ErrorReason, grpc.StatusCode] = {
    ErrorReason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorReason.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorReason.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.BLOCK_EMPTY: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.BLOCK_TOO_LONG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.ETAG_MISMATCH: grpc.StatusCode.ABORTED,
    ErrorReason.MEMORY_DISABLED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.INVALID_PAGE_TOKEN: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.STORE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorReason.WRITE_CONFLICT: grpc.StatusCode.ABORTED,
    ErrorReason.CONVERSATION_DELETED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.MALFORMED_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.SECRET_DETECTED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.STORAGE_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

RETRY_DELAY: Mapping[ErrorReason, timedelta] = {
    # A refused call was never started: a second later the calls ahead of it are done (a call
    # takes milliseconds), so the retry finds room; a client's backoff spreads the retries.
    ErrorReason.OVERLOADED: timedelta(seconds=1),
    # Space comes back when an operator frees it, not within a turn: retry much later.
    ErrorReason.STORAGE_FULL: timedelta(seconds=60),
}
"""The RetryInfo delay of each reason whose status is RESOURCE_EXHAUSTED (a unit test keeps
every such reason here)."""

RETRIED_BY_POLICY = frozenset({ErrorReason.OVERLOADED})
"""The reasons a gRPC retry policy retries after their delay; for the others the pushback says
not to retry at all (gRFC A6: a negative pushback), as a full disk is not freed within a
call's deadline and the policy would wait it out."""


def reason_name(reason: ErrorReason) -> str:
    """The contract's value name for a domain reason, e.g. 'ERROR_REASON_BLOCK_TOO_LONG'."""
    name = f"ERROR_REASON_{reason.name}"
    error_reason_pb2.ErrorReason.Value(name)  # fails loudly if the contract lacks it
    return name


def to_status(error: MemoriaError, localized: str | None = None) -> grpc.Status:
    """The gRPC status, with ErrorInfo and (for field errors) BadRequest details; with
    `localized`, a LocalizedMessage (en-US) too: the words a model reads for it
    (server/rpc/tool_refusals.py)."""
    code = STATUS_OF[error.reason]
    info = error_details_pb2.ErrorInfo(
        reason=reason_name(error.reason), domain=ERROR_DOMAIN, metadata=error.metadata
    )
    details = [_pack(info)]
    if error.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=v.field, description=v.description
                )
                for v in error.violations
            ]
        )
        details.append(_pack(bad))
    delay = RETRY_DELAY.get(error.reason)
    if delay is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromTimedelta(delay)
        details.append(_pack(retry))
    if localized is not None:
        details.append(_pack(error_details_pb2.LocalizedMessage(locale=LOCALE, message=localized)))
    status = rpc_status.to_status(
        status_pb2.Status(code=getattr(code_pb2, code.name), message=error.message, details=details)
    )
    if delay is None:
        return status
    # gRPC's retry policy (gRFC A6) ignores RetryInfo but waits as long as this trailer says
    # before its next attempt, instead of its own backoff; "-1": no further attempt.
    milliseconds = int(delay.total_seconds() * 1000)
    pushback = (
        "grpc-retry-pushback-ms",
        str(milliseconds) if error.reason in RETRIED_BY_POLICY else "-1",
    )
    return _Status(status.code, status.details, (*status.trailing_metadata, pushback))


def overloaded_status(message: str) -> grpc.Status:
    """RESOURCE_EXHAUSTED with ERROR_REASON_OVERLOADED and its RetryInfo: what admission
    answers a call it does not start (server/rpc/limits.py)."""
    return to_status(MemoriaError(ErrorReason.OVERLOADED, message))


def internal_error(trace_id: str) -> MemoriaError:
    """A generic INTERNAL error that names only the trace id to look up in the log."""
    return MemoriaError(
        ErrorReason.INTERNAL, f"internal error; reference {trace_id}", details=Internal(trace_id)
    )


def internal_status(trace_id: str) -> grpc.Status:
    """A generic INTERNAL status that names only the trace id to look up in the log."""
    return to_status(internal_error(trace_id))


@dataclass(frozen=True)
class _Status(grpc.Status):
    """A status with more trailing metadata than grpc_status builds (the retry pushback)."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def _pack(
    message: error_details_pb2.ErrorInfo
    | error_details_pb2.BadRequest
    | error_details_pb2.RetryInfo
    | error_details_pb2.LocalizedMessage,
) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed
