#!/usr/bin/env python3
"""Render the model's tools and memory instructions into the files committed in tools/.

    .venv/bin/python scripts/render-tools.py          # rewrite the rendered files
    .venv/bin/python scripts/render-tools.py --check  # fail, listing them, if any is stale

The one definition is server/domain/model_words.py (TOOLS and BASE_INSTRUCTIONS), which the
server also serves (ModelToolService.GetModelTools). From it come tools/memoria_tools.json (the
definitions as plain JSON), tools/system_prompt.md and the three provider shapes, rendered by
memoria_client.tool_files.render, the same code the client package ships, so what callers
paste, what the package loads and what the server serves cannot differ.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "clients" / "python")]

from memoria_client.tool_files import (  # noqa: E402
    SHAPES,
    SOURCE_FILE,
    SYSTEM_PROMPT_FILE,
    dumps,
    render,
)
from server.domain.model_words import BASE_INSTRUCTIONS, TOOLS  # noqa: E402

SOURCE_COMMENT = (
    "The model's tools as server/domain/model_words.py defines them (the one definition, also "
    "served by ModelToolService.GetModelTools). Rendered by scripts/render-tools.py with "
    "openai_chat_completions.json, openai_responses.json and anthropic_messages.json: edit "
    "model_words.py, then run it. Each parameters object is a JSON Schema (draft 2020-12 "
    "subset every provider accepts)."
)


def rendered_files(tools_dir: Path) -> dict[Path, str]:
    """Each rendered file's path and the text it must have."""
    source = [
        {"name": t.name, "description": t.description, "parameters": t.parameters} for t in TOOLS
    ]
    source_text = json.dumps(
        {"$comment": SOURCE_COMMENT, "tools": source}, indent=2, ensure_ascii=False
    )
    files = {
        tools_dir / SOURCE_FILE: source_text + "\n",
        tools_dir / SYSTEM_PROMPT_FILE: BASE_INSTRUCTIONS + "\n",
    }
    for shape in SHAPES:
        files[tools_dir / f"{shape}.json"] = dumps(render(shape, source))
    return files


def main() -> int:
    """Write the rendered files, or with --check report the stale ones."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if a rendered file is stale")
    args = parser.parse_args()
    stale = []
    for path, text in rendered_files(ROOT / "tools").items():
        current = path.read_text("utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text, "utf-8")
    if args.check and stale:
        names = ", ".join(map(str, stale))
        print(f"stale: {names}; run scripts/render-tools.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
