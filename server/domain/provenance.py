"""Where each line of the current block came from: when it was added, by whom (the model or the
person) and in which conversation and turn (DESIGN 8, "every call belongs to a turn"), so
memory is never opaque.

Origins are derived from the audit log, not stored beside the block (docs/decisions.md): every
rewrite event already keeps its added lines (cut to the audit's line length), its writer, its
time and now its turn. A line's origin is the newest rewrite that added it, read newest first
and never past the block's last deletion or erasure: the block that existed before is gone,
and those events' lines are blanked anyway (deleted content is never kept), so an origin can
never outlive its content, and nothing new is written on the write path.

What the audit allows, said plainly:
- A line longer than the audit keeps is matched by its kept start (the first
  `line_chars - 1` code points and the cut mark): two such lines with the same start take the
  newer one's origin.
- A line the block holds more than once is matched to the newest additions of that text, later
  copies first; which copy an older write added is not recorded, so their order is a guess.
- A line with no rewrite event that added it (written before the audit kept lines, or by other
  means) has no origin: the API omits it and the page says it was not recorded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from server.domain.model import AuditAction, AuditEvent, TurnRef, Writer
from server.domain.text import lines_of, truncate_line

HISTORY_ACTIONS = frozenset(
    {
        AuditAction.BLOCK_REWRITTEN,
        AuditAction.BLOCK_DELETED,
        AuditAction.PRINCIPAL_DATA_ERASED,
    }
)
"""The events an origin is looked for in: rewrites, and the deletions that end the search."""


@dataclass(frozen=True)
class LineOrigin:
    """The write that added one line of the current block (its 0-based index in the lines)."""

    line_index: int
    writer: Writer
    add_time: datetime
    turn: TurnRef | None
    """The turn the write was made in; None when it named none (a settings screen's write)."""


def line_origins(
    text: str,
    events_newest_first: Iterable[AuditEvent],
    *,
    line_chars: int,
    as_of: datetime | None = None,
) -> tuple[LineOrigin, ...]:
    """The origins of the non-blank lines of `text` found in the events, ordered by line.

    `events_newest_first` is consumed only until every line has its origin or a deletion or
    erasure is met, so a caller can read the audit a page at a time. Events after `as_of` (the
    block's update time) belong to later versions than the one shown and are passed over.
    `line_chars` is the audit's line length (each added line is kept cut to it).
    """
    unresolved: dict[str, list[int]] = defaultdict(list)
    for index, line in enumerate(lines_of(text)):
        if line.strip():
            unresolved[truncate_line(line, line_chars)].append(index)
    found: list[LineOrigin] = []
    for event in events_newest_first:
        if not unresolved:
            break
        if event.action in (AuditAction.BLOCK_DELETED, AuditAction.PRINCIPAL_DATA_ERASED):
            break
        if event.action is not AuditAction.BLOCK_REWRITTEN:
            continue
        if as_of is not None and event.create_time > as_of:
            continue
        turn = (
            TurnRef(event.turn_conversation_id, event.turn_id)
            if event.turn_conversation_id and event.turn_id
            else None
        )
        for kept, times in Counter(event.added_lines).items():
            waiting = unresolved.get(kept)
            if not waiting:
                continue
            for _ in range(min(times, len(waiting))):
                index = waiting.pop()  # later copies first
                found.append(LineOrigin(index, event.writer, event.create_time, turn))
            if not waiting:
                del unresolved[kept]
    return tuple(sorted(found, key=lambda origin: origin.line_index))
