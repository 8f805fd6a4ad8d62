"""Accepting a finished turn (IndexTurn): checked, its credentials replaced, queued durably.

Rules (DESIGN 3): a finished turn is accepted durably, with its credentials replaced by
placeholders (server/domain/secrets.py), and indexed by a background processor
(server/domain/indexing.py), or in the call when the caller waits for it. A turn of a deleted
conversation is refused, so a late turn cannot bring the conversation back; with memory off,
turns are not stored. Which of these holds is decided in the unit of work that queues the
turn (server/domain/conversations.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from server.domain.chunking import split_text, turn_text
from server.domain.conversations import accept_turn
from server.domain.errors import (
    ConversationDeleted,
    ErrorReason,
    FieldViolation,
    MemoriaError,
    invalid,
)
from server.domain.ids import id_violations
from server.domain.indexing import Indexer
from server.domain.listing import question_opening
from server.domain.model import AcceptOutcome, Identity, NewTurn, TurnKey
from server.domain.ports import Clock, UnitsOfWork
from server.domain.secrets import SecretDetector, redact_secrets


class TurnOutcome(enum.Enum):
    """What IndexTurn did (the contract's IndexTurnOutcome)."""

    ACCEPTED = "accepted"
    INDEXED = "indexed"
    SKIPPED_MEMORY_DISABLED = "skipped_memory_disabled"


@dataclass(frozen=True)
class IndexTurnResult:
    """How a turn was taken, with its chunking."""

    outcome: TurnOutcome
    chunk_count: int
    truncated: bool
    indexed_char_count: int


def _nobody() -> None:
    """No worker to wake (unit tests, benchmarks)."""


@dataclass(frozen=True)
class TurnIntake:
    """IndexTurn for authenticated callers.

    `units` opens the unit of work the turn is queued on; `indexer` indexes it in the call
    when the caller waits; `wake_worker` tells the background worker a turn is queued.
    `secrets` finds the credentials replaced in every turn before it is stored; None replaces
    nothing (unit tests of other rules).
    """

    units: UnitsOfWork
    indexer: Indexer
    clock: Clock
    wake_worker: Callable[[], None] = field(default=_nobody)
    secrets: SecretDetector | None = None

    def index_turn(
        self,
        who: Identity,
        conversation_id: str,
        turn_id: str,
        question: str,
        answer: str,
        turn_time: datetime | None,
        *,
        wait: bool = False,
    ) -> IndexTurnResult:
        """Accept a finished turn durably; index it now when `wait`, else in the background."""
        violations = [
            *id_violations("conversation_id", conversation_id),
            *id_violations("turn_id", turn_id),
        ]
        if turn_time is None:
            violations.append(FieldViolation("turn_time", "is required"))
        # Credentials are replaced before the turn is queued, so neither the queue nor the
        # index nor a search result ever holds one.
        text = redact_secrets(self.secrets, turn_text(question, answer))
        if not text:
            violations.append(
                FieldViolation("question", "question and answer are both empty after sanitizing")
            )
        if violations:
            raise invalid(*violations)
        assert turn_time is not None
        chunked = split_text(text)
        key = TurnKey(who.tenant_id, who.principal_id, conversation_id, turn_id)
        indexed_text = chunked.indexed_text
        outcome = accept_turn(
            self.units,
            NewTurn(
                key=key,
                text=indexed_text,
                turn_time=turn_time,
                accept_time=self.clock(),
                question_opening=question_opening(self.secrets, question),
            ),
        )
        if outcome is AcceptOutcome.CONVERSATION_DELETED:
            raise MemoriaError(
                ErrorReason.CONVERSATION_DELETED,
                "this conversation was deleted, so its turns are no longer accepted; "
                "use a new conversation id",
                details=ConversationDeleted(conversation_id),
            )
        if outcome is AcceptOutcome.MEMORY_DISABLED:
            return IndexTurnResult(TurnOutcome.SKIPPED_MEMORY_DISABLED, 0, False, 0)
        result = TurnOutcome.ACCEPTED
        if wait and self.indexer.index_now(key):
            result = TurnOutcome.INDEXED
        elif not wait:
            self.wake_worker()
        return IndexTurnResult(result, len(chunked.chunks), chunked.truncated, len(indexed_text))
