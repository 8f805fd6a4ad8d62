"""Every runnable block of README.md and docs/*.md runs as written, so none of them can go stale.

A fenced block's info string says what this test does with it:

- ```` ```sh ```` / ```` ```python ````: run (bash `-e -u -o pipefail`, or the venv's Python)
  and exit status 0 required. The blocks of one file run in order, in a fresh directory that
  links to every entry of the checkout (so `.data`, `.data-pg` and the files a block writes
  are temporary), against a real `memoria serve` started for that file: the documented
  addresses 127.0.0.1:50051 and 127.0.0.1:8080 become its gRPC and HTTP ports, and every
  other 127.0.0.1:PORT a free port of its own (the same one throughout the file).
- `{check: NAME}`: also the assertions of CHECKS[NAME] on the block's output.
- `{serves: HOST:PORT}`: a server in the foreground: started in the background, the next
  block runs once HOST:PORT accepts connections, and it is stopped (SIGTERM to its process
  group) after the file's last block.
- `{cleanup}`: run once the file's servers have stopped (what stops what a recipe started).
- `{no-run: REASON}`: not run; the reason is required.

Other languages (json, sql, text, ...) are not run; a fence without a language fails, so a
command cannot hide in an unlabelled block. `make test` installs grpcurl into .tools/bin
(scripts/tools.sh, from scripts/test-clients.sh) before pytest runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import MEMORIA, ROOT, clean_env, wait_for_port
from tests.qdrant_server import free_port_pair

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = {"sh", "python"}
BLOCK_TIMEOUT_S = 120
SERVER_START_TIMEOUT_S = 60
HTTP_LINE = re.compile(
    r"serving the settings page, Connect, gRPC-Web and MCP \(/mcp\) on http://127\.0\.0\.1:(\d+)/"
)
ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)")
FENCE = re.compile(r"^\s*(`{3,})(.*)$")
INFO = re.compile(r"^(?P<lang>[\w+-]+)?\s*(?:\{(?P<key>[\w-]+)(?::\s*(?P<value>[^}]*))?\})?\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its `{key: value}` attribute, its text."""

    path: Path
    line: int
    lang: str
    key: str
    value: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (a fence closes on a line of at least as
    many backticks and nothing else)."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        ticks, info = opening.group(1), opening.group(2).strip()
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not re.fullmatch(rf"\s*{ticks}`*\s*", lines[end]):
            body.append(lines[end])
            end += 1
        assert end < len(lines), f"{path.relative_to(ROOT)}:{index + 1}: unclosed fence"
        parsed = INFO.match(info)
        assert parsed is not None, f"{path.relative_to(ROOT)}:{index + 1}: info string {info!r}"
        found.append(
            Block(
                path,
                index + 1,
                parsed.group("lang") or "",
                parsed.group("key") or "",
                (parsed.group("value") or "").strip(),
                "\n".join(body) + "\n",
            )
        )
        index = end + 1
    return found


# --- what the runs must show, beyond exit status 0 ------------------------------------------


def _after(out: str, first: str, then: str) -> bool:
    """`then` occurs in `out` after the first occurrence of `first`."""
    return first in out and then in out[out.index(first) + len(first) :]


def _tour(out: str) -> None:
    assert '"added_lines": [\n    "Preferred name: Ana",' in out, "the model's rewrite"
    assert "Personal memory (44/4,000 characters)" in out, "the rendered section"
    assert "Code: Aborted" in out and "ERROR_REASON_ETAG_MISMATCH" in out, "the stale etag"
    assert '"outcome": "INDEX_TURN_OUTCOME_INDEXED"' in out, "the turn, indexed with wait"
    assert _after(out, '"outcome": "INDEX_TURN_OUTCOME_INDEXED"', '"conversation_id": "c-1"'), (
        "the search found the turn"
    )
    assert _after(out, '"memory_enabled": false', '"prompt_section": ""'), "memory off: empty"
    assert _after(out, '"prompt_section": ""', '"hits": []'), "memory off: no hits"
    assert '"status": "SERVING"' in out, "health"


