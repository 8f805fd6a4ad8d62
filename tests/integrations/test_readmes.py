"""Each integration's README shows the wiring its test runs, so the two cannot drift.

The lines between a test's `README wiring: begin` and `end` markers, dedented, must appear as
they are in one of the README's fenced code blocks (which add the imports around them).
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
    code = marked(ROOT / test)
    assert 6 <= len(code.strip().splitlines()) <= 20
    blocks = re.findall(rf"```{language}\n(.*?)```", (ROOT / readme).read_text("utf-8"), re.DOTALL)
    assert any(code in block for block in blocks), f"{readme} does not show:\n{code}"
