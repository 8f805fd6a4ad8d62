"""Properties of the sanitizer and the count that must hold for every text (hypothesis).

The shared vectors pin chosen inputs; these generate texts rich in what the rules are about
(joiners, selectors, braille, fillers, separators, combining marks, tag characters, emoji,
Persian and Devanagari letters) and check what the rule promises for all of them.
"""

from __future__ import annotations

import regex
import unicodedata2
from hypothesis import given, settings
from hypothesis import strategies as st

from server.domain import text as text_module
from server.domain.text import char_count, sanitize, sanitize_and_count

INTERESTING = [
    "\u200c", "\u200d", "\u200b", "\u2060", "\ufeff", "\u00ad", "\u034f", "\u115f", "\u1160",
    "\u3164", "\uffa0", "\u17b4", "\u17b5", "\u180b", "\u180e", "\u180f", "\u2065", "\ufff0",
    "\U000e0080", "\U000e0041", "\U000e0100", "\ufe0e", "\ufe0f", "\u2800", "\u2801", "\u28ff",
    "\u2028", "\u2029", "\r", "\n", "\t", " ", "\u3000", "\x00", "\x85", "\u0301",
    "\u0327", "\u094d", "\u0915", "\u0937", "\u0645", "\u06cc", "\u062e", "\U0001f468",
    "\U0001f3fd", "\u2764", "e", "a", "\u0958", "\u212b", "\u1820", "\u05d0", "\u05b8",
]  # fmt: skip
"""Code points the rules treat specially, or that sit next to them in real text."""

TEXTS = st.one_of(
    # Short texts of only the special characters find the interactions between the rules
    # (a joiner run between two selectors, a blank between joiners...); longer mixed ones find
    # the rest.
    st.text(alphabet=st.sampled_from(INTERESTING), max_size=12),
    st.text(
        alphabet=st.one_of(
            st.sampled_from(INTERESTING), st.characters(blacklist_categories=["Cs"])
        ),
        max_size=60,
    ),
)
BASES = text_module.JOINER_BASE_CATEGORIES
MARKS = text_module.MARK_CATEGORIES
VARIATION_SELECTORS = set(text_module._expand(text_module.VARIATION_SELECTORS))


def _removed_outright(ch: str) -> bool:
    """What the rule removes wherever it stands (the characters with their own rule aside)."""
    if ch in VARIATION_SELECTORS or ch in "\u200c\u200d\u2800":
        return False
    category = unicodedata2.category(ch)
    return (
        category == "Cf"
        or (category == "Cc" and ch not in "\n\t")
        or 0xE0000 <= ord(ch) <= 0xE007F
        or regex.fullmatch(r"\p{Default_Ignorable_Code_Point}", ch) is not None
    )


@settings(max_examples=500, deadline=None)
@given(TEXTS)
def test_sanitize_is_idempotent(text: str) -> None:
    clean = sanitize(text)
    assert sanitize(clean) == clean


@settings(max_examples=500, deadline=None)
@given(TEXTS)
def test_output_has_no_invisible_or_control_character_nor_other_line_break(text: str) -> None:
    clean = sanitize(text)
    assert not any(_removed_outright(ch) for ch in clean)
    assert not set(clean) & {"\r", "\u2028", "\u2029", "\x85"}


@settings(max_examples=500, deadline=None)
@given(TEXTS)
def test_what_survives_of_the_special_characters_obeys_its_rule(text: str) -> None:
    clean = sanitize(text)
    for i, ch in enumerate(clean):
        before = clean[i - 1] if i else ""
        after = clean[i + 1] if i + 1 < len(clean) else ""
        if ch in "\u200c\u200d":
            # Alone, after a base that uses a joiner (past its marks), before a base or a mark.
            assert after and unicodedata2.category(after) in BASES | MARKS
            base = i - 1
            while base >= 0 and unicodedata2.category(clean[base]) in MARKS:
                base -= 1
            assert base >= 0 and unicodedata2.category(clean[base]) in BASES
        elif ch in VARIATION_SELECTORS:
            assert before not in VARIATION_SELECTORS  # never a run
    for run in regex.finditer("\u2800+", clean):
        start, end = run.span()
        assert start > 0 and "\u2801" <= clean[start - 1] <= "\u28ff"
        assert end < len(clean) and "\u2801" <= clean[end] <= "\u28ff"


@settings(max_examples=500, deadline=None)
@given(TEXTS)
def test_output_is_nfc_and_stripped_and_counted_in_code_points(text: str) -> None:
    clean, count = sanitize_and_count(text)
    assert unicodedata2.normalize("NFC", clean) == clean
    assert clean == clean.strip()
    assert count == char_count(text) == len(clean)  # code points, whatever UTF-16 says


@settings(max_examples=300, deadline=None)
@given(TEXTS, st.lists(st.integers(min_value=0, max_value=60), max_size=5))
def test_inserting_characters_that_are_always_removed_changes_nothing(
    text: str, positions: list[int]
) -> None:
    """Removal comes before the other rules (joiner neighbours, selector runs, NFC,
    stripping), so an always-removed character cannot change what they see. Line endings come
    before removal (tests/vectors/README.md: `"a\r\u200b\nb"` is two line ends), so a filler
    is never put inside a CR LF pair here."""
    spiked = text
    fillers = ["\u200b", "\u3164", "\U000e0041", "\x00", "\u034f"]
    for position, filler in zip(positions, fillers, strict=False):
        if spiked[position - 1 : position + 1] == "\r\n":
            position += 1  # after the pair, not between its two characters
        spiked = spiked[:position] + filler + spiked[position:]
    assert sanitize(spiked) == sanitize(text)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_ascii_text_keeps_every_printable_character(text: str) -> None:
    kept = "".join(ch for ch in text.replace("\r\n", "\n").replace("\r", "\n") if ch.isprintable()
                   or ch in "\n\t")  # fmt: skip
    assert sanitize(text) == kept.strip()


def _every_step(text: str) -> str:
    """The rule's steps in their order (tests/vectors/README.md), each applied whether or not
    its characters are there: what `sanitize` must equal with its shortcuts (ASCII, Latin-1,
    and the general path's skipping a step whose characters are absent)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\u2028", "\n").replace("\u2029", "\n")
    text = text_module._INVISIBLE.sub("", text)
    text = text_module._STRAY_BRAILLE_BLANKS.sub("", text)
    text = text_module._JOINER_RUN.sub(lambda run: text_module._keep_joiner(text, run), text)
    text = text_module._SELECTOR_RUN.sub(r"\1", text)
    text = unicodedata2.normalize("NFC", text)
    return text.strip()


LATIN1_TEXTS = st.text(
    alphabet=st.one_of(
        st.characters(max_codepoint=0xFF),
        st.sampled_from(["\r", "\n", "\t", " ", "\x85", "\xa0", "\xad", "\x7f", "\x9f", "é"]),
    ),
    max_size=80,
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(TEXTS, LATIN1_TEXTS))
def test_sanitize_is_every_step_in_order(text: str) -> None:
    assert sanitize(text) == _every_step(text)


@settings(max_examples=300, deadline=None)
@given(LATIN1_TEXTS)
def test_the_latin1_shortcut_is_the_general_path(text: str) -> None:
    general = text_module._sanitize_unicode(text.replace("\r\n", "\n").replace("\r", "\n"))
    assert sanitize(text) == general
