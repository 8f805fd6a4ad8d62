#!/usr/bin/env bash
# Print the path of a pinned Go program in <repo>/.tools/bin, building it on first use.
#
#   scripts/go-install.sh google.golang.org/protobuf/cmd/protoc-gen-go v1.36.12
#     -> /path/to/repo/.tools/bin/protoc-gen-go
#
# The program is built with the installed Go toolchain from the Go module proxy
# (`go install PACKAGE@VERSION`) and kept in .tools/bin (gitignored) with a stamp naming the
# version, so every later call is instant and a changed pin rebuilds. Only the path goes to
# stdout; diagnostics go to stderr. Exits 1 if the program cannot be installed.
set -euo pipefail

log() { printf 'go-install.sh: %s\n' "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

(($# == 2)) || die "usage: $0 PACKAGE VERSION"
readonly package="$1" version="$2"
readonly name="${package##*/}"

script_dir="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
bin_dir="$(dirname -- "$script_dir")/.tools/bin"
binary="$bin_dir/$name"
stamp="$bin_dir/.$name.version"

# Fast path: already installed at the pinned version.
if [[ -x $binary && -f $stamp && "$(<"$stamp")" == "$package@$version" ]]; then
    printf '%s\n' "$binary"
    exit 0
fi

command -v go >/dev/null 2>&1 || die "'go' not found on PATH; install Go to build $package@$version"

log "installing $package@$version with $(go version) ..."
mkdir -p "$bin_dir"
# Build into a private temp dir and move into place, so that a failed or concurrent install
# never leaves a half-written binary behind.
tmp_bin="$(mktemp -d "$bin_dir/.install.XXXXXX")"
trap 'rm -rf -- "$tmp_bin"' EXIT
GOBIN="$tmp_bin" GOTOOLCHAIN=local CGO_ENABLED=0 go install "$package@$version" >&2 ||
    die "'go install $package@$version' failed (see output above)"
[[ -x $tmp_bin/$name ]] || die "go install succeeded but produced no $name binary"

mv -f -- "$tmp_bin/$name" "$binary"
printf '%s\n' "$package@$version" >"$stamp"
log "installed $binary"
printf '%s\n' "$binary"
