// Command dockerfilecheck checks a Dockerfile without Docker: it parses it
// with BuildKit's own parser and instruction reader, as docker build does,
// runs BuildKit's linter over it (the checks of docker build --check), and
// then holds it to kvfast's image rules: several stages, a static build
// (CGO_ENABLED=0), a distroless or scratch runtime stage, and a non-root
// user. make lint runs it on the repository's Dockerfile.
//
// Usage: dockerfilecheck FILE...
//
// It is a lint tool of this repository (tools/go.mod), not part of the
// router: one process, one goroutine, reading its inputs and writing its
// report; it owns nothing beyond its run.
package main
