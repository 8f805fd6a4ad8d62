#!/usr/bin/env python3
"""Render tools/memoria_tools.json into the three provider shapes committed beside it.

    .venv/bin/python scripts/render-tools.py          # rewrite the rendered files
    .venv/bin/python scripts/render-tools.py --check  # fail, listing them, if any is stale

The shapes are rendered by memoria_client.tool_files.render, the same code the client package
ships, so what callers paste and what the package loads cannot differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "clients" / "python")]

from memoria_client.tool_files import SHAPES, SOURCE_FILE, dumps, render  # noqa: E402


def rendered_files(tools_dir: Path) -> dict[Path, str]:
    """Each rendered file's path and the text it must have."""
    import json

    source = json.loads((tools_dir / SOURCE_FILE).read_text("utf-8"))["tools"]
    return {tools_dir / f"{shape}.json": dumps(render(shape, source)) for shape in SHAPES}


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
