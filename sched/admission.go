package sched

import (
	"slices"
	"sync"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// admissionQueue holds the requests waiting for a worker below its busy
// thresholds, ordered by virtual arrival time: the real arrival time minus
// Priority·PriorityBump. Within one priority that is FCFS; a higher
// priority jumps ahead by a bounded amount, so a low-priority request is
// delayed, never starved.
//
// The queue is bounded and short (it only fills under overload), so a
// sorted slice beats a heap: inserting is one memmove, and admission scans
// in order, which a heap cannot do without popping.
type admissionQueue struct {
	mu      sync.Mutex
	list    []*waiter
	seq     uint64
	transit int // woken waiters retrying; their places stay reserved
}

// waiter is one Select call waiting in the queue. It holds no reference to
// the request: the waiting goroutine keeps that on its own stack and
// re-runs selection itself when woken.
type waiter struct {
	key      int64  // virtual arrival, ns
	seq      uint64 // arrival order among equal keys
	since    int64  // first enqueued, ns
	eligible workers.Set
	wake     chan struct{} // buffered 1; a token means "removed, retry"
	queued   bool          // in list; guarded by admissionQueue.mu
	woken    bool          // out of list but its place reserved; guarded likewise
}

var waiterPool = sync.Pool{New: func() any { return &waiter{wake: make(chan struct{}, 1)} }}

func (q *admissionQueue) init(capacity int) { q.list = make([]*waiter, 0, capacity) }

func (w *waiter) before(o *waiter) bool {
	return w.key < o.key || w.key == o.key && w.seq < o.seq
}

// push inserts w at its place, or reports false when the queue is full. A
// woken waiter going back (its worker filled up again before it got there)
// always finds its reserved place: being woken must not cost a request its
// turn, let alone get it refused.
func (q *admissionQueue) push(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.woken {
		w.woken = false
		q.transit--
	} else if len(q.list)+q.transit >= cap(q.list) {
		return false
	}
	i, _ := slices.BinarySearchFunc(q.list, w, func(a, b *waiter) int {
		if a.before(b) {
			return -1
		}
		return 1
	})
	q.list = slices.Insert(q.list, i, w)
	w.queued = true
	return true
}

// remove takes w out of the queue, or reports false if admit already did
// (and left a wake-up token in w.wake).
func (q *admissionQueue) remove(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !w.queued {
		return false
	}
	if i := slices.Index(q.list, w); i >= 0 {
		q.list = slices.Delete(q.list, i, i+1)
	}
	w.queued = false
	return true
}

// wakeLocked hands w its wake-up token; q.mu is held.
func (q *admissionQueue) wakeLocked(w *waiter) {
	w.queued = false
	w.woken = true
	q.transit++
	w.wake <- struct{}{}
}

// join registers a new waiter; the caller pushes it.
func (s *Scheduler) join(priority int32) *waiter {
	w := waiterPool.Get().(*waiter)
	now := clock.Now()
	w.since = now
	w.key = now - bumpOf(priority, s.bump)
	s.queue.mu.Lock()
	s.queue.seq++
	w.seq = s.queue.seq
	s.queue.mu.Unlock()
	s.waiting.Add(1)
	s.queuedTotal.Add(1)
	return w
}

// bumpOf is priority·bump, saturated so that an absurd priority cannot
// wrap a request from the front of the queue to the back.
func bumpOf(priority int32, bump time.Duration) int64 {
	const limit = 1 << 62
	p, b := int64(priority), int64(bump)
	if p != 0 && (p > limit/b || p < -limit/b) {
		if p > 0 {
			return limit
		}
		return -limit
	}
	return p * b
}

// leave retires a waiter that is out of the queue with its wake-up token
// consumed, and passes admission on to whoever is next.
func (s *Scheduler) leave(w *waiter, admitted bool) {
	if w == nil {
		return
	}
	if admitted {
		// A smoothed wait is the retry hint: the time a refused client
		// would have spent queued had there been room.
		d := clock.Now() - w.since
		old := s.waitEWMA.Load()
		s.waitEWMA.Store(old + (d-old)/8)
	}
	s.queue.mu.Lock()
	if w.woken {
		s.queue.transit--
	}
	s.queue.mu.Unlock()
	*w = waiter{wake: w.wake}
	waiterPool.Put(w)
	s.waiting.Add(-1)
	s.admit()
}

// wakeWaiters re-runs admission after load went down or workers changed.
// Without waiters it costs one atomic load.
func (s *Scheduler) wakeWaiters() {
	if s.waiting.Load() > 0 {
		s.admit()
	}
}

// admit wakes queued requests, in queue order, that can now be placed: at
// most one per worker below its thresholds, since each admitted request
// adds load and the next pass (run when it finishes) re-checks. A waiter
// none of whose workers is healthy any more is woken too, to fail.
func (s *Scheduler) admit() {
	q := &s.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.list) == 0 {
		return
	}
	ws := s.workers.Load()
	up := ws.present & workers.Set(s.healthy.Load())
	free := up &^ s.busy(ws, up, clock.Now())
	budget := free.Len()
	keep := q.list[:0]
	for _, w := range q.list {
		switch {
		case w.eligible&up == 0:
		case budget > 0 && w.eligible&free != 0:
			budget--
		default:
			keep = append(keep, w)
			continue
		}
		q.wakeLocked(w)
	}
	clear(q.list[len(keep):])
	q.list = keep
}

// wakeAll wakes every waiter to re-resolve its filters: the worker set
// changed, so the workers a waiter may use may have too.
func (s *Scheduler) wakeAll() {
	q := &s.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.list {
		q.wakeLocked(w)
	}
	clear(q.list)
	q.list = q.list[:0]
}

// overload is the refusal for a full queue: the recent queue wait as a
// retry hint. Retry-After is whole seconds on the wire, so the hint is
// rounded up (a client honouring it never comes back early) and clamped
// to [RetryAfterMin, RetryAfterMax]; that leaves one refusal per whole
// second up to the maximum, built once (newRefusals), because a spike
// refuses thousands of requests a second and none of them may allocate.
func (s *Scheduler) overload() error {
	s.refused.Add(1)
	wait := max(s.waitEWMA.Load(), 0)
	secs := wait / int64(time.Second)
	if wait%int64(time.Second) != 0 {
		secs++
	}
	return &s.refusals[min(secs, int64(len(s.refusals)-1))]
}

// newRefusals returns the refusal for a wait of k whole seconds at index
// k, for k from 0 to the first whole second at or above hi.
func newRefusals(lo, hi time.Duration) []OverloadError {
	n := (hi + time.Second - 1) / time.Second
	r := make([]OverloadError, n+1)
	for k := range r {
		r[k].RetryAfter = min(max(time.Duration(k)*time.Second, lo), hi)
	}
	return r
}
