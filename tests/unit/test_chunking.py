"""Chunking of a turn (DESIGN 3): at most 4,000 characters, no word split where whitespace
allowed a boundary, at most 10 chunks, nothing lost or added."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.domain import text as text_module
from server.domain.chunking import CHUNK_CHARS, MAX_CHUNKS, split_text, split_turn, turn_text

WORDS = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=0, max_size=60)


def test_short_turn_is_one_chunk_question_then_answer() -> None:
    turn = split_turn("What is my account?", "It is acct-4821.")
    assert turn.chunks == ("What is my account?\n\nIt is acct-4821.",)
    assert not turn.truncated


def test_empty_side_is_left_out_and_text_is_sanitized() -> None:
    assert turn_text("  hi\u200b there ", "") == "hi there"
    assert split_turn("", "  ").chunks == ()


def test_boundary_moves_back_to_whitespace() -> None:
    text = "a" * 3990 + " " + "b" * 20
    chunks = split_text(text).chunks
    assert chunks == ("a" * 3990 + " ", "b" * 20)


def test_run_without_whitespace_is_cut_hard() -> None:
    chunks = split_text("x" * 9000).chunks
    assert [len(c) for c in chunks] == [4000, 4000, 1000]


def test_exactly_the_limit_is_one_chunk() -> None:
    assert split_text("y" * CHUNK_CHARS).chunks == ("y" * CHUNK_CHARS,)


def test_at_most_ten_chunks_and_the_rest_is_reported_cut() -> None:
    word = "word "
    text = word * (CHUNK_CHARS * 11 // len(word))
    turn = split_text(text)
    assert len(turn.chunks) == MAX_CHUNKS
    assert turn.truncated
    assert text.startswith(turn.indexed_text)
    assert len(turn.indexed_text) <= CHUNK_CHARS * MAX_CHUNKS


def test_code_points_not_utf16_units_are_counted() -> None:
    emoji = "\U0001f600"  # two UTF-16 units, one code point
    chunks = split_text(emoji * 4000).chunks
    assert chunks == (emoji * 4000,)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(WORDS, st.sampled_from([" ", "\n", "\t", "  ", "\u3000"])), max_size=400
    ).map(lambda parts: "".join(w + s for w, s in parts)),
    st.integers(min_value=5, max_value=300),
)
def test_properties_over_random_texts(text: str, limit: int) -> None:
    turn = split_text(text, chunk_chars=limit, max_chunks=1_000_000)
    # Nothing lost, nothing added, no empty chunk.
    assert turn.indexed_text == text
    assert not turn.truncated
    assert all(turn.chunks)
    offset = 0
    for chunk in turn.chunks:
        assert len(chunk) <= limit
        end = offset + len(chunk)
        if end < len(text):
            window = text[offset : offset + limit + 1]
            split_word = not (text[end].isspace() or text[end - 1].isspace())
            if split_word:
                # A word was cut only if the whole window had no whitespace boundary at all.
                assert not any(c.isspace() for c in window[1:]), (offset, end)
        offset = end


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=0, max_size=3000), st.integers(min_value=1, max_value=7))
def test_truncation_keeps_a_prefix(text: str, max_chunks: int) -> None:
    turn = split_text(text, chunk_chars=100, max_chunks=max_chunks)
    assert text.startswith(turn.indexed_text)
    assert len(turn.chunks) <= max_chunks
    assert turn.truncated == (len(turn.indexed_text) < len(text))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            WORDS,
            st.integers(min_value=1, max_value=900),  # each word repeated: long turns quickly
            st.sampled_from([" ", "\n", "\r\n", "\u2028", "\u200b", ""]),
        ),
        max_size=40,
    ),
    WORDS,
)
def test_properties_at_the_real_limits(parts: list[tuple[str, int, str]], answer: str) -> None:
    """A whole turn at the default limits: every chunk is at most CHUNK_CHARS code points of
    sanitized text, at most MAX_CHUNKS of them, and they join back to the turn text (what is
    cut off is reported, and only ever a suffix)."""
    question = "".join((word + sep) * times for word, times, sep in parts)
    turn = split_turn(question, answer)
    text = turn_text(question, answer)
    assert len(turn.chunks) <= MAX_CHUNKS
    assert all(0 < len(chunk) <= CHUNK_CHARS for chunk in turn.chunks)
    assert text.startswith(turn.indexed_text)
    assert turn.truncated == (len(turn.indexed_text) < len(text))
    assert not turn.truncated or len(turn.chunks) == MAX_CHUNKS
    # Chunks are pieces of sanitized text: nothing invisible, no other line break than LF.
    for chunk in turn.chunks:
        assert not set(chunk) & {"\r", "\u2028", "\u200b"}
        assert text_module._INVISIBLE.search(chunk) is None
