#!/usr/bin/env bash
# Regenerates the stubs into a scratch folder and fails if they differ from generated/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
MEMORIA_GENERATE_OUT="$scratch" scripts/generate.sh 2>/dev/null
if ! diff -r -q -x __pycache__ "$scratch/python" generated/python >&2; then
  echo "generated/ is stale: run 'make generate' and commit the result" >&2
  exit 1
fi
