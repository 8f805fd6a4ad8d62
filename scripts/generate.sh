#!/usr/bin/env bash
# Regenerates generated/python from proto/ with the pinned grpcio-tools and mypy-protobuf of
# .venv (protoc is the one bundled in grpcio-tools, so no system protoc is needed).
# CI runs this and fails when the committed stubs differ (scripts/check-generated.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
out="${MEMORIA_GENERATE_OUT:-$root/generated}/python"
cd "$root"

rm -rf "$out/memoria"
mkdir -p "$out"
mapfile -t protos < <(find proto -name '*.proto' | sort)
"$py" -m grpc_tools.protoc \
  -I proto \
  --python_out="$out" \
  --grpc_python_out="$out" \
  --plugin=protoc-gen-mypy="$root/.venv/bin/protoc-gen-mypy" \
  --plugin=protoc-gen-mypy_grpc="$root/.venv/bin/protoc-gen-mypy_grpc" \
  --mypy_out="$out" \
  --mypy_grpc_out="$out" \
  "${protos[@]}"

# Make the output an importable, typed package (an import root for pytest and mypy).
find "$out/memoria" -type d -exec touch {}/__init__.py \;
touch "$out/memoria/py.typed"
echo "generated $(find "$out/memoria" -type f | wc -l) files in generated/python" >&2
