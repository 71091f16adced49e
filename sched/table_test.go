package sched

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"unsafe"
)

func TestLayoutSizes(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 64 {
		t.Errorf("a table entry is %d bytes; the design keeps it to one cache line", n)
	}
	if n := unsafe.Sizeof(workerLive{}); n != 64 {
		t.Errorf("workerLive is %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(progress{}); n != 64 {
		t.Errorf("progress is %d bytes, want 64", n)
	}
}

// checkTable verifies the table against itself: every used entry with a
// reference is findable by its key, masks agree with counts, live agrees
// with masks, and no slot points at an entry twice.
func checkTable(t testing.TB, tb *activeTable) {
	t.Helper()
	seen := make(map[uint32]bool)
	for _, s := range tb.slots {
		if s == 0 {
			continue
		}
		e := uint32(s) - 1
		if seen[e] {
			t.Fatalf("entry %d indexed twice", e)
		}
		seen[e] = true
		if got := tb.find(tb.entries[e].key); got != e {
			t.Fatalf("entry %d (key %#x) not findable: find gives %d", e, tb.entries[e].key, got)
		}
	}
	live := 0
	for e := range tb.entries[:tb.next] {
		en := &tb.entries[e]
		if en.mask != 0 {
			live++
			if !seen[uint32(e)] {
				t.Fatalf("referenced entry %d is not indexed", e)
			}
		}
		for w := range uint(64) {
			c := tb.count(uint32(e), w)
			if (c != 0) != (en.mask>>w&1 == 1) {
				t.Fatalf("entry %d worker %d: count %d but mask bit %d", e, w, c, en.mask>>w&1)
			}
		}
	}
	if live != tb.live {
		t.Fatalf("live = %d, %d entries have references", tb.live, live)
	}
}

func TestTableSharesBlocksAcrossRequests(t *testing.T) {
	tb := newActiveTable(64)
	a := prompt(1, 6, 2, 10) // blocks 0..5 shared with b
	b := prompt(1, 6, 3, 8)
	book := func(h []uint64, w uint) ([]uint32, int64) {
		idx := make([]uint32, len(h))
		var acc laneCounter
		tb.scan(h, ^uint64(0), idx, &acc)
		return idx, tb.book(h, idx, w)
	}
	ia, fresh := book(a, 3)
	if fresh != 10 {
		t.Fatalf("first booking added %d blocks, want 10", fresh)
	}
	ib, fresh := book(b, 3)
	if fresh != 2 {
		t.Fatalf("second booking on the same worker added %d blocks, want 2 (6 shared)", fresh)
	}
	ic, fresh := book(b, 5)
	if fresh != 8 {
		t.Fatalf("booking on another worker added %d blocks, want 8", fresh)
	}

	var acc laneCounter
	tb.scan(prompt(1, 6, 9, 12), ^uint64(0), nil, &acc)
	if got := [3]uint32{acc.get(3), acc.get(5), acc.get(0)}; got != [3]uint32{6, 6, 0} {
		t.Fatalf("shared blocks per worker (3, 5, 0) = %v, want [6 6 0]", got)
	}
	var only5 laneCounter
	tb.scan(b, 1<<5, nil, &only5)
	if only5.get(3) != 0 || only5.get(5) != 8 {
		t.Fatalf("scan limited to worker 5 counted %d for worker 3 and %d for 5", only5.get(3), only5.get(5))
	}
	checkTable(t, tb)

	if freed := tb.release(ia, 3); freed != 4 {
		t.Fatalf("releasing a freed %d blocks on worker 3, want 4 (6 still held by b)", freed)
	}
	if freed := tb.release(ib, 3); freed != 8 {
		t.Fatalf("releasing b freed %d blocks on worker 3, want 8", freed)
	}
	if freed := tb.release(ic, 5); freed != 8 {
		t.Fatalf("releasing c freed %d blocks on worker 5, want 8", freed)
	}
	checkTable(t, tb)
	if tb.live != 0 {
		t.Fatalf("live = %d after releasing everything", tb.live)
	}
}

func TestTableDeepSharesCarryIntoHighCounts(t *testing.T) {
	tb := newActiveTable(16)
	h := prompt(7, 3, 7, 3)
	const refs = 3*laneLow + 5 // several carries into the high part
	var idxs [][]uint32
	for i := range refs {
		idx := make([]uint32, len(h))
		var acc laneCounter
		tb.scan(h, ^uint64(0), idx, &acc)
		if want := uint32(min(i, 1) * 3); acc.get(9) != want {
			t.Fatalf("scan %d: worker 9 shares %d blocks, want %d", i, acc.get(9), want)
		}
		tb.book(h, idx, 9)
		idxs = append(idxs, idx)
	}
	if got := tb.count(idxs[0][0], 9); got != refs {
		t.Fatalf("count = %d, want %d", got, refs)
	}
	if len(tb.high) != 3 {
		t.Fatalf("%d deep shares, want one per block", len(tb.high))
	}
	checkTable(t, tb)
	for i, idx := range idxs {
		freed := tb.release(idx, 9)
		if want := int64(0); i == len(idxs)-1 {
			want = 3
			if freed != want {
				t.Fatalf("last release freed %d, want %d", freed, want)
			}
		} else if freed != want {
			t.Fatalf("release %d freed %d blocks while others still hold them", i, freed)
		}
		if i%7 == 0 {
			checkTable(t, tb)
		}
	}
	if len(tb.high) != 0 || tb.live != 0 {
		t.Fatalf("after all releases: %d deep shares, %d live", len(tb.high), tb.live)
	}
}

func TestTableEvictsIdleEntriesWhenFull(t *testing.T) {
	tb := newActiveTable(32)
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		h := make([]uint64, 1+r.IntN(20))
		for i := range h {
			h[i] = r.Uint64()
		}
		idx := make([]uint32, len(h))
		var acc laneCounter
		tb.scan(h, ^uint64(0), idx, &acc)
		w := uint(r.IntN(64))
		if fresh := tb.book(h, idx, w); fresh != int64(len(h)) {
			t.Fatalf("round %d: %d fresh blocks, want %d", round, fresh, len(h))
		}
		for i, e := range idx {
			if e == noEntry || tb.entries[e].key != h[i] {
				t.Fatalf("round %d: block %d booked in entry %d (key %#x)", round, i, e, tb.entries[e].key)
			}
		}
		checkTable(t, tb)
		tb.release(idx, w)
	}
	if tb.untracked != 0 {
		t.Fatalf("%d blocks went untracked although idle entries were free", tb.untracked)
	}
}

