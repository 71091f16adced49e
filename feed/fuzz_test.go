package feed

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/kvfast/kvfast/shm"
)

// FuzzIngest lets the fuzzer act as a hostile publisher: it writes any
// bytes into a ring and any head, and the ingester applies whatever it
// accepts. The process must not crash and the index must stay
// structurally valid.
func FuzzIngest(f *testing.F) {
	f.Add([]byte{24, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, uint64(24))
	f.Add(make([]byte, 64), uint64(64))
	f.Add([]byte{48, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0}, uint64(48))
	dir := f.TempDir()
	seg, err := shm.Open(dir+"/seg", shm.Options{Index: testIndex, RingBytes: shm.MinRingBytes})
	if err != nil {
		f.Fatal(err)
	}
	p, err := seg.Register(shm.WorkerConfig{WorkerID: 1, Model: testModel, BlockSize: 1})
	if err != nil {
		f.Fatal(err)
	}
	in := New(seg, Config{HeartbeatGrace: time.Hour}) // its publishers do not heartbeat
	if ok, err := in.Acquire(context.Background()); !ok {
		f.Fatal(err)
	}
	in.ScanRegistry()
	h := seg.Header()
	ring := ringAt(seg, p.Slot())
	fd, err := os.OpenFile(seg.Path(), os.O_RDWR, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte, advance uint64) {
		st := seg.RingState(p.Slot())
		off := int64(st.Head % uint64(h.RingBytes))
		if n := int64(h.RingBytes) - off; int64(len(data)) > n {
			data = data[:n]
		}
		fd.WriteAt(data, ring+256+off)
		var word [8]byte
		head := st.Head + advance%uint64(2*h.RingBytes)
		for i := range word {
			word[i] = byte(head >> (8 * i))
		}
		fd.WriteAt(word[:], ring)
		// Records may claim this generation and any sequence number.
		for i := 0; i < 4 && in.Poll() > 0; i++ {
		}
		if err := seg.Index().Verify(); err != nil {
			t.Fatal(err)
		}
	})
}
