"""Domain errors: each carries a reason from the contract's ErrorReason enum.

The transport maps each reason to a gRPC status code in one table (server/rpc/errors.py); the
domain never names status codes. Member names equal the contract's value names without the
`ERROR_REASON_` prefix (a unit test keeps the two in step).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class ErrorReason(enum.Enum):
    """Why an operation failed; mirrors memoria.v1.ErrorReason."""

    UNAUTHENTICATED = enum.auto()
    PERMISSION_DENIED = enum.auto()
    INVALID_ARGUMENT = enum.auto()
    BLOCK_EMPTY = enum.auto()
    BLOCK_TOO_LONG = enum.auto()
    ETAG_MISMATCH = enum.auto()
    MEMORY_DISABLED = enum.auto()
    INVALID_PAGE_TOKEN = enum.auto()
    STORE_UNAVAILABLE = enum.auto()
    INTERNAL = enum.auto()
    WRITE_CONFLICT = enum.auto()
    CONVERSATION_DELETED = enum.auto()
    MALFORMED_REQUEST = enum.auto()
    SECRET_DETECTED = enum.auto()
    STORAGE_FULL = enum.auto()


@dataclass(frozen=True)
class FieldViolation:
    """One invalid request field: its path (as in the contract) and why it is invalid."""

    field: str
    description: str


class MemoriaError(Exception):
    """An expected failure with a contract reason, a safe message and optional details."""

    def __init__(
        self,
        reason: ErrorReason,
        message: str,
        *,
        metadata: Mapping[str, str] | None = None,
        violations: tuple[FieldViolation, ...] = (),
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata or {})
        self.violations = violations


def invalid(*violations: FieldViolation) -> MemoriaError:
    """An INVALID_ARGUMENT error listing every violated field."""
    fields = ", ".join(v.field for v in violations)
    return MemoriaError(
        ErrorReason.INVALID_ARGUMENT, f"invalid request field(s): {fields}", violations=violations
    )
