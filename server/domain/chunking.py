"""How a finished turn becomes the chunks that search indexes (DESIGN 3). No LLM involved.

The turn text is the sanitized question, a blank line, then the sanitized answer. It is split
into chunks of at most `CHUNK_CHARS` characters (Unicode code points, as everywhere in
Memoria). Each boundary moves back to the nearest position next to whitespace, so no word is
split across two chunks; only a run longer than a chunk with no whitespace at all is cut hard.
At most `MAX_CHUNKS` chunks are indexed; the rest of the turn is not, and the caller is told.
Chunks keep every character, so joining them gives back exactly the indexed text.
"""

from __future__ import annotations

from dataclasses import dataclass

from server.domain.text import sanitize

CHUNK_CHARS = 4000
"""Largest chunk, in code points."""

MAX_CHUNKS = 10
"""Most chunks indexed per turn (40,000 characters)."""

QUESTION_ANSWER_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class ChunkedTurn:
    """The chunks of one turn, in order, and whether text past the last chunk was dropped."""

    chunks: tuple[str, ...]
    truncated: bool

    @property
    def indexed_text(self) -> str:
        """The part of the turn text that is indexed: the chunks joined."""
        return "".join(self.chunks)


def turn_text(question: str, answer: str) -> str:
    """The text of a turn as it is indexed: sanitized question, a blank line, sanitized
    answer (just one of them when the other is empty)."""
    parts = [p for p in (sanitize(question), sanitize(answer)) if p]
    return QUESTION_ANSWER_SEPARATOR.join(parts)


def split_turn(
    question: str, answer: str, *, chunk_chars: int = CHUNK_CHARS, max_chunks: int = MAX_CHUNKS
) -> ChunkedTurn:
    """Split a turn into chunks (see the module docstring). An empty turn has no chunks."""
    return split_text(turn_text(question, answer), chunk_chars=chunk_chars, max_chunks=max_chunks)


def split_text(
    text: str, *, chunk_chars: int = CHUNK_CHARS, max_chunks: int = MAX_CHUNKS
) -> ChunkedTurn:
    """Split already-sanitized text into at most `max_chunks` chunks of at most `chunk_chars`."""
    chunks: list[str] = []
    start = 0
    while start < len(text) and len(chunks) < max_chunks:
        end = _boundary(text, start, chunk_chars)
        chunks.append(text[start:end])
        start = end
    return ChunkedTurn(chunks=tuple(chunks), truncated=start < len(text))


def _boundary(text: str, start: int, chunk_chars: int) -> int:
    """The end of the chunk starting at `start`: the last position within `chunk_chars` that
    does not fall inside a word (a whitespace character on either side), or a hard cut when
    the whole window is one run without whitespace."""
    limit = start + chunk_chars
    if limit >= len(text):
        return len(text)
    for end in range(limit, start, -1):
        if text[end].isspace() or text[end - 1].isspace():
            return end
    return limit
