#!/usr/bin/env bash
# make lint: every check runs, even after one fails, so that one run shows
# all there is to fix; the exit status is 1 if any failed. The tools are
# the versions pinned by tools/go.mod, built by scripts/install-tools.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
tools=bin/tools
./scripts/install-tools.sh || exit 1

failed=()
check() { # name, command...
	local name=$1
	shift
	echo "== $name" >&2
	if ! "$@"; then
		failed+=("$name")
	fi
}
unformatted() {
	local files
	files=$(gofmt -l .)
	[ -z "$files" ] && return 0
	echo "$files"
	echo "gofmt: the files above need formatting (gofmt -w)"
	return 1
}
check gofmt unformatted
check "go vet" "$go" vet ./...
check "go vet (tools)" "$go" -C tools vet ./...
check staticcheck "$tools/staticcheck" ./...
check "staticcheck (tools)" sh -c "cd tools && ../$tools/staticcheck ./..."
# The image's Dockerfile, parsed and linted as docker build --check would,
# and held to the image rules (static binary, distroless, non-root).
check Dockerfile "$tools/dockerfilecheck" Dockerfile
# Code not even a test calls: delete it.
check "unreached -test" "$tools/unreached" -test ./...
# Code the kvfast binary never calls: delete it, move it to a package's
# export_test.go if only tests use it, or list it in .deadcode-allow with
# the reason it stays.
check unreached "$tools/unreached" -allow .deadcode-allow ./...

if [ ${#failed[@]} -gt 0 ]; then
	echo "lint: failed: ${failed[*]}" >&2
	exit 1
fi
echo "lint: ok" >&2
