package sched

import "github.com/kvfast/kvfast/workers"

// DefaultEvictionWeight is the eviction weight kvfast serve and kvfast
// demo run with: between two full workers, a copy of a prefix must save
// more than 31 times the prefix's prefill in queueing. Weights 1, 3, 10
// and 30 were measured on the capacity sweep (docs/routing.md): hits rose
// with the weight up to 10 and held at 30, the TTFT tail did not move. It
// needs stall detection (stall.go) beside it: the term rewards free
// memory and multiplies the in-flight credit, and a worker that swallows
// requests without answering would otherwise keep both.
const DefaultEvictionWeight = 30

// The eviction term.
//
// Once an engine's cache is full, every block a request computes there
// evicts a cached one: the least recently used, which some later request
// might have found. The cost model's prefill term prices computing a
// prompt's uncached blocks in time; it does not price what computing
// them destroys. A router that copies a prefix to a less loaded worker to
// save a little queueing pays it twice over when caches are full: the
// copy evicts a prefix that worker held, and the node as a whole now
// caches one prefix twice and the evicted one nowhere. Measured on the
// capacity sweep, those copies were where kv lost hits against one pooled
// LRU cache of the same size.
//
// So with CostParams.EvictionWeight > 0 each prompt block the worker does
// not cache costs EvictionWeight prefill blocks more, scaled by how full
// the worker's cache is: 0 while it still has never-used memory, 1 once
// it must evict. The term is in prefill blocks, scaled by
// PrefillLoadScale like the prefill term, so the trade it makes (a copy
// is worth it when the cached worker's prefill queue exceeds
// 1+EvictionWeight times the prefix) does not depend on the scale. Load
// still forces a copy when the queue is longer than that.
//
// Fullness comes from the router's own bookings: the uncached prompt
// blocks booked on the worker since its engine joined, against its KV
// capacity (the registry's, else the total its load page reports). An
// LRU cache stays full once filled, so the count only grows; a new
// engine in the slot starts it again from zero.

// cacheFill returns how full each candidate's cache is, 0 empty to 1
// full: the factor of its eviction term. All zero when the weight is 0.
func (s *Scheduler) cacheFill(ws *workerSet, p *CostParams, cands workers.Set, now int64) (fill [workers.Max]float64) {
	if p.EvictionWeight == 0 {
		return fill
	}
	for w := range cands.All() {
		capacity := ws.info[w].KVCapacityBlocks
		if capacity == 0 {
			capacity = s.live[w].kvTotal.Load()
		}
		switch {
		case capacity == 0: // unknown capacity: no eviction term
		case s.progress[w].unproven(now, p.StallAfter):
			fill[w] = 1 // free memory counts only on an engine that answers (stall.go)
		default:
			fill[w] = min(float64(s.written[w].Load())/float64(capacity), 1)
		}
	}
	return fill
}

// evictBlocks is the eviction term, in prefill blocks before scaling, of
// a request that would compute uncached of its full blocks on a worker
// whose cache is fullness full.
func (p *CostParams) evictBlocks(fullness float64, uncached int) float64 {
	if p.EvictionWeight == 0 || uncached <= 0 {
		return 0
	}
	return p.EvictionWeight * fullness * float64(uncached)
}
