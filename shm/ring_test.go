package shm

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func register(t testing.TB, seg *Segment, id uint64) *Publisher {
	t.Helper()
	p, err := seg.Register(WorkerConfig{WorkerID: id, Model: "m", BlockSize: 4, KVCapacityBlocks: 100, Endpoint: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRingRoundTrip(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: MinRingBytes})
	p := register(t, seg, 1)
	r := seg.Reader(p.Slot())
	var rec Record
	// Enough records to wrap a 4 KiB ring many times, checking each one.
	for i := 0; i < 2000; i++ {
		n := i%5 + 1
		hashes := make([]uint64, n)
		tokens := make([]uint32, 4*n)
		for j := range hashes {
			hashes[j] = uint64(i*100 + j)
		}
		for j := range tokens {
			tokens[j] = uint32(i + j)
		}
		switch i % 3 {
		case 0:
			if err := p.Stored(uint64(i), i%2 == 0, hashes, tokens); err != nil {
				t.Fatal(err)
			}
		case 1:
			if err := p.Removed(hashes); err != nil {
				t.Fatal(err)
			}
		case 2:
			if err := p.Cleared(); err != nil {
				t.Fatal(err)
			}
		}
		ok, err := r.Next(&rec)
		if !ok || err != nil {
			t.Fatalf("record %d: ok=%v err=%v", i, ok, err)
		}
		if rec.Seq != uint64(i+1) || rec.Gen != p.Generation() {
			t.Fatalf("record %d: seq %d gen %d", i, rec.Seq, rec.Gen)
		}
		switch i % 3 {
		case 0:
			if rec.Kind != KindStored || rec.HasParent != (i%2 == 0) || rec.Parent != uint64(i) || rec.BlockSize != 4 ||
				len(rec.Hashes) != n || rec.Hashes[n-1] != hashes[n-1] || len(rec.Tokens) != 4*n || rec.Tokens[4*n-1] != tokens[4*n-1] {
				t.Fatalf("record %d: bad stored %+v", i, rec)
			}
		case 1:
			if rec.Kind != KindRemoved || len(rec.Hashes) != n || rec.Hashes[0] != hashes[0] {
				t.Fatalf("record %d: bad removed %+v", i, rec)
			}
		case 2:
			if rec.Kind != KindCleared {
				t.Fatalf("record %d: bad cleared %+v", i, rec)
			}
		}
		r.Commit(&rec)
		if _, last := r.Cursor(); last != rec.Seq {
			t.Fatalf("cursor %d after commit of %d", last, rec.Seq)
		}
	}
	if ok, err := r.Next(&rec); ok || err != nil {
		t.Fatalf("empty ring: ok=%v err=%v", ok, err)
	}
}

func TestRingOverflowDropsAndShowsGap(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: MinRingBytes})
	p := register(t, seg, 1)
	hashes := []uint64{1, 2, 3, 4}
	tokens := make([]uint32, 16)
	var full int
	for i := 0; i < 200; i++ {
		if err := p.Stored(0, false, hashes, tokens); errors.Is(err, ErrRingFull) {
			full++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if dropped := seg.RingState(p.Slot()).Dropped; full == 0 || dropped != uint64(full) {
		t.Fatalf("full=%d dropped=%d", full, dropped)
	}
	r := seg.Reader(p.Slot())
	var rec Record
	var last uint64
	for {
		ok, err := r.Next(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if rec.Seq != last+1 {
			t.Fatalf("unexpected gap before drops ran out: %d after %d", rec.Seq, last)
		}
		last = rec.Seq
		r.Commit(&rec)
	}
	// Room again: the next record carries a sequence number that jumps
	// over every dropped one.
	if err := p.Cleared(); err != nil {
		t.Fatal(err)
	}
	if ok, _ := r.Next(&rec); !ok || rec.Seq != last+uint64(full)+1 {
		t.Fatalf("gap not visible: seq %d, last %d, dropped %d", rec.Seq, last, full)
	}
	if dropped := seg.RingState(p.Slot()).Dropped; dropped != uint64(full) {
		t.Fatalf("dropped counter %d, want %d", dropped, full)
	}
}

func TestRingSplitsLargeBatches(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: MinRingBytes})
	p := register(t, seg, 1)
	n := 3*p.maxBlocks + 2
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = uint64(i + 10)
	}
	r := seg.Reader(p.Slot())
	var rec Record
	var got []uint64
	tokens := make([]uint32, 4*n)
	// Publish chunk by chunk while draining, since the ring holds 4 KiB.
	for i := 0; i < n; i += p.maxBlocks {
		j := min(n, i+p.maxBlocks)
		parent, has := uint64(0), false
		if i > 0 {
			parent, has = hashes[i-1], true
		}
		if err := p.Stored(parent, has, hashes[i:j], tokens[4*i:4*j]); err != nil {
			t.Fatal(err)
		}
		for {
			ok, err := r.Next(&rec)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			if len(got) > 0 && (!rec.HasParent || rec.Parent != got[len(got)-1]) {
				t.Fatalf("chunk does not chain to the previous one")
			}
			got = append(got, rec.Hashes...)
			r.Commit(&rec)
		}
	}
	if len(got) != n {
		t.Fatalf("got %d hashes, want %d", len(got), n)
	}
	// And one call with the whole batch splits by itself.
	big, err := Open(seg.Path()+"2", Options{Index: testIndex, RingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	bp := register(t, big, 2)
	huge := make([]uint64, 3*bp.maxBlocks)
	if err := bp.Stored(0, false, huge, make([]uint32, 4*len(huge))); err != nil {
		t.Fatal(err)
	}
	if bp.Seq() != 3 {
		t.Fatalf("split into %d records, want 3", bp.Seq())
	}
}

func TestRingGarbageIsRefusedNotCrashed(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: MinRingBytes})
	p := register(t, seg, 1)
	r := seg.Reader(p.Slot())
	data := seg.bytesAt(seg.ringBase(int(p.Slot()))+ringControlSize, MinRingBytes)
	head := seg.u64(seg.ringBase(int(p.Slot())) + ctlHead)
	le := binary.LittleEndian
	cases := []struct {
		name  string
		write func()
	}{
		{"size past head", func() { le.PutUint32(data[0:], 1000); data[4] = 1; atomic.StoreUint64(head, 32) }},
		{"unaligned size", func() { le.PutUint32(data[0:], 33); atomic.StoreUint64(head, 40) }},
		{"unknown kind", func() {
			le.PutUint32(data[0:], 24)
			data[4] = 9
			le.PutUint64(data[8:], 1)
			atomic.StoreUint64(head, 24)
		}},
		{"huge count", func() {
			le.PutUint32(data[0:], 32)
			data[4] = byte(KindRemoved)
			le.PutUint64(data[8:], 1)
			le.PutUint32(data[20:], 1<<31)
			atomic.StoreUint64(head, 32)
		}},
		{"head beyond ring", func() { atomic.StoreUint64(head, 1<<40) }},
		{"head not aligned", func() { atomic.StoreUint64(head, 13) }},
		{"bad pad", func() { le.PutUint32(data[0:], 16); data[4] = byte(kindPad); atomic.StoreUint64(head, 16) }},
	}
	var rec Record
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Start each case from an empty ring at position 0.
			atomic.StoreUint64(head, 0)
			atomic.StoreUint64(r.tail, 0)
			r.pos, r.avail = 0, 0
			clear(data)
			tc.write()
			ok, err := r.Next(&rec)
			var re *RecordError
			if ok || !errors.As(err, &re) {
				t.Fatalf("ok=%v err=%v", ok, err)
			}
			r.Resync()
			atomic.StoreUint64(head, 0)
			atomic.StoreUint64(r.tail, 0)
			r.pos, r.avail = 0, 0
		})
	}
}

