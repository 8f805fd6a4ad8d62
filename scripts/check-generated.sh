#!/usr/bin/env bash
# Regenerates generated/ and fails if anything differs from what is committed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/generate.sh 2>/dev/null
changes=$(git status --porcelain -- generated)
if [ -n "$changes" ]; then
  echo "generated/ is stale: run 'make generate' and commit the result:" >&2
  echo "$changes" >&2
  git --no-pager diff --stat -- generated >&2
  exit 1
fi
