"""The one rule for identity values: tenant ids, principal ids and role names.

Authentication (JWT claims, trusted headers) and the domain (erasure's and the audit filter's
`principal_id`) both check identity values with `identity_value_problem`, so an id the service
accepts from a credential is always an id a request field may name, and the other way round.

Why this rule: identity values travel in gRPC metadata, whose values are printable ASCII by
the gRPC spec (0x20-0x7E). Refusing everything else means one byte string always names one
id: a UTF-8 `iso-á` and a Latin-1 `iso-\\xe1` cannot both decode to the same tenant, and no
control, invisible or look-alike character can make two ids that print the same. Leading and
trailing spaces are refused too (a proxy or a copy-paste adds them silently, and `" ana"`
would otherwise be a different principal from `"ana"`), which also refuses a value of only
spaces. 256 characters fit every identity provider's subject we know of (UUIDs, emails, URLs).

The other id rule, for the ids a caller names its own things by (conversation and turn ids:
IndexTurn's fields and a turn reference's `turn.*`), is `id_violations`: any text the service
stores, so any printable Unicode, but nothing invisible that would make two ids look alike.
"""

from __future__ import annotations

import re

from server.domain.errors import FieldViolation
from server.domain.model import TurnRef
from server.domain.text import sanitize

IDENTITY_MAX_CHARS = 256
"""The longest tenant id, principal id or role name accepted."""

_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")


def is_printable_ascii(value: str) -> bool:
    """Whether every character of `value` is printable ASCII (0x20-0x7E); true for ""."""
    return not value or _PRINTABLE_ASCII.fullmatch(value) is not None


def identity_value_problem(value: object) -> str | None:
    """Why `value` is not a valid identity value, or None when it is one.

    Valid: a string of 1 to IDENTITY_MAX_CHARS printable ASCII characters (0x20-0x7E) that
    neither starts nor ends with a space. The answer names the broken part of the rule and
    never quotes the value (it may come from a hostile caller and ends up in logs).
    """
    if not isinstance(value, str):
        return "is not a string"
    if not value:
        return "is empty"
    if len(value) > IDENTITY_MAX_CHARS:
        return f"has {len(value)} characters; at most {IDENTITY_MAX_CHARS}"
    if not is_printable_ascii(value):
        return "must be printable ASCII (0x20-0x7E): no control, tab or non-ASCII characters"
    if value[0] == " " or value[-1] == " ":
        return "must not start or end with a space"
    return None


ID_MAX_CHARS = 128
"""The longest conversation id or turn id accepted."""


def id_violations(field: str, value: str) -> list[FieldViolation]:
    """A conversation or turn id is 1 to ID_MAX_CHARS code points with no control or
    invisible characters and no surrounding whitespace; the problem, named for `field`."""
    if not value:
        return [FieldViolation(field, "is required")]
    if len(value) > ID_MAX_CHARS:
        return [FieldViolation(field, f"has {len(value)} characters; at most {ID_MAX_CHARS}")]
    if value.isascii() and value.isprintable() and value[0] != " " and value[-1] != " ":
        # The usual id, answered without building its sanitized copy (every call naming a
        # turn checks two): printable ASCII has no control, invisible or line-ending
        # character, so `sanitize` would only strip spaces at its ends, and there are none.
        return []
    if sanitize(value) != value or "\n" in value or "\t" in value:
        return [
            FieldViolation(
                field,
                "must not contain control or invisible characters or surrounding whitespace",
            )
        ]
    return []


def turn_reference_violations(turn: TurnRef) -> list[FieldViolation]:
    """A turn reference's ids follow the rule of IndexTurn's ids (fields `turn.*`)."""
    return [
        *id_violations("turn.conversation_id", turn.conversation_id),
        *id_violations("turn.turn_id", turn.turn_id),
    ]
