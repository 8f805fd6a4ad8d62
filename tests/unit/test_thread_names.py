"""OS-level thread names (server/adapters/thread_names.py): what Linux's /proc shows for a
thread (the service runs on Linux; elsewhere naming is a no-op)."""

from __future__ import annotations

import threading
from pathlib import Path

from server.adapters.thread_names import name_os_thread


def _os_name_in_thread(python_name: str, given: str | None) -> str:
    """The kernel's name of a thread called `python_name` after name_os_thread(given)."""
    seen: list[str] = []

    def run() -> None:
        name_os_thread(given)
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=run, name=python_name)
    thread.start()
    thread.join()
    return seen[0].strip()


def test_a_thread_gets_its_python_name() -> None:
    assert _os_name_in_thread("index-worker-0", None) == "index-worker-0"


def test_a_given_name_wins_and_is_cut_to_fifteen_bytes_on_a_character_boundary() -> None:
    assert _os_name_in_thread("anything", "inspection-writer") == "inspection-writ"
    # "é" is two bytes: 14 ASCII characters and it would need 16, so it is left out whole.
    assert _os_name_in_thread("anything", "abcdefghijklmné") == "abcdefghijklmn"
