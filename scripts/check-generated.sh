#!/usr/bin/env bash
# Regenerates every stub (Python, Go, TypeScript) into a scratch folder and fails if any differs
# from generated/ or is missing or extra there. The hand-written package files are not generated
# and so not compared.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if ! MEMORIA_GENERATE_ROOT="$scratch" scripts/generate.sh 2>"$scratch/log"; then
  cat "$scratch/log" >&2
  echo "generating the stubs failed" >&2
  exit 1
fi
if ! diff -r -q -x __pycache__ -x node_modules -x package.json -x go.mod -x go.sum \
  "$scratch/generated" generated >&2; then
  echo "generated/ is stale: run 'make generate' and commit the result" >&2
  exit 1
fi
