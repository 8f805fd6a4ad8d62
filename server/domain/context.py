"""A chunk's neighbours in its conversation: the context of keyword representations 3 and 4,
and of the semantic context vector.

A chunk's keyword vector holds its own terms and, at its representation's weight, those of the
chunks just before and just after it in its conversation: one a side (representation 3), or
two for a model whose semantic side is strong (4; server/domain/keywords.py,
encode_in_context, MODEL_REPRESENTATIONS). For such a model the chunk's semantic multivector
also holds a context vector (`DenseContext`, DENSE_CONTEXT_WEIGHTS). This module decides what
"before" and "after" mean and which vectors a change makes stale:

- The conversation's order is its chunks sorted by turn time, then by the order the turns
  were accepted in (the turn queue's row id, recorded with each point as turn_order: turns of
  equal time are common when a caller stamps a whole session with one time), then by turn id
  compared as text with its digits as numbers (for chunks written before turn_order was
  recorded: `s1-t2` before `s1-t10`), then by chunk index. Inside a turn of several chunks
  the neighbours are the turn's own chunks; at its edges, the neighbouring turns' edge chunks.
- Indexing a turn changes the context of its own chunks and of the chunks within reach of it,
  so all of those are encoded again (`turn_updates`). A turn sent again with another time
  leaves its old neighbours' contexts holding its words until they are indexed again.
  Re-encoding a chunk never changes another's context (a context is made of texts, not of
  vectors), so moving old chunks to a representation touches exactly those chunks
  (`chunk_updates`). A context vector is made of the neighbours' stored windows (not of
  their context vectors), so it too changes only when a neighbour is written.

Everything is read from the chunk index (the texts and windows live nowhere else once a turn
is indexed): the places (no texts) of the chunks nearest the turn in time, then the texts or
windows of the few turns needed, by id. The nearest places are NEAR_PLACES each way by the
turn_time index, so the cost does not grow with the conversation. A side that comes back full
may stop inside a group of equal times, whose order is then unknown, so that group is left out
of the window; when the window cannot place twice the reach in chunks on each side of the turn
(many chunks of one time around it), the whole conversation's places are read instead
(`neighbourhood`). Two turns of one conversation indexed at the same moment by two processes
can each miss the other, leaving one neighbour's context without the other until either turn
is indexed again; each turn's own words and windows are always there, so it is found by them.
A context vector is written with the windows it was read with (the engine has no per-vector
update of a multivector): when a turn is sent again with new text while another processor
writes its neighbour's context, the turn can keep its previous windows until it is indexed
again (rare: a turn re-sent while another thread or process indexes its neighbour, an
IndexTurn that waits included); a chunk deleted meanwhile is never written back (the engine
refuses to update a missing point, and the neighbour's indexing is tried again).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Protocol

from server.domain.keywords import (
    ONE_NEIGHBOUR,
    KeywordEncoder,
    KeywordRepresentation,
    keyword_document,
)
from server.domain.model import (
    ChunkPlace,
    DenseContextUpdate,
    SparseVector,
    StoredChunk,
    TurnKey,
)
from server.domain.ports import ChunkPlaces, DenseVectors

Update = tuple[StoredChunk, SparseVector]

_DIGITS = re.compile(r"(\d+)")


def _natural(turn_id: str) -> tuple[tuple[int, int, str], ...]:
    """A turn id's sort key with its runs of digits compared as numbers."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part)
        for part in _DIGITS.split(turn_id)
        if part
    )


NEAR_PLACES = 32
"""Places read each way from a turn's time to find its neighbours (a window of ~2x this)."""


def conversation_order(places: Iterable[ChunkPlace]) -> list[ChunkPlace]:
    """The conversation's chunks in order (see the module docstring)."""
    return sorted(
        places, key=lambda p: (p.turn_time, p.turn_order, _natural(p.turn_id), p.chunk_index)
    )


def neighbourhood(
    index: ChunkPlaces, key: TurnKey, turn_time: datetime, reach: int
) -> tuple[list[ChunkPlace], list[int]]:
    """The conversation's chunks in order around a turn, and the positions of the turn's own
    chunks among them (none: the turn has no chunks, deleted), with `reach` neighbours known
    for each chunk within `reach` of the turn: the places nearest `turn_time` when they hold
    2 x `reach` places on each side of the turn (or the conversation's ends), else the whole
    conversation's."""
    order, first, last = _window(index, key, turn_time)
    at = [i for i, place in enumerate(order) if place.turn_id == key.turn_id]
    if (
        not at
        or not (first or at[0] >= 2 * reach)
        or not (last or at[-1] <= len(order) - 1 - 2 * reach)
    ):
        order = _whole(index, key)
        at = [i for i, place in enumerate(order) if place.turn_id == key.turn_id]
    return order, at


