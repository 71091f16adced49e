#!/usr/bin/env bash
# Builds the lint tools pinned by tools/go.mod (staticcheck; unreached,
# the production dead-code check in tools/unreached; dockerfilecheck, the
# Dockerfile check in tools/dockerfilecheck) into bin/tools, where
# make lint runs them. The Go build cache makes a repeat run cheap; the
# first downloads the pinned modules through the module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
GOBIN="$PWD/bin/tools" go -C tools install tool
