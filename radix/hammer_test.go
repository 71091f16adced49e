package radix

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// TestHammer runs writers and lock-free readers against one small index, so
// that shifts on delete race readers constantly, and checks what a reader
// may rely on:
//   - a block that is present and untouched is always found (the stable
//     worker's blocks never go missing, even while neighbours shift);
//   - a reader never sees a worker on a block that worker never stored,
//     by Lookup or by FindMatches' guesses along a run of slots;
//   - once writers stop, the structure verifies and matches their ledger.
//
// It runs on uniform hashes, and on chained ones where every writer's
// blocks continue one shared prefix, so that siblings crowd the prefix's
// group: writers then spill across shards and take two locks, while the
// stable worker's chain runs through the same crowded group.
func TestHammer(t *testing.T) {
	const writers = 3
	t.Run("uniform", func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 3))
		// owner is encoded in the hash's top byte, never a valid chain
		hashFor := func(owner workers.Slot, r *rand.Rand) uint64 {
			return uint64(owner)<<56 | r.Uint64()>>8 | 1<<20
		}
		stable := make([]uint64, 400)
		for i := range stable {
			stable[i] = hashFor(hammerStable, r)
		}
		pools := make([][]uint64, writers)
		for w := range pools {
			pools[w] = make([]uint64, 600)
			wr := rand.New(rand.NewPCG(uint64(w), 11))
			for i := range pools[w] {
				pools[w][i] = hashFor(workers.Slot(w), wr)
			}
		}
		hammer(t, Config{Capacity: 3000, Shards: 2}, stable, pools)
	})
	t.Run("siblings", func(t *testing.T) {
		r := rand.New(rand.NewPCG(4, 4))
		prefix := extendChain(r, testSeed, nil, 3)
		stable := extendChain(r, testSeed, slices.Clone(prefix), 397)
		pools := make([][]uint64, writers)
		for w := range pools {
			for range 60 {
				pools[w] = append(pools[w], extendChain(r, testSeed, slices.Clone(prefix), 10)[3:]...)
			}
		}
		cfg := Config{Capacity: 3000, Shards: 4}
		// Precondition: stored together, these hashes do spill, and into
		// other shards than their group's.
		probe := newTestIndex(t, cfg)
		probe.Stored(hammerStable, stable)
		for w, pool := range pools {
			probe.Stored(workers.Slot(w), pool)
		}
		crossShard := 0
		for si := range probe.shards {
			tb := &probe.shards[si].blocks
			for i := range tb.n {
				if k := tb.at(i).key.Load(); k != emptyKey && nearShard(k, tb.mask) != tb.self {
					crossShard++
				}
			}
		}
		if crossShard < 100 {
			t.Fatalf("only %d blocks spilled to another shard: the test would not exercise spilling", crossShard)
		}
		hammer(t, cfg, stable, pools)
	})
}

const hammerStable = workers.Slot(63)

// hammer stores stable for hammerStable, then lets writer w churn pools[w]
// as worker w while readers check the guarantees.
func hammer(t *testing.T, cfg Config, stable []uint64, pools [][]uint64) {
	const readers = 2
	writers := len(pools)
	duration := 2 * time.Second
	if testing.Short() {
		duration = 300 * time.Millisecond
	}
	ix := newTestIndex(t, cfg)
	owner := map[uint64]workers.Slot{}
	for _, h := range stable {
		owner[h] = hammerStable
	}
	for w, pool := range pools {
		for _, h := range pool {
			if _, dup := owner[h]; dup {
				t.Fatalf("hash %#x in two pools", h)
			}
			owner[h] = workers.Slot(w)
		}
	}
	ix.Stored(hammerStable, stable)

	var stop atomic.Bool
	var wg sync.WaitGroup
	ledgers := make([]map[uint64]bool, writers)
	for w := range writers {
		ledgers[w] = map[uint64]bool{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			wr := rand.New(rand.NewPCG(uint64(w), 99))
			slot := workers.Slot(w)
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
			var out workers.Overlaps
			for !stop.Load() {
				if ix.FindMatches(stable, &out); out[hammerStable] != uint32(len(stable)) {
					violations.Add(1)
					t.Errorf("stable worker's overlap %d of %d", out[hammerStable], len(stable))
				}
				for range 64 {
					w := rr.IntN(writers)
					h := pools[w][rr.IntN(len(pools[w]))]
					if set := ix.Lookup(h); set&^workers.SetOf(owner[h]) != 0 {
						violations.Add(1)
						t.Errorf("hash of worker %d seen held by %b", w, set)
					}
				}
				// FindMatches' run guesses read the slots next to the
				// ones they found, which writers keep shifting: a run of
				// one writer's blocks may only ever match that writer.
				w := rr.IntN(writers)
				lo := rr.IntN(len(pools[w]))
				run := pools[w][lo:min(lo+1+rr.IntN(3*groupSize), len(pools[w]))]
				if set := ix.FindMatches(run, &out); set&^workers.SetOf(workers.Slot(w)) != 0 {
					violations.Add(1)
					t.Errorf("blocks of worker %d matched for %b", w, set)
				}
				lookups.Add(int64(len(stable) + 64 + len(run)))
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
			if got, want := ix.Lookup(h).Has(workers.Slot(w)), ledgers[w][h]; got != want {
				t.Fatalf("worker %d hash %#x: index says %v, writer's ledger %v", w, h, got, want)
			}
		}
		if got := ix.Stats().WorkerBlocks[w]; got != uint64(len(ledgers[w])) {
			t.Fatalf("worker %d: %d blocks counted, ledger has %d", w, got, len(ledgers[w]))
		}
	}
	if st := ix.Stats(); st.Overflow != 0 {
		t.Fatalf("overflow %d in a test sized to avoid it", st.Overflow)
	}
	t.Logf("%d block lookups against %d writers", lookups.Load(), writers)
}
