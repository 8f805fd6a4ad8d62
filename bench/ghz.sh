#!/usr/bin/env bash
# Print the path of a pinned ghz (gRPC load generator) binary, installing it
# on first use.
#
#   bench/ghz.sh            -> prints e.g. /path/to/repo/.tools/bin/ghz
#
# ghz (github.com/bojand/ghz) is a Go program; scripts/go-install.sh builds it
# with the installed Go toolchain through the Go module proxy (takes ~1 min)
# and caches it in <repo>/.tools/bin, so every call after the first one is
# instant. Only the final path goes to stdout; all diagnostics go to stderr.
# Exits 1 if ghz cannot be installed.
#
# Pin: v0.121.0 is the newest tagged release (2025-12) and builds with the
# Go here (needs go >= 1.23). Note that `go list -m -versions` on the proxy
# only reports v0.93.0 for this module, so `@latest` would pick an old
# release: always install the explicit pin below.
set -euo pipefail
script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
exec "$script_dir/../scripts/go-install.sh" github.com/bojand/ghz/cmd/ghz v0.121.0
