#!/usr/bin/env bash
# Installs what the test suite needs beyond the Go toolchain, so that
# `make test` passes on a fresh machine. Idempotent and quiet when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."
# Go modules: downloaded up front so a missing proxy fails here, clearly.
go mod download

# Node.js and the official openai npm client, pinned by
# fastpath/testdata/openai/package-lock.json, for fastpath's real-client
# test (TestOfficialOpenAIClient), which fails in CI without them.
openai_dir=fastpath/testdata/openai
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "setup-test-deps: installing Node.js and npm with apt-get" >&2
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
	else
		echo "setup-test-deps: node and npm are missing; install Node.js 20 or later with npm" \
			"(or run this script as root to apt-get them): fastpath's openai client test needs them" >&2
		exit 1
	fi
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
	echo "setup-test-deps: warning: Node.js $(node --version) is older than the openai client supports (20)" >&2
fi
# npm ci only when the installed client is not the locked one.
locked=$(cd "$openai_dir" && node -p 'require("./package-lock.json").packages["node_modules/openai"].version')
installed=$(cd "$openai_dir" && node -p 'try { require("./node_modules/openai/package.json").version } catch { "" }')
if [ "$locked" != "$installed" ]; then
	(cd "$openai_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
	echo "setup-test-deps: installed openai@$locked in $openai_dir" >&2
fi
