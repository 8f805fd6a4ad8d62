#!/usr/bin/env bash
# Prints the path of Debian's Chromium for the browser tests (tests/browser/), installing the
# `chromium` package with apt-get when it is missing and we are root (as scripts/pg.sh does
# for PostgreSQL). Where it cannot be installed this exits non-zero with the reason, and the
# browser tests fail (they never skip). MEMORIA_TEST_CHROMIUM names another binary, used as is.
set -euo pipefail
if [[ -n ${MEMORIA_TEST_CHROMIUM:-} ]]; then
  if [[ ! -x $MEMORIA_TEST_CHROMIUM ]]; then
    echo "chromium.sh: MEMORIA_TEST_CHROMIUM=$MEMORIA_TEST_CHROMIUM is not an executable" >&2
    exit 1
  fi
  echo "$MEMORIA_TEST_CHROMIUM"
  exit 0
fi
bin=/usr/bin/chromium
if [[ ! -x $bin ]]; then
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "chromium.sh: $bin is missing; install Debian's chromium (apt-get install chromium) or set MEMORIA_TEST_CHROMIUM" >&2
    exit 1
  fi
  echo "chromium.sh: installing chromium with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 ||
    { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; }
  [[ -x $bin ]] || { echo "chromium.sh: apt-get did not install $bin" >&2; exit 1; }
fi
echo "$bin"
