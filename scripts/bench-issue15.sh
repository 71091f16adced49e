#!/usr/bin/env bash
# Reproduces the figures of issue 15 in BENCHMARKS.md ("Issue 15"). Each
# part is a ratio measured in one run, so that it holds on any machine.
#
#   scripts/bench-issue15.sh [out] [count]   (default bench-issue15.txt, 5)
#
# Part 1 and 2 (radix): x-floor, FindMatches over the memory floor of the
# same lookups, and x-xxh64, block hashing over xxhash.Sum64 of the same
# bytes, each timed in one loop with the two sides taking turns, compared
# by medians; then the standalone benchmarks they replace, for scale.
# Other parts of the issue add their sections below.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-issue15.txt}
count=${2:-5}
run() { # package, benchmark regexp, benchtime
	echo "== $1 $2" >&2
	go test -run '^$' -bench "$2" -benchmem -benchtime "$3" -count "$count" "$1" | tee -a "$out"
}
: >"$out"
{ echo "# $(date -u +%FT%TZ) $(go version) $(nproc) cores"; uname -a; } >>"$out"

# 1. FindMatches at memory speed; 2. hashing at XXH64 speed.
run ./radix '^(BenchmarkFindMatchesFloor|BenchmarkHashBlocksXXH64)$' 1s
run ./radix '^(BenchmarkFindMatches|BenchmarkProbeFloor|BenchmarkHashBlocks|BenchmarkHashBlocksMM|BenchmarkFindMatchesTiers)$' 1s
