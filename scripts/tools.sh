#!/usr/bin/env bash
# Installs, when missing or when a pin changed, what `make generate` and the client tests need
# beside .venv/: the Go code generators and grpcurl (built from the Go module proxy into .tools/bin) and
# the TypeScript client's packages (`npm ci` in clients/ts: exact versions from its
# package-lock.json, including protoc-gen-es). Both stay out of git (.gitignore).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# protoc-gen-go must match google.golang.org/protobuf in generated/go/go.mod; protoc-gen-go-grpc
# 1.6 emits code for google.golang.org/grpc >= 1.64.
scripts/go-install.sh google.golang.org/protobuf/cmd/protoc-gen-go v1.36.12 >/dev/null
scripts/go-install.sh google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2 >/dev/null
# grpcurl, for the README's and docs/'s tour, which tests/api/test_docs.py runs as written.
scripts/go-install.sh github.com/fullstorydev/grpcurl/cmd/grpcurl v1.9.3 >/dev/null

# npm ci wipes and reinstalls node_modules; do it only when the lock file changed since.
stamp=clients/ts/node_modules/.installed-package-lock.json
if ! cmp -s clients/ts/package-lock.json "$stamp"; then
  echo "tools.sh: npm ci in clients/ts" >&2
  (cd clients/ts && npm ci --no-audit --no-fund --loglevel=error >&2)
  cp clients/ts/package-lock.json "$stamp"
fi