// TestRingHammer runs a producer and a consumer concurrently; the
// consumer checks every record is complete and sequence numbers only
// skip where the producer reported drops.
func TestRingHammer(t *testing.T) {
	seg, _ := openTest(t, Options{RingBytes: 16 << 10})
	p := register(t, seg, 1)
	r := seg.Reader(p.Slot())
	const records = 50000
	var done atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		hashes := make([]uint64, 8)
		tokens := make([]uint32, 32)
		for i := 1; i <= records; i++ {
			n := i%8 + 1
			for j := 0; j < n; j++ {
				hashes[j] = uint64(i)<<8 | uint64(j)
			}
			for j := range tokens[:4*n] {
				tokens[j] = uint32(i)
			}
			p.Stored(uint64(i), true, hashes[:n], tokens[:4*n])
		}
		done.Store(true)
	}()
	var rec Record
	var last, seen uint64
	for {
		ok, err := r.Next(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if done.Load() && !r.Pending() {
				break
			}
			continue
		}
		i := rec.Parent
		if rec.Seq != i || rec.Seq <= last || len(rec.Hashes) != int(i%8+1) {
			t.Fatalf("record seq %d parent %d after %d with %d hashes", rec.Seq, i, last, len(rec.Hashes))
		}
		for j, h := range rec.Hashes {
			if h != i<<8|uint64(j) {
				t.Fatalf("torn record %d: hash %d = %#x", i, j, h)
			}
		}
		for _, tok := range rec.Tokens {
			if tok != uint32(i) {
				t.Fatalf("torn record %d: token %d", i, tok)
			}
		}
		last = rec.Seq
		seen++
		r.Commit(&rec)
	}
	wg.Wait()
	if dropped := seg.RingState(p.Slot()).Dropped; seen+dropped != records {
		t.Fatalf("seen %d + dropped %d != %d", seen, dropped, records)
	}
}

func TestSlotIndexing(t *testing.T) {
	seg, _ := openTest(t, Options{})
	var pubs []*Publisher
	for i := 0; i < workers.Max; i++ {
		pubs = append(pubs, register(t, seg, uint64(i+1)))
	}
	if _, err := seg.Register(WorkerConfig{WorkerID: 999, BlockSize: 4}); !errors.Is(err, ErrRegistryFull) {
		t.Fatalf("65th worker: %v", err)
	}
	for i, p := range pubs {
		if err := p.Cleared(); err != nil {
			t.Fatal(err)
		}
		var rec Record
		if ok, _ := seg.Reader(p.Slot()).Next(&rec); !ok || rec.Kind != KindCleared {
			t.Fatalf("worker %d: record not in its own ring", i)
		}
	}
}