func TestTableFullOfInFlightBlocksCountsTheRestUntracked(t *testing.T) {
	tb := newActiveTable(8)
	h := prompt(5, 0, 5, 20)
	idx := make([]uint32, len(h))
	var acc laneCounter
	tb.scan(h, ^uint64(0), idx, &acc)
	if fresh := tb.book(h, idx, 2); fresh != 20 {
		t.Fatalf("fresh = %d, want all 20 counted even untracked", fresh)
	}
	if tb.untracked != 12 || tb.live != 8 {
		t.Fatalf("untracked %d live %d, want 12 and 8", tb.untracked, tb.live)
	}
	checkTable(t, tb)
	if freed := tb.release(idx, 2); freed != 20 {
		t.Fatalf("freed = %d, want 20", freed)
	}
	if tb.live != 0 {
		t.Fatalf("live = %d", tb.live)
	}
}

func TestLaneCounterAddsAllLanesAtOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var c laneCounter
	var want [64]uint32
	for range 5000 {
		m := r.Uint64() & r.Uint64()
		c.add(m)
		for w := range 64 {
			want[w] += uint32(m >> w & 1)
		}
	}
	for w := range uint(64) {
		if c.get(w) != want[w] {
			t.Fatalf("lane %d = %d, want %d", w, c.get(w), want[w])
		}
	}
}

// FuzzActiveTable drives the table with bookings and releases decoded from
// the input and checks it against a map of (hash, worker) -> count.
func FuzzActiveTable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{255, 0, 255, 0, 1, 1, 1, 1, 128, 3, 3, 3, 200, 7})
	f.Add(binary.LittleEndian.AppendUint64(nil, 0x0102030405060708))
	f.Fuzz(func(t *testing.T, ops []byte) {
		tb := newActiveTable(16)
		type booking struct {
			h   []uint64
			idx []uint32
			w   uint
		}
		var open []booking
		model := map[[2]uint64]uint32{}
		for len(ops) >= 2 {
			op, arg := ops[0], ops[1]
			ops = ops[2:]
			if op&1 == 1 && len(open) > 0 {
				k := int(arg) % len(open)
				b := open[k]
				open = append(open[:k], open[k+1:]...)
				tb.release(b.idx, b.w)
				for _, h := range b.h {
					model[[2]uint64{h, uint64(b.w)}]--
				}
				continue
			}
			// A prompt of 1..8 blocks drawn from a 24-hash alphabet, so that
			// bookings overlap, repeat hashes, and overflow the table.
			n := 1 + int(arg)%8
			h := make([]uint64, n)
			for i := range h {
				h[i] = uint64(op>>1+uint8(i)*uint8(arg|1)) % 24
			}
			w := uint(op>>1) % 4
			idx := make([]uint32, n)
			var acc laneCounter
			tb.scan(h, ^uint64(0), idx, &acc)
			tb.book(h, idx, w)
			for _, x := range h {
				model[[2]uint64{x, uint64(w)}]++
			}
			open = append(open, booking{h, idx, w})
		}
		checkTable(t, tb)
		for k, want := range model {
			e := tb.find(k[0])
			var got uint32
			if e != noEntry {
				got = tb.count(e, uint(k[1]))
			}
			// Untracked bookings are counted per block, not per hash, so the
			// table may hold fewer references than the model, never more.
			if got > want || tb.untracked == 0 && got != want {
				t.Fatalf("hash %d worker %d: table count %d, model %d", k[0], k[1], got, want)
			}
		}
		for _, b := range open {
			tb.release(b.idx, b.w)
		}
		if tb.live != 0 || len(tb.high) != 0 {
			t.Fatalf("after releasing everything: live %d, deep %d", tb.live, len(tb.high))
		}
	})
}
