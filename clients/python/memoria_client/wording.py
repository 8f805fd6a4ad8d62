"""Every sentence the model reads from a Memoria tool, in one place.

The model acts on these words: a result that sounds unfinished invites a repeated call, and an
error that does not say what to do next invites a guess. So each outcome says what happened to
the stored block, and whether and how to try again. Keeping the wording here, away from the
call logic, lets a reviewer (and the project's documentation) read every outcome at once.
"""

from __future__ import annotations

from collections.abc import Sequence

REWRITE = "memory_rewrite"
SEARCH = "conversation_search"

#: The line that follows the base section when the person has no block (or memory is off).
EMPTY_BLOCK = "Personal memory: empty (nothing is remembered about this person yet)."

#: The line that follows the base section when the block could not be loaded for this turn.
BLOCK_UNAVAILABLE = (
    "Personal memory: could not be loaded for this turn (the memory service did not answer). "
    "Do not call memory_rewrite in this turn: it replaces the whole block, which you cannot see."
)

#: How many failed memory writes one turn may make before the adapter stops calling the server.
DEFAULT_MAX_FAILED_WRITES = 3


def _named(violations: Sequence[tuple[str, str]]) -> str:
    """Field violations as one clause: 'text[line 2]: looks like an API key; ...'."""
    return "; ".join(f"{field}: {why.rstrip('.')}" for field, why in violations)


def chars(count: int, limit: int) -> str:
    """'1,234/4,000 characters', as in the rendered header."""
    return f"{count:,}/{limit:,} characters"


def _lines(prefix: str, lines: Sequence[str]) -> list[str]:
    return [f"{prefix} {line}" for line in lines]


def saved(count: int, limit: int, removed: Sequence[str], added: Sequence[str]) -> str:
    """A rewrite that changed the block: final, with the diff to check."""
    out = [f"Saved. The memory block now has {chars(count, limit)}."]
    if removed:
        out.append("Removed lines (check that each removal was intended):")
        out += _lines("-", removed)
    else:
        out.append("Removed lines: none.")
    if added:
        out.append("Added lines:")
        out += _lines("+", added)
    else:
        out.append("Added lines: none.")
    out.append(
        "This write is done: do not call memory_rewrite again for it. Only if a removal above "
        "was not intended, call it once more with that line restored."
    )
    return "\n".join(out)


def unchanged(count: int, limit: int) -> str:
    """A rewrite identical to the stored block."""
    return (
        "Nothing changed: the text is identical to the stored memory block "
        f"({chars(count, limit)}), so it is already saved. Do not call memory_rewrite again "
        "for it."
    )


def too_long(count: int | None, limit: int | None) -> str:
    """BLOCK_TOO_LONG: the count against the limit and what to do."""
    if count is not None and limit is not None:
        size = (
            f"the block has {count:,} characters and the limit is {limit:,} "
            f"({count - limit:,} over)"
        )
    else:
        size = "the block is longer than the limit"
    return (
        f"Not saved: {size}. Nothing was cut and the stored block is unchanged. Merge related "
        "lines, shorten long ones and drop stale ones, then call memory_rewrite again with the "
        "whole shortened block."
    )


BLOCK_EMPTY = (
    "Not saved: the text is empty once whitespace and invisible characters are removed. The "
    "stored memory block is unchanged; an empty write never deletes it. Deleting everything is "
    "the person's own action in their memory settings: if they asked for that, tell them where "
    "to do it."
)

MEMORY_DISABLED = (
    "Not saved: this person has turned memory off, so nothing can be remembered. Do not retry. "
    "If it matters, tell them that memory is off and that they can turn it back on in their "
    "settings."
)

STORE_UNAVAILABLE = (
    "Not saved: the memory store is temporarily unavailable, and nothing changed. Tell the "
    "person it could not be saved right now; sending the same block again later is safe."
)

STORAGE_FULL = (
    "Not saved: the memory store is out of space for now, and nothing changed. Do not retry in "
    "this turn; tell the person it could not be saved right now."
)

WRITE_CONFLICT = (
    "Not saved: other writes to this memory kept landing at the same moment, and nothing "
    "changed. Call memory_rewrite once more with the whole block."
)

REWRITE_UNAUTHENTICATED = (
    "Not saved: this person's identity is not confirmed, so their memory cannot be written. "
    "Do not retry."
)

REWRITE_BLOCK_UNSEEN = (
    "Not sent: the memory block could not be loaded into this prompt, so a rewrite would "
    "replace a block you have not seen. Do not call memory_rewrite in this turn; tell the "
    "person it could not be saved right now."
)

