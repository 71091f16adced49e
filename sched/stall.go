package sched

import (
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// DefaultStallAfter is how long a worker may keep requests waiting for a
// first token without producing any before the cost model stops
// crediting its in-flight prompts (CostParams.StallAfter).
const DefaultStallAfter = 10 * time.Second

// Stall detection.
//
// With CreditInFlight the cost model credits the prompt blocks that
// requests in flight on a worker hold as if they were cached: a healthy
// engine computes them shortly. An engine that accepts requests and never
// answers computes nothing, yet its in-flight requests keep their credit
// until the first-byte timeout (minutes) releases them, and every
// follow-up that shares their prefix is drawn to it. The eviction term
// multiplies that pull: a credited block is one the placement would not
// evict, worth 1 + EvictionWeight prefill blocks.
//
// The eviction term has a second pull of its own: a worker whose cache
// still has never-used memory pays no eviction, so against full workers
// it may take a queue of about 1 + EvictionWeight prompts before load
// sends traffic elsewhere. For an empty engine that is right; an engine
// that never answers stays "empty" for ever, and the soak's clients all
// ended up waiting on it (throughput fell 30-fold).
//
// So each worker tracks its progress: the time of its last first token,
// or, if later, the moment a request began waiting on it when none was,
// and whether it has answered at all since its engine joined. A worker
// with requests waiting and no first token for StallAfter is stalled:
// its in-flight credit is withdrawn, so it is priced by what the index
// says it caches and by its queue. While requests wait on a worker that
// is stalled or has never answered, its free memory does not count: its
// cache is priced as full. A healthy engine's first token ends both
// within one prefill; a hung engine's never comes. Its requests are left
// alone: whether to give up on them is the dispatcher's timeouts' call,
// and outlier ejection's.

// progress is one worker's stall state, apart from workerLive, whose
// layout is one cache line per worker.
type progress struct {
	awaiting atomic.Int64 // booked requests waiting for their first token
	since    atomic.Int64 // clock time of the last first token, or of awaiting rising from 0
	answered atomic.Bool  // a first token came since the slot's engine joined
}

// booked records a request waiting for its first token from now on.
func (p *progress) booked(now int64) {
	if p.awaiting.Add(1) == 1 {
		p.since.Store(now)
	}
}

// firstToken records a request's first token at now.
func (p *progress) firstToken(now int64) {
	p.awaiting.Add(-1)
	p.since.Store(now)
	p.answered.Store(true)
}

// abandoned records a request released before its first token.
func (p *progress) abandoned() { p.awaiting.Add(-1) }

// stalled reports whether requests have waited on the worker for longer
// than after without a first token from it.
func (p *progress) stalled(now int64, after time.Duration) bool {
	return after > 0 && p.awaiting.Load() > 0 && time.Duration(now-p.since.Load()) > after
}

// unproven reports whether the worker's free cache memory must not count
// (capacity.go): requests wait on it and it has either never produced a
// first token since its engine joined or is stalled.
func (p *progress) unproven(now int64, after time.Duration) bool {
	return p.awaiting.Load() > 0 && (!p.answered.Load() || p.stalled(now, after))
}

// inFlightCredit is the in-flight credit of worker w, whose requests in
// flight hold shared of the prompt's blocks: none when w is stalled.
func (s *Scheduler) inFlightCredit(p *CostParams, w workers.Slot, shared uint32, now int64) uint32 {
	if s.progress[w].stalled(now, p.StallAfter) {
		return 0
	}
	return shared
}
