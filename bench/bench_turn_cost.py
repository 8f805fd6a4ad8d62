"""The cost of a turn: the server's CPU per assistant turn, by component, from an
integration's own turn loop, and what indexing costs by turn size next to the model alone.

What it measures
----------------
One ``memoria serve`` on the embedded default (SQLite and qdrant-edge in a temporary data
dir, one principal with a seeded memory block) is driven by the Python client's turn adapter
(``memoria_client.MemoriaTurnAdapter``, what the integrations wrap), one turn after another
in conversations of the synthetic corpus (search_corpus.py; questions lengthened to about 150
characters, answers of log-normal length, median about 1,100 characters). Per turn, as an
agent loop calls it:

1. ``start_turn`` and ``prompt_section()``: ``RenderPromptSection`` naming the turn;
2. every fifth turn, the model's ``conversation_search`` tool call through ``execute()``:
   ``ExecuteToolCall``, which runs the same search as ``SearchConversations`` and words the
   hits for the model;
3. ``finish_turn(question, answer)`` then ``flush()``: ``IndexTurn``, sent without waiting
   as the adapter does, and waited for, so that its synchronous part has a window of its own.

It prints the server's CPU per turn for each component (and, after the loop, the same
renders again with the worker idle, as a reference: in the loop the worker indexes the turns
before beside them, sharing the cores and the GIL):

* ``render``: RenderPromptSection (the block read, the section, the inspector's record);
* ``accept``: IndexTurn's synchronous part (checks, redaction, the durable insert);
* ``search``: the search tool call (query embedding, the engine's two queries, fusion);
* ``index``: the background worker: chunking, embedding, keyword vectors, the engine's
  writes, marking the turn indexed;
* ``inspector``: the background writer of the inspector's records (batched, 50 ms linger);
* ``other``: the server's remaining threads between calls (gRPC's timers and pollers, the
  health monitor): idle cost, not the turn's.

Then, in the same run, indexing alone for turns of 300, 1,600 and 4,000 characters (a
question of at most 150 characters and an answer filling the rest, submitted back to back,
then drained): the worker's CPU per turn and turns per second per core (one over it), next
to the embedding model's own cost for the same texts, measured in this process with the
server's embedder class (``OnnxMiniLmEmbedder``, one intra-op thread like the server's
default; the chunks of each turn in one ``embed_documents`` call, as the worker embeds them;
this thread's CPU time). Last, the server's RSS when serving idle, after the warm-up and
after the run.

How the CPU is attributed
-------------------------
CPU time, not wall time, so that the figures hold on a machine shared with other work. The
server names its own threads at the OS level (server/adapters/thread_names.py): the indexing
worker ``index-worker-N``, the RPC pool ``rpc_N``, the inspector's writer
``inspect-writer``; the embedded engine names its pool ``edge-search-N``; gRPC's C core
``event_engine`` and ``grpc_global_tim``; the rest keep the process's name. This script
reads every thread's CPU time in nanoseconds (``/proc/PID/task/TID/schedstat``, the
scheduler's exact on-CPU time, not tick samples) before and after each synchronous call,
one call at a time (one integration, as a person's turns come), and attributes each
thread's CPU in each interval:

* ``index-worker-N``: always to ``index``; ``inspect-writer``: always to ``inspector``;
* ``edge-search-N``: to ``search`` inside a search call, else to ``index`` (the worker also
  uses the engine's pool, to read a turn's neighbours for its keyword context). Before each
  search the loop waits until the worker has indexed every accepted turn (the backlog is
  read from the server's SQLite file, read-only, at no cost to the server), so that the
  engine's pool works for the search alone in its window;
* every other thread (the RPC pool, gRPC's threads, the Python server loop): to the call
  in flight, or to ``other`` between calls.

The process's own CPU over the loop (``/proc/PID/stat``) is printed beside the sum over
threads, as a check that nothing was missed. CPU time is less sensitive to neighbours than
wall time, not immune: under load, caches and the shared core's other hyperthread make the
same work cost more CPU, so the load average is printed with the figures, and the model's
cost, measured in the same run on the same texts, is the reference to read the indexing
figures against.

Usage (from the repository root)::

    .venv/bin/python bench/bench_turn_cost.py            # 200 turns, ~4 min
    .venv/bin/python bench/bench_turn_cost.py --quick    # 20 turns, under a minute

Everything binds 127.0.0.1; the server is stopped and its data dir removed before the script
exits, also on Ctrl-C, SIGTERM or an error. A failed call makes the exit status 1.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc

# harness.py, procs.py and search_corpus.py sit beside this script (its folder is on sys.path).
from harness import TENANT, Population, SqliteBacklog, drain, sqlite_database
from procs import (
    HOST,
    RUN_ENDED,
    BudgetExceeded,
    Memory,
    ServerProcess,
    failure_outcome,
    machine_line,
    process_cpu_seconds,
    raise_on_sigterm,
    software_line,
)
from search_corpus import CorpusGenerator, Turn

from memoria_client.adapter import MemoriaTurnAdapter
from server.adapters.embedding.minilm import (
    MODEL_NAME,
    QUANTIZED_MODEL_NAME,
    OnnxMiniLmEmbedder,
)
from server.adapters.sql.engine import sqlite_url
from server.domain.chunking import split_turn

SERVICE = "memoria.v1.ConversationSearchService"  # SERVING once both stores answer
PRINCIPAL = "p0"  # the seeded principal: its block is rendered every turn
SEED = 20261205
SEARCH_EVERY = 5
SIZES = (300, 1_600, 4_000)
QUESTION_CHARS = 150
SERVER_START_TIMEOUT_S = 180.0
SERVER_STOP_TIMEOUT_S = 15.0
CALL_TIMEOUT_S = 30.0
COMPONENTS = ("render", "accept", "search", "index", "inspector", "other")


# --------------------------------------------------------------------------------------------
# Per-thread CPU of the server, attributed to components
# --------------------------------------------------------------------------------------------


def _group(name: str) -> str:
    """A server thread's kind, from its OS name (see the module docstring)."""
    if name.startswith("index-worker"):
        return "worker"
    if name.startswith("edge-search"):
        return "engine"
    if name.startswith("inspect-writer"):
        return "inspector"
    return "serving"  # rpc_N, event_engine, grpc_global_tim, the Python server loop, ...


