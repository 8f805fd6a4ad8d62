"""The one keyword (BM25) encoder, used at index time and at query time (DESIGN 3).

Keyword retrieval exists to find what embeddings miss: exact rare tokens such as account ids,
ticket numbers and names. So the tokenizer keeps id-like compounds whole: `acct-4821`,
`INC-20931`, `po-7781-b`, `ana@example.com` and `2026-11-30` are one term each (lowercased, not
stemmed), and their parts are terms too, so a query for `4821` still finds the account. Plain
words are casefolded, NFKC-normalized, stop words dropped and stemmed (Snowball English via
PyStemmer), so `running` finds `runs`. Runs of Han, Hiragana and Katakana, which have no
spaces between words, become overlapping character bigrams.

Terms map to sparse indices by a stable 32-bit hash (never Python's salted `hash`), so every
process and every release maps a term to the same index. A document's value for a term is
BM25's term-frequency part with length normalization; the inverse document frequency is
applied by the engine (Qdrant's IDF modifier on the sparse vector), so it follows the corpus
without re-encoding anything. A query's value is 1 per distinct term.
"""

from __future__ import annotations

import hashlib
import re
import string
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import Stemmer
import unicodedata2 as unicodedata

from server.domain.model import SparseVector

BM25_K1 = 1.2
"""Term-frequency saturation (the usual BM25 value)."""

BM25_B = 0.75
"""Strength of length normalization (the usual BM25 value)."""

AVERAGE_TERMS = 256.0
"""Assumed average chunk length in terms, for length normalization. Fixed (not measured on
the corpus) so that an indexed chunk never needs re-encoding; Qdrant's own BM25 uses 256."""

KEYWORD_VERSION = 3
"""The keyword representation of a chunk that the index holds (recorded with each point).

1: the chunk's text alone. 2: the turn's date as words ("8 May 2023", see
`keyword_document`), then the text. 3: version 2 plus its neighbours in the conversation at
CONTEXT_WEIGHT (`encode_in_context`, server/domain/context.py). Chunks of an older version
keep being searched as they are while the index worker encodes them again from what the
index stores (server/domain/reindex.py)."""

CONTEXT_FREE_VERSION = 2
"""The representation a chunk is first written in, its own words only: the index worker then
encodes it and its neighbours with their context (server/domain/context.py), read back from
the index. A chunk left at this version (a crash in between) is moved on by the reindexer."""

CONTEXT_WEIGHT = 0.5
"""How much a neighbouring chunk's terms count in a chunk's keyword vector, against its own.

A turn's words often say only half of what it is about: "yes, last Tuesday, with Mel" answers
a question asked in the turn before, and a question about it names what that turn named.
So the keyword side of a chunk also holds the terms of the chunk just before and just after
it in its conversation, at a lower weight so that a turn's own words still rank it first.
Measured on real conversations (LoCoMo, bench/search_levers.py), with the keyword share at
0.8 (server/domain/fusion.py, KEYWORD_WEIGHT): hybrid R@5 0.784 -> 0.826,
R@10 0.840 -> 0.885, MRR@10 0.612 -> 0.627; the leave-one-out folds chose 0.4 or 0.5 (figures
in docs/decisions.md). Whole neighbours (weight 1) lost the first hit (R@1 0.414). Only the
keyword side gets context: every context variant measured worse on the semantic side."""


@dataclass(frozen=True)
class KeywordRepresentation:
    """How a chunk's keyword vector is made, recorded with each point as its `version`: its
    keyword document plus `weight` times the terms of the `neighbours` chunks on each side of
    it in its conversation (server/domain/context.py)."""

    version: int
    neighbours: int
    weight: float


ONE_NEIGHBOUR = KeywordRepresentation(KEYWORD_VERSION, 1, CONTEXT_WEIGHT)
"""Representation 3, one chunk a side at CONTEXT_WEIGHT: every model's but those below."""
TWO_NEIGHBOURS = KeywordRepresentation(4, 2, 0.4)
"""Representation 4, two chunks a side at 0.4, for a model whose semantic side is strong.

With e5-small-v2 as the semantic side, every held-out LoCoMo file chose two chunks a side
(weights 0.3-0.5, 0.4 in three folds) and a keyword share of 0.6 (bench/search_encoder.py):
held out 0.536 / 0.842 / 0.895 / 0.660 (R@1 / R@5 / R@10 / MRR@10) against 0.512 / 0.837 /
0.888 / 0.646 with one chunk a side. With MiniLM the folds split between one and two (held out
no better than the service's), so its representation stays 3 (docs/decisions.md)."""
MODEL_REPRESENTATIONS = {"e5-small-v2-int8": TWO_NEIGHBOURS}
"""The keyword representation per model (the name before the first colon of its model id);
ONE_NEIGHBOUR for every other. A store keeps its model, so its chunks all reach one version;
chunks of another version are encoded again by the index worker (server/domain/reindex.py)."""


