package sched

import "sync/atomic"

// busyStretchGap is how long a worker may go unobserved before a busy
// observation starts a new stretch: the router cannot tell what it was
// in between.
const busyStretchGap = int64(1e9)

// busyDipTolerance is how long a busy stretch lives through observations
// of the worker under its threshold (busyStretch): the pinned waiters of
// a saturated worker look at it every pinLapseCheck, so a dip between two
// admissions is seen busy again within it.
const busyDipTolerance = int64(pinLapseCheck)

// busyStretchWrite bounds how often an observation of a busy worker
// writes its last-seen time: selections run on every core, and the
// stretch needs no finer grain.
const busyStretchWrite = int64(10e6)

// busyStretch is one worker's current stretch over a busy threshold, as
// the selections that weighed it saw it: since when (0: not busy when
// last seen), when last seen busy, and since when seen free without a
// busy observation between (0: not), CLOCK_MONOTONIC ns. Every selection
// that weighs a worker's busy state notes it, pinned and session requests
// included, so the stretch grows with the traffic the worker gets, not
// only with one session's turns, seconds apart.
//
// A stretch ends once the worker has been seen free for busyDipTolerance
// without a busy observation between, not at the first free observation:
// a saturated worker with requests queued for it dips under its threshold
// every time one ends, and the admission queue's next waiter sees it free
// at that very moment, before its own booking fills it again. Ended there,
// the stretch never grew past one request's prefill, and a session bound
// to a worker that stayed saturated was never unbound. A longer tolerance
// kept a mostly idle worker busy for good: one over its threshold for
// 50 ms in every 900 never ended its stretch.
type busyStretch struct {
	since, seen, freeSince atomic.Int64
}

// note records one observation at now. A worker free for a while costs
// one load.
func (b *busyStretch) note(busy bool, now int64) {
	if !busy {
		if b.since.Load() == 0 {
			return
		}
		switch free := b.freeSince.Load(); {
		case free == 0:
			b.freeSince.CompareAndSwap(0, now)
		case now-free > busyDipTolerance:
			b.since.Store(0)
			b.freeSince.Store(0)
		}
		return
	}
	if b.freeSince.Load() != 0 {
		b.freeSince.Store(0)
	}
	seen := b.seen.Load()
	if b.since.Load() == 0 || now-seen > busyStretchGap {
		b.since.Store(now)
	}
	if now-seen > busyStretchWrite {
		b.seen.Store(now)
	}
}

// length is how long the worker has been busy at now, 0 when it is not.
func (b *busyStretch) length(now int64) int64 {
	since := b.since.Load()
	if since == 0 || now-b.seen.Load() > busyStretchGap {
		return 0
	}
	return now - since
}
