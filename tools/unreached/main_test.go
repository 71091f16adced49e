package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func keys(t *testing.T, test bool) []string {
	t.Helper()
	found, err := analyse("testdata/prog", []string{"./..."}, test)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range found {
		got = append(got, f.key)
	}
	return got
}

func TestReportsWhatNoCallReaches(t *testing.T) {
	want := []string{"T.OnlyReflection", "T.unexported", "dead", "onlyTest"}
	if got := keys(t, false); !slices.Equal(got, want) {
		t.Errorf("without -test: got %q, want %q", got, want)
	}
	want = []string{"T.OnlyReflection", "T.unexported", "dead"}
	if got := keys(t, true); !slices.Equal(got, want) {
		t.Errorf("with -test: got %q, want %q", got, want)
	}
}

func TestAllowList(t *testing.T) {
	dir := t.TempDir()
	write := func(text string) string {
		name := filepath.Join(dir, "allow")
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return name
	}
	var out strings.Builder
	allow := write("# comment\ndead  kept for the demo\nT.OnlyReflection called by a template\nonlyTest tests use it # trailing comment\ngone was deleted\n")
	n, err := run(&out, "testdata/prog", []string{"./..."}, false, allow)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if n != 2 || len(lines) != 2 || !strings.HasSuffix(lines[0], ": T.unexported") ||
		!strings.Contains(lines[1], "gone is reached now or gone") {
		t.Fatalf("%d findings:\n%s", n, out.String())
	}
	if !strings.HasPrefix(lines[0], "main.go:") {
		t.Errorf("position not relative to the module: %s", lines[0])
	}
	if _, err := run(&out, "testdata/prog", []string{"./..."}, false, write("dead\n")); err == nil ||
		!strings.Contains(err.Error(), "has no reason") {
		t.Fatalf("an entry without a reason: %v", err)
	}
}
