package feed

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
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

// ringAt is the file offset of slot's ring: its control block, whose first
// word is the producer's head (docs/shm-layout.md), then its data.
func ringAt(seg *shm.Segment, slot workers.Slot) int64 {
	h := seg.Header()
	return h.RingsOffset + int64(slot)*int64(h.RingStride)
}

// scribbleHead sets slot's producer head word to head, as a buggy
// producer's commit would.
func scribbleHead(t testing.TB, seg *shm.Segment, slot workers.Slot, head uint64) {
	t.Helper()
	scribble(t, seg.Path(), ringAt(seg, slot), binary.LittleEndian.AppendUint64(nil, head))
}