def keyword_representation(model_id: str) -> KeywordRepresentation:
    """The keyword representation of a chunk index whose semantic side is `model_id`."""
    return MODEL_REPRESENTATIONS.get(model_id.split(":", 1)[0], ONE_NEIGHBOUR)


_CONNECTORS = "-_./:@#+"
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
# A word: a run of letters and digits (not CJK); compounds join words with one connector.
_WORD = rf"[^\W_{_CJK}]+"


def _compound(word: str) -> str:
    """The pattern of a token: `word`s joined by single connectors (one word alone too)."""
    return rf"{word}(?:[{re.escape(_CONNECTORS)}]{word})*"


_TOKEN = re.compile(rf"(?P<compound>{_compound(_WORD)})|(?P<cjk>[{_CJK}]+)")
_PART = re.compile(_WORD)
_WORD_TOKEN = re.compile(_compound(_WORD))  # `_TOKEN` without its CJK runs
_CJK_RUN = re.compile(rf"[{_CJK}]+")
# The same tokens on ASCII text, where a word is [a-z0-9]+ once casefolded: the general
# classes cost several times more to match, and most text is ASCII (`term_set`).
_ASCII_TOKEN = re.compile(_compound("[a-z0-9]+"))
_ASCII_WORD_CHARS = frozenset(string.ascii_lowercase + string.digits)
# Casefolded ASCII text with every character but a letter or digit blanked: its words, split.
_ASCII_BLANKS = str.maketrans({chr(i): " " for i in range(128) if chr(i) not in _ASCII_WORD_CHARS})
# ... with letters and digits as "a" and connectors as "-": "a-a" marks a compound.
_ASCII_MARKS = str.maketrans(
    {
        chr(i): "a" if chr(i) in _ASCII_WORD_CHARS else "-" if chr(i) in _CONNECTORS else " "
        for i in range(128)
    }
)

# NLTK's English list (the apostrophe-free forms: the tokenizer splits "hasn't" into
# "hasn" and "t"), plus would, could, get, got.
STOP_WORDS = frozenset(
    """
    a about above after again against ain all am an and any are aren as at be because
    been before being below between both but by can could couldn d did didn do does
    doesn doing don down during each few for from further get got had hadn has hasn have
    haven having he her here hers herself him himself his how i if in into is isn it its
    itself just ll m ma me mightn more most mustn my myself needn no nor not now o of
    off on once only or other our ours ourselves out over own re s same shan she should
    shouldn so some such t than that the their theirs them themselves then there these
    they this those through to too under until up ve very was wasn we were weren what
    when where which while who whom why will with won would wouldn y you your yours
    yourself yourselves
    """.split()  # noqa: SIM905 (a word list reads better as text)
)


