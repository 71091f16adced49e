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
# and capacity, 8 minutes per trace on 2 cores.
if want capacity; then
  mkdir -p benchmarks/results/issue15
  for trace in embedded gen:low gen:high; do
    name=${trace#gen:}
    echo "== capacity sweep: $trace" >&2
    "$out/kvfast" demo --quiet --trace "$trace" --engines 4 --block-tokens 64 \
      --capacities 0.25,0.5,0.75,1 --policies all --seed 1 \
      --html "benchmarks/results/issue15/capacity-$name.html" | tee "benchmarks/results/issue15/capacity-$name.txt" ||
      echo "kvfast demo failed on $trace: see above" >&2
  done
fi
# --- end capacity ---
