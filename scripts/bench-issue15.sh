#!/usr/bin/env bash
# Reproduces what BENCHMARKS.md records for issue 15. Each part is a
# separate block, selected by name (default: all of them), and runs one
# thing at a time so that nothing competes for the 2 cores.
# Usage: scripts/bench-issue15.sh [part...] (OUT=dir for the raw output)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench-issue15}
mkdir -p "$out"
go build -o "$out/kvfast" ./cmd/kvfast
parts=("$@")
want() { [ ${#parts[@]} -eq 0 ] || [[ " ${parts[*]} " == *" $1 "* ]]; }

# --- floor: lookup and hashing against their floors (issue 15, parts 1 and 2) ---
# x-floor: FindMatches over the memory floor of the same lookups; x-xxh64:
# block hashing over xxhash.Sum64 of the same bytes. Each is timed in one
# loop with the two sides taking turns and compared by medians; then the
# standalone benchmarks they replace, for scale. COUNT runs each (5).
if want floor; then
  count=${COUNT:-5}
  {
    echo "# $(date -u +%FT%TZ) $(go version) $(nproc) cores"; uname -a
    go test -run '^$' -bench '^(BenchmarkFindMatchesFloor|BenchmarkHashBlocksXXH64)$' -benchmem -count "$count" ./radix
    go test -run '^$' -bench '^(BenchmarkFindMatches|BenchmarkProbeFloor|BenchmarkHashBlocks|BenchmarkHashBlocksMM|BenchmarkFindMatchesTiers)$' -benchmem -count "$count" ./radix
  } | tee "$out/floor.txt"
fi
# --- end floor ---

# --- calibration: the prefill load scale, auto against a hand-tuned sweep (issue 15, part 3) ---
# kv on the demo's two workloads with --prefill-load-scale pinned at each
# value of the sweep and with auto, REPS runs each with --seed 1..REPS.
# Each run's tables go to calib-WORKLOAD-SCALE-SEED.txt and its notes
# (including the scale auto fitted, or would have) to .err; the summary
# table, medians over the runs, to calibration.txt.
if want calibration; then
  reps=${REPS:-3}
  scales=${SCALES:-"auto 1 3 10 30 100 1000"}
  for seed in $(seq 1 "$reps"); do
    for x in $scales; do
      for wl in tokens chat; do
        pol=kv
        [ "$wl" = chat ] && pol=kv-builtin
        echo "== calibration: $wl, --prefill-load-scale $x, seed $seed" >&2
        "$out/kvfast" demo --workload "$wl" --policies "$pol" --prefill-load-scale "$x" --seed "$seed" --html "" \
          > "$out/calib-$wl-$x-$seed.txt" 2> "$out/calib-$wl-$x-$seed.err"
      done
    done
  done
  # Columns of the demo's first table: 4 is TTFT p50, 11 the hit rate.
  {
    printf '%-8s %-6s %12s %12s %10s\n' workload scale 'TTFT p50' 'hit rate' 'fitted'
    for wl in tokens chat; do
      for x in $scales; do
        ttft=$(for f in "$out"/calib-$wl-$x-*.txt; do grep -A1 'policy  reqs' "$f" | tail -1 | awk '{print $4}'; done |
          sed 's/ms$//' | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)] "ms"}')
        hit=$(for f in "$out"/calib-$wl-$x-*.txt; do grep -A1 'policy  reqs' "$f" | tail -1 | awk '{print $11}'; done |
          sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
        fit=$(grep -ho 'fitted prefill load scale [0-9.e+]*' "$out"/calib-$wl-$x-*.err | awk '{print $5}' | sort -g | tr '\n' ' ')
        printf '%-8s %-6s %12s %12s   %s\n' "$wl" "$x" "$ttft" "$hit" "$fit"
      done
    done
  } | tee "$out/calibration.txt"
fi
# --- end calibration ---

# --- capacity: hit rate when caches are full (issue 15, items 4 and 5) ---
# Every policy, the pooled-LRU reference and the infinite-cache bound,
# with the engines' KV capacity at 0.25x to 1x of the replayed prompts'
# working set, on the shipped trace's last 600 records and on generated
# traces of low and high reuse. 4 engines and 64 tokens per hash id so
# that the longest prompt fits an engine at 0.25x; about 20 s per policy
# and capacity, 8 minutes per trace on 2 cores. SCALE sets
# --prefill-load-scale (default 10: the demo's default when BENCHMARKS.md's
# sweep was recorded; the affinity part below runs kv at auto).
if want capacity; then
  mkdir -p benchmarks/results/issue15
  for trace in embedded gen:low gen:high; do
    name=${trace#gen:}
    echo "== capacity sweep: $trace" >&2
    "$out/kvfast" demo --quiet --trace "$trace" --engines 4 --block-tokens 64 \
      --capacities 0.25,0.5,0.75,1 --policies all --seed 1 --prefill-load-scale "${SCALE:-10}" \
      --html "benchmarks/results/issue15/capacity-$name.html" | tee "benchmarks/results/issue15/capacity-$name.txt" ||
      echo "kvfast demo failed on $trace: see above" >&2
  done
fi
# --- end capacity ---

# --- affinity: kv against pure affinity and approx, repeated (issue 15, items 4 and 5) ---
# The capacity sweep above runs each point once, and single runs of one
# policy spread by about as much as kv and affinity differ on the
# generated traces. This part runs only kv, affinity and approx over the
# same sweep with --seed 1..REPS (default 5), kv at the demo's default
# --prefill-load-scale (auto; SCALE pins another), and summarises, per
# trace and capacity, the median hit rate of each, kv's median share of
# the pooled-LRU reference, the median TTFT p99 of kv and affinity, and
# in how many runs kv won each comparison. TRACES narrows it (default:
# embedded gen:low gen:high). Raw tables: affinity-TRACE-SEED.txt.
if want affinity; then
  reps=${REPS:-5}
  traces=${TRACES:-"embedded gen:low gen:high"}
  for seed in $(seq 1 "$reps"); do
    for trace in $traces; do
      name=${trace#gen:}
      echo "== kv against affinity and approx: $trace, seed $seed" >&2
      "$out/kvfast" demo --quiet --trace "$trace" --engines 4 --block-tokens 64 \
        --capacities 0.25,0.5,0.75,1 --policies kv,affinity,approx --seed "$seed" --html "" \
        --prefill-load-scale "${SCALE:-auto}" \
        > "$out/affinity-$name-$seed.txt" || echo "kvfast demo failed on $trace, seed $seed" >&2
    done
  done
  # A sweep row with three policies reads: capacity, KV blocks, bound,
  # pooled LRU, then each policy's hit rate and (share of the pooled LRU)
  # in --policies order, then each one's TTFT p99 in the same order.
  {
    printf '%-9s %-8s %7s %8s %8s %8s %7s %7s %9s %9s %7s %s\n' trace capacity 'kv hit' 'of LRU' 'aff hit' 'apx hit' 'kv>=aff' 'kv>=apx' 'kv p99' 'aff p99' 'kv<=aff' 'runs'
    for trace in $traces; do
      trace=${trace#gen:}
      cat "$out"/affinity-$trace-*.txt | awk -v trace="$trace" '
        function ms(v) { if (v ~ /ms$/) { sub(/ms$/, "", v); return v + 0 } if (v ~ /µs$/) { sub(/µs$/, "", v); return v / 1000 } sub(/s$/, "", v); return v * 1000 }
        function median(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
        $1 ~ /^[0-9.]+x$/ && NF == 13 {
          c = $1; n[c]++; if (!(c in seen)) { seen[c] = 1; order[++caps] = c }
          i = n[c]; kh[c, i] = $5; ks[c, i] = $5 / $4; ah[c, i] = $7; xh[c, i] = $9; kp[c, i] = ms($11); ap[c, i] = ms($12)
          if ($5 + 0 >= $7 + 0) aw[c]++
          if ($5 + 0 >= $9 + 0) xw[c]++
          if (ms($11) <= ms($12)) pw[c]++
        }
        END {
          for (i = 1; i <= caps; i++) {
            c = order[i]; m = n[c]
            for (j = 1; j <= m; j++) { h[j] = kh[c, j]; s[j] = ks[c, j]; a[j] = ah[c, j]; x[j] = xh[c, j]; u[j] = kp[c, j]; v[j] = ap[c, j] }
            printf "%-9s %-8s %7.3f %7.1f%% %8.3f %8.3f %5d/%d %5d/%d %7.1fms %7.1fms %5d/%d %d\n", trace, c, median(h, m), 100 * median(s, m), median(a, m), median(x, m), aw[c], m, xw[c], m, median(u, m), median(v, m), pw[c], m, m
          }
        }'
    done
  } | tee "$out/affinity.txt"
fi
# --- end affinity ---

# --- frontend: router CPU per request under an external load generator (issue 15, part 6) ---
# A router (kvfast serve, default flags) in front of four mock engines, one
# of which caches the prompt, answers route-only requests for one
# 1024-token completions body (TOKENS to change it) sent by wrk, a separate
# process, over CONNS keep-alive connections for SECS seconds. The
# router's CPU per request (user and system, from /proc) is set beside the
# sum of the in-process stage benchmarks (BenchmarkRouteStages: parse,
# hash, lookup, select, encode) on the same body and index state; what the
# stages do not account for is HTTP, framework, runtime and kernel cost.
# REPS rounds, each a wrk run and five counts of the stage benchmarks
# (per stage their median), alternating. Everything goes to frontend.txt.
if want frontend; then
  command -v wrk >/dev/null || { echo "frontend: needs wrk (apt-get install wrk)" >&2; exit 1; }
  reps=${REPS:-3}; secs=${SECS:-15}; conns=${CONNS:-16}; tokens=${TOKENS:-1024}
  tmp=$(mktemp -d)
  pids=()
  cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
  trap cleanup EXIT
  # wait_for DESC CMD...: polls CMD for up to 30 s and gives up loudly.
  wait_for() {
    local desc=$1; shift
    for _ in $(seq 300); do "$@" && return 0; sleep 0.1; done
    echo "frontend: gave up waiting for $desc" >&2; exit 1
  }
  # A free port as the kernel picks it; another process could take it
  # before the router binds, in which case serve fails and so does the wait.
  freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
  api=$(freeport); admin=$(freeport)
  python3 -c '
import json, random, sys
r = random.Random(1)
json.dump({"model": "mock", "prompt": [r.randrange(151935) for _ in range(int(sys.argv[1]))],
           "max_tokens": 16, "temperature": 0.0}, sys.stdout)' "$tokens" > "$tmp/body.json"
  "$out/kvfast" serve --listen "127.0.0.1:$api" --admin-listen "127.0.0.1:$admin" --segment "$tmp/seg" --log-level warn 2> "$out/frontend-serve.log" &
  router=$!; pids+=("$router")
  wait_for "the router's segment" test -e "$tmp/seg"
  "$out/kvfast" mock --engines 4 --listen 127.0.0.1:0 --segment "$tmp/seg" --engine-speedup inf 2> "$out/frontend-mock.log" &
  pids+=("$!")
  healthy() { [ "$(curl -s "127.0.0.1:$admin/admin/workers" | grep -o '"healthy":true' | wc -l)" -ge 4 ]; }
  wait_for "four healthy engines" healthy
  # One served request caches the prompt on one engine, whose KV events
  # reach the index; then every route-only answer finds the whole prompt.
  curl -sf -XPOST -H 'Content-Type: application/json' --data-binary @"$tmp/body.json" "127.0.0.1:$api/v1/completions" > /dev/null
  cached() {
    curl -s -XPOST --data-binary @"$tmp/body.json" "127.0.0.1:$api/v1/route/completions" > "$tmp/route.json" &&
      awk '# the decision comes first, before the per-worker terms
           match($0, /"overlap_blocks":[0-9]+/) { o = substr($0, RSTART + 17, RLENGTH - 17) + 0 }
           match($0, /"prompt_blocks":[0-9]+/) { p = substr($0, RSTART + 16, RLENGTH - 16) + 0 }
           END { exit !(p > 0 && o == p) }' "$tmp/route.json"
  }
  wait_for "the prompt to be cached in the index" cached
  url="http://127.0.0.1:$api/v1/route/completions"
  KVFAST_BODY="$tmp/body.json" wrk -t1 -c"$conns" -d3s -s scripts/frontend.lua "$url" > /dev/null # warm up
  {
    echo "# scripts/bench-issue15.sh frontend: REPS=$reps SECS=$secs CONNS=$conns TOKENS=$tokens"
    echo "# $(date -u +%FT%TZ) $(go version) $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  } > "$out/frontend.txt"
  : > "$tmp/stages.txt"
  for rep in $(seq 1 "$reps"); do
    read -r u0 s0 < <(awk '{print $14, $15}' "/proc/$router/stat")
    KVFAST_BODY="$tmp/body.json" wrk -t1 -c"$conns" -d"${secs}s" -s scripts/frontend.lua "$url" > "$tmp/wrk.txt"
    read -r u1 s1 < <(awk '{print $14, $15}' "/proc/$router/stat")
    n=$(awk '/requests in/ {print $1}' "$tmp/wrk.txt")
    bad=$(awk '/Non-2xx/ {print $NF}' "$tmp/wrk.txt")
    errs=$(awk '/Socket errors/ {print}' "$tmp/wrk.txt")
    if [ -n "$bad" ] || [ -n "$errs" ]; then
      cat "$tmp/wrk.txt" >&2; echo "frontend: wrk saw failed requests; the figures would not be of served ones" >&2; exit 1
    fi
    echo "round $rep: requests $n user_ticks $((u1 - u0)) sys_ticks $((s1 - s0)) clk_tck $(getconf CLK_TCK)" | tee -a "$out/frontend.txt"
    go test -run '^$' -bench "^BenchmarkRouteStages/tokens=$tokens/" -benchtime 20000x -count 5 ./fastpath |
      grep -E '^Benchmark' | sed "s/^/round $rep: /" | tee -a "$tmp/stages.txt" >&2
  done
  cat "$tmp/stages.txt" >> "$out/frontend.txt"
  # A profile round, not counted above (sampling costs the router CPU):
  # perf records the router while wrk loads it, and perf-attribute.py
  # splits the samples into the stages, HTTP and framework, kernel and
  # runtime. PROFILE=0, or no usable perf, skips it.
  if [ "${PROFILE:-1}" != 0 ] && command -v perf >/dev/null && perf record -o /dev/null -- true >/dev/null 2>&1; then
    KVFAST_BODY="$tmp/body.json" wrk -t1 -c"$conns" -d"$((secs + 2))s" -s scripts/frontend.lua "$url" > /dev/null &
    wrkpid=$!
    perf record -F 999 -g -p "$router" -o "$tmp/perf.data" -- sleep "$secs" > /dev/null 2>&1
    wait "$wrkpid"
    perf script -i "$tmp/perf.data" -F tid,period,ip,sym,dso 2> /dev/null | python3 scripts/perf-attribute.py |
      sed 's/^/profile: /' >> "$out/frontend.txt"
  else
    echo "frontend: no profile round (PROFILE=0, or perf is missing or not allowed)" >&2
  fi
  # Per round: CPU per request (user, system), the sum of the stages'
  # medians and the handler's median; then the medians over the rounds.
  # overhead is the share of the CPU the stages do not account for.
  awk '
    function med(a, n,   i, j, x) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { x = a[j]; a[j] = a[j-1]; a[j-1] = x } return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2 }
    $3 == "requests" { r = $2 + 0; rounds = r > rounds ? r : rounds; u[r] = $6 * 1e6 / $10 / $4; s[r] = $8 * 1e6 / $10 / $4 }
    $1 == "profile:" && $2 == "share" { line = $0; sub(/^profile: share /, "", line); pv = line; sub(/.*: /, "", pv); sub(/:[^:]*$/, "", line); sub(/%$/, "", pv)
      if (line ~ /^HTTP and framework/) http = pv + 0; else { nprof++; pname[nprof] = line; pshare[nprof] = pv + 0 }
      next }
    $3 ~ /^BenchmarkRouteStages/ { r = $2 + 0; st = $3; sub(/.*\//, "", st); sub(/-[0-9]+$/, "", st); k = r SUBSEP st; n[k]++; v[k, n[k]] = $5 / 1000; names[st] = 1 }
    END {
      for (r = 1; r <= rounds; r++) {
        sum = 0
        for (st in names) { m = n[r, st]; for (i = 1; i <= m; i++) x[i] = v[r, st, i]; md[st] = med(x, m); if (st != "handler") sum += md[st] }
        t[r] = u[r] + s[r]; uu[r] = u[r]; ss[r] = s[r]; stg[r] = sum; h[r] = md["handler"]; o[r] = 1 - sum / t[r]
        printf "round %d: CPU %.1f us/request (user %.1f, system %.1f), stage sum %.2f us (parse %.2f, hash %.2f, lookup %.2f, select %.2f, encode %.2f), handler %.2f us\n", r, t[r], u[r], s[r], sum, md["parse"], md["hash"], md["lookup"], md["select"], md["encode"], h[r]
        if (sum > h[r]) printf "round %d: WARNING: the stage sum exceeds the whole handler; the machine was too noisy for this round\n", r
      }
      printf "route-only, %d rounds, medians:\n", rounds
      printf "router CPU per request: %.1f us (user %.1f, system %.1f)\n", med(t, rounds), med(uu, rounds), med(ss, rounds)
      printf "in-process handler:     %.1f us\n", med(h, rounds)
      printf "stage sum:              %.1f us (parse, hash, lookup, select, encode)\n", med(stg, rounds)
      printf "outside the stages (HTTP, framework, runtime, kernel): %.0f%% of the router CPU\n", 100 * med(o, rounds)
      if (nprof) {
        printf "profile round, share of the router CPU (and us per request at the median CPU above):\n"
        for (i = 1; i <= nprof; i++) printf "  %-48s %5.1f%% %6.1f us\n", pname[i], pshare[i], pshare[i] * med(t, rounds) / 100
        printf "HTTP and framework (fasthttp, net, kvfast outside the stages): %.1f%% of the router CPU (target <= 30%%)\n", http
      }
    }' "$out/frontend.txt" | tee -a "$out/frontend.txt"
fi
# --- end frontend ---