class ThreadMeter:
    """Reads the server's threads' CPU times and books each interval to a component.

    `mark(window)` ends the interval begun by the previous mark: `window` is the call that
    was in flight during it ("render", "accept", "search"), or None between calls.
    """

    def __init__(self, pid: int) -> None:
        self._task_dir = Path(f"/proc/{pid}/task")
        self._names: dict[str, str] = {}
        self._last = self._read()
        self.booked: Counter[str] = Counter()  # nanoseconds per component
        self.calls: Counter[str] = Counter()

    def _name(self, tid: str) -> str:
        name = self._names.get(tid)
        if name is None:
            name = (self._task_dir / tid / "comm").read_text().strip()
            if name != "memoria":  # a thread names itself as it starts: read again until then
                self._names[tid] = name
        return name

    def _read(self) -> dict[str, tuple[str, int]]:
        """tid -> (thread kind, CPU nanoseconds so far), for every live thread."""
        threads: dict[str, tuple[str, int]] = {}
        for task in self._task_dir.iterdir():
            try:
                ns = int((task / "schedstat").read_text().split()[0])
                threads[task.name] = (_group(self._name(task.name)), ns)
            except (OSError, ValueError, IndexError):
                continue  # the thread exited meanwhile
        return threads

    def mark(self, window: str | None) -> None:
        now = self._read()
        for tid, (group, ns) in now.items():
            spent = ns - self._last.get(tid, (group, 0))[1]
            if group == "worker":
                self.booked["index"] += spent
            elif group == "inspector":
                self.booked["inspector"] += spent
            elif group == "engine":
                self.booked["search" if window == "search" else "index"] += spent
            else:
                self.booked[window or "other"] += spent
        if window is not None:
            self.calls[window] += 1
        self._last = now

    def reset(self) -> None:
        """Start a new account from now."""
        self._last = self._read()
        self.booked = Counter()
        self.calls = Counter()


# --------------------------------------------------------------------------------------------
# The texts
# --------------------------------------------------------------------------------------------


