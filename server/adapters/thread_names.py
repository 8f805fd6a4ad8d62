"""Thread names the operating system sees, so a thread's CPU can be told apart from outside.

Python before 3.14 names its threads for itself only: the kernel (`top -H`, `ps -L`,
/proc/PID/task/TID/comm) shows every Python thread under the process's name, next to the
threads that gRPC and the embedded Qdrant engine name themselves (`event_engine`,
`edge-search-0`). Naming the server's own threads (the indexing worker, the RPC pools, the
inspection writer) lets an operator see where the CPU goes, and bench/bench_turn_cost.py
attribute the server's CPU per turn to rendering, accepting, indexing and searching.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading

_PR_SET_NAME = 15  # prctl(2): the calling thread's name, at most 15 bytes and a NUL
_MAX_NAME_BYTES = 15


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, on Linux only (elsewhere nothing is named)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread `name` (default: its Python name) at the OS level, cut to the
    kernel's 15 bytes. Best effort: where it cannot be done, nothing changes (a name is for
    observing, never needed to run). Usable as a thread pool's `initializer`."""
    libc = _libc()
    if libc is None:
        return
    text = threading.current_thread().name if name is None else name
    raw = text.encode("utf-8")[:_MAX_NAME_BYTES].decode("utf-8", "ignore").encode("utf-8")
    with contextlib.suppress(AttributeError, OSError):
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
