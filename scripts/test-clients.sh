#!/usr/bin/env bash
# The stubs we ship and the tools users reach for, against one real server. Starts
# `memoria serve` on the embedded default (fresh temporary data dir, 127.0.0.1, port 0), runs
#   the TypeScript client's tests (clients/ts: node:test, Connect over gRPC), among them the
#     conformance data (tests/conformance/model_turn.json) through its turn adapter, and the
#     README's wiring (clients/ts/examples/wiring.ts) with a scripted model,
#   the Vercel AI SDK integration's tests (integrations/vercel-ai) with the SDK's test model,
#   the Go client's tests (clients/go: go test, google.golang.org/grpc), among them the same
#     conformance data through its turn adapter, and the README's wiring (examples/wiring),
#   the MCP Go SDK integration's tests (integrations/go-mcp), an agent loop over MCP in memory,
#   the runnable examples (examples/python, examples/go, examples/ts),
#   calls through server reflection with `buf curl`, and
#   a bounded ghz run of each hot RPC's config in bench/ghz/,
# then stops the server (also on failure, when it prints the server log's tail). Any failure
# fails the script. Everything it needs is installed by scripts/tools.sh and bench/ghz.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin="$root/.venv/bin"

scripts/tools.sh
ghz=$(bench/ghz.sh)

work=$(mktemp -d)
server_pid=""
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  # SIGTERM drains in-flight calls (MEMORIA_SHUTDOWN_GRACE_SECONDS); past 20 s, kill it.
  timeout 20 tail --pid="$server_pid" -f /dev/null || kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
on_exit() {
  local status=$?
  stop_server
  if ((status != 0)) && [[ -s $work/server.log ]]; then
    echo "== last lines of the server log" >&2
    tail -n 40 "$work/server.log" >&2
  fi
  rm -rf "$work"
}
trap on_exit EXIT

# check NAME JSON PYTHON-EXPR: fails unless the expression holds for r = the parsed JSON.
check() {
  "$bin/python" -c '
import json, sys
name, text, expr = sys.argv[1:]
r = json.loads(text)
if not eval(expr, {"r": r}):
    sys.exit(f"FAILED {name}: {expr}\n{json.dumps(r, indent=2)[:3000]}")
print(f"ok {name}")
' "$@"
}

echo "== server: memoria serve on 127.0.0.1:0, embedded default in a fresh data dir" >&2
# The server's settings come only from these flags: MEMORIA_* variables of the caller's shell
# (say, a database URL or jwt auth) must not change what is tested.
mapfile -t no_settings < <(compgen -e | grep '^MEMORIA_' | sed 's/^/--unset=/' || true)
env "${no_settings[@]}" "$bin/memoria" serve --listen 127.0.0.1:0 --data-dir "$work/data" \
  --port-file "$work/port" >"$work/server.log" 2>&1 &
server_pid=$!

curl_grpc() { "$bin/buf" curl --protocol grpc --http2-prior-knowledge --timeout 10s "$@"; }

# Ready once the port file names a port whose health check answers SERVING (bounded: 60 s).
deadline=$((SECONDS + 60))
until [[ -s $work/port ]] && health=$(curl_grpc "http://127.0.0.1:$(<"$work/port")/grpc.health.v1.Health/Check" 2>/dev/null) &&
  [[ $health == *SERVING* ]]; do
  kill -0 "$server_pid" 2>/dev/null || {
    echo "the server exited before it was ready" >&2
    exit 1
  }
  ((SECONDS < deadline)) || {
    echo "the server was not ready after 60 s" >&2
    exit 1
  }
  sleep 0.2
done
addr="127.0.0.1:$(<"$work/port")"
url="http://$addr"
export MEMORIA_SERVER="$addr"
echo "server ready on $addr" >&2

echo "== Python client package (clients/python): a fresh venv, a plain (non-editable) install" >&2
# setuptools reuses clients/python/build/; a stale copy there could hide a file the package lost.
rm -rf clients/python/build
"${PYTHON:-python3}" -m venv "$work/client-venv"
"$work/client-venv/bin/pip" install --quiet --disable-pip-version-check -c requirements.lock \
  "$root/clients/python"
# From outside the repository, so every import comes from the installed package (and without
# the caller's PYTHONPATH, which could name a checkout's sources).
client_python() { (cd "$work" && env -u PYTHONPATH "$work/client-venv/bin/python" "$@"); }
client_python "$root/clients/python/checks/installed_package.py"

echo "== TypeScript client (clients/ts): its tests, the conformance data, the README's wiring" >&2
(cd clients/ts && npm test --silent && npm run example --silent)

echo "== Vercel AI SDK integration (integrations/vercel-ai): MockLanguageModelV3 through it" >&2
# It depends on clients/ts by path, built just above. npm ci only when its lock file changed.
stamp=integrations/vercel-ai/node_modules/.installed-package-lock.json
if ! cmp -s integrations/vercel-ai/package-lock.json "$stamp"; then
  (cd integrations/vercel-ai && npm ci --no-audit --no-fund --loglevel=error >&2)
  cp integrations/vercel-ai/package-lock.json "$stamp"
fi
(cd integrations/vercel-ai && npm test --silent)

echo "== Go client (clients/go)" >&2
test -z "$(gofmt -l clients/go)" || {
  gofmt -l clients/go >&2
  echo "gofmt: the files above need formatting" >&2
  exit 1
}
# -v shows each top-level test (and a skip's reason); the vectors' subtests only when they fail.
(cd clients/go && go vet ./... && go test -count=1 -v ./... 2>&1 |
  grep -Ev '^(=== (RUN|PAUSE|CONT|NAME) |    --- PASS: )')
