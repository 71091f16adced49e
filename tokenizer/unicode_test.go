package tokenizer

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestUnicodeTablesAreGenerated regenerates unicode_tables.go from the
// pinned Unicode data packages and requires the committed file to match.
func TestUnicodeTablesAreGenerated(t *testing.T) {
	requireReference(t)
	out := filepath.Join(t.TempDir(), "unicode_tables.go")
	cmd := exec.Command("node", filepath.Join(referenceDir, "gen-unicode.mjs"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen-unicode.mjs: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("unicode_tables.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("unicode_tables.go is stale: run go generate ./tokenizer")
	}
}

// TestClassesFollowUnicode16 pins a few classes Go's own tables (Unicode
// 15.0) get differently.
func TestClassesFollowUnicode16(t *testing.T) {
	initClasses()
	for _, c := range []struct {
		r    rune
		want charClass
	}{
		{'a', clLetter | clLower | clWord},
		{' ', clSpace},
		{'\n', clSpace | clNewline},
		{0x116D0, clNumber | clWord},          // MYANMAR PAO DIGIT ZERO, new in 16.0
		{0x1C89, clLetter | clUpper | clWord}, // CYRILLIC CAPITAL LETTER TJE, new in 16.0
	} {
		if got := classOf(c.r) &^ clNormalizedAsIs; got != c.want {
			t.Errorf("classOf(U+%04X) = %#x, want %#x", c.r, got, c.want)
		}
	}
	if classOf(0x32FF)&clNormalizedAsIs == 0 {
		t.Error("U+32FF, new in 12.1, should be left alone by normalization")
	}
	if classOf('é')&clNormalizedAsIs != 0 {
		t.Error("é should be normalized")
	}
}