def _stubs(out: str) -> None:
    assert "['Likes short answers']" in out
    assert "Personal memory (19/4,000 characters)\nLikes short answers" in out


def _adapter(out: str) -> None:
    assert "Preferred name: Ana" in out


def _error_details(out: str) -> None:
    assert "StatusCode.INVALID_ARGUMENT ERROR_REASON_BLOCK_TOO_LONG" in out
    assert "'char_count': '4001'" in out and "'char_limit': '4000'" in out


def _retry_policy(out: str) -> None:
    assert "char_limit: 4000" in out, "a render through the retry policy"
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    shown = api[api.index("## Retries") :]
    shown = shown[shown.index("```json\n") + len("```json\n") :]
    shown = shown[: shown.index("```")]
    assert json.loads(out.strip().splitlines()[-1]) == json.loads(shown), "the JSON shown"


def _buf_curl(out: str) -> None:
    assert "memoria.v1.MemoryBlockService/RenderMemoryBlock" in out, "methods listed"
    assert '"promptSection": "Personal memory (19/4,000 characters)\\nPreferred name: Ana"' in out


def _http(out: str) -> None:
    assert '"text": "Preferred name: Ana"' in out or '"text":"Preferred name: Ana"' in out
    assert '"promptSection": "Personal memory (19/4,000 characters)\\nPreferred name: Ana"' in out


def _jwt(out: str) -> None:
    assert '"changed": true' in out, "the token's rewrite"
    assert "Code: Unauthenticated" in out, "headers refused in jwt mode"
    assert re.search(r"^eyJ[\w-]+\.[\w-]+\.[\w-]+$", out, re.M), "the printed token"


def _mcp(out: str) -> None:
    assert '"memory_rewrite"' in out and '"conversation_search"' in out, "tools/list"
    last = json.loads(out.strip().splitlines()[-1])
    assert last["error"]["code"] == -32001, "no token: the MCP error"


def _mcp_http(out: str) -> None:
    answer = json.loads(out)["result"]
    assert answer["isError"] is False, "the write over MCP"
    assert answer["content"][0]["text"].startswith("Saved."), "the model's words"


def _mcp_client(out: str) -> None:
    assert "['memory_rewrite', 'conversation_search']" in out, "tools/list"
    assert "Personal memory (" in out, "the prompt section"
    assert "'refund'" in out, "conversation_search over MCP, in the model's words"


def _postgres(out: str) -> None:
    # The database `memoria` outlives the run, so a second run's rewrite is a no-op: the
    # render is what shows the block is there.
    section = "Personal memory (40/4,000 characters)\\nPreferred name: Ana\\nStored in PostgreSQL"
    assert section in out


def _pgbouncer(out: str) -> None:
    # Written through the pooler and rendered back (as in _postgres, a rerun's render shows it).
    section = "Personal memory (42/4,000 characters)\\nPreferred name: Bo\\nStored behind PgBouncer"
    assert section in out


def _qdrant(out: str) -> None:
    assert _after(out, "INDEX_TURN_OUTCOME_INDEXED", '"conversation_id": "q-1"'), "found"
    assert "Under the blue flowerpot." in out


def _reindex(out: str) -> None:
    assert re.search(r"memoria reindex: \d+/\d+ chunks", out), out


def _inspector(out: str) -> None:
    inspection = json.loads(out[out.rindex("\n{\n") :])["inspection"]
    assert [r["char_count"] for r in inspection["renders"]] == [19]
    assert [s["query"] for s in inspection["searches"]] == ["acct-4821"]


def _conversations(out: str) -> None:
    assert '"first_question_opening": "Which account got the refund?"' in out, "the list"
    assert '"turn_count": 1' in out, "the list's count"
    assert '"text": "Which account got the refund?\\n\\nacct-4821, on Monday."' in out, "the turn"


