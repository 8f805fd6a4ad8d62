"""Repeated and near-duplicate lines of a memory block (DESIGN 2, "the model proposes, the
service checks").

A saved rewrite's result and the person's page point these lines out so the next write merges
them; nothing is dropped or changed for them (a repeated line can be meant: the same item under
two headings), as with removed lines the service exposes rather than prevents.

The two rules, each explainable in one sentence:
- **Repeated**: lines that are the same after stripping, collapsing whitespace and ignoring case
  (`casefold`).
- **Near-duplicate**: lines whose sets of words (runs of letters and digits, case-folded) have
  a Jaccard similarity of at least `NEAR_DUPLICATE_SIMILARITY` (shared words over all words of
  the two), each line having at least `MIN_NEAR_DUPLICATE_WORDS` words. Measured on the
  examples in tests/unit/test_duplicates.py: "Preferred name: Ana" and "Preferred name is Ana"
  share 3 of 4 words (0.75, a match); "Jira account: acct-7731" and "Jira account: acct-7732"
  share 3 of 5 (0.6: two accounts are two facts, not a match); "Name: Ana" and "Name: Bob"
  have too few words to judge. Word order does not count ("Ana prefers tea" repeats "prefers
  tea, Ana"); meaning does not either ("Likes short answers" and "Prefers brief replies" are
  not found: the instructions ask the model to edit the line that covers a fact).
Near-duplicates are grouped transitively (A near B and B near C make one group), so each group
is one thing to merge.
"""

from __future__ import annotations

import enum
import math
import re
from collections import defaultdict
from dataclasses import dataclass

from server.domain.text import lines_of

NEAR_DUPLICATE_SIMILARITY = 0.75
"""Least Jaccard similarity of two lines' word sets for them to be near-duplicates."""
MIN_NEAR_DUPLICATE_WORDS = 3
"""Lines with fewer distinct words are never near-duplicates (only repeated): two words in
common out of three says little ("Name: Ana" / "Name: Bob")."""

_WORD = re.compile(r"\w+")
_ASCII_NON_WORD = bytes(
    c if c < 128 and (chr(c).isalnum() or chr(c) == "_") else ord(" ") for c in range(256)
)
r"""ASCII bytes with every byte that `\w` does not match (in ASCII: all but letters, digits and
`_`) turned into a space: the words of an ASCII line are then its `split()`."""


class DuplicateKind(enum.Enum):
    """How the lines of a group resemble each other."""

    REPEATED = "repeated"
    NEAR_DUPLICATE = "near_duplicate"


@dataclass(frozen=True)
class DuplicateGroup:
    """Lines of one block to merge into one: their 0-based indexes in the block's lines (in
    order) and the lines themselves."""

    kind: DuplicateKind
    line_indexes: tuple[int, ...]
    lines: tuple[str, ...]


def repeat_key(line: str) -> str:
    """What makes two lines repeats: stripped, whitespace runs collapsed, case ignored."""
    return " ".join(line.split()).casefold()


def word_set(line: str) -> frozenset[str]:
    """The words a near-duplicate is judged on: runs of letters and digits, case-folded."""
    return _words(line.casefold())


def _words(folded: str) -> frozenset[str]:
    r"""The runs of `\w` in a case-folded line. An ASCII line (most lines) takes a shortcut
    with the same result: a byte translation and a split, about three times faster than the
    regex, which tries Unicode's word classes at every character."""
    if folded.isascii():
        return frozenset(folded.encode("ascii").translate(_ASCII_NON_WORD).decode("ascii").split())
    return frozenset(_WORD.findall(folded))


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two word sets (0 when both are empty)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def duplicate_groups(text: str) -> tuple[DuplicateGroup, ...]:
    """The repeated and the near-duplicate lines of a sanitized block, repeated groups first,
    each group ordered by line and the groups by their first line. Blank lines are ignored."""
    lines = lines_of(text)
    by_key: dict[str, list[int]] = defaultdict(list)
    for index, line in enumerate(lines):
        key = repeat_key(line)
        if key:
            by_key[key].append(index)
    groups = [
        _group(DuplicateKind.REPEATED, indexes, lines)
        for indexes in by_key.values()
        if len(indexes) > 1
    ]
    groups += [
        _group(DuplicateKind.NEAR_DUPLICATE, sorted(i for key in keys for i in by_key[key]), lines)
        for keys in _near_components(list(by_key))
    ]
    repeated = [g for g in groups if g.kind is DuplicateKind.REPEATED]
    near = [g for g in groups if g.kind is DuplicateKind.NEAR_DUPLICATE]
    return tuple(sorted(repeated, key=_first) + sorted(near, key=_first))


