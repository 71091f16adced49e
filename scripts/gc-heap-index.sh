#!/usr/bin/env bash
# Counts the router's garbage collections over 1,000 small requests with a
# 16M-block index on the heap (--segment none), as BENCHMARKS.md's "The
# memory limit and an index on the heap" quotes. It starts one mock engine
# and one router on 127.0.0.1 (ports PORT..PORT+2, default 45100) and stops
# both. Usage: scripts/gc-heap-index.sh [kvfast binary] (default: builds one).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/kvfast
  go build -o "$bin" ./cmd/kvfast
fi
port=${PORT:-45100}
"$bin" mock --engines 1 --listen "127.0.0.1:$port" --engine-speedup 50 >/dev/null 2>&1 &
mock=$!
"$bin" serve --segment none --index-capacity 16777216 --log-level warn \
  --worker "url=http://127.0.0.1:$port,id=1,model=mock" \
  --listen "127.0.0.1:$((port + 1))" --admin-listen "127.0.0.1:$((port + 2))" >/dev/null 2>&1 &
router=$!
trap 'kill $router $mock 2>/dev/null; wait $router $mock 2>/dev/null || true' EXIT
for _ in $(seq 1 150); do curl -sf "127.0.0.1:$((port + 1))/ready" >/dev/null && break; sleep 0.2; done
gc() { curl -s "127.0.0.1:$((port + 2))/metrics" | awk '/^go_gc_duration_seconds_count/ {print $2}'; }
before=$(gc)
PORT=$((port + 1)) python3 - <<'PY'
import concurrent.futures, json, os, urllib.request
url = "http://127.0.0.1:%s/v1/completions" % os.environ["PORT"]
def one(i):
    body = json.dumps({"model": "mock", "prompt": [i % 500 + 1, 2, 3, 4], "max_tokens": 2}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=30).status
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    codes = list(pool.map(one, range(1000)))
print("requests answered 200:", codes.count(200))
PY
echo "garbage collections during them: $(( $(gc) - before ))"
