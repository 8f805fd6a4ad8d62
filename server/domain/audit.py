"""Reading the audit log: who may read what, filters, and opaque signed page tokens."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime

from server.domain.errors import ErrorReason, FieldViolation, MemoriaError, invalid
from server.domain.model import AuditAction, AuditEvent, AuditQuery, Identity
from server.domain.ports import MemoryStore

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
ALL_PRINCIPALS = "-"
"""`principal_id` value that asks for every principal of the tenant (AIP-159 style)."""


@dataclass(frozen=True)
class AuditRequest:
    """A request to list audit events, as the transport decoded it."""

    page_size: int = 0
    page_token: str = ""
    principal_id: str = ""
    actions: frozenset[AuditAction] = frozenset()
    start_time: datetime | None = None
    end_time: datetime | None = None


@dataclass(frozen=True)
class AuditPage:
    """One page of events, newest first, and the token of the next page ("" at the end)."""

    events: tuple[AuditEvent, ...]
    next_page_token: str


class PageTokens:
    """Signs and verifies page tokens so a client cannot forge or reuse them across queries.

    A token carries the id to continue below and is bound (by an HMAC over both) to the
    caller and the filters it was issued for.
    """

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("page token secret must have at least 16 bytes")
        self._secret = secret

    def _mac(self, scope: str, before: int) -> bytes:
        msg = f"{scope}\x00{before}".encode()
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:16]

    def issue(self, scope: str, before: int) -> str:
        body = json.dumps({"v": 1, "b": before}, separators=(",", ":")).encode()
        raw = self._mac(scope, before) + body
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def verify(self, scope: str, token: str) -> int:
        """The id to continue below; INVALID_PAGE_TOKEN for anything not issued for `scope`."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            mac, body = raw[:16], raw[16:]
            before = json.loads(body)["b"]
            if not isinstance(before, int) or isinstance(before, bool):
                raise ValueError("bad cursor")
        except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise _bad_token() from None
        if not hmac.compare_digest(mac, self._mac(scope, before)):
            raise _bad_token()
        return before


def _bad_token() -> MemoriaError:
    return MemoriaError(
        ErrorReason.INVALID_PAGE_TOKEN,
        "the page token is not valid for this caller and these filters; start again without it",
        violations=(FieldViolation("page_token", "not issued for this request"),),
    )


class AuditLog:
    """Lists audit events for authenticated callers."""

    def __init__(self, store: MemoryStore, tokens: PageTokens):
        self._store = store
        self._tokens = tokens

    def list(self, who: Identity, req: AuditRequest) -> AuditPage:
        """A page of events the caller may read, newest first."""
        violations: list[FieldViolation] = []
        if req.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        if req.start_time and req.end_time and req.start_time >= req.end_time:
            violations.append(FieldViolation("end_time", "must be after start_time"))
        if violations:
            raise invalid(*violations)
        principal = _readable_principal(who, req.principal_id)
        scope = _scope(who, principal, req)
        before = self._tokens.verify(scope, req.page_token) if req.page_token else None
        size = min(req.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        query = AuditQuery(
            principal_id=principal,
            actions=req.actions,
            start_time=req.start_time,
            end_time=req.end_time,
            before_event_id=before,
            limit=size + 1,  # one more tells whether another page exists
        )
        events = self._store.list_audit(who.tenant_id, query)
        page = tuple(events[:size])
        more = len(events) > size
        token = self._tokens.issue(scope, page[-1].event_id) if more and page else ""
        return AuditPage(page, token)


def _readable_principal(who: Identity, requested: str) -> str | None:
    """Whose events the caller may read: its own, or (administrators) any of its tenant's."""
    if requested in ("", who.principal_id):
        return who.principal_id
    if not who.is_tenant_admin:
        raise MemoriaError(
            ErrorReason.PERMISSION_DENIED,
            "only a tenant administrator may read another principal's audit events",
        )
    return None if requested == ALL_PRINCIPALS else requested


def _scope(who: Identity, principal: str | None, req: AuditRequest) -> str:
    """Everything a page token is bound to: caller, tenant and filters."""
    parts = [
        who.tenant_id,
        who.principal_id,
        principal if principal is not None else ALL_PRINCIPALS,
        ",".join(sorted(a.value for a in req.actions)),
        req.start_time.isoformat() if req.start_time else "",
        req.end_time.isoformat() if req.end_time else "",
    ]
    return "\x1f".join(parts)
