"""docs/configuration.md is what the settings object prints, and every setting is described.

The page is generated (`python -m server.runtime.settings --markdown`), so a setting added,
renamed or redescribed in server/runtime/settings/groups.py changes it; this fails until the page is
generated again, and says how.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from server.runtime.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ".venv/bin/python -m server.runtime.settings --markdown > docs/configuration.md"


def test_the_page_is_what_the_settings_print() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "server.runtime.settings", "--markdown"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == printed, f"docs/configuration.md is out of date: run `{COMMAND}`"


def test_every_setting_is_described_and_on_the_page() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    for setting in SETTINGS:
        assert setting.info.description, f"{setting.env} has no description"
        assert f"| `{setting.env}`" in page