def _window(
    index: ChunkPlaces, key: TurnKey, turn_time: datetime
) -> tuple[list[ChunkPlace], bool, bool]:
    """The conversation's chunks nearest `turn_time`, in order, with every chunk of a time
    strictly inside the window (so their order is exact), and whether the window starts at
    the conversation's first chunk and ends at its last."""
    before, after = index.places_near(
        key.tenant_id, key.principal_id, key.conversation_id, turn_time, NEAR_PLACES
    )
    # A full side may stop inside a group of equal times: that group is left out.
    low = before[-1].turn_time if len(before) >= NEAR_PLACES else None
    high = after[-1].turn_time if len(after) >= NEAR_PLACES else None
    found = {(p.turn_id, p.chunk_index): p for p in (*before, *after)}
    inside = (
        p
        for p in found.values()
        if (low is None or p.turn_time > low) and (high is None or p.turn_time < high)
    )
    return conversation_order(inside), low is None, high is None


def _whole(index: ChunkPlaces, key: TurnKey) -> list[ChunkPlace]:
    """Every chunk of the key's conversation, in order."""
    return conversation_order(
        index.conversation_places(key.tenant_id, key.principal_id, key.conversation_id)
    )


class KeywordContext:
    """Encodes chunks' keyword vectors with their neighbours, reading both from the index, in
    one keyword representation (`representation`: how many neighbours a side, at what
    weight)."""

    def __init__(
        self,
        index: ChunkPlaces,
        keywords: KeywordEncoder,
        representation: KeywordRepresentation = ONE_NEIGHBOUR,
    ) -> None:
        self._index = index
        self._keywords = keywords
        self._representation = representation

    def turn_updates(self, key: TurnKey, turn_time: datetime) -> list[Update]:
        """New keyword vectors for the turn's stored chunks and the `neighbours` chunks on
        each side of it (their context now holds the turn); none if the turn has no chunks
        (deleted)."""
        reach = self._representation.neighbours
        order, at = neighbourhood(self._index, key, turn_time, reach)
        if not at:
            return []
        targets = range(max(at[0] - reach, 0), min(at[-1] + reach + 1, len(order)))
        return self._vectors(key, order, targets)

    def chunk_updates(self, chunks: Sequence[StoredChunk]) -> list[Update]:
        """New keyword vectors for these chunks, each with its current neighbours. A chunk the
        index no longer places (deleted or re-sent meanwhile) is encoded without context, so
        a caller moving chunks to this representation always moves every chunk it read."""
        by_conversation: dict[TurnKey, list[StoredChunk]] = defaultdict(list)
        for chunk in chunks:
            by_conversation[_conversation(chunk.key)].append(chunk)
        updates: list[Update] = []
        for conversation, group in by_conversation.items():
            order = _whole(self._index, conversation)
            position = {(p.turn_id, p.chunk_index): i for i, p in enumerate(order)}
            wanted = {(c.key.turn_id, c.chunk_index) for c in group}
            found = self._vectors(
                conversation, order, sorted(position[w] for w in wanted if w in position)
            )
            updates += found
            done = {(c.key.turn_id, c.chunk_index) for c, _ in found}
            updates += [
                (c, self._keywords.encode_document(keyword_document(c.text, c.turn_time)))
                for c in group
                if (c.key.turn_id, c.chunk_index) not in done
            ]
        return updates

    def _vectors(
        self, conversation: TurnKey, order: Sequence[ChunkPlace], targets: Iterable[int]
    ) -> list[Update]:
        """The vectors of order[i] for each target i, with the `neighbours` chunks before and
        after it as context. A target whose text cannot be read (deleted meanwhile) is left
        out."""
        targets = list(targets)
        reach = self._representation.neighbours
        turns = sorted(
            {
                order[j].turn_id
                for i in targets
                for j in range(i - reach, i + reach + 1)
                if 0 <= j < len(order)
            }
        )
        texts = self._index.turn_chunks(
            conversation.tenant_id,
            conversation.principal_id,
            [(conversation.conversation_id, turn) for turn in turns],
        )

        def text(j: int) -> str | None:
            if not 0 <= j < len(order):
                return None
            chunks = texts.get((conversation.conversation_id, order[j].turn_id), ())
            index = order[j].chunk_index
            return chunks[index] if index < len(chunks) else None

        updates: list[Update] = []
        for i in targets:
            own = text(i)
            if own is None:
                continue
            place = order[i]
            chunk = StoredChunk(
                key=TurnKey(
                    conversation.tenant_id,
                    conversation.principal_id,
                    conversation.conversation_id,
                    place.turn_id,
                ),
                chunk_index=place.chunk_index,
                text=own,
                turn_time=place.turn_time,
            )
            around = [*range(i - reach, i), *range(i + 1, i + reach + 1)]
            context = [t for t in map(text, around) if t]
            vector = self._keywords.encode_in_context(
                keyword_document(own, place.turn_time), context, self._representation.weight
            )
            updates.append((chunk, vector))
        return updates


