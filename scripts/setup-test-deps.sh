#!/usr/bin/env bash
# Installs what the test suite needs beyond the Go toolchain, so that
# `make test` passes on a fresh machine. Idempotent and quiet when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."
# Go modules: downloaded up front so a missing proxy fails here, clearly.
go mod download
