package radix

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfast/kvfast/workers"
)

// filledIndex returns an index of capacity blocks holding about fill of
// them, stored as forking prompts of 64 blocks on workers 0..7, and the
// prompts.
func filledIndex(t testing.TB, capacity, fill int) (*Index, [][]uint64) {
	t.Helper()
	ix := newTestIndex(t, Config{Capacity: capacity})
	r := rand.New(rand.NewPCG(7, 7))
	var prompts [][]uint64
	for ix.Stats().Entries < uint64(fill) {
		p := chains(r, 64, 64)
		for i, c := range p {
			ix.Stored(workers.Slot(i%8), c)
		}
		prompts = append(prompts, p...)
	}
	return ix, prompts
}

// blockTable is the bytes of every shard's block table.
func (ix *Index) blockTable() []byte {
	g := ix.geo
	return ix.region[g.tableOff : g.tableOff+int(g.shards)*int(g.blockSlots)*slotSize]
}

func scribble(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

// repairOrReset is what the ingester does with a region it attaches.
func repairOrReset(t testing.TB, ix *Index) (dropped int, reset bool) {
	t.Helper()
	n, err := ix.Repair(context.Background(), RepairOptions{})
	if errors.Is(err, ErrBeyondRepair) {
		ix.Reset()
		return 0, true
	}
	if err != nil {
		t.Fatal(err)
	}
	return n, false
}

func TestRepairRandomBytesInBlockTable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		capacity  int
		damage    func(table []byte) []byte // the bytes to scribble over; nil: every other cache line
		wantReset bool
		minKept   float64 // of the entries, when repaired
	}{
		{"one KiB", 1 << 14, func(b []byte) []byte { return b[len(b)/3 : len(b)/3+1024] }, false, 0.9},
		// Half the slots random, yet under the live limit and in short
		// runs: repair drops the garbage and keeps what it can still find.
		{"every other cache line", 1 << 12, nil, false, 0},
		{"the whole table", 1 << 12, func(b []byte) []byte { return b }, true, 0},
		// 22 MiB of block table: before repair was bounded, random bytes
		// made it quadratic (12 s per MiB), so this took minutes.
		{"the whole table of a 1M-block index", 1 << 20, func(b []byte) []byte { return b }, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, prompts := filledIndex(t, tc.capacity, tc.capacity/2)
			before := ix.Stats().Entries
			r := rand.New(rand.NewPCG(1, 2))
			if tc.damage == nil {
				tb := ix.blockTable()
				for off := 0; off+64 <= len(tb); off += 128 {
					scribble(r, tb[off:off+64])
				}
			} else {
				scribble(r, tc.damage(ix.blockTable()))
			}
			done := make(chan struct{})
			var dropped int
			var reset bool
			go func() {
				defer close(done)
				dropped, reset = repairOrReset(t, ix)
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("repair did not finish within two minutes")
			}
			if reset != tc.wantReset {
				t.Fatalf("index reset: %v, want %v (dropped %d)", reset, tc.wantReset, dropped)
			}
			if err := ix.Verify(); err != nil {
				t.Fatalf("index inconsistent after repair: %v", err)
			}
			kept := ix.Stats().Entries
			t.Logf("%d entries before, %d after; %d slots dropped", before, kept, dropped)
			if !reset && float64(kept) < tc.minKept*float64(before) {
				t.Fatalf("repair of light damage kept %d of %d entries", kept, before)
			}
			// The index takes writes again, and every prompt stored now is found.
			p := prompts[0]
			ix.Removed(0, p)
			ix.Stored(0, p)
			if got, _ := findMatches(ix, p); got[0] != uint32(len(p)) {
				t.Fatalf("overlap %d after a fresh store, want %d", got[0], len(p))
			}
			if err := ix.Verify(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func findMatches(ix *Index, hashes []uint64) (workers.Overlaps, workers.Set) {
	var out workers.Overlaps
	set := ix.FindMatches(hashes, &out)
	return out, set
}

func TestRepairStopsWhenCancelled(t *testing.T) {
	ix, _ := filledIndex(t, 1<<16, 1<<15)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	phases := map[string]bool{}
	done := make(chan error, 1)
	go func() {
		_, err := ix.Repair(ctx, RepairOptions{Progress: func(p RepairProgress) {
			phases[p.Phase] = true
			if p.Phase == "block table" {
				cancel() // as SIGTERM does, mid-sweep
			}
		}})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Repair returned %v after its context was cancelled, want context.Canceled", err)
		}
		if phases["recount"] {
			t.Fatal("Repair went on to its last phase after it was cancelled")
		}
	case <-time.After(time.Minute):
		t.Fatal("Repair did not stop within a minute of its context's cancellation")
	}
	// The locks are free again and a full repair still succeeds.
	if n, err := ix.Repair(context.Background(), RepairOptions{}); err != nil || n != 0 {
		t.Fatalf("second Repair: %d dropped, %v", n, err)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestRepairReportsProgress(t *testing.T) {
	ix, _ := filledIndex(t, 1<<16, 1<<14)
	var last RepairProgress
	var order []string
	_, err := ix.Repair(context.Background(), RepairOptions{Progress: func(p RepairProgress) {
		if len(order) == 0 || order[len(order)-1] != p.Phase {
			order = append(order, p.Phase)
		}
		last = p
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"survey", "engine map", "block table", "recount"}
	if len(order) != len(want) {
		t.Fatalf("phases %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("phases %v, want %v", order, want)
		}
	}
	if last.Done != last.Total || last.Total == 0 {
		t.Fatalf("last report %+v, want the recount done", last)
	}
}

func TestResetEmptiesTheIndex(t *testing.T) {
	ix, prompts := filledIndex(t, 1<<12, 1<<11)
	ix.Reset()
	st := ix.Stats()
	if st.Entries != 0 || st.EngineMapEntries != 0 || st.WorkerBlocks != ([workers.Max]uint64{}) {
		t.Fatalf("after Reset: %d entries, %d mappings, blocks per worker %v", st.Entries, st.EngineMapEntries, st.WorkerBlocks)
	}
	if _, set := findMatches(ix, prompts[0]); set != 0 {
		t.Fatalf("after Reset, workers %v still match", set)
	}
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkRepair repairs the region of a 1M-block index, sound or
// damaged, and reports the time as a multiple of one plain linear read of
// the same region in the same run (x-scan): the cost repair adds over the
// least any check of the region could cost.
func BenchmarkRepair(b *testing.B) {
	warm, _ := sharedWarmIndex(b)
	for _, bc := range []struct {
		name   string
		damage func(r *rand.Rand, ix *Index)
	}{
		{"sound", func(*rand.Rand, *Index) {}},
		{"1KiB-random", func(r *rand.Rand, ix *Index) {
			tb := ix.blockTable()
			scribble(r, tb[len(tb)/2:len(tb)/2+1024])
		}},
		{"table-random", func(r *rand.Rand, ix *Index) { scribble(r, ix.blockTable()) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			region := alignedHeap(len(warm.region))
			r := rand.New(rand.NewPCG(3, 3))
			var repair, scan time.Duration
			b.SetBytes(int64(len(region)))
			for b.Loop() {
				b.StopTimer()
				copy(region, warm.region)
				ix, err := Attach(region)
				if err != nil {
					b.Fatal(err)
				}
				bc.damage(r, ix)
				t0 := time.Now()
				sink += linearScan(region)
				t1 := time.Now()
				b.StartTimer()
				if _, err := ix.Repair(context.Background(), RepairOptions{}); errors.Is(err, ErrBeyondRepair) {
					ix.Reset()
				} else if err != nil {
					b.Fatal(err)
				}
				repair += time.Since(t1)
				scan += t1.Sub(t0)
			}
			mib := float64(len(region)) / (1 << 20)
			b.ReportMetric(float64(repair)/float64(scan), "x-scan")
			b.ReportMetric(repair.Seconds()/float64(b.N)/mib*1e3, "ms/MiB")
			b.ReportMetric(repair.Seconds()/float64(b.N)/(float64(warm.geo.capacity)/(1<<20)), "s/Mblocks")
		})
	}
}

var sink uint64

// linearScan reads every word of the region once: the floor any check of
// the region is held against.
func linearScan(b []byte) uint64 {
	var x uint64
	for i := 0; i+8 <= len(b); i += 8 {
		x += uint64(b[i]) | uint64(b[i+1])<<8 | uint64(b[i+2])<<16 | uint64(b[i+3])<<24 |
			uint64(b[i+4])<<32 | uint64(b[i+5])<<40 | uint64(b[i+6])<<48 | uint64(b[i+7])<<56
	}
	return x
}

// A table found full while its live count says it has room was written by
// something other than its writers: Damaged says so, until Repair or
// Reset.
func TestDamagedWhenATableIsFullBelowItsLimit(t *testing.T) {
	ix := newTestIndex(t, Config{Capacity: 1000, Shards: 2})
	ix.Stored(1, spread(10, 5))
	if ix.Damaged() {
		t.Fatal("a sound index reports damage")
	}
	// Every block-table slot holds some key, as random bytes leave it.
	tb := ix.geo.shards * ix.geo.blockSlots
	for i := range tb {
		s := (*slot)(unsafe.Add(unsafe.Pointer(&ix.region[ix.geo.tableOff]), uintptr(i)*slotSize))
		s.key.Store(uint64(i)*0x9e3779b97f4a7c15 | 1<<62)
		s.val.Store(1)
	}
	ix.Stored(2, spread(10, 6))
	if !ix.Damaged() {
		t.Fatal("stores into a full table below its limit: no damage reported")
	}
	ix.Reset()
	if ix.Damaged() {
		t.Fatal("damage reported after Reset")
	}
	if _, refused := ix.StoredAgain(2, spread(10, 6), nil); refused != 0 {
		t.Fatalf("%d blocks refused after Reset", refused)
	}
}

// TestRepairAfterStrayWords: a few 8-byte words of the block table
// overwritten (a stray write into the segment). One of them could land on
// the value of an empty slot: Repair skipped empty slots, a worker's
// removal then read that value's bits as blocks and decremented counters
// that never counted them until they wrapped (an index 4% full refused
// every store as over the worker's share). After Repair the index must
// stay consistent through every worker's removal.
func TestRepairAfterStrayWords(t *testing.T) {
	for _, words := range []int{1, 20} {
		broken := 0
		for seed := range uint64(40) {
			ix, _ := filledIndex(t, 1<<14, 1<<12)
			r := rand.New(rand.NewPCG(seed, uint64(words)))
			tb := ix.blockTable()
			for range words {
				o := r.IntN(len(tb)/8) * 8
				for j := range 8 {
					tb[o+j] = byte(r.Uint32())
				}
			}
			if _, reset := repairOrReset(t, ix); reset {
				continue
			}
			err := ix.Verify()
			if err == nil {
				for w := range 8 {
					ix.RemoveWorker(workers.Slot(w))
				}
				err = ix.Verify()
			}
			if err != nil {
				t.Logf("%d words, seed %d: %v", words, seed, err)
				broken++
			}
		}
		if broken > 0 {
			t.Errorf("%d stray words: %d of 40 repaired indexes were left inconsistent", words, broken)
		}
	}
}
