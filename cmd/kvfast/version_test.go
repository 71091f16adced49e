package main

import (
	"io"
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

// TestEveryCommandHasHelp: README promises --help for every command, and
// the usage line promises "kvfast help <command>", which runs it.
func TestEveryCommandHasHelp(t *testing.T) {
	saved := helpOutput
	helpOutput = io.Discard
	defer func() { helpOutput = saved }()
	for name, cmd := range subcommands {
		if code := cmd.run([]string{"--help"}); code != 0 {
			t.Errorf("kvfast %s --help: exit %d, want 0", name, code)
		}
	}
}