def loop_turns(count: int) -> tuple[list[Turn], list[str]]:
    """`count` turns of one person's conversations from the synthetic corpus, and queries
    about them for the search tool calls. The corpus's questions (mean about 90 characters)
    are lengthened to about QUESTION_CHARS with the start of the turn before's answer, as a
    person quoting what they were told: the question's length as the issue measured it."""
    generator = CorpusGenerator(SEED)
    corpus = generator.principal(TENANT, PRINCIPAL, count + count // 5 + 10)
    if len(corpus.turns) < count + 1:
        raise RuntimeError(f"the corpus gave {len(corpus.turns)} turns, {count + 1} needed")
    turns: list[Turn] = []
    for before, turn in zip(corpus.turns[:count], corpus.turns[1 : count + 1], strict=True):
        question = _cut(f"{turn.question} {before.answer}", QUESTION_CHARS)
        chunks = split_turn(question, turn.answer).chunks
        turns.append(
            Turn(turn.conversation_id, turn.turn_id, question, turn.answer, turn.turn_time, chunks)
        )
    return turns, generator.queries(corpus, count // SEARCH_EVERY + 10)


def _cut(text: str, chars: int) -> str:
    """`text` cut to at most `chars` characters, back to a space."""
    if len(text) <= chars:
        return text
    cut = text.rfind(" ", 0, chars + 1)
    return text[: cut if cut > 0 else chars].rstrip()


def sized_turns(size: int, count: int, tag: str) -> list[Turn]:
    """`count` turns whose text (question, blank line, answer) is `size` characters: a
    corpus question cut to QUESTION_CHARS and answers of the corpus joined and cut to fill."""
    generator = CorpusGenerator(SEED + size)
    corpus = generator.principal(TENANT, f"sized-{size}", count * (size // 1000 + 2))
    prose = " ".join(t.answer.replace("\n\n", " ") for t in corpus.turns)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    turns: list[Turn] = []
    offset = 0
    for i in range(count):
        question = _cut(corpus.turns[i % len(corpus.turns)].question, QUESTION_CHARS)
        answer_chars = size - len(question) - 2  # turn_text joins them with a blank line
        while len(prose) - offset < answer_chars * 2:
            prose += " " + prose
        answer = prose[offset : offset + answer_chars + 40]
        answer = answer[answer.find(" ") + 1 :]  # start on a word
        answer = answer[:answer_chars].rstrip()
        offset += answer_chars
        chunks = split_turn(question, answer).chunks
        when = start + timedelta(minutes=i)
        turns.append(Turn(f"{tag}-{size}", f"turn-{i}", question, answer, when, chunks))
    return turns


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one run measured (ms are CPU milliseconds)."""

    turns: list[Turn]
    loop_ns: Counter[str]
    loop_calls: Counter[str]
    process_s: float  # the server process's CPU over the loop, all threads
    render_alone_ns: float  # a render's CPU with the worker idle (after the loop drained)
    sized: dict[int, tuple[list[Turn], float]]  # size -> (turns, index ns per turn)
    memory: dict[str, Memory]
    failures: int


class Loop:
    """The integration's turn loop against the server, with its CPU booked by `meter`."""

    def __init__(
        self,
        adapter: MemoriaTurnAdapter,
        meter: ThreadMeter,
        backlog: SqliteBacklog,
        deadline: float,
    ) -> None:
        self.adapter = adapter
        self.meter = meter
        self.backlog = backlog
        self.deadline = deadline
        self.failures = 0

    def wait_indexed(self) -> None:
        """Until the worker has indexed every accepted turn (bounded by the time budget)."""
        counts, took = drain(self.backlog, max(1.0, self.deadline - time.monotonic()))
        if took is None:
            raise BudgetExceeded(f"the backlog drained ({counts['pending']} turns pending)")
        if counts["failed"]:
            raise RuntimeError(f"{counts['failed']} turns failed to index")

    def turn(self, turn: Turn, query: str | None) -> None:
        """One turn as an agent loop runs it (see the module docstring)."""
        adapter, meter = self.adapter, self.meter
        meter.mark(None)
        adapter.start_turn(turn.conversation_id, turn.turn_id)
        section = adapter.prompt_section()
        meter.mark("render")
        if section == adapter.model_tools.unavailable_prompt_section:
            self.failures += 1
        if query is not None:
            self.wait_indexed()  # the engine's pool then works for the search alone
            meter.mark(None)
            result = adapter.execute("conversation_search", {"query": query})
            meter.mark("search")
            self.failures += result.is_error
        adapter.finish_turn(turn.question, turn.answer, turn.turn_time)
        self.failures += adapter.flush(CALL_TIMEOUT_S)
        meter.mark("accept")
        if time.monotonic() > self.deadline:
            raise BudgetExceeded("the turn loop ended")

    def submit(self, turns: Sequence[Turn]) -> None:
        """Accept `turns` back to back (no render, no search), then wait until indexed."""
        for turn in turns:
            self.adapter.start_turn(turn.conversation_id, turn.turn_id)
            self.adapter.finish_turn(turn.question, turn.answer, turn.turn_time)
        self.failures += self.adapter.flush(CALL_TIMEOUT_S)
        self.wait_indexed()


def measure(turn_count: int, sized_count: int, warmup: int, budget_s: float, model: str) -> Run:
    """Start the server, warm it up, run the loop and the sized phases; see the docstring."""
    deadline = time.monotonic() + budget_s
    turns, queries = loop_turns(turn_count + warmup)
    warm, turns = turns[:warmup], turns[warmup:]
    sized = {size: sized_turns(size, sized_count, "sized") for size in SIZES}
    memory: dict[str, Memory] = {}
    with sqlite_database(Population(1, 0)) as db, tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(db.server_args[db.server_args.index("--data-dir") + 1])
        server = ServerProcess(
            db.server_args,
            Path(tmp),
            service=SERVICE,
            stop_timeout_s=SERVER_STOP_TIMEOUT_S,
            env={"MEMORIA_LOCAL_EMBEDDING_MODEL": model},
        )
        backlog = SqliteBacklog(Path(sqlite_url(data_dir).removeprefix("sqlite:///")), TENANT)
        try:
            server.wait_serving(SERVER_START_TIMEOUT_S)
            pid = server.proc.pid
            memory["serving, idle"] = Memory.of(pid)
            metadata = (("x-memoria-tenant", TENANT), ("x-memoria-principal", PRINCIPAL))
            with grpc.insecure_channel(f"{HOST}:{server.port}") as channel:
                adapter = MemoriaTurnAdapter(channel, metadata, timeout=CALL_TIMEOUT_S)
                meter = ThreadMeter(pid)
                loop = Loop(adapter, meter, backlog, deadline)
                for i, turn in enumerate(warm):  # every path once or more, not measured
                    loop.turn(turn, queries[-1 - i] if i % 2 else None)
                loop.submit(sized_turns(SIZES[-1], 2, "warm-up"))
                memory["after the warm-up"] = Memory.of(pid)

                meter.reset()
                cpu_before = process_cpu_seconds(pid)
                for i, turn in enumerate(turns):
                    search = i % SEARCH_EVERY == SEARCH_EVERY - 1
                    loop.turn(turn, queries[i // SEARCH_EVERY] if search else None)
                loop.wait_indexed()
                meter.mark(None)
                process_s = process_cpu_seconds(pid) - cpu_before
                loop_ns, loop_calls = meter.booked, meter.calls

                meter.reset()  # the loop's renders again, now with nothing to index
                for turn in turns:
                    meter.mark(None)
                    adapter.start_turn(turn.conversation_id, turn.turn_id)
                    loop.failures += (
                        adapter.prompt_section() == adapter.model_tools.unavailable_prompt_section
                    )
                    meter.mark("render")
                render_alone_ns = meter.booked["render"] / meter.calls["render"]

                sized_ns: dict[int, tuple[list[Turn], float]] = {}
                for size, size_turns in sized.items():
                    meter.reset()
                    loop.submit(size_turns)
                    meter.mark(None)
                    sized_ns[size] = (size_turns, meter.booked["index"] / len(size_turns))
                memory["after the run"] = Memory.of(pid)
        finally:
            backlog.close()
            server.stop()
    return Run(
        turns, loop_ns, loop_calls, process_s, render_alone_ns, sized_ns, memory, loop.failures
    )


def model_ms(embedder: OnnxMiniLmEmbedder, turns: Sequence[Turn]) -> tuple[float, float]:
    """The model's CPU per turn (ms) and windows per turn for `turns`, each turn's chunks
    in one call, on this thread (one intra-op thread runs on the caller's)."""
    embedder.embed_documents([turns[0].chunks[0]])  # the first run allocates
    spent = 0.0
    windows = 0
    for turn in turns:
        started = time.thread_time()
        vectors = embedder.embed_documents(list(turn.chunks))
        spent += time.thread_time() - started
        windows += sum(len(v) for v in vectors)
    return spent / len(turns) * 1000, windows / len(turns)


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------


def _chars(turn: Turn) -> int:
    return len(turn.question) + 2 + len(turn.answer)


def report(run: Run, embedder: OnnxMiniLmEmbedder) -> None:
    turns = len(run.turns)
    searches = run.loop_calls["search"]
    lengths = sorted(_chars(t) for t in run.turns)
    questions = statistics.mean(len(t.question) for t in run.turns)
    chunks = statistics.mean(len(t.chunks) for t in run.turns)
    print(
        f"loop: {turns} turns of one person's conversations through MemoriaTurnAdapter, "
        f"a search tool call every {SEARCH_EVERY}th ({searches}); question mean "
        f"{questions:.0f} characters, turn text mean {statistics.mean(lengths):.0f} "
        f"(p10 {lengths[len(lengths) // 10]}, p90 {lengths[len(lengths) * 9 // 10]}), "
        f"{chunks:.2f} chunks a turn"
    )
    print("\nserver CPU per turn, by component (CPU ms of the server's threads)")
    print(f"{'component':<10} {'calls':>6} {'ms/call':>8} {'ms/turn':>8} {'share':>7}")
    total_ns = sum(run.loop_ns[c] for c in COMPONENTS)
    for component in COMPONENTS:
        ns = run.loop_ns[component]
        calls = run.loop_calls[component] if component in ("render", "accept", "search") else 0
        per_call = f"{ns / calls / 1e6:8.2f}" if calls else f"{'':>8}"
        calls_text = str(calls) if calls else ""
        print(
            f"{component:<10} {calls_text:>6} {per_call} {ns / turns / 1e6:8.2f} "
            f"{ns / total_ns:7.1%}"
        )
    print(f"{'total':<10} {'':>6} {'':>8} {total_ns / turns / 1e6:8.2f} {1:7.1%}")
    print(
        f"render alone: {run.render_alone_ns / 1e6:.2f} ms a call (the same {turns} renders "
        "after the loop, the worker idle; in the loop the worker indexed beside them)"
    )
    print(
        f"check: the process's CPU over the loop {run.process_s:.2f} s, its threads' "
        f"{total_ns / 1e9:.2f} s ({total_ns / 1e9 / run.process_s:.1%}; /proc/PID/stat counts "
        "in clock ticks)"
    )

    print("\nindexing by turn size: the worker's CPU against the model's on the same texts")
    header = f"{'turn chars':>10} {'turns':>5} {'chunks':>6} {'windows':>7}"
    print(
        f"{header} {'index ms':>9} {'turns/s/core':>12} {'model ms':>9} "
        f"{'turns/s/core':>12} {'model share':>11}"
    )
    rows: list[tuple[str, list[Turn], float]] = [
        (f"{size:,}", size_turns, ns / 1e6) for size, (size_turns, ns) in run.sized.items()
    ]
    rows.append(("loop", run.turns, run.loop_ns["index"] / turns / 1e6))
    for label, row_turns, index_ms in rows:
        model, windows = model_ms(embedder, row_turns)
        row_chunks = statistics.mean(len(t.chunks) for t in row_turns)
        print(
            f"{label:>10} {len(row_turns):>5} {row_chunks:>6.2f} {windows:>7.2f} "
            f"{index_ms:>9.1f} {1000 / index_ms:>12.2f} {model:>9.1f} "
            f"{1000 / model:>12.2f} {model / index_ms:>11.1%}"
        )

    print("\nserver memory (MiB): RSS (anonymous + file-backed)")
    for label, memory in run.memory.items():
        print(f"  {label:<18} {memory.rss:7.0f} ({memory.anon:.0f} + {memory.file:.0f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200, help="turns in the measured loop")
    parser.add_argument("--sized", type=int, default=30, help="turns of each size indexed")
    parser.add_argument("--warmup", type=int, default=10, help="turns before measuring")
    parser.add_argument("--quick", action="store_true", help="20 turns, 5 of each size")
    parser.add_argument("--time-budget", type=float, default=900.0, help="seconds per model")
    parser.add_argument(
        "--models",
        default=MODEL_NAME,
        help=f"in-process models, comma-separated, each measured in turn (the server's "
        f"MEMORIA_LOCAL_EMBEDDING_MODEL): {MODEL_NAME} (default), {QUANTIZED_MODEL_NAME}",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.turns, args.sized, args.warmup = 20, 5, 3
    if args.turns < SEARCH_EVERY or args.sized < 1 or args.warmup < 2:
        parser.error(f"--turns must be at least {SEARCH_EVERY}, --sized 1, --warmup 2")
    models = args.models.split(",")
    if unknown := set(models) - {MODEL_NAME, QUANTIZED_MODEL_NAME}:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}")
    raise_on_sigterm()
    failures = 0
    for model in models:
        try:
            run = measure(args.turns, args.sized, args.warmup, args.time_budget, model)
        except RUN_ENDED as error:
            print(f"bench_turn_cost: {failure_outcome(error)}", file=sys.stderr)
            return 1
        # The server's model, one intra-op thread as the server runs it.
        embedder = OnnxMiniLmEmbedder(intra_op_threads=1, quantized=model == QUANTIZED_MODEL_NAME)
        print(f"=== {model} ({embedder.model_id})")
        report(run, embedder)
        print()
        failures += run.failures
    print()
    print(machine_line())
    print(
        software_line(
            f"onnxruntime {importlib.metadata.version('onnxruntime')}",
            f"qdrant-edge-py {importlib.metadata.version('qdrant-edge-py')}",
        )
    )
    print("database: SQLite (the embedded default) and the embedded qdrant-edge engine")
    if failures:
        print(f"FAILED: {failures} calls failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
