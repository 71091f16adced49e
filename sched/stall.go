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
// it completes; an engine's 4xx, which judges the request, answers too;
// a 5xx, a broken stream or a timeout is no answer), and whether it has
// answered at all since its engine joined. The stall clock runs only
// while requests wait on the worker: it starts when the first begins
// waiting, pauses when the last leaves unanswered (given up on by the
// client or a timeout) and resumes with the next, and an answer sets it
// back to zero. A worker whose clock passes StallAfter is stalled: its
// in-flight credit is withdrawn, so it is priced by what the index says
// it caches and by its queue. While requests wait on a worker that is
// stalled or has never answered, its free memory does not count: its
// cache is priced as full. A hung engine's answer never comes, and
// clients that give up on it first do not reset its clock; one that
// hangs after answering keeps both until StallAfter of waiting has
// passed. Its requests are left alone: whether to give up on them is the
// dispatcher's timeouts' call, and outlier ejection's.
//
// A disaggregated decode stage waits on its worker only once its request
// is sent (Reservation.AwaitDecode): in vLLM's protocol that is after the
// remote prefill, so a slow prefill pool does not make its decode workers
// look stalled. In SGLang's the decode request goes out beside the
// prefill's, and the decode worker's clock runs through the prefill.

// progress is one worker's stall state, apart from workerLive, and
// padded to 64 bytes like it, so that different workers' entries mostly
// sit on different cache lines: answers update it outside the
// scheduler's lock.
type progress struct {
	// waiting packs the engine's generation (high 32 bits, bumped when a
	// new engine takes the slot), whether that engine has answered
	// (answeredBit), and the requests booked on it that wait for their
	// answer (the low 31 bits), so that a request of the slot's previous
	// engine can neither miscount the new one's nor mark it answered.
	waiting atomic.Uint64
	// since is the clock time the stall clock counts from: the last
	// answer, or the moment requests began waiting again less the time
	// owed from earlier waits.
	since atomic.Int64
	// owed is the stall clock's reading when the last waiting request
	// left unanswered, carried over to the next wait.
	owed atomic.Int64
	// pausedAt is when the last request waiting on the worker left
	// unanswered (shunned); 0 after an answer.
	pausedAt atomic.Int64
	_        [64 - 8 - 8 - 8 - 8]byte
}

const (
	answeredBit  = 1 << 31
	waitingCount = answeredBit - 1
)

// booked records a request waiting for its answer from now on and
// returns the engine generation it waits on.
func (p *progress) booked(now int64) uint32 {
	for {
		v := p.waiting.Load()
		if v&waitingCount == 0 {
			// Before the count rises, so that no reader sees a request
			// waiting since an old time.
			p.since.Store(now - p.owed.Load())
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
		if uint32(v>>32) != gen || v&waitingCount == 0 {
			return
		}
		next := v - 1
		if answered {
			next |= answeredBit
			p.owed.Store(0) // before the count can fall to 0 and a booking read it
		}
		if !p.waiting.CompareAndSwap(v, next) {
			continue
		}
		switch {
		case answered:
			p.since.Store(now)
			p.pausedAt.Store(0)
		case next&waitingCount == 0:
			p.owed.Store(max(now-p.since.Load(), 0))
			p.pausedAt.Store(now)
		}
		return
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
	p.owed.Store(0)
	p.pausedAt.Store(0)
	p.since.Store(now)
}

func (p *progress) awaiting() uint32 { return uint32(p.waiting.Load() & waitingCount) }

func (p *progress) answered() bool { return p.waiting.Load()&answeredBit != 0 }

// stalled reports whether requests wait on the worker and its stall
// clock has passed after.
func (p *progress) stalled(now int64, after time.Duration) bool {
	return after > 0 && p.awaiting() > 0 && time.Duration(now-p.since.Load()) > after
}

// overdue reports whether the worker's stall clock has passed after, as
// stalled does, or did when the last request waiting on it was given up
// on: between requests nothing waits, and a hung engine whose clients
// each give up before after would otherwise never be found stalled by
// the next one to look (a sticky session deciding whether to pin).
func (p *progress) overdue(now int64, after time.Duration) bool {
	if after <= 0 {
		return false
	}
	if p.awaiting() > 0 {
		return time.Duration(now-p.since.Load()) > after
	}
	return time.Duration(p.owed.Load()) > after
}

// shunned reports whether selection passes the worker over while other
// free workers progress: it is stalled, or nothing waits on it but its
// clock had passed after when the last request waiting on it was given up
// on (overdue) less than after ago. Between requests a hung engine whose
// clients each gave up on it was otherwise no worse than any other, and
// the next request, a session's next turn say, went to it and hung too.
// Once after has passed since its last request was given up on, it
// competes again: the first request booked on it is stalled at once
// (its wait resumes from what was owed), so the others pass it over
// while that one waits; an engine that recovered answers it and is
// cleared, a hung one holds only it. Selections that book nothing (a
// route-only answer) do not use that chance up.
func (p *progress) shunned(now int64, after time.Duration) bool {
	if p.stalled(now, after) {
		return true
	}
	if after <= 0 || p.awaiting() > 0 || time.Duration(p.owed.Load()) <= after {
		return false
	}
	return time.Duration(now-p.pausedAt.Load()) <= after
}

// unproven reports whether the worker's free cache memory must not count
// (capacity.go): requests wait on it and it has either never answered
// since its engine joined or is stalled.
func (p *progress) unproven(now int64, after time.Duration) bool {
	return p.awaiting() > 0 && (!p.answered() || p.stalled(now, after))
}

// inFlightCredit is the in-flight credit of worker w, whose requests in
// flight hold shared of the prompt's blocks: none when w is stalled.
func (s *Scheduler) inFlightCredit(p *CostParams, w workers.Slot, shared uint32, now int64) uint32 {
	if s.progress[w].stalled(now, p.StallAfter) {
		return 0
	}
	return shared
}

// progressing narrows free to the workers that are not shunned (stalled,
// or left overdue by its last requests), when any is: such a worker is
// chosen only when every free candidate is. Its
// withdrawn credit does not keep traffic off it by itself: a request
// whose prompt costs nothing (a two-word prompt routed by its text) ties
// on every worker, and half of a burst went to an engine that had kept
// a hundred requests waiting.
func (s *Scheduler) progressing(p *CostParams, free workers.Set, now int64) workers.Set {
	if p.StallAfter <= 0 {
		return free
	}
	var stalled workers.Set
	for w := range free.All() {
		if s.progress[w].shunned(now, p.StallAfter) {
			stalled |= workers.SetOf(w)
		}
	}
	if stalled == free {
		return free
	}
	return free &^ stalled
}
