"""The BM25 keyword encoder: ids stay whole, words are stemmed, indices are stable."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from server.domain.keywords import KeywordEncoder, _index, keyword_document

ENCODER = KeywordEncoder()


def terms(text: str) -> list[str]:
    return list(ENCODER.terms(text))


def test_ids_are_kept_whole_and_in_parts() -> None:
    assert terms("acct-4821") == ["acct-4821", "acct", "4821"]
    assert "inc-20931" in terms("See INC-20931.")
    assert "po-7781-b" in terms("order PO-7781-B shipped")
    assert "ana@example.com" in terms("mail ana@example.com")
    assert "2026-11-30" in terms("on 2026-11-30,")


def test_words_are_casefolded_stemmed_and_stop_words_dropped() -> None:
    assert terms("The Runners were RUNNING") == ["runner", "run"]


def test_cjk_runs_become_bigrams() -> None:
    assert terms("東京タワー") == ["東京", "京タ", "タワ", "ワー"]


def test_fullwidth_forms_match_ascii() -> None:
    assert terms("ＡＣＣＴ－４８２１") == terms("acct-4821")  # noqa: RUF001


def test_exact_id_shares_more_terms_than_a_near_miss() -> None:
    query = set(ENCODER.encode_query("acct-4821").indices)
    exact = set(ENCODER.encode_document("moved money to acct-4821 today").indices)
    near = set(ENCODER.encode_document("moved money to acct-4822 today").indices)
    assert query <= exact
    assert len(query & near) == 1  # only "acct"


def test_document_weights_saturate_and_normalize_by_length() -> None:
    once = ENCODER.encode_document("alpha")
    many = ENCODER.encode_document("alpha " * 50)
    assert once.indices == many.indices
    assert many.values[0] > once.values[0]
    assert many.values[0] < 2.2  # k1 + 1 bounds the term-frequency part
    long_doc = ENCODER.encode_document("alpha " + "filler " * 600)
    alpha = long_doc.values[long_doc.indices.index(_index("alpha"))]
    assert alpha < once.values[0]


def test_query_has_unit_weights_and_unique_indices() -> None:
    q = ENCODER.encode_query("run running runs acct-4821 acct-4821")
    assert len(set(q.indices)) == len(q.indices)
    assert all(math.isclose(v, 1.0) for v in q.values)


def test_indices_are_stable_32_bit_values() -> None:
    # Pinned: a change here would silently break every index built before it.
    assert _index("acct-4821") == 1441337684
    assert _index("run") == 3365767514


def test_the_keyword_document_starts_with_the_turns_date_in_utc() -> None:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert keyword_document("we met", when) == "8 May 2023\n\nwe met"
    late = datetime(2023, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-2)))
    assert keyword_document("x", late).startswith("1 January 2024\n\n")
    assert {"8", "may", "2023"} <= set(terms(keyword_document("we met", when)))


# Text mixing what the tokenizer treats apart: ASCII words and ids, connectors, stop words,
# digits, accents and curly quotes, fullwidth forms, CJK runs, Cyrillic, and any character.
_PIECES = st.sampled_from(
    [
        "acct-4821",
        "e.g.",
        "a.b-c_d",
        "ana@example.com",
        "2026-11-30",
        "running",
        "the",
        "Café",
        "naïve",
        "\u2019",
        "\u2014",
        "\u201c",
        "\u2026",
        "\u3000",
        "\xa0",
        "\t",
        "\uff21\uff23\uff23\uff34\uff0d\uff14\uff18\uff12\uff11",
        "東京タワー",
        "北京",
        "Ростислав",
        "½",
        "Ⅻ",
        "፲",
        "-",
        ".",
        "_",
        " ",
        "\n",
        "x",
        "7",
    ]
)
_TEXTS = st.lists(
    st.one_of(_PIECES, st.text(st.characters(blacklist_categories=["Cs"]), max_size=6)),
    max_size=30,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_TEXTS)
def test_term_set_is_the_set_of_terms(text: str) -> None:
    """The bulk reading (ASCII and general paths) finds exactly the terms one by one."""
    assert ENCODER.term_set(text) == frozenset(ENCODER.terms(text))