class KeywordEncoder:
    """Encodes documents and queries into BM25 sparse vectors. Thread-safe."""

    def __init__(self) -> None:
        self._local = threading.local()  # a PyStemmer stemmer is not thread-safe: one per thread

    def _stemmer(self) -> Stemmer.Stemmer:
        stemmer: Stemmer.Stemmer | None = getattr(self._local, "stemmer", None)
        if stemmer is None:
            stemmer = self._local.stemmer = Stemmer.Stemmer("english")
        return stemmer

    def terms(self, text: str) -> Iterator[str]:
        """The terms of `text`, in order, with repeats (see the module docstring)."""
        text = unicodedata.normalize("NFKC", text).casefold()
        stemmer = self._stemmer()
        for match in _TOKEN.finditer(text):
            compound = match.group("compound")
            if compound is None:
                yield from _bigrams(match.group("cjk"))
                continue
            parts = _PART.findall(compound)
            if len(parts) > 1:
                yield compound
            for part in parts:
                if part in STOP_WORDS:
                    continue
                yield part if any(c.isdigit() for c in part) else stemmer.stemWord(part)

    def term_set(self, text: str) -> frozenset[str]:
        """The distinct terms of `text`, `frozenset(self.terms(text))`, read in bulk: the
        ASCII pieces translated and split, the others by one pattern, and one stemmer call
        over the distinct words; three to seven times faster than the term-by-term loop (on
        the synthetic corpus 59 µs for 1,200 characters of ASCII, 107 for 1,800 with
        accents). server/domain/relevance.py reads the terms of every turn a search
        returns."""
        text = unicodedata.normalize("NFKC", text).casefold()
        found: set[str] = set()
        # No term spans whitespace: the pieces of pure ASCII (most of any text) take a fast
        # path, translated and split, or the ASCII pattern when a connector joins two words;
        # the few other pieces (accents, curly quotes, CJK) the general pattern.
        if text.isascii():
            plain, other = text, ""
        else:
            pieces = text.split()
            plain = " ".join([p for p in pieces if p.isascii()])
            other = " ".join([p for p in pieces if not p.isascii()])
        if "a-a" in plain.translate(_ASCII_MARKS):
            tokens = set(_ASCII_TOKEN.findall(plain))
        else:
            tokens = set(plain.translate(_ASCII_BLANKS).split())
        if other:
            tokens.update(_WORD_TOKEN.findall(other))
            for run in _CJK_RUN.findall(other):
                found.update(_bigrams(run))
        compounds = {t for t in tokens if not t.isalnum()}  # words joined by connectors
        words = tokens - compounds
        for compound in compounds:
            found.add(compound)
            words.update(_PART.findall(compound))
        words -= STOP_WORDS
        # As `terms`: a word holding a digit is not stemmed (a letter is never a digit, so a
        # word of letters alone needs no look at each character).
        numbers = {w for w in words if not w.isalpha() and any(c.isdigit() for c in w)}
        found |= numbers
        found.update(self._stemmer().stemWords(list(words - numbers)))
        return frozenset(found)

    def encode_document(self, text: str) -> SparseVector:
        """BM25 term-frequency weights of a chunk, length-normalized."""
        counts = Counter(_index(t) for t in self.terms(text))
        length = sum(counts.values())
        norm = BM25_K1 * (1 - BM25_B + BM25_B * length / AVERAGE_TERMS)
        items = sorted(counts.items())
        return SparseVector(
            indices=tuple(i for i, _ in items),
            values=tuple(tf * (BM25_K1 + 1) / (tf + norm) for _, tf in items),
        )

    def encode_in_context(
        self, own: str, context: Sequence[str], weight: float = CONTEXT_WEIGHT
    ) -> SparseVector:
        """A chunk's keyword vector with context: the BM25 weights of `own` (its keyword
        document) plus `weight` times those of its neighbours' texts, encoded together as one
        document, term by term. Without context it is `encode_document(own)`. (Only the
        search lab, bench/search_levers.py, passes another weight than CONTEXT_WEIGHT.)"""
        vector = self.encode_document(own)
        around = "\n\n".join(text for text in context if text)
        if not around:
            return vector
        weights = dict(zip(vector.indices, vector.values, strict=True))
        extra = self.encode_document(around)
        for index, value in zip(extra.indices, extra.values, strict=True):
            weights[index] = weights.get(index, 0.0) + weight * value
        items = sorted(weights.items())
        return SparseVector(indices=tuple(i for i, _ in items), values=tuple(v for _, v in items))

    def encode_query(self, text: str) -> SparseVector:
        """Weight 1 per distinct query term; the engine multiplies in each term's IDF."""
        indices = sorted({_index(t) for t in self.terms(text)})
        return SparseVector(indices=tuple(indices), values=tuple(1.0 for _ in indices))


def is_id_like(term: str) -> bool:
    """Whether a term (from `KeywordEncoder.terms`) is a compound the encoder keeps whole, an
    id such as `acct-4821`, `INC-20931` or `ana@example.com`: what the keyword side exists to
    find (server/domain/relevance.py counts one as a strong match on its own)."""
    return any(c in term for c in _CONNECTORS)


def keyword_document(text: str, turn_time: datetime) -> str:
    """What the keyword side indexes for a chunk: the turn's date as words, then the text.

    Questions about the past often name the time ("what did I cook on 3 May?", "in March
    2023"), and the date a turn happened is part of what it says, but the turn's own text
    rarely spells it. Measured on real conversations (LoCoMo, bench/search_levers.py): with
    the date, keyword recall@1 0.460 -> 0.485 and hybrid MRR@10 0.587 -> 0.612. Only the
    keyword side gets it: the semantic model gained nothing from a date (0.339 either way).
    The date is the turn time's (UTC) day, month name and year; the stored and shown text
    stays the chunk's own.
    """
    day = turn_time.astimezone(UTC)
    month = _MONTHS[day.month - 1]  # not %B, which follows the process's locale
    return f"{day.day} {month} {day.year}\n\n{text}"


_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def _bigrams(run: str) -> Iterator[str]:
    if len(run) == 1:
        yield run
    for i in range(len(run) - 1):
        yield run[i : i + 2]


def _index(term: str) -> int:
    """A stable 32-bit sparse index for a term."""
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "big")
