"""The sanitizer, character count and line diff, driven by the shared vectors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from server.domain import text as text_module
from server.domain.memory import DEFAULT_CHAR_LIMIT
from server.domain.text import char_count, diff_lines, lines_of, sanitize, truncate_line

VECTORS = json.loads(
    (Path(__file__).parent.parent / "vectors" / "char_count.json").read_text(encoding="utf-8")
)


def expand(text: Any) -> str:
    """A vector text: a string, or parts of strings and {"repeat", "times"} objects."""
    if isinstance(text, str):
        return text
    return "".join(p if isinstance(p, str) else p["repeat"] * p["times"] for p in text)


def test_vectors_limit_is_the_servers_default() -> None:
    assert VECTORS["limit"] == DEFAULT_CHAR_LIMIT


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_vector(case: dict[str, Any]) -> None:
    raw = expand(case["input"])
    clean = sanitize(raw)
    assert clean == expand(case["sanitized"])
    assert char_count(raw) == case["char_count"]
    assert (char_count(raw) == 0) == case["empty"]
    assert (char_count(raw) > VECTORS["limit"]) == case["over_limit"]


def test_vector_names_are_unique() -> None:
    names = [c["name"] for c in VECTORS["cases"]]
    assert len(names) == len(set(names))


def test_diff_reports_removed_and_added_lines_in_order() -> None:
    old = "Name: Ana\nLikes tea\nLives in Porto\nWorks at Acme"
    new = "Name: Ana\nLikes coffee\nLives in Porto\nHas a cat"
    diff = diff_lines(old, new)
    assert diff.removed == ("Likes tea", "Works at Acme")
    assert diff.added == ("Likes coffee", "Has a cat")


def test_diff_of_new_and_deleted_blocks() -> None:
    assert diff_lines("", "a\nb").added == ("a", "b")
    assert diff_lines("a\nb", "").removed == ("a", "b")
    assert lines_of("") == []


def test_diff_keeps_duplicate_lines_distinct() -> None:
    diff = diff_lines("x\nx\ny", "x\ny")
    assert diff.removed == ("x",)
    assert diff.added == ()


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_the_ascii_fast_path_removes_what_the_general_path_does(text: str) -> None:
    general = text_module._sanitize_unicode(text.replace("\r\n", "\n").replace("\r", "\n"))
    assert sanitize(text) == general


def test_default_ignorable_code_points_come_from_the_unicode_property() -> None:
    """Every default-ignorable code point is removed, but for those with a rule of their own."""
    own_rule = set(text_module._expand(text_module.VARIATION_SELECTORS) + text_module.JOINERS)
    every = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, sys.maxunicode + 1)))
    ignorable = regex.findall(r"\p{Default_Ignorable_Code_Point}", every)
    assert len(ignorable) > 4000  # U+E0000-E0FFF alone is 4,096
    for ch in ignorable:
        assert bool(text_module._INVISIBLE.fullmatch(ch)) == (ch not in own_rule), hex(ord(ch))


def test_variation_selectors_are_the_unicode_property() -> None:
    listed = set(text_module._expand(text_module.VARIATION_SELECTORS))
    every = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))
    assert listed == set(regex.findall(r"\p{Variation_Selector}", every))


def _is_subsequence(part: tuple[str, ...], whole: list[str]) -> bool:
    rest = iter(whole)
    return all(line in rest for line in part)


def _lcs(a: list[str], b: list[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


_LINE_POOL = st.sampled_from(["a", "b", "c", "likes tea", "lives in Porto", "x"])


@given(st.lists(_LINE_POOL, max_size=12), st.lists(_LINE_POOL, max_size=12))
def test_diff_is_an_edit_between_the_blocks(old: list[str], new: list[str]) -> None:
    """Removed lines come out of the old block and added lines out of the new one, in order,
    and both keep as many lines, no more than they have in common."""
    diff = diff_lines("\n".join(old), "\n".join(new))
    assert _is_subsequence(diff.removed, old)
    assert _is_subsequence(diff.added, new)
    kept = len(old) - len(diff.removed)
    assert kept == len(new) - len(diff.added)
    assert kept <= _lcs(old, new)


def test_diff_of_a_one_line_change_in_a_long_block() -> None:
    old = "\n".join(f"fact {i}" for i in range(40))
    new = old.replace("fact 17", "fact seventeen")
    diff = diff_lines(old, new)
    assert diff.removed == ("fact 17",)
    assert diff.added == ("fact seventeen",)


def test_truncate_line_cuts_code_points_and_marks_the_cut() -> None:
    assert truncate_line("a" * 200, 200) == "a" * 200
    cut = truncate_line("\U0001f600" * 300, 200)
    assert len(cut) == 200
    assert cut.endswith("…")
