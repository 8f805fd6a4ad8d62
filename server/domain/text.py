"""The one sanitizer, the one character count and the one line diff of a memory block.

The block is the only path by which text the model read elsewhere reaches the system prompt,
so every path (write, load, render, the limit check, the header, the API's counts) goes through
`sanitize` and `char_count` here. The shared vectors in tests/vectors/char_count.json pin the
behaviour for clients in other languages; tests/vectors/README.md states the rules in order.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass

# Default_Ignorable_Code_Point is a derived property (DerivedCoreProperties.txt) that neither
# the standard library nor unicodedata2 exposes; the maintained `regex` module has it.
import regex

# The Unicode database is pinned by the unicodedata2 package rather than taken from whichever
# Python runs the server (3.11 ships Unicode 14, whose Cf set lacks characters that Go, Node and
# newer Pythons already remove), so server and clients agree on what is invisible.
import unicodedata2 as unicodedata

TAG_BLOCK = range(0xE0000, 0xE0080)
"""The whole tag block: its unassigned code points are as invisible as the tag characters."""

VARIATION_SELECTORS = "\u180b-\u180d\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef"
"""Unicode's Variation_Selector property: the Mongolian free variation selectors, VS1-VS16
and the supplement VS17-VS256 (a unit test checks this against the property)."""

JOINERS = "\u200c\u200d"
"""ZERO WIDTH NON-JOINER and ZERO WIDTH JOINER: format characters that real text needs."""

JOINER_BASE_CATEGORIES = frozenset({"Lo", "Sm", "Sc", "Sk", "So"})
"""What a kept joiner may follow (past any combining marks) and precede: a letter of an uncased
script (Lo: Arabic, Persian, the Indic scripts, Sinhala, Khmer...) or a symbol (S: emoji,
skin-tone modifiers). Cased scripts (Latin, Greek, Cyrillic) never need a joiner."""

MARK_CATEGORIES = frozenset({"Mn", "Mc", "Me"})
"""Combining marks: a virama before ZWJ, VS16 after an emoji. A kept joiner may also precede
one; before one it looks at their base, which NFC may compose with them but never turns into
a cased letter, so the rule gives the same answer on its own output."""

BRAILLE_BLANK = "\u2800"
"""BRAILLE PATTERN BLANK: the space of braille text, and a well-known invisible filler."""


def _invisible_class() -> re.Pattern[str]:
    """A regex matching what never reaches the prompt, except the characters that have a rule
    of their own (variation selectors, joiners, the braille blank): every Cf code point, every
    Cc one except newline and tab, the whole tag block U+E0000-E007F, and every
    Default_Ignorable_Code_Point (assigned or not: U+034F, the Hangul fillers, U+17B4/U+17B5,
    U+2065, U+FFF0-FFF8, U+E0080-E0FFF...).

    Built once from the pinned Unicode database, so the per-call work is a single C-level
    `re.sub` instead of a Python loop over each character (the render path is hot).
    """
    # Surrogates are no text; leaving them out lets `regex` scan every other code point at once.
    every = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, sys.maxunicode + 1)))
    remove = {ch for ch in every if unicodedata.category(ch) in ("Cf", "Cc")} - {"\n", "\t"}
    remove.update(map(chr, TAG_BLOCK))
    for run in regex.finditer(r"\p{Default_Ignorable_Code_Point}+", every):
        remove.update(run.group())
    remove.difference_update(_expand(VARIATION_SELECTORS) + JOINERS)
    ranges: list[str] = []
    start = last = -2
    for cp in sorted(map(ord, remove)):
        if cp != last + 1:
            if start >= 0:
                ranges.append(_range(start, last))
            start = cp
        last = cp
    ranges.append(_range(start, last))
    return re.compile("[" + "".join(ranges) + "]+")


def _expand(ranges: str) -> str:
    """Every character of a regex class body made of single characters and `a-b` ranges."""
    out: list[str] = []
    i = 0
    while i < len(ranges):
        if i + 2 < len(ranges) and ranges[i + 1] == "-":
            out.extend(chr(cp) for cp in range(ord(ranges[i]), ord(ranges[i + 2]) + 1))
            i += 3
        else:
            out.append(ranges[i])
            i += 1
    return "".join(out)


def _range(first: int, last: int) -> str:
    if first == last:
        return re.escape(chr(first))
    return f"{re.escape(chr(first))}-{re.escape(chr(last))}"


_INVISIBLE = _invisible_class()
_ASCII_CONTROLS = bytes(c for c in range(128) if _INVISIBLE.fullmatch(chr(c)))
"""What `_INVISIBLE` matches in ASCII: the controls other than newline and tab."""
_LATIN1_INVISIBLE = bytes(c for c in range(256) if _INVISIBLE.fullmatch(chr(c)))
"""What `_INVISIBLE` matches in Latin-1 (U+0000-U+00FF): those controls, DEL, the C1
controls and the soft hyphen."""

_LINE_SEPARATORS = ("\u2028", "\u2029")
"""LINE SEPARATOR and PARAGRAPH SEPARATOR are line breaks: they become the one line ending."""

# A braille blank is kept only inside braille text (a run of them with a braille pattern that
# has dots on both sides: the space between braille words). Anywhere else it is only ever an
# invisible filler, e.g. a block that looks empty but is not.
_STRAY_BRAILLE_BLANKS = re.compile(
    f"(?<![\u2800-\u28ff]){BRAILLE_BLANK}+|{BRAILLE_BLANK}+(?![\u2800-\u28ff])"
)

_JOINER_RUN = re.compile(f"[{JOINERS}]+")

# A variation selector picks a glyph for the character before it, so one is all a character
# can use; a run of them is invisible payload (data smuggled one byte per selector). Keep the
# first of each run, so emoji (U+FE0F), ideographic variation sequences (name kanji) and
# Mongolian positional variants (U+180B-U+180D, U+180F) still render.
_SELECTOR_RUN = re.compile(f"([{VARIATION_SELECTORS}])[{VARIATION_SELECTORS}]+")


def _keep_joiner(text: str, run: re.Match[str]) -> str:
    """A joiner is kept only alone, after a base in JOINER_BASE_CATEGORIES (skipping the
    combining marks on it) and before a base or a mark: ZWJ builds emoji sequences (family,
    profession, rainbow flag) and Indic half forms after a virama, ZWNJ is part of Persian
    spelling (می‌خواهم) and of Indic scripts. Anywhere else, and in runs (binary data written
    as ZWNJ/ZWJ), it is removed."""
    start, end = run.span()
    if end - start != 1 or end == len(text):
        return ""
    if unicodedata.category(text[end]) not in JOINER_BASE_CATEGORIES | MARK_CATEGORIES:
        return ""
    base = start - 1
    while base >= 0 and unicodedata.category(text[base]) in MARK_CATEGORIES:
        base -= 1
    if base < 0 or unicodedata.category(text[base]) not in JOINER_BASE_CATEGORIES:
        return ""
    return run.group()


def sanitize(text: str) -> str:
    """Return `text` as it may reach the prompt: the only form Memoria stores or shows.

    Line endings (CRLF, CR, U+2028, U+2029) become `\\n`; format characters (Unicode Cf),
    default-ignorable code points, the rest of the tag block and control characters other than
    newline and tab are removed, except a ZWJ/ZWNJ alone between characters that need it, a
    braille blank inside braille text and the first of a run of variation selectors; the
    result is NFC and has no leading or trailing whitespace. Idempotent. The order of these
    steps is part of the rule (tests/vectors/README.md).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.isascii():
        # The common case. ASCII has no format characters or selectors and is NFC already,
        # so only its control characters go, which bytes.translate removes several times
        # faster than the regex (this runs on every render and twice per rewrite).
        return text.encode("ascii").translate(None, _ASCII_CONTROLS).decode("ascii").strip()
    try:
        latin1 = text.encode("latin-1")
    except UnicodeEncodeError:
        return _sanitize_unicode(text)
    # Latin-1 text (Western European letters: "é", "ã", "ü"...) has no line separator, joiner,
    # braille blank or selector (all above U+00FF), so only the invisible characters go and
    # NFC applies: the same steps as `_sanitize_unicode`, the removal done by bytes.translate
    # (the benchmarks' seeded blocks in Latin-1: about 4 µs instead of 86, measured; every
    # render of such a block sanitizes it on load).
    text = latin1.translate(None, _LATIN1_INVISIBLE).decode("latin-1")
    text = unicodedata.normalize("NFC", text)
    return text.strip()


def _sanitize_unicode(text: str) -> str:
    """`sanitize` after CR and CR LF became LF, for any text (ASCII and Latin-1 take
    shortcuts). Line separators, braille blanks and joiners are handled only where a
    substring test (a C search) finds them; `str.translate` with a table and a `max(text)`
    gate before it walked the text a character at a time (70 and 22 µs of a 1,500-character
    block, measured)."""
    for separator in _LINE_SEPARATORS:
        if separator in text:
            text = text.replace(separator, "\n")
    text = _INVISIBLE.sub("", text)
    # Each step sees what the one before left, in this order: removing a braille blank can
    # make joiners adjacent, and removing joiners can make selectors adjacent.
    if BRAILLE_BLANK in text:
        text = _STRAY_BRAILLE_BLANKS.sub("", text)
    if "\u200c" in text or "\u200d" in text:
        text = _JOINER_RUN.sub(lambda run: _keep_joiner(text, run), text)
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


def block_line_count(text: str) -> int:
    """How many lines a stored block has, as every count of removed lines reports them (a
    deletion's and an erasure's): the lines of its sanitized text."""
    return len(lines_of(sanitize(text)))


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
