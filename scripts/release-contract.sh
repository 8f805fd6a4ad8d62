#!/usr/bin/env bash
# Records the contract as released: later changes are checked against this image by
# `buf breaking` (scripts/lint.sh). Run it only when a version of the contract is released.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mkdir -p contract-baseline
.venv/bin/buf build -o contract-baseline/memoria.binpb
echo "contract-baseline/memoria.binpb updated; commit it with the release" >&2
