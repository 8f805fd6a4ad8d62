#!/usr/bin/env bash
# Print the path of a pinned ghz (gRPC load generator) binary, installing it
# on first use.
#
#   bench/ghz.sh            -> prints e.g. /path/to/repo/.tools/bin/ghz
#
# ghz (github.com/bojand/ghz) is a Go program; it is built with the installed
# Go toolchain through the Go module proxy and cached in <repo>/.tools/bin, so
# every call after the first one is instant. Only the final path goes to
# stdout; all diagnostics go to stderr. Exits 1 if ghz cannot be installed.
#
# Pin: v0.121.0 is the newest tagged release (2025-12) and builds with the
# Go here (needs go >= 1.23). Note that `go list -m -versions` on the proxy
# only reports v0.93.0 for this module, so `@latest` would pick an old
# release: always install the explicit pin below.
set -euo pipefail

readonly GHZ_MODULE="github.com/bojand/ghz"
readonly GHZ_VERSION="v0.121.0"

log() { printf 'ghz.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
repo_root="$(dirname -- "$script_dir")"
bin_dir="$repo_root/.tools/bin"
ghz_bin="$bin_dir/ghz"
stamp="$bin_dir/.ghz.version"

# Fast path: already installed at the pinned version.
if [[ -x "$ghz_bin" && -f "$stamp" && "$(<"$stamp")" == "$GHZ_VERSION" ]]; then
    printf '%s\n' "$ghz_bin"
    exit 0
fi

command -v go >/dev/null 2>&1 \
    || die "'go' not found on PATH; install Go (>= 1.23) to build ghz $GHZ_VERSION"

log "installing $GHZ_MODULE/cmd/ghz@$GHZ_VERSION with $(go version) (takes ~1 min) ..."
mkdir -p "$bin_dir"
# Build into a private temp dir and move into place atomically, so that a
# failed or concurrent install never leaves a half-written binary behind.
tmp_bin="$(mktemp -d "$bin_dir/.ghz-install.XXXXXX")"
trap 'rm -rf -- "$tmp_bin"' EXIT

if ! GOBIN="$tmp_bin" GOTOOLCHAIN=local CGO_ENABLED=0 \
        go install "$GHZ_MODULE/cmd/ghz@$GHZ_VERSION" >&2; then
    die "'go install $GHZ_MODULE/cmd/ghz@$GHZ_VERSION' failed (see output above)"
fi
[[ -x "$tmp_bin/ghz" ]] || die "go install succeeded but produced no ghz binary"

mv -f -- "$tmp_bin/ghz" "$ghz_bin"
printf '%s\n' "$GHZ_VERSION" >"$stamp"
log "installed $ghz_bin"
printf '%s\n' "$ghz_bin"
