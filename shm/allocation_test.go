//go:build !race

package shm

import "testing"

func TestRingZeroAllocs(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: 1 << 20})
	p := register(t, seg, 1)
	r := seg.Reader(p.Slot())
	hashes := []uint64{1, 2, 3, 4}
	tokens := make([]uint32, 16)
	var rec Record
	allocs := testing.AllocsPerRun(1000, func() {
		p.Stored(9, true, hashes, tokens)
		p.Removed(hashes)
		p.Cleared()
		for {
			ok, err := r.Next(&rec)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			r.Commit(&rec)
		}
	})
	if allocs != 0 {
		t.Fatalf("ring write+read: %v allocs per run", allocs)
	}
	// A full ring drops without allocating either.
	for p.Cleared() == nil {
	}
	if a := testing.AllocsPerRun(100, func() { p.Stored(9, true, hashes, tokens) }); a != 0 {
		t.Fatalf("dropping write: %v allocs", a)
	}
}

func TestLoadZeroAllocs(t *testing.T) {
	seg, _ := openTest(t, Options{})
	p := register(t, seg, 1)
	if a := testing.AllocsPerRun(1000, func() {
		p.Load(Load{Running: 1})
		seg.LoadOf(p.Slot())
	}); a != 0 {
		t.Fatalf("load page write+read: %v allocs", a)
	}
}
