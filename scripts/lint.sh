#!/usr/bin/env bash
# Static checks of the contract and the code: buf lint/format/breaking, fresh generated stubs,
# ruff, mypy (strict on server/ and the client package), the rendered tool files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=.venv/bin

echo "== buf lint / format / breaking" >&2
"$bin/buf" lint
"$bin/buf" format --diff --exit-code
# The contract as released: changing it in a breaking way fails here. Update the baseline
# deliberately (scripts/release-contract.sh) when a version is released.
"$bin/buf" breaking --against contract-baseline/memoria.binpb

echo "== generated stubs are fresh" >&2
scripts/check-generated.sh

echo "== ruff / mypy" >&2
"$bin/ruff" check .
"$bin/ruff" format --check .
"$bin/mypy"

echo "== tool files (tools/*.json) match their source" >&2
"$bin/python" scripts/render-tools.py --check