DENSE_CONTEXT_WEIGHTS = {"e5-small-v2-int8": 0.2}
"""Models whose chunks also get a context vector on the semantic side (`DenseContext`), with
the weight of each neighbour's vector in it, by the name before the first colon of the
embedder's model id; other models get none.

With e5-small-v2 the neighbour's weight 0.2 was chosen leave-one-out with the keyword side's
two chunks a side (bench/search_encoder.py: 0.2, 0.35 and 0.5 tried, every held-out file
chose 0.2): held out 0.531 / 0.840 / 0.905 / 0.658 (recall@1/5/10, MRR@10) against 0.536 /
0.842 / 0.895 / 0.660 without. On the 8-bit MiniLM it moved nothing (docs/decisions.md)."""


def dense_context_weight(model_id: str) -> float | None:
    """The neighbour weight of the model's context vector, None for a model without one."""
    return DENSE_CONTEXT_WEIGHTS.get(model_id.split(":", 1)[0])


class DenseVectorPlaces(ChunkPlaces, DenseVectors, Protocol):
    """What the semantic context reads and writes: places, windows, context vectors."""


class DenseContext:
    """A chunk's context vector on the semantic side: the unit vector of its own vector (the
    mean of its windows, made unit) plus `weight` times each neighbour's (the chunk just
    before and just after it in its conversation, in the order above). It is searched as one
    more vector of the chunk's multivector (MAX_SIM), so it only ever adds a way to be found:
    a turn whose answer only makes sense after the one before it ("yes, with Mel, last
    Tuesday"). Made of the stored window vectors, read back: nothing is embedded again."""

    def __init__(self, index: DenseVectorPlaces, weight: float) -> None:
        self._index = index
        self._weight = weight

    def turn_updates(self, key: TurnKey, turn_time: datetime) -> list[DenseContextUpdate]:
        """The context vectors of the turn's stored chunks and the chunk on each side of it
        (their context now holds the turn); none if the turn has no chunks (deleted)."""
        order, at = neighbourhood(self._index, key, turn_time, 1)
        if not at:
            return []
        targets = range(max(at[0] - 1, 0), min(at[-1] + 2, len(order)))
        read = sorted({j for i in targets for j in (i - 1, i, i + 1) if 0 <= j < len(order)})
        windows = self._index.chunk_windows(
            key.tenant_id,
            key.principal_id,
            key.conversation_id,
            [(order[j].turn_id, order[j].chunk_index) for j in read],
        )
        own = {
            j: _unit(_mean(found))
            for j in read
            if (found := windows.get((order[j].turn_id, order[j].chunk_index)))
        }
        updates: list[DenseContextUpdate] = []
        for i in targets:
            if i not in own:
                continue  # deleted meanwhile
            context = list(own[i])
            for j in (i - 1, i + 1):
                for d, value in enumerate(own.get(j, ())):
                    context[d] += self._weight * value
            place = order[i]
            chunk = TurnKey(key.tenant_id, key.principal_id, key.conversation_id, place.turn_id)
            found = windows[place.turn_id, place.chunk_index]
            updates.append((chunk, place.chunk_index, found, _unit(context)))
        return updates


def _mean(vectors: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(column) / len(vectors) for column in zip(*vectors, strict=True)]


def _unit(vector: Sequence[float]) -> tuple[float, ...]:
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return tuple(v / norm for v in vector) if norm else tuple(vector)


def _conversation(key: TurnKey) -> TurnKey:
    """The conversation of a turn key, as a key with an empty turn id."""
    return TurnKey(key.tenant_id, key.principal_id, key.conversation_id, "")
