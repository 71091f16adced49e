package feed

import (
	"os"
	"testing"
)

// scribble overwrites bytes of the segment file through the page cache,
// as a buggy or hostile process with write access could.
func scribble(t testing.TB, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
