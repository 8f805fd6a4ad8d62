#!/usr/bin/env bash
# Regenerates every stub in generated/ from proto/ (what `make generate` runs):
#   generated/python  grpcio-tools' bundled protoc + mypy-protobuf, pinned in .venv
#   generated/go      buf generate (buf.gen.yaml): protoc-gen-go + protoc-gen-go-grpc
#   generated/ts      buf generate (buf.gen.yaml): protoc-gen-es (protobuf-es v2, for Connect v2),
#                     plus google/rpc/error_details.proto (buf.gen.googleapis.yaml)
# Python stays on grpc_tools rather than buf: gRPC's Python generator exists only inside
# grpcio-tools' protoc (there is no protoc-gen-grpc_python binary for buf to run as a local
# plugin), and buf's protoc_builtin would need a wrapper posing as protoc. One proven path is
# simpler; the inputs are the same proto/ files either way.
# The hand-written package files (generated/ts/package.json, generated/go/go.mod and go.sum) are
# left alone. CI runs this into a scratch folder and fails when the committed stubs differ
# (scripts/check-generated.sh); MEMORIA_GENERATE_ROOT names that folder (default: the repo).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/.venv/bin/python"
buf="$root/.venv/bin/buf"
gen="${MEMORIA_GENERATE_ROOT:-$root}/generated"
cd "$root"

scripts/tools.sh

# Python.
out="$gen/python"
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

# Go and TypeScript. buf's -o is prepended to the templates' out directories (generated/...).
rm -rf "$gen/go/memoria" "$gen/ts/memoria" "$gen/ts/google"
"$buf" generate --template buf.gen.yaml -o "$gen/.."
site=$("$py" -c 'import pathlib, google.rpc.error_details_pb2 as m; print(pathlib.Path(m.__file__).parents[2])')
"$buf" generate "$site" --path "$site/google/rpc/error_details.proto" \
  --template buf.gen.googleapis.yaml -o "$gen/.."

for lang in python go ts; do
  echo "generated $(find "$gen/$lang" -type f \( -name '*.py*' -o -name '*.go' -o -name '*.ts' \) | wc -l) files in generated/$lang" >&2
done
