package main

import (
	"strings"
	"testing"
)

// TestVersion: the build's module version and Go release are printed,
// whether or not the build recorded a commit (go test builds do not).
func TestVersion(t *testing.T) {
	var b strings.Builder
	printVersion(&b)
	if out := b.String(); !strings.HasPrefix(out, "kvfast ") || !strings.Contains(out, "built with go") {
		t.Fatalf("version:\n%s", out)
	}
}
