"""The loops in clients/python/README.md run as written, against scripted SDKs and server.

Neither SDK is installed (and no LLM is reachable), so each test puts a scripted stand-in for
`openai` or `anthropic` in sys.modules: the model asks for one memory_rewrite, reads the
result, then answers. The README's code runs unchanged except for the server address, which
points at tests/fake_memoria.py's server. The Go and TypeScript READMEs' wiring is the code of
an example program that scripts/test-clients.sh runs against a real server; the last test here
checks that each README shows exactly that code.
"""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from memoria_client import load_tools
from tests.fake_memoria import Script, answer, scripted_server

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "clients" / "python" / "README.md"
TEXT = "Preferred name: Ana"
SAVED = "the server's words for the saved block"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text("utf-8"), flags=re.DOTALL)


def test_every_python_block_compiles() -> None:
    blocks = python_blocks()
    assert len(blocks) == 2
    for number, code in enumerate(blocks):
        compile(code, f"{README.name} block {number}", "exec")


def block_for(sdk: str) -> str:
    (code,) = [code for code in python_blocks() if f"import {sdk}" in code or f"from {sdk}" in code]
    return code


def ns(**fields: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fields)


class Recorder:
    """Records each create() call and answers from a script of replies."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = replies
        self.calls: list[dict[str, Any]] = []

    def create(self, **request: Any) -> Any:
        # Copy the messages: the loop appends to the same list after the call.
        self.calls.append({**request, "messages": list(request["messages"])})
        return self.replies.pop(0)


def assert_one_turn(script: Script) -> None:
    """One render and one rewrite, both naming the turn the README's loop started."""
    (call,) = script.calls
    assert (call.tool_name, json.loads(call.arguments_json)) == ("memory_rewrite", {"text": TEXT})
    turns = [request.turn for request in script.renders] + [call.turn]
    for turn in turns:
        assert (turn.conversation_id, turn.turn_id) == ("c-1", "1")
    assert len(script.renders) == 1


def run_readme(code: str, port: int) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(code.replace("127.0.0.1:50051", f"127.0.0.1:{port}"), namespace)
    return namespace


def test_openai_chat_completions_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    call = ns(id="call_1", function=ns(name="memory_rewrite", arguments=json.dumps({"text": TEXT})))
    recorder = Recorder(
        [
            ns(choices=[ns(message=ns(tool_calls=[call], content=None))]),
            ns(choices=[ns(message=ns(tool_calls=None, content="Noted, Ana."))]),
        ]
    )
    fake = types.ModuleType("openai")
    fake.OpenAI = lambda: ns(chat=ns(completions=recorder))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openai", fake)
    with scripted_server() as (script, _channel, port):
        script.execute = answer(SAVED)
        readme = run_readme(block_for("openai"), port)
        reply = readme["answer"]("c-1", "1", "Call me Ana.", [])
        assert readme["memory"].flush(timeout=10) == 0
    assert reply == "Noted, Ana."
    assert_one_turn(script)
    first, second = recorder.calls
    assert first["tools"] == load_tools("openai_chat_completions")
    assert first["messages"][0]["content"].endswith("\n\n" + script.section)
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": SAVED}
    (indexed,) = script.indexed
    assert (indexed.question, indexed.answer) == ("Call me Ana.", "Noted, Ana.")


def test_anthropic_messages_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    use = ns(type="tool_use", id="toolu_1", name="memory_rewrite", input={"text": TEXT})
    recorder = Recorder(
        [
            ns(stop_reason="tool_use", content=[ns(type="text", text="Saving."), use]),
            ns(stop_reason="end_turn", content=[ns(type="text", text="Noted, Ana.")]),
        ]
    )
    fake = types.ModuleType("anthropic")
    fake.Anthropic = lambda: ns(messages=recorder)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "anthropic", fake)
    with scripted_server() as (script, _channel, port):
        script.execute = answer(SAVED)
        readme = run_readme(block_for("anthropic"), port)
        reply = readme["answer"]("c-1", "1", "Call me Ana.", [])
        assert readme["memory"].flush(timeout=10) == 0
    assert reply == "Noted, Ana."
    assert_one_turn(script)
    first, second = recorder.calls
    assert first["tools"] == load_tools("anthropic_messages")
    assert first["system"].endswith("\n\n" + script.section)
    assert second["messages"][-1] == {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": SAVED,
                "is_error": False,
            }
        ],
    }


def fenced(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text("utf-8"), flags=re.DOTALL)


def marked(path: Path) -> str:
    """The lines of an example program between its `README wiring` markers."""
    text = path.read_text("utf-8")
    begin = text.index("README wiring: begin")
    begin = text.index("\n", begin) + 1
    end = text.rindex("\n", 0, text.index("README wiring: end")) + 1
    return text[begin:end]


@pytest.mark.parametrize(
    ("readme", "language", "example"),
    [
        ("clients/go/README.md", "go", "clients/go/examples/wiring/main.go"),
        ("clients/ts/README.md", "ts", "clients/ts/examples/wiring.ts"),
        ("README.md", "go", "clients/go/examples/wiring/main.go"),
        ("README.md", "ts", "clients/ts/examples/wiring.ts"),
    ],
)
def test_the_go_and_ts_wiring_is_the_example_scripts_test_clients_runs(
    readme: str, language: str, example: str
) -> None:
    code = marked(ROOT / example)
    assert code in fenced(ROOT / readme, language)
    assert 10 <= len(code.strip().splitlines()) <= 32
