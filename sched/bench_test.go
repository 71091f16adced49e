package sched

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

const benchBlocks = 512

// benchState is the load the benchmarks select against: every worker has
// two requests in flight, sharing a different share of the benchmark's
// prompt, and a different cached prefix of it, so that the scan finds
// blocks held by several workers and no two workers cost the same.
type benchState struct {
	hashes   []uint64
	overlaps workers.Overlaps
}

func newBenchState(workers int) benchState {
	st := benchState{hashes: prompt(1, benchBlocks, 1, benchBlocks)}
	for w := range workers {
		st.overlaps[w] = uint32(w * 37 % benchBlocks)
	}
	return st
}

func (st benchState) background(w int) [2][]uint64 {
	return [2][]uint64{
		prompt(1, w*61%benchBlocks, uint64(1000+w), 256),
		prompt(uint64(2000+w), 0, uint64(3000+w), 128),
	}
}

// BenchmarkSelect measures one request's whole accounting: select and book
// a 512-block prompt, then release it. The mutexmap family is the obvious
// implementation of the same model (one map keyed by (block, worker), one
// lookup per block per worker) for a ratio measured in the same run.
func BenchmarkSelect(b *testing.B) {
	for _, workers := range []int{8, 64} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchSelect(b, workers, PolicyKV) })
	}
	// The other policies against the same load: the scan and the booking
	// are the same, only the choice differs.
	for _, pol := range allPolicies[1:] {
		b.Run(fmt.Sprintf("policy=%s/workers=8", pol), func(b *testing.B) { benchSelect(b, 8, pol) })
	}
	for _, workers := range []int{8, 64} {
		b.Run(fmt.Sprintf("mutexmap/workers=%d", workers), func(b *testing.B) {
			m := newMapAccounting()
			st := newBenchState(workers)
			for w := range workers {
				for _, h := range st.background(w) {
					m.book(h, w, 0)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				w := m.selectAndBook(st.hashes, &st.overlaps, workers, benchBlocks*16)
				m.release(st.hashes, w)
			}
			reportBlocks(b)
		})
	}
}

func benchSelect(b *testing.B, workers int, pol Policy) {
	s, st, held := newLoadedScheduler(b, workers)
	if err := s.SetPolicy(pol); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var res Reservation
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		req := Request{Hashes: st.hashes, PromptTokens: benchBlocks * 16, Overlaps: &st.overlaps}
		if _, err := s.Select(ctx, &req, &res); err != nil {
			b.Fatal(err)
		}
		res.Release()
	}
	reportBlocks(b)
	for i := range held {
		held[i].Release()
	}
	requireZeroLoad(b, s)
}

// newLoadedScheduler books every worker's background requests.
func newLoadedScheduler(b *testing.B, workers int) (*Scheduler, benchState, []Reservation) {
	s := newTestScheduler(b, workers, Config{})
	st := newBenchState(workers)
	held := make([]Reservation, 2*workers)
	for w := range workers {
		for i, h := range st.background(w) {
			r := &held[2*w+i]
			mustSelect(b, s, &Request{Hashes: h, PromptTokens: len(h) * 16, Pinned: true, PinWorker: 100 + uint64(w)}, r)
			r.PrefillDone()
		}
	}
	return s, st, held
}

func reportBlocks(b *testing.B) {
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)*benchBlocks/sec, "blocks/s")
	b.ReportMetric(float64(b.N)/sec, "selects/s")
}

// BenchmarkSelectParallel shows the table lock under contention: every
// goroutine books its own 512-block prompt (half shared with the others).
func BenchmarkSelectParallel(b *testing.B) {
	s := newTestScheduler(b, 8, Config{})
	var mu sync.Mutex
	next := uint64(0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		mu.Lock()
		next++
		h := prompt(1, benchBlocks/2, next, benchBlocks)
		mu.Unlock()
		var res Reservation
		ctx := context.Background()
		for pb.Next() {
			req := Request{Hashes: h, PromptTokens: benchBlocks * 16}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				b.Error(err)
				return
			}
			res.Release()
		}
	})
	reportBlocks(b)
}

// BenchmarkQuery is a route-only query against the same load as
// BenchmarkSelect: the scan and the scores, no booking.
func BenchmarkQuery(b *testing.B) {
	s, st, _ := newLoadedScheduler(b, 8)
	var sc Scores
	b.ReportAllocs()
	for b.Loop() {
		req := Request{Hashes: st.hashes, PromptTokens: benchBlocks * 16, Overlaps: &st.overlaps, QueryOnly: true, Scores: &sc}
		if _, err := s.Select(context.Background(), &req, nil); err != nil {
			b.Fatal(err)
		}
	}
	reportBlocks(b)
}

// mapAccounting is the baseline: the same cost model and bookkeeping with
// a mutex-guarded map of (block, worker) reference counts.
type mapAccounting struct {
	mu      sync.Mutex
	refs    map[mapKey]int32
	active  [workers.Max]int64
	prefill [workers.Max]int64
}

type mapKey struct {
	hash   uint64
	worker int
}

func newMapAccounting() *mapAccounting { return &mapAccounting{refs: make(map[mapKey]int32)} }

func (m *mapAccounting) book(h []uint64, w int, prefill int64) {
	for _, x := range h {
		k := mapKey{x, w}
		if m.refs[k]++; m.refs[k] == 1 {
			m.active[w]++
		}
	}
	m.prefill[w] += prefill
}

func (m *mapAccounting) selectAndBook(h []uint64, overlaps *workers.Overlaps, workers, tokens int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	best, bestCost := 0, math.Inf(1)
	for w := range workers {
		shared := 0
		for _, x := range h {
			if m.refs[mapKey{x, w}] > 0 {
				shared++
			}
		}
		p := DefaultCostParams()
		c := p.Cost(CostInputs{
			BlockSize: 16, PromptTokens: tokens, OverlapBlocks: overlaps[w],
			ActivePrefillTokens: m.prefill[w], ActiveDecodeBlocks: float64(m.active[w]),
			NewBlocks: int64(len(h) - shared),
		})
		if c.Cost < bestCost {
			best, bestCost = w, c.Cost
		}
	}
	m.book(h, best, int64(tokens))
	return best
}

func (m *mapAccounting) release(h []uint64, w int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range h {
		k := mapKey{x, w}
		if m.refs[k]--; m.refs[k] == 0 {
			delete(m.refs, k)
			m.active[w]--
		}
	}
	m.prefill[w] = 0
}
