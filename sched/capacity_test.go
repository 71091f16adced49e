package sched

import (
	"testing"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// TestEvictionTermKeepsAPrefixInOnePlace: between two workers whose
// caches are full, worker 0 caches 20 blocks of a 40-block prompt and has
// a prefill queue of 30 blocks. Dynamo's cost copies the prefix to the
// idle worker 1 (10·(30+40−20) + 70 = 570 against 10·40 + 40 = 440); the
// eviction term charges worker 0 its 20 uncached blocks and worker 1 all
// 40, and keeps it (570 + 10·20 = 770 against 440 + 10·40 = 840). A queue
// of 60 blocks still forces the copy, and before the caches fill the
// term is next to nothing, unless worker 0's engine has never answered:
// then its free memory does not count (stall.go).
func TestEvictionTermKeepsAPrefixInOnePlace(t *testing.T) {
	const bs, capacity = 16, 1000 // newTestScheduler's KVCapacityBlocks
	for _, tc := range []struct {
		name     string
		weight   float64
		full     bool
		queue    int
		answered bool // worker 0's engine has produced a first token before
		want     workers.Slot
	}{
		{"no eviction term", 0, true, 30, true, 1},
		{"full caches", 1, true, 30, true, 0},
		{"full caches, long queue", 1, true, 60, true, 1},
		{"empty caches", 1, false, 30, true, 1},
		{"empty caches, worker 0 never answered", 1, false, 30, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultCostParams()
			p.PrefillLoadScale, p.EvictionWeight = 10, tc.weight
			s := newTestScheduler(t, 2, Config{Cost: &p})
			if tc.full {
				for w := range 2 {
					var res Reservation
					mustSelect(t, s, &Request{Hashes: prompt(uint64(900+w), 0, 1, capacity), PromptTokens: capacity * bs,
						Pinned: true, PinWorker: 100 + uint64(w)}, &res)
					res.Release()
				}
			}
			if tc.answered {
				s.progress[0].waiting.Or(answeredBit)
			}
			var queued Reservation
			mustSelect(t, s, &Request{Hashes: prompt(50, 0, 1, tc.queue), PromptTokens: tc.queue * bs, Pinned: true, PinWorker: 100}, &queued)
			overlaps := workers.Overlaps{0: 20}
			var sc Scores
			req := Request{Hashes: prompt(1, 20, 2, 40), PromptTokens: 40 * bs, Overlaps: &overlaps, Scores: &sc, QueryOnly: true}
			d := mustSelect(t, s, &req, nil)
			if d.Slot != tc.want {
				t.Fatalf("picked %d (costs %.0f, %.0f), want %d", d.Slot, sc.Workers[0].Cost, sc.Workers[1].Cost, tc.want)
			}
			wantEvict := [2]float64{20 * tc.weight, 40 * tc.weight}
			switch {
			case !tc.full && !tc.answered: // worker 0 is priced full, worker 1 has nothing waiting
				wantEvict = [2]float64{20 * tc.weight, 0}
			case !tc.full: // only the queued request's 30 blocks written, on worker 0
				wantEvict = [2]float64{20 * tc.weight * 30 / capacity, 0}
			}
			for w := range 2 {
				if got := sc.Workers[w].EvictBlocks; got != wantEvict[w] {
					t.Errorf("worker %d: eviction term %v blocks, want %v", w, got, wantEvict[w])
				}
			}
			queued.Release()
			requireZeroLoad(t, s)
		})
	}
}

func TestCacheFullnessRampsWithBookedBlocksAndRestartsWithTheEngine(t *testing.T) {
	p := DefaultCostParams()
	p.EvictionWeight = 1
	s := newTestScheduler(t, 1, Config{Cost: &p})
	ws := s.workers.Load()
	book := func(seed uint64, n int) {
		var res Reservation
		mustSelect(t, s, &Request{Hashes: prompt(seed, 0, 1, n), PromptTokens: n * 16}, &res)
		res.Release()
	}
	book(1, 250)
	if f := s.cacheFill(ws, &p, 1, clock.Now())[0]; f != 0.25 {
		t.Fatalf("after 250 of 1000 blocks: fullness %v, want 0.25", f)
	}
	// A cached prompt writes nothing new.
	var res Reservation
	overlaps := workers.Overlaps{0: 250}
	mustSelect(t, s, &Request{Hashes: prompt(1, 0, 1, 250), PromptTokens: 250 * 16, Overlaps: &overlaps}, &res)
	res.Release()
	book(2, 2000)
	if f := s.cacheFill(ws, &p, 1, clock.Now())[0]; f != 1 {
		t.Fatalf("after 2250 of 1000 blocks: fullness %v, want 1", f)
	}
	// A new engine in the slot starts empty.
	if err := s.Upsert(WorkerInfo{ID: 555, Slot: 0, Model: "m", KVCapacityBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	if f := s.cacheFill(s.workers.Load(), &p, 1, clock.Now())[0]; f != 0 {
		t.Fatalf("new engine: fullness %v, want 0", f)
	}
	// So does the same engine restarted: its registration's generation
	// changed. The same registration upserted again keeps its count.
	book(4, 2000)
	for _, tc := range []struct {
		gen  uint32
		want float64
	}{{0, 1}, {1, 0}} {
		if err := s.Upsert(WorkerInfo{ID: 555, Slot: 0, Model: "m", KVCapacityBlocks: 1000, Generation: tc.gen}); err != nil {
			t.Fatal(err)
		}
		if f := s.cacheFill(s.workers.Load(), &p, 1, clock.Now())[0]; f != tc.want {
			t.Fatalf("upserted at generation %d: fullness %v, want %v", tc.gen, f, tc.want)
		}
	}
	// Without the weight nothing is computed.
	p.EvictionWeight = 0
	book(3, 2000)
	if f := s.cacheFill(s.workers.Load(), &p, 1, clock.Now())[0]; f != 0 {
		t.Fatalf("weight 0: fullness %v, want 0 (not computed)", f)
	}
}
