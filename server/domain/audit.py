"""Reading the audit log: who may read what, filters, and opaque signed page tokens."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import datetime

from server.domain.errors import ErrorReason, FieldViolation, MemoriaError, invalid
from server.domain.ids import identity_value_problem
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
    """Signs and verifies page tokens so a client cannot forge, alter or reuse them.

    A token is `base64url(mac || body)` without padding, where body is the canonical JSON
    `{"v":1,"b":<id to continue below>}` and mac an HMAC-SHA256 (first 16 bytes) over the
    scope (caller and filters) and the body's exact bytes. The whole token is authenticated:
    verify accepts only the exact string `issue` would produce, so any change (version,
    keys, their order, whitespace, padding, base64 alphabet, trailing bits) is refused.
    """

    VERSION = 1

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("page token secret must have at least 16 bytes")
        self._secret = secret

    def _mac(self, scope: str, body: bytes) -> bytes:
        msg = scope.encode() + b"\x00" + body
        return hmac.new(self._secret, msg, hashlib.sha256).digest()[:_MAC_BYTES]

    @classmethod
    def _body(cls, before: int) -> bytes:
        return json.dumps({"v": cls.VERSION, "b": before}, separators=(",", ":")).encode()

    def issue(self, scope: str, before: int) -> str:
        """A token that continues the listing below event id `before`, bound to `scope`."""
        body = self._body(before)
        return _b64(self._mac(scope, body) + body)

    def verify(self, scope: str, token: str) -> int:
        """The id to continue below; INVALID_PAGE_TOKEN for anything not issued for `scope`."""
        if len(token) > _MAX_TOKEN_CHARS or _B64URL.fullmatch(token) is None:
            raise _bad_token()
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise _bad_token() from None
        # One byte string has one encoding: refuse the others (e.g. other trailing bits).
        if _b64(raw) != token or len(raw) <= _MAC_BYTES:
            raise _bad_token()
        mac, body = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(scope, body)):
            raise _bad_token()
        # Authentic, so issued by a server with this secret; still check it is the current
        # format (a future version would be refused here rather than misread).
        try:
            before = json.loads(body)["b"]
        except (ValueError, KeyError, TypeError):
            raise _bad_token() from None
        if not isinstance(before, int) or isinstance(before, bool) or body != self._body(before):
            raise _bad_token()
        return before


_MAC_BYTES = 16
_MAX_TOKEN_CHARS = 512
"""Far above any token issued (about 50 characters); longer input is refused unread."""
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


def _b64(raw: bytes) -> str:
    """base64url without padding, the only encoding a token has."""
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


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
        if req.principal_id not in ("", ALL_PRINCIPALS):
            problem = identity_value_problem(req.principal_id)
            if problem is not None:
                violations.append(FieldViolation("principal_id", problem))
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
