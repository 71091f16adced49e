#!/usr/bin/env bash
# Runs the benchmarks whose numbers BENCHMARKS.md quotes, one package at a
# time (so they do not compete for the 2 cores), and writes the raw
# `go test -bench` output to the file given (default bench-results.txt).
# Compare runs with benchstat. Usage: scripts/bench-headline.sh [out] [count]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results.txt}
count=${2:-3}
run() { # package, benchmark regexp, benchtime
  echo "== $1 $2" >&2
  go test -run '^$' -bench "$2" -benchmem -benchtime "$3" -count "$count" "$1" | tee -a "$out"
}
: > "$out"
{ echo "# $(date -u +%FT%TZ) $(go version) $(nproc) cores"; uname -a; } >> "$out"
run ./radix 'HashBlocks|FindMatches|ProbeFloor|IndexMixed' 1s
run ./shm 'Ring' 1s
run ./feed 'FeedIngest|PublishToVisible' 1s
run ./sched 'Select|Query' 1s
run ./guard 'GuardLifecycle' 1s
run ./openai 'ParseRequest|SSEScan' 1s
run ./fastpath 'RouteOnly' 1s
run ./benchmarks 'ProxyOverhead' 2s
