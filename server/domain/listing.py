"""Listing a person's conversations and reading one (issue 24, item 3).

A settings screen lists the caller's conversations, newest first, each titled by the opening of
its first question with its dates, and opens one to read its turns, without reading every
turn's text (the export does that). Both lists are read from the accepted turns the turn store
holds (indexed or still queued), so:
- deleting a conversation removes it from both at once (its turns go in the transaction that
  writes its tombstone, server/domain/conversations.py), queued turns included; an erased
  principal lists nothing;
- only the caller's own turns are read: the principal comes from the authenticated call, and
  an unknown, deleted or other principal's conversation id has no turns (an empty page);
- the opening of a question is taken when the turn is accepted (`question_opening`) and kept
  after indexing, when the turn's text leaves the queue for the chunk index.

Turns past the tenant's retention are never listed (`TurnsKept`, server/domain/retention.py):
the store reads only turns at or after the cutoff, purged or not.

Paging is AIP-158 with the audit log's signed tokens (`PageTokens`), as the export pages. Both
lists are keyset pages over an index (migration 0012): a token packs the place of the last row
returned, its time and row id, into the one integer a token carries.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from server.domain.audit import PageTokens
from server.domain.errors import FieldViolation, invalid
from server.domain.export import ExportedTurn, held_turns
from server.domain.ids import id_violations
from server.domain.model import ConversationSummary, Identity, ListCursor
from server.domain.ports import ChunkTexts, ConversationListing
from server.domain.retention import KEEP_ALL_TURNS, TurnsKept
from server.domain.secrets import SecretDetector, redact_secrets
from server.domain.text import sanitize

OPENING_CHARS = 100
"""Most characters (code points) of a question kept as its opening."""

DEFAULT_CONVERSATIONS, MAX_CONVERSATIONS = 50, 500
DEFAULT_TURNS, MAX_TURNS = 20, 100
"""Page sizes: a turn carries up to 40,000 characters, so its pages are smaller."""

_WHITESPACE = re.compile(r"\s+")
_EPOCH = datetime(1, 1, 1, tzinfo=UTC)
_ROW_BITS = 64
"""A token's integer is microseconds since year 1, shifted, plus the row id (below 2**63)."""


def question_opening(detector: SecretDetector | None, question: str) -> str:
    """The opening of a question as lists show it: sanitized, credentials replaced (the whole
    question is scanned before it is cut, so no credential is cut in half unseen), whitespace
    runs joined into one space, at most `OPENING_CHARS` code points."""
    redacted = redact_secrets(detector, sanitize(question))
    return _WHITESPACE.sub(" ", redacted).strip()[:OPENING_CHARS]


@dataclass(frozen=True)
class ConversationPage:
    """One page of the caller's conversations, newest first, and the next page's token."""

    conversations: tuple[ConversationSummary, ...]
    next_page_token: str


@dataclass(frozen=True)
class TurnPage:
    """One page of a conversation's turns, oldest first, and the next page's token."""

    turns: tuple[ExportedTurn, ...]
    next_page_token: str


class ConversationList:
    """ListConversations and ListConversationTurns for authenticated callers."""

    def __init__(
        self,
        listing: ConversationListing,
        index: ChunkTexts,
        tokens: PageTokens,
        kept: TurnsKept = KEEP_ALL_TURNS,
    ):
        self._listing = listing
        self._index = index
        self._tokens = tokens
        self._kept = kept

    def conversations(self, who: Identity, page_size: int, page_token: str) -> ConversationPage:
        """The page at `page_token` ("" for the first) of the caller's conversations."""
        if page_size < 0:
            raise invalid(FieldViolation("page_size", "must not be negative"))
        scope = "conversations\x1f" + who.tenant_id + "\x1f" + who.principal_id
        after = _cursor(self._tokens.verify(scope, page_token)) if page_token else None
        size = min(page_size or DEFAULT_CONVERSATIONS, MAX_CONVERSATIONS)
        since = self._kept.since(who.tenant_id)
        rows = self._listing.list_conversations(
            who.tenant_id, who.principal_id, after, size + 1, since
        )
        page = tuple(rows[:size])
        more = len(rows) > size
        token = self._tokens.issue(scope, _position(page[-1].cursor)) if more else ""
        return ConversationPage(page, token)

    def turns(
        self, who: Identity, conversation_id: str, page_size: int, page_token: str
    ) -> TurnPage:
        """The page at `page_token` ("" for the first) of one conversation's turns with their
        text, oldest first."""
        violations = id_violations("conversation_id", conversation_id)
        if page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        if violations:
            raise invalid(*violations)
        scope = "\x1f".join(("turns", who.tenant_id, who.principal_id, conversation_id))
        after = _cursor(self._tokens.verify(scope, page_token)) if page_token else None
        size = min(page_size or DEFAULT_TURNS, MAX_TURNS)
        since = self._kept.since(who.tenant_id)
        rows = self._listing.list_conversation_turns(
            who.tenant_id, who.principal_id, conversation_id, after, size + 1, since
        )
        page = rows[:size]
        token = ""
        if len(rows) > size:
            last = page[-1]
            token = self._tokens.issue(scope, _position(ListCursor(last.turn_time, last.row_id)))
        return TurnPage(tuple(held_turns(self._index, who, page)), token)


def _position(cursor: ListCursor) -> int:
    """The one integer a page token carries for `cursor` (exact to the microsecond)."""
    micros = (cursor.time - _EPOCH) // timedelta(microseconds=1)
    return (micros << _ROW_BITS) | cursor.row_id


def _cursor(position: int) -> ListCursor:
    """The cursor a verified token's integer packs (tokens are signed: it is one we issued)."""
    micros, row_id = divmod(position, 1 << _ROW_BITS)
    return ListCursor(_EPOCH + timedelta(microseconds=micros), row_id)
