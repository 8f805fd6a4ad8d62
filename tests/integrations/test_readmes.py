"""Each integration's README shows the wiring its test runs, so the two cannot drift.

The lines between a test's `README wiring: begin` and `end` markers, dedented, must appear as
they are in one of the README's fenced code blocks (which add the imports around them), blank
lines aside (ruff formats the README's Python with two blank lines around a top-level def,
where the test's nested one has one).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def marked(path: Path) -> str:
    """The lines between the file's `README wiring` markers, dedented."""
    text = path.read_text("utf-8")
    begin = text.index("\n", text.index("README wiring: begin")) + 1
    end = text.rindex("\n", 0, text.index("README wiring: end")) + 1
    return textwrap.dedent(text[begin:end])


def without_blank_lines(code: str) -> str:
    return "".join(line + "\n" for line in code.splitlines() if line.strip())


@pytest.mark.parametrize(
    ("readme", "language", "test"),
    [
        (
            "integrations/openai-agents/README.md",
            "python",
            "tests/integrations/test_openai_agents.py",
        ),
        ("integrations/langchain/README.md", "python", "tests/integrations/test_langchain.py"),
        ("integrations/vercel-ai/README.md", "ts", "integrations/vercel-ai/test/vercel-ai.test.ts"),
        ("integrations/go-mcp/README.md", "go", "integrations/go-mcp/memoriamcp_test.go"),
    ],
)
def test_the_readme_shows_the_wiring_its_test_runs(readme: str, language: str, test: str) -> None:
    code = without_blank_lines(marked(ROOT / test))
    assert 6 <= len(code.splitlines()) <= 20
    blocks = re.findall(rf"```{language}\n(.*?)```", (ROOT / readme).read_text("utf-8"), re.DOTALL)
    shown = [without_blank_lines(block) for block in blocks]
    assert any(code in block for block in shown), f"{readme} does not show:\n{code}"
