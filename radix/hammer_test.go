package radix

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHammer runs writers and lock-free readers against one small table, so
// that shifts on delete race readers constantly, and checks what a reader
// may rely on:
//   - a block that is present and untouched is always found (the stable
//     worker's blocks never go missing, even while neighbours shift);
//   - a reader never sees a worker on a block that worker never stored;
//   - once writers stop, the structure verifies and matches their ledger.
func TestHammer(t *testing.T) {
	const (
		writers = 3
		readers = 2
		stable  = WorkerSlot(63)
	)
	duration := 2 * time.Second
	if testing.Short() {
		duration = 300 * time.Millisecond
	}
	ix := newTestIndex(t, Config{Capacity: 3000, Shards: 2})
	r := rand.New(rand.NewPCG(3, 3))

	// owner is encoded in the hash's top byte, so a reader can tell which
	// worker may legitimately hold any hash it looks up.
	hashFor := func(owner WorkerSlot, r *rand.Rand) uint64 {
		return uint64(owner)<<56 | r.Uint64()>>8 | 1<<20
	}
	stableHashes := make([]uint64, 400)
	for i := range stableHashes {
		stableHashes[i] = hashFor(stable, r)
	}
	ix.Stored(stable, stableHashes)

	var stop atomic.Bool
	var wg sync.WaitGroup
	ledgers := make([]map[uint64]bool, writers)
	pools := make([][]uint64, writers)
	for w := range writers {
		pools[w] = make([]uint64, 600)
		wr := rand.New(rand.NewPCG(uint64(w), 11))
		for i := range pools[w] {
			pools[w][i] = hashFor(WorkerSlot(w), wr)
		}
	}
	for w := range writers {
		ledgers[w] = map[uint64]bool{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			wr := rand.New(rand.NewPCG(uint64(w), 99))
			slot := WorkerSlot(w)
			batch := make([]uint64, 0, 8)
			for !stop.Load() {
				batch = batch[:0]
				for range 1 + wr.IntN(8) {
					batch = append(batch, pools[w][wr.IntN(len(pools[w]))])
				}
				switch k := wr.IntN(1000); {
				case k < 500:
					ix.Stored(slot, batch)
					for _, h := range batch {
						ledgers[w][h] = true
					}
				case k < 998:
					ix.Removed(slot, batch)
					for _, h := range batch {
						delete(ledgers[w], h)
					}
				default:
					ix.Cleared(slot)
					clear(ledgers[w])
				}
			}
		}()
	}
	var lookups, violations atomic.Int64
	for rd := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rr := rand.New(rand.NewPCG(uint64(rd), 5))
			var out Overlaps
			for !stop.Load() {
				if ix.FindMatches(stableHashes, &out); out[stable] != uint32(len(stableHashes)) {
					violations.Add(1)
					t.Errorf("stable worker's overlap %d of %d", out[stable], len(stableHashes))
				}
				for range 64 {
					w := rr.IntN(writers)
					h := pools[w][rr.IntN(len(pools[w]))]
					if set := ix.Lookup(h); set&^SetOf(WorkerSlot(w)) != 0 {
						violations.Add(1)
						t.Errorf("hash of worker %d seen held by %b", w, set)
					}
				}
				lookups.Add(int64(len(stableHashes) + 64))
				if violations.Load() > 5 {
					return
				}
			}
		}()
	}
	time.Sleep(duration)
	stop.Store(true)
	wg.Wait()
	if err := ix.Verify(); err != nil {
		t.Fatal(err)
	}
	for w := range writers {
		for _, h := range pools[w] {
			if got, want := ix.Lookup(h).Has(WorkerSlot(w)), ledgers[w][h]; got != want {
				t.Fatalf("worker %d hash %#x: index says %v, writer's ledger %v", w, h, got, want)
			}
		}
		if got := ix.Stats().WorkerBlocks[w]; got != uint64(len(ledgers[w])) {
			t.Fatalf("worker %d: %d blocks counted, ledger has %d", w, got, len(ledgers[w]))
		}
	}
	t.Logf("%d block lookups against %d writers", lookups.Load(), writers)
}
