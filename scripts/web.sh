#!/usr/bin/env bash
# Builds the settings page into web/dist (served by the server's HTTP port at /): installs the
# pinned packages of web/package-lock.json (npm ci, from the npm registry), type-checks the
# TypeScript (tsc) and bundles it with esbuild (web/build.mjs). Run by `make serve` and
# `make test` when a source is newer than the bundle; `make web` runs it alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root/web"
if [[ ! -d node_modules ]] || [[ package-lock.json -nt node_modules ]]; then
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules
fi
npx --no-install tsc -p tsconfig.json --noEmit
node build.mjs
echo "built the settings page into web/dist" >&2
