"""Moving stored chunks to the index's keyword representation (its model's), in place.

A change of what the keyword side indexes (server/domain/keywords.py) must not strand the
chunks indexed before it: each point records the keyword representation it was encoded
with, and the index worker encodes the older ones again from what the index itself holds
(the chunk's text and its turn's time), a batch at a time whenever it has nothing else to
do. Versions 3 and 4 encode each chunk with its neighbours in the conversation, also read
from the index (server/domain/context.py). No model runs (only the keyword vector changes),
nothing is re-sent by callers, and searches keep being served throughout: a chunk is searched
with its old keyword vector until its new one replaces it, and the dense side is untouched.
Resumable by construction: a chunk's recorded version is the progress, so a restarted process
continues where the last one stopped. `memoria reindex` runs the same steps to the end in the
foreground, with progress printed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from server.domain.context import KeywordContext
from server.domain.keywords import ONE_NEIGHBOUR, KeywordEncoder, KeywordRepresentation
from server.domain.model import EVERYONE, Owner
from server.domain.ports import ChunkPlaces, KeywordVectors

log = logging.getLogger(__name__)


class ReindexedChunks(KeywordVectors, ChunkPlaces, Protocol):
    """The chunk index roles the reindexer uses: the stale chunks, their new vectors, and
    their neighbours' places and texts."""


class KeywordReindexer:
    """Encodes the keyword vectors of older-version chunks again, batch by batch: every
    tenant's (what the index worker runs), or one tenant's or principal's (`memoria reindex
    --only-tenant T [--only-principal P]`, to bring one owner to the new representation first)."""

    def __init__(
        self,
        index: ReindexedChunks,
        keywords: KeywordEncoder,
        owner: Owner = EVERYONE,
        representation: KeywordRepresentation = ONE_NEIGHBOUR,
    ) -> None:
        """`representation`: the index's (`keyword_representation` of its model)."""
        self._index = index
        self._context = KeywordContext(index, keywords, representation)
        self._version = representation.version
        self._owner = owner
        self._done = 0

    def run_once(self, limit: int) -> int:
        """Re-encode up to `limit` stale chunks; return how many (0: none left)."""
        stale = self._index.stale_keyword_chunks(self._version, limit, self._owner)
        if not stale:
            return 0
        self._index.set_keyword_vectors(self._context.chunk_updates(stale), self._version)
        if self._done == 0:
            left = self._index.count_stale_keyword_chunks(self._version, self._owner)
            log.info(
                "encoding keyword vectors again (representation %d): %d chunks left",
                self._version,
                left,
            )
        self._done += len(stale)
        return len(stale)

    def run(self, batch: int, progress: Callable[[int, int], None] = lambda d, t: None) -> int:
        """Re-encode every stale chunk, reporting (done, total) after each batch."""
        total = self._index.count_stale_keyword_chunks(self._version, self._owner)
        done = 0
        progress(done, total)
        while count := self.run_once(batch):
            done += count
            progress(done, max(total, done))
        return done
