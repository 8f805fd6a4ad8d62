"""The one sanitizer, the one character count and the one line diff of a memory block.

The block is the only path by which text the model read elsewhere reaches the system prompt,
so every path (write, load, render, the limit check, the header, the API's counts) goes through
`sanitize` and `char_count` here. The shared vectors in tests/vectors/char_count.json pin the
behaviour for clients in other languages.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass

# The Unicode database is pinned by the unicodedata2 package rather than taken from whichever
# Python runs the server (3.11 ships Unicode 14, whose Cf set lacks characters that Go, Node and
# newer Pythons already remove), so server and clients agree on what is invisible.
import unicodedata2 as unicodedata

TAG_BLOCK = range(0xE0000, 0xE0080)
"""The whole tag block: its unassigned code points are as invisible as the tag characters."""

VARIATION_SELECTORS = "\ufe00-\ufe0f\U000e0100-\U000e01ef"


def _invisible_class() -> re.Pattern[str]:
    """A regex matching what never reaches the prompt: every Cf code point, every Cc one
    except newline and tab, and the whole tag block U+E0000-E007F.

    Built once from this Python's Unicode database, so the per-call work is a single C-level
    `re.sub` instead of a Python loop over each character (the render path is hot).
    """
    ranges: list[str] = []
    start = -1
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        remove = cat == "Cf" or (cat == "Cc" and ch not in "\n\t") or cp in TAG_BLOCK
        if remove and start < 0:
            start = cp
        elif not remove and start >= 0:
            ranges.append(_range(start, cp - 1))
            start = -1
    if start >= 0:
        ranges.append(_range(start, sys.maxunicode))
    return re.compile("[" + "".join(ranges) + "]+")


def _range(first: int, last: int) -> str:
    if first == last:
        return re.escape(chr(first))
    return f"{re.escape(chr(first))}-{re.escape(chr(last))}"


_INVISIBLE = _invisible_class()
_ASCII_CONTROLS = bytes(c for c in range(128) if _INVISIBLE.fullmatch(chr(c)))
"""What `_INVISIBLE` matches in ASCII: the controls other than newline and tab."""

# A variation selector picks a glyph for the character before it, so one is all a character
# can use; a run of them is invisible payload (data smuggled one byte per selector). Keep the
# first of each run, so emoji (U+FE0F) and ideographic variation sequences still render.
_SELECTOR_RUN = re.compile(f"([{VARIATION_SELECTORS}])[{VARIATION_SELECTORS}]+")
_FIRST_SELECTOR = "\ufe00"  # no text whose largest code point is below this has a selector


def sanitize(text: str) -> str:
    """Return `text` as it may reach the prompt: the only form Memoria stores or shows.

    Line endings become `\\n`; format characters (Unicode Cf: zero-width, bidi controls, tag
    characters, BOM, soft hyphen), the rest of the tag block and control characters other than
    newline and tab are removed; a run of variation selectors keeps only its first; the result
    is NFC and has no leading or trailing whitespace. Idempotent.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.isascii():
        # The common case. ASCII has no format characters or selectors and is NFC already,
        # so only its control characters go, which bytes.translate removes several times
        # faster than the regex (this runs on every render and twice per rewrite).
        return text.encode("ascii").translate(None, _ASCII_CONTROLS).decode("ascii").strip()
    text = _INVISIBLE.sub("", text)
    if max(text, default="") >= _FIRST_SELECTOR:
        text = _SELECTOR_RUN.sub(r"\1", text)
    text = unicodedata.normalize("NFC", text)
    return text.strip()


def sanitize_and_count(text: str) -> tuple[str, int]:
    """`sanitize(text)` and its character count, for callers that need both (one pass).

    The count of a block is the number of Unicode code points of the sanitized, stripped
    text; this function and `char_count` are the only places that define it.
    """
    clean = sanitize(text)
    return clean, len(clean)


def char_count(text: str) -> int:
    """The character count of a block: Unicode code points of the sanitized, stripped text.

    The limit check, the rendered header and the counts the API reports all come from here or
    from `sanitize_and_count`.
    """
    return sanitize_and_count(text)[1]


def lines_of(text: str) -> list[str]:
    """The lines of a sanitized block; an empty block has none."""
    return text.split("\n") if text else []


@dataclass(frozen=True)
class LineDiff:
    """The lines one rewrite removed from the old block and added to the new, each in order."""

    removed: tuple[str, ...]
    added: tuple[str, ...]


def diff_lines(old: str, new: str) -> LineDiff:
    """Line diff of two sanitized blocks (difflib's longest matching subsequence).

    Lines the two blocks share at their start and end are kept as they are first, as diff
    tools do: a rewrite usually changes a few lines, and difflib then only compares those (a
    fraction of the work on the write path). A longest common subsequence can always keep a
    shared first or last line; difflib's matching is a heuristic either way, so on rare inputs
    the lines reported can differ from difflib's on the whole blocks, never their validity.
    """
    old_lines, new_lines = lines_of(old), lines_of(new)
    start, old_end, new_end = 0, len(old_lines), len(new_lines)
    while start < old_end and start < new_end and old_lines[start] == new_lines[start]:
        start += 1
    while old_end > start and new_end > start and old_lines[old_end - 1] == new_lines[new_end - 1]:
        old_end -= 1
        new_end -= 1
    old_mid, new_mid = old_lines[start:old_end], new_lines[start:new_end]
    if not old_mid or not new_mid or len(old_mid) == len(new_mid) == 1:
        # Nothing to match: one side is empty, or one line was replaced by another (lines
        # left after setting the shared ones aside differ at both ends).
        return LineDiff(removed=tuple(old_mid), added=tuple(new_mid))
    matcher = difflib.SequenceMatcher(a=old_mid, b=new_mid, autojunk=False)
    removed: list[str] = []
    added: list[str] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op in ("replace", "delete"):
            removed.extend(old_mid[i1:i2])
        if op in ("replace", "insert"):
            added.extend(new_mid[j1:j2])
    return LineDiff(removed=tuple(removed), added=tuple(added))


def truncate_line(line: str, limit: int) -> str:
    """Cut a line to at most `limit` code points for the audit log, marking the cut with '…'."""
    if len(line) <= limit:
        return line
    return line[: limit - 1] + "…"
