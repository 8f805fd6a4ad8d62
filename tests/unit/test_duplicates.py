"""Repeated and near-duplicate lines (server/domain/duplicates.py): examples that must and must
not match, the grouping, and that a rewrite's result carries them without changing the block."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.domain import model_words as words
from server.domain.duplicates import (
    MIN_NEAR_DUPLICATE_WORDS,
    NEAR_DUPLICATE_SIMILARITY,
    DuplicateGroup,
    DuplicateKind,
    duplicate_groups,
    repeat_key,
    similarity,
    word_set,
)
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, Writer
from tests.fakes import InMemoryMemoryStore

REPEATED = DuplicateKind.REPEATED
NEAR = DuplicateKind.NEAR_DUPLICATE


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Likes short answers", "Likes short answers"),
        ("  Likes   short answers ", "likes short ANSWERS"),
        ("Ana\tprefers tea", "ana prefers tea"),
    ],
)
def test_repeats_are_equal_after_whitespace_and_case(a: str, b: str) -> None:
    assert duplicate_groups(f"{a}\n{b}") == (DuplicateGroup(REPEATED, (0, 1), (a, b)),)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Preferred name: Ana", "Preferred name is Ana"),  # 3 of 4 words
        ("Preferred name: Ana", "Preferred name - Ana."),  # punctuation only
        ("Ana prefers tea", "tea, Ana prefers"),  # order does not count
        ("Works at Acme as a data engineer", "Works at Acme as data engineer"),
        ("Jira account: acct-7731 (confirmed)", "Jira account acct-7731, confirmed"),
    ],
)
def test_near_duplicates_share_most_words(a: str, b: str) -> None:
    assert similarity(word_set(a), word_set(b)) >= NEAR_DUPLICATE_SIMILARITY
    assert duplicate_groups(f"{a}\n{b}") == (DuplicateGroup(NEAR, (0, 1), (a, b)),)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Jira account: acct-7731", "Jira account: acct-7732"),  # two accounts: 3 of 5 words
        ("Name: Ana", "Name: Bob"),  # too few words to judge
        ("Name: Ana", "name ana"),  # the same words, but only two
        ("Likes short answers", "Prefers brief replies"),  # the same meaning is not found
        ("Lives in Lisbon", "Moved from Lisbon to Porto in 2024"),
        ("Birthday: 1990-03-04", "Birthday: 1990-03-05"),
    ],
)
def test_lines_that_are_not_near_duplicates(a: str, b: str) -> None:
    assert duplicate_groups(f"{a}\n{b}") == ()


def test_groups_are_transitive_ordered_and_ignore_blank_lines() -> None:
    text = "\n".join(
        [
            "Projects:",  # 0
            "- Memoria",  # 1
            "",  # 2
            "Interests:",  # 3
            "- memoria",  # 4: repeats 1 (meant, perhaps: the page and the model only see it)
            "Preferred name: Ana",  # 5
            "Preferred name is Ana",  # 6
            "The preferred name is Ana",  # 7: near 6, not near enough 5 (3 of 5): one group
            "",  # 8
        ]
    )
    assert duplicate_groups(text) == (
        DuplicateGroup(REPEATED, (1, 4), ("- Memoria", "- memoria")),
        DuplicateGroup(
            NEAR,
            (5, 6, 7),
            ("Preferred name: Ana", "Preferred name is Ana", "The preferred name is Ana"),
        ),
    )


def test_a_block_of_distinct_lines_has_none() -> None:
    assert duplicate_groups("") == ()
    assert duplicate_groups("Preferred name: Ana\nJira account: acct-7731\nLikes tea") == ()


class _Clock:
    def __call__(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC)


def test_a_rewrite_points_them_out_and_saves_the_text_as_written() -> None:
    blocks = MemoryBlocks(InMemoryMemoryStore(), _Clock())
    who = Identity("acme", "ana")
    text = "Likes tea\nPreferred name: Ana\nlikes  tea"
    result = blocks.rewrite(who, text, Writer.MODEL)
    assert result.block.text == text
    assert result.duplicates == (DuplicateGroup(REPEATED, (0, 2), ("Likes tea", "likes  tea")),)
    # An identical rewrite reports them too; the page reads them with the block.
    assert blocks.rewrite(who, text, Writer.MODEL).duplicates == result.duplicates
    assert blocks.get_annotated(who).duplicates == result.duplicates


def test_the_model_reads_them_after_a_saved_rewrite_and_nothing_more_without() -> None:
    groups = duplicate_groups("Likes tea\nPreferred name: Ana\nlikes tea\nPreferred name is Ana")
    text = words.saved(60, 4000, [], ["Preferred name is Ana"], groups)
    assert text == "\n".join(
        [
            "Saved. The memory block now has 60/4,000 characters.",
            "Removed lines: none.",
            "Added lines:",
            "+ Preferred name is Ana",
            "Lines that repeat each other (saved as written; next time you write the block, "
            "merge each group into one line unless the repetition is meant):",
            "* lines 1 and 3 (the same line):",
            "  1: Likes tea",
            "  3: likes tea",
            "* lines 2 and 4 (near-duplicates):",
            "  2: Preferred name: Ana",
            "  4: Preferred name is Ana",
            "This write is done: do not call memory_rewrite again for it. Only if a removal "
            "above was not intended, call it once more with that line restored.",
        ]
    )
    assert words.saved(9, 4000, [], ["Likes tea"], ()) == words.saved(9, 4000, [], ["Likes tea"])
    assert "repeat" not in words.saved(9, 4000, [], ["Likes tea"])


def _near_pairs_by_checking_all(text: str) -> set[frozenset[str]]:
    """Every pair of distinct repeat keys whose word sets reach the threshold, found by
    comparing all pairs: what the prefix filter must find, no more and no less."""
    keys = sorted({repeat_key(line) for line in text.split("\n")} - {""})
    sets = {key: _words_by_the_rule(key) for key in keys}
    return {
        frozenset((a, b))
        for i, a in enumerate(keys)
        for b in keys[i + 1 :]
        if min(len(sets[a]), len(sets[b])) >= MIN_NEAR_DUPLICATE_WORDS
        and similarity(sets[a], sets[b]) >= NEAR_DUPLICATE_SIMILARITY
    }


def _words_by_the_rule(line: str) -> frozenset[str]:
    """The module docstring's rule as written: runs of `\\w`, case-folded (word_set takes a
    shortcut for ASCII lines)."""
    return frozenset(re.findall(r"\w+", line.casefold()))


_WORDS = st.sampled_from(
    [
        *("a", "b", "c", "d", "e", "the", "and", "of", "ana", "tea", "porto", "likes", "runs"),
        # Case, punctuation and non-ASCII words, which ASCII lines share with non-ASCII ones.
        *("Ana", "TEA,", "(porto)", "x_y", "Straße", "STRASSE", "café", "Ärger", "ärger:", "ΣΟΦΊΑ"),
    ]
)
_LINES = st.lists(st.lists(_WORDS, min_size=1, max_size=9).map(" ".join), max_size=14)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_word_set_is_the_rule(line: str) -> None:
    assert word_set(line) == _words_by_the_rule(line)
    assert word_set(line) == word_set(line.casefold())


@pytest.mark.parametrize("line", ["Ana's tea-time, 09:30!", "a_b\tc  D", "", "  ", "x" * 300])
def test_word_set_of_ascii_lines(line: str) -> None:
    assert word_set(line) == _words_by_the_rule(line)


def test_case_folding_is_idempotent() -> None:
    """The near-duplicate search takes the words of a repeat key, which is case-folded
    already, without folding again: right only because folding twice folds once."""
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    assert every.casefold().casefold() == every.casefold()


@settings(max_examples=400, deadline=None)
@given(_LINES)
def test_the_prefix_filter_finds_exactly_the_pairs_all_pairs_find(lines: list[str]) -> None:
    """Near-duplicate groups are the connected components of the all-pairs relation: each
    pair that reaches the threshold lies in one group, and each group is connected by such
    pairs (a small vocabulary with common words makes many candidate pairs)."""
    text = "\n".join(lines)
    pairs = _near_pairs_by_checking_all(text)
    groups = [g for g in duplicate_groups(text) if g.kind is NEAR]
    group_of = {repeat_key(line): n for n, g in enumerate(groups) for line in g.lines}
    for pair in pairs:
        a, b = sorted(pair)
        assert a in group_of and group_of[a] == group_of.get(b)
    for group in groups:
        members = {repeat_key(line) for line in group.lines}
        reached = {min(members)}
        while True:
            more = {m for m in members for r in reached if frozenset((m, r)) in pairs} - reached
            if not more:
                break
            reached |= more
        assert reached == members
