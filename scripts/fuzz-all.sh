#!/usr/bin/env bash
# Runs every fuzz target in the module for the given duration each.
# Go's fuzzer takes one target per invocation, so we enumerate them.
set -euo pipefail
fuzztime=${1:-20s}
cd "$(dirname "$0")/.."
status=0
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  targets=$(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' || true)
  for t in $targets; do
    echo "== $pkg $t ($fuzztime)"
    go test -run '^$' -fuzz "^${t}\$" -fuzztime "$fuzztime" "$pkg" || status=1
  done
done
exit $status