def _first(group: DuplicateGroup) -> int:
    return group.line_indexes[0]


def _group(kind: DuplicateKind, indexes: list[int], lines: list[str]) -> DuplicateGroup:
    return DuplicateGroup(kind, tuple(indexes), tuple(lines[i] for i in indexes))


def _near_components(keys: list[str]) -> list[list[str]]:
    """Groups of distinct lines (by repeat key) linked by near-duplicate pairs.

    Candidate pairs come from prefix filtering, the standard way to join sets by similarity
    (Bayardo et al., "Scaling up all pairs similarity search", WWW 2007): two sets with
    Jaccard similarity t or more share at least ceil(t x size) words, so with every line's
    words in one total order each line's first `size - ceil(t x size) + 1` words must meet the
    other's. Lines are taken smallest first, and a smaller line under t x size words cannot
    reach t either. Any total order finds exactly the same pairs; it only decides how many
    candidates are checked. The order here is the words' own (code point order), which a C
    sort gives at no cost; ranking the block's words rarest first, as before, cut the
    candidates further but cost more than it saved. Measured in one process on this machine
    (figures in docs/decisions.md, "The rewrite's own CPU"): a 13-line rewrite's search about
    2.5 times cheaper, 4,000-character blocks 10-20% cheaper; checking every pair of lines
    whose sizes allow a match was a little faster on small blocks and five to ten times slower
    on 4,000 characters of short lines. The keys are already case-folded (`repeat_key`), and
    case folding is idempotent, so their words are `_words(key)`. The pairs found are exactly
    those an all-pairs check finds (tests/unit/test_duplicates.py compares the two on random
    blocks).
    """
    words = [_words(key) for key in keys]
    eligible = sorted(
        (i for i, ws in enumerate(words) if len(ws) >= MIN_NEAR_DUPLICATE_WORDS),
        key=lambda i: len(words[i]),
    )
    parent = list(range(len(keys)))
    having: dict[str, list[int]] = {}  # a word -> lines with it in their prefix
    for i in eligible:
        line = words[i]
        size = len(line)
        # 0.75 x a count is exact in binary; were a threshold not, the margin lets rounding
        # only lengthen the prefix (slower), never shorten it (a pair missed).
        prefix = size - math.ceil(NEAR_DUPLICATE_SIMILARITY * size - 1e-9) + 1
        least = NEAR_DUPLICATE_SIMILARITY * size
        checked: set[int] = set()
        for word in sorted(line)[:prefix]:
            others = having.get(word)
            if others is None:
                having[word] = [i]
                continue
            for j in others:
                other = words[j]
                if j in checked or len(other) < least:
                    continue
                checked.add(j)
                # `similarity(line, other) >= NEAR_DUPLICATE_SIMILARITY` without building the
                # union: |A | B| = |A| + |B| - |A & B|.
                shared = len(line & other)
                if shared >= NEAR_DUPLICATE_SIMILARITY * (size + len(other) - shared):
                    parent[_root(parent, i)] = _root(parent, j)
            others.append(i)
    components: dict[int, list[str]] = defaultdict(list)
    for i, key in enumerate(keys):
        components[_root(parent, i)].append(key)
    return [members for members in components.values() if len(members) > 1]


def _root(parent: list[int], i: int) -> int:
    """Union-find's representative of `i` (with path halving)."""
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i
