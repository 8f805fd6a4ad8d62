"""The error table: every domain reason exists in the contract and maps to one status; the
ErrorInfo metadata of each reason is declared once (server/domain/errors.py DETAILS_OF), every
raise site uses its reason's declaration, and the error table of docs/api.md documents each key."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from memoria.v1 import error_reason_pb2
from server.domain.errors import (
    DETAILS_OF,
    BlockTooLong,
    ErrorReason,
    EtagMismatch,
    FieldViolation,
    MemoriaError,
    SecretDetected,
    StorageFull,
    metadata_keys,
)
from server.rpc.errors import (
    ERROR_DOMAIN,
    RETRY_DELAY,
    STATUS_OF,
    internal_status,
    overloaded_status,
    to_status,
)


def test_domain_reasons_and_contract_reasons_are_the_same_set() -> None:
    contract = {
        value.name.removeprefix("ERROR_REASON_")
        for value in error_reason_pb2.DESCRIPTOR.enum_types_by_name["ErrorReason"].values
        if value.number != 0
    }
    assert contract == {r.name for r in ErrorReason}


def test_every_reason_has_a_status_code() -> None:
    assert set(STATUS_OF) == set(ErrorReason)
    assert grpc.StatusCode.OK not in STATUS_OF.values()


def test_every_resource_exhausted_status_carries_a_retry_info() -> None:
    exhausted = {r for r, code in STATUS_OF.items() if code is grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert exhausted == set(RETRY_DELAY)
    status = overloaded_status("busy")
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    decoded = status_pb2.Status.FromString(
        dict(status.trailing_metadata)["grpc-status-details-bin"]
    )
    info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
    assert decoded.details[0].Unpack(info) and decoded.details[1].Unpack(retry)
    assert info.reason == "ERROR_REASON_OVERLOADED"
    assert retry.retry_delay.ToTimedelta() == RETRY_DELAY[ErrorReason.OVERLOADED]
    # The same delay as gRPC's own pushback, which a client's retry policy obeys; a full disk
    # tells the policy not to retry (it would wait past the call's deadline).
    assert ("grpc-retry-pushback-ms", "1000") in status.trailing_metadata
    full = to_status(MemoriaError(ErrorReason.STORAGE_FULL, "full"))
    assert ("grpc-retry-pushback-ms", "-1") in full.trailing_metadata


def test_status_carries_error_info_and_bad_request() -> None:
    error = MemoriaError(
        ErrorReason.BLOCK_TOO_LONG,
        "too long",
        details=BlockTooLong(char_count=4001, char_limit=4000),
        violations=(FieldViolation("text", "too long"),),
    )
    status = to_status(error)
    assert status.code is grpc.StatusCode.INVALID_ARGUMENT
    decoded = status_pb2.Status.FromString(
        dict(status.trailing_metadata)["grpc-status-details-bin"]
    )
    info, bad = error_details_pb2.ErrorInfo(), error_details_pb2.BadRequest()
    assert decoded.details[0].Unpack(info) and decoded.details[1].Unpack(bad)
    assert info.reason == "ERROR_REASON_BLOCK_TOO_LONG"
    assert info.domain == ERROR_DOMAIN
    assert dict(info.metadata) == {"char_count": "4001", "char_limit": "4000"}
    assert bad.field_violations[0].field == "text"


def test_internal_status_names_only_the_trace_id() -> None:
    status = internal_status("abc123")
    assert status.code is grpc.StatusCode.INTERNAL
    assert status.details == "internal error; reference abc123"


ROOT = Path(__file__).resolve().parents[2]


def test_metadata_comes_only_from_the_declared_fields() -> None:
    assert metadata_keys(ErrorReason.BLOCK_TOO_LONG) == ("char_count", "char_limit")
    assert metadata_keys(ErrorReason.MEMORY_DISABLED) == ()
    secret = MemoriaError(ErrorReason.SECRET_DETECTED, "m", details=SecretDetected(("a", "b")))
    assert secret.metadata == {"secret_types": "a,b"}
    # A figure not known at the raise site is left out, never sent empty.
    assert MemoriaError(ErrorReason.STORAGE_FULL, "m", details=StorageFull()).metadata == {}
    assert MemoriaError(ErrorReason.ETAG_MISMATCH, "m").metadata == {}


def test_another_reasons_details_are_refused() -> None:
    with pytest.raises(TypeError, match="BLOCK_TOO_LONG carries BlockTooLong"):
        MemoriaError(ErrorReason.BLOCK_TOO_LONG, "m", details=EtagMismatch("e"))
    with pytest.raises(TypeError, match="MEMORY_DISABLED carries no details"):
        MemoriaError(ErrorReason.MEMORY_DISABLED, "m", details=EtagMismatch("e"))


SITES_WITHOUT_DETAILS: set[tuple[str, str]] = set()
"""Raise sites of a reason that declares metadata but cannot know it (none today)."""


def raise_sites() -> list[tuple[str, str, str | None]]:
    """Every `MemoriaError(ErrorReason.X, ..., details=Y(...))` in server/: (where, X, Y).

    Fails on a call that passes free-form `metadata=` or a reason that is not a literal
    `ErrorReason.X` (which this check could not follow)."""
    sites: list[tuple[str, str, str | None]] = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "MemoriaError"):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            keywords = {k.arg: k.value for k in node.keywords}
            assert "metadata" not in keywords, f"{where}: free-form metadata"
            reason = node.args[0] if node.args else keywords.get("reason")
            assert isinstance(reason, ast.Attribute), f"{where}: reason is not ErrorReason.X"
            assert getattr(reason.value, "id", "") == "ErrorReason", where
            details = keywords.get("details")
            if details is None or (isinstance(details, ast.Constant) and details.value is None):
                sites.append((where, reason.attr, None))
                continue
            assert isinstance(details, ast.Call), f"{where}: details is not built at the site"
            sites.append((where, reason.attr, getattr(details.func, "id", "?")))
    return sites


def test_every_raise_site_uses_its_reasons_declared_details() -> None:
    sites = raise_sites()
    assert len(sites) >= 15  # the walk found the raise sites (there are about 20)
    for where, reason, details in sites:
        declared = DETAILS_OF.get(ErrorReason[reason])
        if details is None:
            # Only a reason that declares no metadata, or a site that is not the one
            # that knows it, may leave details out: list the known exceptions.
            assert declared is None or (where, reason) in SITES_WITHOUT_DETAILS, where
        else:
            assert declared is not None and declared.__name__ == details, where
    # Each declared class is used by at least one raise site.
    used = {details for _, _, details in sites}
    assert {cls.__name__ for cls in DETAILS_OF.values()} <= used


def test_the_api_docs_error_table_documents_every_reason_and_key() -> None:
    api_docs = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    rows = {
        match.group(1): match.group(2)
        for match in re.finditer(r"^\| `ERROR_REASON_([A-Z_]+)` \|(.*)\|$", api_docs, re.M)
    }
    assert set(rows) == {reason.name for reason in ErrorReason}
    for reason in ErrorReason:
        for key in metadata_keys(reason):
            assert f"`{key}`" in rows[reason.name], f"{reason.name}: metadata `{key}`"


def _contract_value_comments() -> dict[str, str]:
    """Each ErrorReason value's leading comment in the contract, by value name without the
    prefix (read from proto/, the source the stubs and every client are generated from)."""
    proto = (ROOT / "proto" / "memoria" / "v1" / "error_reason.proto").read_text(encoding="utf-8")
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in proto.splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            pending.append(stripped[2:].strip())
        elif match := re.match(r"ERROR_REASON_([A-Z_]+) = \d+;", stripped):
            comments[match.group(1)] = " ".join(pending)
            pending = []
        else:
            pending = []
    return comments


def test_the_contract_documents_every_reasons_metadata_keys() -> None:
    """The keys declared once in DETAILS_OF are the keys the contract's comments name: a key
    added to a declaration fails here until the contract documents it."""
    comments = _contract_value_comments()
    assert set(comments) == {"UNSPECIFIED"} | {reason.name for reason in ErrorReason}
    for reason in ErrorReason:
        for key in metadata_keys(reason):
            assert f"`{key}`" in comments[reason.name], f"{reason.name}: metadata `{key}`"
