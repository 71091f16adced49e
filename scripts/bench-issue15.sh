#!/usr/bin/env bash
# Reproduces the figures BENCHMARKS.md quotes for issue 15. Each part is a
# block of its own; run them all, or name parts: scripts/bench-issue15.sh
# [part...]. Output goes to benchmarks/results/issue15/ (or $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results/issue15}
mkdir -p "$out"
parts=("$@")
want() { [ ${#parts[@]} -eq 0 ] || [[ " ${parts[*]} " == *" $1 "* ]]; }

# --- capacity: hit rate when caches are full (issue 15, items 4 and 5) ---
# Every policy, the pooled-LRU reference and the infinite-cache bound,
# with the engines' KV capacity at 0.25x to 1x of the replayed prompts'
# working set, on the shipped trace's last 600 records and on generated
# traces of low and high reuse. 4 engines and 64 tokens per hash id so
# that the longest prompt fits an engine at 0.25x; about 20 s per policy
# and capacity, 8 minutes per trace on 2 cores.
if want capacity; then
  go build -o "$out/kvfast" ./cmd/kvfast
  for trace in embedded gen:low gen:high; do
    name=${trace#gen:}
    echo "== capacity sweep: $trace" >&2
    "$out/kvfast" demo --quiet --trace "$trace" --engines 4 --block-tokens 64 \
      --capacities 0.25,0.5,0.75,1 --policies all --seed 1 \
      --html "$out/capacity-$name.html" | tee "$out/capacity-$name.txt" ||
      echo "kvfast demo failed on $trace: see above" >&2
  done
  rm -f "$out/kvfast"
fi
