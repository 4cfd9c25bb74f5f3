#!/usr/bin/env bash
# Times calls to a real MCP server (tests/fixtures/mcp_server.py, the
# official Python SDK) through the gateway: one node of BINARY on loopback
# ports 18470-18473, an agent bound to the server's `translate` tool, N
# `POST /agents/{id}/invoke` after 20 to warm up, from CLIENTS keep-alive
# clients at once (1: sequential). With --json the server answers each
# call in one JSON body instead of an event stream. Prints p50, p99 and
# calls/s under LABEL. Run it with two builds to compare them
# (docs/benchmarks.md, "MCP sessions kept").
# Usage: bench-mcp-gateway.sh BINARY LABEL [N] [CLIENTS] [--json]
#        (scripts/fetch-mcp.sh first)
set -euo pipefail
bin="$1"; label="$2"; n="${3:-500}"; clients="${4:-1}"; mode="${5:-}"
here="$(cd "$(dirname "$0")" && pwd)"
py="${AGENTRY_MCP_PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/agentry/mcp-venv/bin/python}"
dir=$(mktemp -d)
trap 'kill $node $mcp 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
printf '[gateway.outbound]\nallow = ["127.0.0.1"]\nallow_http = true\n' > "$dir/agentry.toml"
"$py" "$here/../tests/fixtures/mcp_server.py" 0 $mode > "$dir/mcp.port" 2>/dev/null &
mcp=$!
"$bin" serve --config "$dir/agentry.toml" --data-dir "$dir/data" \
  --http-addr 127.0.0.1:18470 --grpc-addr 127.0.0.1:18471 \
  --raft-addr 127.0.0.1:18472 --peer-addr 127.0.0.1:18473 \
  --admin-key bench-admin-key-000000001 > "$dir/node.log" 2>&1 &
node=$!
for _ in $(seq 1 60); do
  grep -q "agentry ready" "$dir/node.log" && [ -s "$dir/mcp.port" ] && break
  sleep 1
done
"$py" - "$(head -1 "$dir/mcp.port")" "$n" "$label" "$clients" <<'PY'
import sys, time, httpx
from concurrent.futures import ThreadPoolExecutor
port, n, label, clients = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
base = "http://127.0.0.1:18470"
auth = {"Authorization": "Bearer bench-admin-key-000000001"}
agent = {"id": "mcp-translate", "name": "Translate over MCP",
         "description": "Translates text, over MCP.",
         "bindings": [{"protocol": "mcp", "endpoint": f"http://127.0.0.1:{port}/mcp",
                       "tool": "translate"}]}
with httpx.Client(timeout=30) as c:
    r = c.post(base + "/agents", json=agent, headers=auth)
    assert r.status_code in (200, 201), r.text
url = base + "/agents/mcp-translate/invoke"
body = {"text": "hello", "target_language": "fr"}

def run(calls):
    lat = []
    with httpx.Client(timeout=30) as c:
        for _ in range(calls):
            t = time.perf_counter()
            r = c.post(url, json=body, headers=auth)
            assert r.status_code == 200, r.text
            lat.append(time.perf_counter() - t)
    return lat

run(20)
share = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
start = time.perf_counter()
with ThreadPoolExecutor(clients) as pool:
    lat = sorted(x for part in pool.map(run, share) for x in part)
took = time.perf_counter() - start
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000
print(f"{label}: {n} calls from {clients} clients, p50 {p(0.5):.2f} ms, "
      f"p99 {p(0.99):.2f} ms, {n / took:.0f} calls/s")
PY
