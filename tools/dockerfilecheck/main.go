// Command dockerfilecheck checks a Dockerfile without Docker: it parses it
// with BuildKit's own parser and instruction reader, as docker build does,
// runs BuildKit's linter over it (the checks of docker build --check), and
// then holds it to kvfast's image rules: several stages, a static build
// (CGO_ENABLED=0), a distroless or scratch runtime stage, and a non-root
// user. make lint runs it on the repository's Dockerfile.
//
// Usage: dockerfilecheck FILE...
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dockerfilecheck FILE...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		problems, err := checkFile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			failed = true
			continue
		}
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "%s: %s\n", path, p)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}