echo "== Go client: the README's wiring (clients/go/examples/wiring), a scripted model" >&2
(cd clients/go && go run ./examples/wiring)

echo "== Go over the official MCP Go SDK (integrations/go-mcp): in-memory transports" >&2
test -z "$(gofmt -l integrations/go-mcp)" || {
  gofmt -l integrations/go-mcp >&2
  echo "gofmt: the files above need formatting" >&2
  exit 1
}
(cd integrations/go-mcp && go vet ./... && go test -count=1 -v ./... 2>&1 |
  grep -Ev '^(=== (RUN|PAUSE|CONT|NAME) |    --- PASS: )')

echo "== examples/: Python (from the client package installed above), Go, TypeScript" >&2
# Each renders the section, rewrites, indexes a turn with wait and searches, and exits non-zero
# unless it saw what it wrote: the README points to these files, so they must keep working.
client_python "$root/examples/python/quickstart.py"
# That install has no mcp extra: its memoria-mcp must say what to install, in one line.
if out=$(env -u PYTHONPATH "$work/client-venv/bin/memoria-mcp" --tenant t --principal p 2>&1 </dev/null); then
  echo "memoria-mcp ran without the MCP SDK installed" >&2
  exit 1
fi
[[ $out == "memoria mcp: the MCP SDK is not installed "*": pip install "* && $out != *Traceback* ]] || {
  printf 'memoria-mcp without its mcp extra said:\n%s\n' "$out" >&2
  exit 1
}
test -z "$(gofmt -l examples/go)" || {
  gofmt -l examples/go >&2
  echo "gofmt: the files above need formatting" >&2
  exit 1
}
(cd examples/go && go vet ./... && go run .)
# npm ci wipes and reinstalls node_modules; only when the lock file changed since (as tools.sh).
stamp=examples/ts/node_modules/.installed-package-lock.json
if ! cmp -s examples/ts/package-lock.json "$stamp"; then
  (cd examples/ts && npm ci --no-audit --no-fund --loglevel=error >&2)
  cp examples/ts/package-lock.json "$stamp"
fi
(cd examples/ts && npm start --silent)

echo "== buf curl through server reflection" >&2
methods=$(curl_grpc --list-methods "$url")
check "buf curl --list-methods" "$(printf '%s\n' "$methods" | "$bin/python" -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))')" \
  '"memoria.v1.MemoryBlockService/RenderMemoryBlock" in r and "memoria.v1.AuditService/ListAuditEvents" in r'
as_ana=(-H "x-memoria-tenant: buf-curl" -H "x-memoria-principal: ana")
out=$(curl_grpc "${as_ana[@]}" -d '{"text": "Preferred name: Ana\nUses Jira account ana-42", "writer": "WRITER_MODEL"}' \
  "$url/memoria.v1.MemoryBlockService/RewriteMemoryBlock")
check "buf curl RewriteMemoryBlock" "$out" \
  'r["changed"] and r["memoryBlock"]["charCount"] == 44 and r["addedLines"] == ["Preferred name: Ana", "Uses Jira account ana-42"]'
out=$(curl_grpc "${as_ana[@]}" "$url/memoria.v1.MemoryBlockService/RenderMemoryBlock")
check "buf curl RenderMemoryBlock" "$out" \
  'r["promptSection"] == "Personal memory (44/4,000 characters)\nPreferred name: Ana\nUses Jira account ana-42"'
# An error: buf curl exits non-zero and prints the status with its details.
if out=$(curl_grpc "${as_ana[@]}" -d '{"text": " \u200b ", "writer": "WRITER_MODEL"}' \
  "$url/memoria.v1.MemoryBlockService/RewriteMemoryBlock" 2>&1); then
  echo "buf curl: an empty rewrite succeeded" >&2
  exit 1
fi
check "buf curl empty rewrite is an error" "$out" \
  'r["code"] == "invalid_argument" and [d["type"] for d in r["details"]] == ["google.rpc.ErrorInfo", "google.rpc.BadRequest"]'

echo "== ghz: bench/ghz/ configs, bounded (200 calls each, 4 in flight)" >&2
# Every config must name an RPC of the contract, including those not run yet.
"$bin/python" - bench/ghz/*.json <<'PY'
import json, pathlib, sys
contract = "".join(p.read_text() for p in pathlib.Path("proto").rglob("*.proto"))
for path in sys.argv[1:]:
    service, method = json.loads(pathlib.Path(path).read_text())["call"].rsplit("/", 1)
    if f"service {service.rsplit('.', 1)[1]} " not in contract or f"rpc {method}(" not in contract:
        sys.exit(f"{path}: the contract has no {service}/{method}")
PY
ghz_run() {
  local config=$1 report="$work/ghz-$1.json"
  timeout 120 "$ghz" --config "bench/ghz/$config.json" --total 200 --concurrency 4 \
    --duration 0 --timeout 10s --format json --output "$report" "$addr"
  check "ghz $config" "$(<"$report")" \
    'r["count"] == 200 and r["statusCodeDistribution"] == {"OK": 200} and not r.get("errorDistribution")'
}
# Rewrite first, so that get and render read real blocks.
ghz_run rewrite
# The data template reached the server: call 7 wrote principal p7's block.
out=$(curl_grpc -H "x-memoria-tenant: ghz" -H "x-memoria-principal: p7" \
  "$url/memoria.v1.MemoryBlockService/GetMemoryBlock")
check "ghz rewrite landed" "$out" \
  'r["memoryBlock"]["text"] == "Load test 7\nPreferred name: P7\nUses Jira account p-7\nLikes short answers"'
ghz_run get
ghz_run render
ghz_run search

stop_server
echo "client checks passed" >&2