def _export(out: str) -> None:
    header = '{"kind": "header", "format": "memoria-export/1", "turn_retention_days": 0}'
    assert header in out.splitlines(), "the header"
    assert '"kind": "memory_block"' in out, "the block"
    assert "memoria import: " in out, "the import's summary"


def _bounded_search(out: str) -> None:
    found = out[out.rindex("INDEX_TURN_OUTCOME_INDEXED") :]
    assert '"turn_id": "t-03"' in found and "t-05" not in found, "March only"
    assert "Code: InvalidArgument" in out and "end_time" in out, "the empty span refused"


CHECKS: dict[str, Callable[[str], None]] = {
    "tour": _tour,
    "stubs": _stubs,
    "adapter": _adapter,
    "error-details": _error_details,
    "retry-policy": _retry_policy,
    "buf-curl": _buf_curl,
    "http": _http,
    "jwt": _jwt,
    "mcp": _mcp,
    "mcp-http": _mcp_http,
    "mcp-client": _mcp_client,
    "postgres": _postgres,
    "pgbouncer": _pgbouncer,
    "qdrant": _qdrant,
    "reindex": _reindex,
    "inspector": _inspector,
    "conversations": _conversations,
    "export": _export,
    "bounded-search": _bounded_search,
}
"""The assertions a `{check: NAME}` block's output must pass, by NAME."""


# --- every block is run or says why ----------------------------------------------------------


def test_every_block_is_run_or_says_why() -> None:
    problems: list[str] = []
    used: set[str] = set()
    for path in DOCUMENTS:
        for block in blocks(path):
            if not block.lang:
                problems.append(f"{block.where}: a fence without a language (text, sh, ...)")
            elif block.key and block.lang not in RUNNABLE:
                problems.append(f"{block.where}: {{{block.key}}} on a {block.lang} block")
            elif block.key == "no-run" and len(block.value) < 10:
                problems.append(f"{block.where}: no-run without a reason")
            elif block.key == "check":
                used.add(block.value)
                if block.value not in CHECKS:
                    problems.append(f"{block.where}: no check called {block.value!r}")
            elif block.key == "serves" and not ADDRESS.fullmatch(block.value):
                problems.append(f"{block.where}: serves needs 127.0.0.1:PORT")
            elif block.key not in {"", "no-run", "check", "serves", "cleanup"}:
                problems.append(f"{block.where}: unknown attribute {block.key!r}")
    assert not problems, "\n".join(problems)
    assert used == set(CHECKS), f"checks no block uses: {sorted(set(CHECKS) - used)}"


LINK = re.compile(r"\]\((?!https?:|mailto:)(?P<path>[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation
    other than - and _ dropped, spaces as -)."""
    headings: list[str] = []
    in_block = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_block = not in_block
        elif not in_block and (heading := re.match(r"#+ (.+)$", line)):
            headings.append(heading.group(1))
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_link_between_the_docs_resolves() -> None:
    problems: list[str] = []
    for path in DOCUMENTS:
        for match in LINK.finditer(path.read_text(encoding="utf-8")):
            target = (path.parent / match.group("path")).resolve() if match.group("path") else path
            if not target.exists():
                problems.append(f"{path.relative_to(ROOT)}: {match.group(0)}: no such file")
            elif match.group("anchor") and match.group("anchor") not in _anchors(target):
                problems.append(f"{path.relative_to(ROOT)}: {match.group(0)}: no such heading")
    assert not problems, "\n".join(problems)


# --- running them -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Addresses:
    """The documented ports of one file, each moved to a port of this run."""

    ports: dict[str, int]

    def move(self, text: str) -> str:
        def one(match: re.Match[str]) -> str:
            documented = match.group(1)
            if documented not in self.ports:
                self.ports[documented] = _free_port()
            return f"127.0.0.1:{self.ports[documented]}"

        return ADDRESS.sub(one, text)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group this test started (the shell and the server in it)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A fresh directory that links to every entry of the checkout except its data dirs."""
    work = tmp_path / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".data"):
            (work / entry.name).symlink_to(entry)
    return work


