"""Domain errors: each carries a reason from the contract's ErrorReason enum.

The transport maps each reason to a gRPC status code in one table (server/rpc/errors.py); the
domain never names status codes. Member names equal the contract's value names without the
`ERROR_REASON_` prefix (a unit test keeps the two in step).

The ErrorInfo metadata a reason carries is declared here, once: one frozen dataclass per reason
that has any (`DETAILS_OF`), whose field names are the metadata keys. A raise site passes an
instance of its reason's class, so a key cannot be chosen, misspelt or forgotten at the site
(mypy checks the fields; `MemoriaError` refuses another class). The error table of
docs/api.md documents every declared key (a unit test checks it).
"""

from __future__ import annotations

import dataclasses
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
    OVERLOADED = enum.auto()


@dataclass(frozen=True)
class FieldViolation:
    """One invalid request field: its path (as in the contract) and why it is invalid."""

    field: str
    description: str


@dataclass(frozen=True)
class BlockTooLong:
    """BLOCK_TOO_LONG: how long the refused block is and the limit it is over, both in
    characters as DESIGN 2 counts them, so the model can trim without counting itself."""

    char_count: int
    char_limit: int


@dataclass(frozen=True)
class EtagMismatch:
    """ETAG_MISMATCH: the stored block's etag now ("" when there is no block), so a settings
    screen can tell whether its copy is stale without another read."""

    current_etag: str


@dataclass(frozen=True)
class ConversationDeleted:
    """CONVERSATION_DELETED: the deleted conversation the refused turn belongs to."""

    conversation_id: str


@dataclass(frozen=True)
class SecretDetected:
    """SECRET_DETECTED: the kinds of credential found (never the credential), in order of
    first appearance; in the metadata, comma-separated."""

    secret_types: tuple[str, ...]


@dataclass(frozen=True)
class StorageFull:
    """STORAGE_FULL: the embedded data directory's free bytes and the watermark under which
    writes are refused. Unknown (left out of the metadata) when the database itself reported
    its disk full."""

    free_bytes: int | None = None
    watermark_bytes: int | None = None


@dataclass(frozen=True)
class Internal:
    """INTERNAL: the id to look the failure up by in the server log (nothing else leaks)."""

    trace_id: str


ErrorDetails = (
    BlockTooLong | EtagMismatch | ConversationDeleted | SecretDetected | StorageFull | Internal
)
"""Every class of metadata a MemoriaError can carry."""

DETAILS_OF: Mapping[ErrorReason, type[ErrorDetails]] = {
    ErrorReason.BLOCK_TOO_LONG: BlockTooLong,
    ErrorReason.ETAG_MISMATCH: EtagMismatch,
    ErrorReason.CONVERSATION_DELETED: ConversationDeleted,
    ErrorReason.SECRET_DETECTED: SecretDetected,
    ErrorReason.STORAGE_FULL: StorageFull,
    ErrorReason.INTERNAL: Internal,
}
"""The one declaration of which reason carries which metadata; a reason not named carries
none."""


def metadata_keys(reason: ErrorReason) -> tuple[str, ...]:
    """The ErrorInfo metadata keys `reason` may carry, as declared in DETAILS_OF."""
    details = DETAILS_OF.get(reason)
    return () if details is None else tuple(f.name for f in dataclasses.fields(details))


class MemoriaError(Exception):
    """An expected failure with a contract reason, a safe message and optional details.

    `details` must be an instance of the reason's class in DETAILS_OF (or None, for a reason
    that declares none, or when a reason's figures are not known at the raise site); anything
    else is a programming error and raises TypeError at once.
    """

    def __init__(
        self,
        reason: ErrorReason,
        message: str,
        *,
        details: ErrorDetails | None = None,
        violations: tuple[FieldViolation, ...] = (),
    ) -> None:
        super().__init__(message)
        declared = DETAILS_OF.get(reason)
        if details is not None and type(details) is not declared:
            raise TypeError(
                f"{reason.name} carries {declared.__name__ if declared else 'no'} details, "
                f"not {type(details).__name__}"
            )
        self.reason = reason
        self.message = message
        self.details = details
        self.violations = violations

    @property
    def metadata(self) -> dict[str, str]:
        """The ErrorInfo metadata: one entry per known field of the details."""
        if self.details is None:
            return {}
        return {
            field.name: _metadata_value(value)
            for field in dataclasses.fields(self.details)
            if (value := getattr(self.details, field.name)) is not None
        }


def _metadata_value(value: object) -> str:
    """ErrorInfo metadata values are strings: numbers in decimal, lists comma-separated."""
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def invalid(*violations: FieldViolation) -> MemoriaError:
    """An INVALID_ARGUMENT error listing every violated field."""
    fields = ", ".join(v.field for v in violations)
    return MemoriaError(
        ErrorReason.INVALID_ARGUMENT, f"invalid request field(s): {fields}", violations=violations
    )
