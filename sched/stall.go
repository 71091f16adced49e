package sched

import (
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// DefaultStallAfter is how long a worker may keep requests waiting
// without answering any before the cost model stops crediting its
// in-flight prompts and its free memory (CostParams.StallAfter).
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
// So each worker tracks its progress: the time of its last answer (a
// stream's first token, also a disaggregated decode stage's own, not the
// end of its remote prefill; a request that is not streamed answers when
// it completes; an error is no answer), or, if later, the moment a request
// began waiting on it when none was, and whether it has answered at all
// since its engine joined. A worker with requests waiting and no answer
// for StallAfter is stalled: its in-flight credit is withdrawn, so it is
// priced by what the index says it caches and by its queue. While
// requests wait on a worker that is stalled or has never answered, its
// free memory does not count: its cache is priced as full. A hung engine's
// answer never comes; one that hangs after answering keeps both until
// StallAfter has passed. Its requests are left alone: whether to give up
// on them is the dispatcher's timeouts' call, and outlier ejection's.

// progress is one worker's stall state, apart from workerLive, and
// padded to 64 bytes like it, so that different workers' entries mostly
// sit on different cache lines: answers update it outside the
// scheduler's lock.
type progress struct {
	// waiting packs the engine's generation (high 32 bits, bumped when a
	// new engine takes the slot) and the requests booked on it that wait
	// for their answer (low 32 bits), so that a request
	// booked on the slot's previous engine cannot miscount the new one's.
	waiting  atomic.Uint64
	since    atomic.Int64 // clock time of the last answer, or of waiting rising from 0
	answered atomic.Bool  // an answer came since the slot's engine joined
	_        [64 - 8 - 8 - 4]byte
}

// booked records a request waiting for its answer from now on and
// returns the engine generation it waits on.
func (p *progress) booked(now int64) uint32 {
	for {
		v := p.waiting.Load()
		if uint32(v) == 0 {
			// Before the count rises, so that no reader sees a request
			// waiting since an old time.
			p.since.Store(now)
		}
		if p.waiting.CompareAndSwap(v, v+1) {
			return uint32(v >> 32)
		}
	}
}

// closed records that a request booked on generation gen no longer
// waits: it was answered at now, or it was given up on. A request of an
// earlier engine changes nothing.
func (p *progress) closed(gen uint32, answered bool, now int64) {
	for {
		v := p.waiting.Load()
		if uint32(v>>32) != gen || uint32(v) == 0 {
			return
		}
		if p.waiting.CompareAndSwap(v, v-1) {
			break
		}
	}
	if answered {
		p.since.Store(now)
		if !p.answered.Load() {
			p.answered.Store(true)
		}
	}
}

// renew starts the slot's count afresh for a new engine at now: what
// its predecessor left waiting no longer counts, and it has answered
// nothing yet.
func (p *progress) renew(now int64) {
	for {
		v := p.waiting.Load()
		if p.waiting.CompareAndSwap(v, (v>>32+1)<<32) {
			break
		}
	}
	p.since.Store(now)
	p.answered.Store(false)
}

func (p *progress) awaiting() uint32 { return uint32(p.waiting.Load()) }

// stalled reports whether requests have waited on the worker for longer
// than after without an answer from it.
func (p *progress) stalled(now int64, after time.Duration) bool {
	return after > 0 && p.awaiting() > 0 && time.Duration(now-p.since.Load()) > after
}

// unproven reports whether the worker's free cache memory must not count
// (capacity.go): requests wait on it and it has either never answered
// since its engine joined or is stalled.
func (p *progress) unproven(now int64, after time.Duration) bool {
	return p.awaiting() > 0 && (!p.answered.Load() || p.stalled(now, after))
}

// inFlightCredit is the in-flight credit of worker w, whose requests in
// flight hold shared of the prompt's blocks: none when w is stalled.
func (s *Scheduler) inFlightCredit(p *CostParams, w workers.Slot, shared uint32, now int64) uint32 {
	if s.progress[w].stalled(now, p.StallAfter) {
		return 0
	}
	return shared
}