UNREACHABLE_WRITE = (
    "Not saved: the memory service could not be reached (or did not answer in time). The "
    "write may not have happened; sending the same whole block again is safe, as an identical "
    "write changes nothing."
)


def secret_detected(kinds: str, violations: Sequence[tuple[str, str]]) -> str:
    """SECRET_DETECTED: which lines hold a credential (never the credential itself)."""
    where = _named(violations)
    found = f" ({kinds})" if kinds else ""
    return (
        f"Not saved: the block contains a credential{found}"
        + (f" - {where}" if where else "")
        + ". Passwords, keys and tokens must never be stored. The stored block is unchanged; "
        "remove that content and call memory_rewrite again with the rest of the block."
    )


def rejected(reason: str, message: str, violations: Sequence[tuple[str, str]]) -> str:
    """Any other refused write, described from the server's ErrorInfo and BadRequest."""
    detail = _named(violations) or message.rstrip(".")
    return (
        f"Not saved ({reason or 'error'}): {detail}. The stored block is unchanged. Fix what "
        "is named and call memory_rewrite again with the whole block, or tell the person it "
        "could not be saved."
    )


def internal(trace_id: str) -> str:
    """An unexpected server error: nothing known, nothing to fix on the model's side."""
    ref = f" (reference {trace_id})" if trace_id else ""
    return (
        f"Not saved: the memory service had an unexpected error{ref}. Do not retry in this "
        "turn; tell the person it may not have been saved."
    )


def refused_after_failures(limit: int) -> str:
    """The terminal refusal once a turn has used up its failed writes (no call is made)."""
    return (
        f"Not sent: memory_rewrite already failed {limit} times in this turn, so no further "
        "write is attempted until the next turn. Do not call it again now; tell the person "
        "that this could not be remembered."
    )


def failures_left(failed: int, limit: int) -> str:
    """Appended to a failed write, so the model knows how many attempts remain this turn."""
    left = limit - failed
    if left <= 0:
        return f"(Failed memory writes this turn: {failed} of {limit}; no more will be sent.)"
    return f"(Failed memory writes this turn: {failed} of {limit}.)"


# Malformed calls: answered by the adapter itself, before any call to the server.


def bad_arguments(tool: str, problem: str) -> str:
    """A tool call whose arguments do not match the tool's schema."""
    if tool == REWRITE:
        usage = (
            "memory_rewrite takes exactly one argument, `text`: a string with the entire "
            "memory block you want to end up with"
        )
    else:
        usage = (
            "conversation_search takes `query` (a non-empty string) and optionally "
            "`max_turns` (an integer from 1 to 50)"
        )
    return f"Not sent: {problem}. {usage}. Nothing was called; fix the arguments and call again."


def unknown_tool(name: str) -> str:
    """A tool name this adapter does not serve."""
    return (
        f"Unknown tool {name!r}: the memory tools are memory_rewrite and conversation_search. "
        "Nothing was called."
    )


# Search results.


def no_hits(query: str) -> str:
    """A search that found nothing (also what a person with memory off gets)."""
    return (
        f"No past conversation matched {query!r}. Do not invent one; if it matters, ask the person."
    )


SEARCH_UNAUTHENTICATED = (
    "No past conversations: this person's identity is not confirmed, so nothing was searched "
    "and there are no results. Do not retry."
)

SEARCH_UNAVAILABLE = (
    "Search failed: conversation search is temporarily unavailable (or did not answer in "
    "time), so past conversations cannot be looked up right now. Answer without them and say "
    "so."
)


def search_failed(reason: str, message: str, violations: Sequence[tuple[str, str]]) -> str:
    """Any other refused search, from the server's ErrorInfo and BadRequest."""
    detail = _named(violations) or message.rstrip(".")
    return f"Search failed ({reason or 'error'}): {detail}. Nothing was found."


def why_matched(keyword_rank: int, semantic_rank: int) -> str:
    """Why a hit matched, from its keyword and semantic ranks (0 = not found by that side)."""
    if keyword_rank and semantic_rank:
        return f"matched by keywords (rank {keyword_rank}) and meaning (rank {semantic_rank})"
    if keyword_rank:
        return f"matched by keywords only (rank {keyword_rank})"
    if semantic_rank:
        return f"matched by meaning only (rank {semantic_rank})"
    return "matched"


def hits_header(count: int, query: str) -> str:
    """The first line of a search result with hits."""
    turns = "turn" if count == 1 else "turns"
    return f"{count} past {turns} matched {query!r}, best first:"


def hit(position: int, conversation: str, turn: str, when: str, why: str, text: str) -> str:
    """One hit: where it comes from, when, why it matched, and its text."""
    return f"[{position}] conversation {conversation}, turn {turn}, {when}; {why}\n{text}"