@pytest.fixture
def documented_server(tmp_path: Path) -> Iterator[Callable[[], Addresses]]:
    """Starts, on first use, the `memoria serve` a file's blocks call as 127.0.0.1:50051 and
    :8080 (embedded default, a temporary data dir, the page on a port of its own)."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> Addresses:
        log = tmp_path / "memoria.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    str(MEMORIA),
                    "serve",
                    *("--listen", "127.0.0.1:0"),
                    *("--data-dir", str(tmp_path / "server-data")),
                    *("--port-file", str(tmp_path / "port")),
                ],
                env=clean_env(MEMORIA_HTTP_LISTEN="127.0.0.1:0"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(process)
        port = wait_for_port(process, tmp_path / "port", log, timeout=SERVER_START_TIMEOUT_S)
        http = HTTP_LINE.search(log.read_text(errors="replace"))
        assert http is not None, log.read_text(errors="replace")
        return Addresses({"50051": port, "8080": int(http.group(1))})

    yield start
    for process in started:
        _stop(process)


def _wait_for_listener(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Returns once 127.0.0.1:`port` accepts a connection; fails at once, with the block's
    output, if the block exits first, and after SERVER_START_TIMEOUT_S otherwise."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            pass
        try:
            code = process.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"exited with {code} before serving:\n{log.read_text()[-4000:]}")
    raise AssertionError(f"not serving after {SERVER_START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


def _command(block: Block, text: str) -> list[str]:
    if block.lang == "python":
        return [".venv/bin/python", "-c", text]
    # -u as well: a variable a failed `eval "$(scripts/pg.sh start)"` left unset stops the block.
    return ["bash", "-e", "-u", "-o", "pipefail", "-c", text]


def _runnable(path: Path) -> list[Block]:
    return [b for b in blocks(path) if b.lang in RUNNABLE and b.key != "no-run"]


@pytest.mark.parametrize(
    "path",
    [path for path in DOCUMENTS if _runnable(path)],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_runnable_blocks_run_as_written(
    path: Path, workdir: Path, documented_server: Callable[[], Addresses]
) -> None:
    runnable = _runnable(path)
    addresses = documented_server()
    # scripts/qdrant.sh's server of this run: a directory and ports of its own, not the
    # checkout's .qdrant/ (the reader's own server may be running there).
    env = clean_env(
        MEMORIA_TEST_QDRANT_DIR=str(workdir.parent / "qdrant"),
        MEMORIA_TEST_QDRANT_PORT=str(free_port_pair()),
    )
    failures: list[str] = []
    servers: list[tuple[Block, subprocess.Popen[bytes], Path]] = []

    def run(block: Block) -> None:
        done = subprocess.run(
            _command(block, addresses.move(block.text)),
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        out = done.stdout
        if done.returncode != 0:
            failures.append(f"{block.where}: exit status {done.returncode}\n{out[-4000:]}")
        elif block.key == "check":
            try:
                CHECKS[block.value](out)
            except AssertionError as failed:
                failures.append(f"{block.where}: check {block.value}: {failed}\n{out[-4000:]}")

    try:
        for block in runnable:
            if block.key == "serves":
                log = workdir.parent / f"serves-{block.line}.log"
                with log.open("wb") as out:
                    process = subprocess.Popen(
                        _command(block, addresses.move(block.text)),
                        cwd=workdir,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                servers.append((block, process, log))
                port = int(addresses.move(block.value).rsplit(":", 1)[1])
                try:
                    _wait_for_listener(process, port, log)
                except AssertionError as failed:
                    failures.append(f"{block.where}: {failed}")
            elif block.key != "cleanup":
                run(block)
    finally:
        for block, process, log in servers:
            if process.poll() is not None and not any(f.startswith(block.where) for f in failures):
                failures.append(f"{block.where}: exited early:\n{log.read_text()[-4000:]}")
            _stop(process)
        for block in runnable:
            if block.key == "cleanup":
                run(block)
    assert not failures, "\n\n".join(failures)
