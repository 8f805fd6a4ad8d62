"""Indexing accepted turns: the background processor of the turn queue, and its retry policy.

A finished turn is accepted durably into a queue (server/domain/intake.py) and indexed here:
its text is split without any LLM into at most ten chunks of at most 4,000 characters
(chunking.py); each chunk gets a semantic (dense, windowed) and a keyword (BM25) vector, the
keyword one of the turn's date and the text (keywords.py), written first with the chunk's own
words and then with its neighbours' (context.py). Writing a turn again replaces it (point ids
are deterministic), so a retry never duplicates. A turn that fails is retried with exponential
backoff, and given up after MAX_INDEX_ATTEMPTS unless the index was unreachable. Deleted
conversations' chunks are purged here too.
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import Protocol

from server.domain.chunking import split_text
from server.domain.context import DenseContext, KeywordContext, dense_context_weight
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.keywords import (
    CONTEXT_FREE_VERSION,
    KeywordEncoder,
    keyword_document,
    keyword_representation,
)
from server.domain.model import ClaimedTurn, IndexedChunk, TurnKey
from server.domain.ports import (
    ChunkPlaces,
    ChunkWriter,
    Clock,
    DenseVectors,
    Embedder,
    KeywordVectors,
    TurnBatch,
    TurnStore,
)

log = logging.getLogger(__name__)

MAX_INDEX_ATTEMPTS = 8
"""A turn that fails this many times is recorded as failed and no longer retried."""
MAX_RETRY_DELAY = timedelta(minutes=5)
OUTAGE_RETRY_DELAY = timedelta(seconds=30)
"""The longest a turn waits between tries while the chunk index is unreachable
(STORE_UNAVAILABLE). An outage is not the turn's fault: it never makes a turn give up (with
MAX_INDEX_ATTEMPTS alone, an outage of about four minutes, 2+4+...+128 s of retries, marked
every waiting turn failed for good), and the short cap has the backlog indexed soon after
the store is back."""


class IndexerChunks(ChunkWriter, KeywordVectors, ChunkPlaces, DenseVectors, Protocol):
    """The chunk index roles the indexer uses: it writes turns and purges conversations, and
    encodes each written turn's keyword vectors again with its neighbours (read by place),
    and for a model with one its semantic context vectors (read from the windows)."""


class Indexer:
    """Turns queued turns into chunks in the index, and purges deleted conversations.

    Used by the background worker (in the server process or `memoria worker`) and by
    IndexTurn calls that wait. Safe to run in several threads and processes at once: the turn
    store's claims keep two processors off the same turn.
    """

    def __init__(
        self,
        turns: TurnStore,
        index: IndexerChunks,
        embedder: Embedder,
        keywords: KeywordEncoder,
        clock: Clock,
        *,
        max_attempts: int = MAX_INDEX_ATTEMPTS,
    ) -> None:
        self._turns = turns
        self._index = index
        self._embedder = embedder
        self._keywords = keywords
        self._representation = keyword_representation(embedder.model_id)
        self._context = KeywordContext(index, keywords, self._representation)
        weight = dense_context_weight(embedder.model_id)
        self._dense = DenseContext(index, weight) if weight is not None else None
        self._clock = clock
        self._max_attempts = max_attempts

    def run_once(self, limit: int) -> int:
        """Index up to `limit` due turns; return how many were claimed."""
        with self._turns.claim(limit, self._clock()) as batch:
            self._process(batch)
            return len(batch.turns)

    def index_now(self, key: TurnKey) -> bool:
        """Index one turn now (waiting for another processor holding it); True once it is
        searchable, False if it is gone (deleted or erased meanwhile). If indexing fails the
        turn stays queued for the worker and STORE_UNAVAILABLE is raised."""
        with self._turns.claim(1, self._clock(), only=key) as batch:
            if not batch.turns:
                return False
            if self._process(batch) == len([t for t in batch.turns if t.text is not None]):
                return True
        raise MemoriaError(
            ErrorReason.STORE_UNAVAILABLE,
            "the turn is stored, but it could not be indexed now; the worker retries it in "
            "the background. Send it again to wait for it once more.",
        )

    def purge_once(self, limit: int) -> int:
        """Remove the chunks of up to `limit` deleted conversations from the index."""
        with self._turns.claim_purges(limit) as purges:
            for purge in purges:
                self._index.delete_conversation(
                    purge.tenant_id, purge.principal_id, purge.conversation_id
                )
            return len(purges)

    def _process(self, batch: TurnBatch) -> int:
        """Chunk and embed the batch's turns together (one model batch), then store each;
        return how many were indexed. A turn without text is already indexed (claimed by key
        after another processor)."""
        chunked = [(t, split_text(t.text).chunks) for t in batch.turns if t.text is not None]
        if chunked:
            log.debug("indexing turns %s", [t.row_id for t, _ in chunked])
        try:
            texts = [chunk for _, chunks in chunked for chunk in chunks]
            vectors = iter(self._embedder.embed_documents(texts))
        except Exception as error:  # the model failed for the whole batch: retry each turn
            for turn, _ in chunked:
                self._failed(batch, turn, error)
            return 0
        indexed_turns = 0
        for turn, chunks in chunked:
            # Written first with its own words only (searchable at once, and marked as such),
            # then it and its neighbours are encoded with their context, read back from the
            # index (server/domain/context.py). A failure in between leaves the turn queued.
            indexed = [
                IndexedChunk(
                    chunk_index=i,
                    text=text,
                    dense=next(vectors),
                    sparse=self._keywords.encode_document(keyword_document(text, turn.turn_time)),
                    keyword_version=CONTEXT_FREE_VERSION,
                    turn_order=turn.row_id,
                )
                for i, text in enumerate(chunks)
            ]
            try:
                self._index.upsert_turn(turn.key, turn.turn_time, indexed)
                self._index.set_keyword_vectors(
                    self._context.turn_updates(turn.key, turn.turn_time),
                    self._representation.version,
                )
                if self._dense is not None:
                    self._index.set_dense_context(
                        self._dense.turn_updates(turn.key, turn.turn_time)
                    )
            except Exception as error:
                self._failed(batch, turn, error)
                continue
            batch.indexed(turn)
            indexed_turns += 1
        return indexed_turns

    def _failed(self, batch: TurnBatch, turn: ClaimedTurn, error: Exception) -> None:
        attempts = turn.attempts + 1
        # Only the exception type: messages of storage errors may quote the turn's text.
        reason = type(error).__name__
        outage = isinstance(error, MemoriaError) and error.reason is ErrorReason.STORE_UNAVAILABLE
        if attempts >= self._max_attempts and not outage:
            log.error("turn %s failed %d times (%s); giving up", turn.row_id, attempts, reason)
            batch.failed(turn, reason, None)
            return
        cap = OUTAGE_RETRY_DELAY if outage else MAX_RETRY_DELAY
        delay = min(timedelta(seconds=2 ** min(attempts, 16)), cap)
        jitter = timedelta(seconds=random.uniform(0, delay.total_seconds() / 4))
        log.warning("turn %s failed (%s); retry %d in %s", turn.row_id, reason, attempts, delay)
        batch.failed(turn, reason, self._clock() + delay + jitter)
