package fastpath

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
)

// queueWait is the context a request waits in the admission queue under:
// the server's cut (done when Shutdown cuts requests, not when it begins
// draining), the operator's queue timeout, and the client's hang-up
// (exchange.HangUp cancels it). fasthttp's RequestCtx would not do: its
// Done closes when Shutdown begins, which refused the queued requests a
// drain should serve, and never when the client leaves. sched.Select asks for Done only when it has to queue, so the
// timer and channel exist only for requests that actually wait; the common
// path allocates nothing.
type queueWait struct {
	parent  context.Context
	timeout time.Duration

	mu      sync.Mutex
	done    chan struct{}
	since   int64 // when the request began to wait (clock.Now), for its trace's queue span
	err     error
	timer   *time.Timer
	unwatch func() bool
}

func (q *queueWait) reset(parent context.Context, timeout time.Duration) {
	q.release()
	q.parent, q.timeout = parent, timeout
}

// release stops the timer and the parent watch, if Done armed them.
func (q *queueWait) release() {
	q.mu.Lock()
	if q.timer != nil {
		q.timer.Stop()
	}
	if q.unwatch != nil {
		q.unwatch()
	}
	q.done, q.err, q.timer, q.unwatch, q.since = nil, nil, nil, nil, 0
	q.parent = nil
	q.mu.Unlock()
}

func (q *queueWait) Deadline() (time.Time, bool) { return time.Time{}, false }
func (q *queueWait) Value(key any) any           { return q.parent.Value(key) }

func (q *queueWait) Done() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done == nil {
		q.done = make(chan struct{})
		q.since = clock.Now()
		if q.err != nil { // the client left before the request queued
			close(q.done)
			return q.done
		}
		q.timer = time.AfterFunc(q.timeout, func() { q.cancel(context.DeadlineExceeded) })
		q.unwatch = context.AfterFunc(q.parent, func() { q.cancel(context.Canceled) })
	}
	return q.done
}

func (q *queueWait) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// cancel ends the wait with err, or makes a wait not yet begun end at once.
func (q *queueWait) cancel(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err == nil {
		q.err = err
		if q.done != nil {
			close(q.done)
		}
	}
}

// waitStats remembers how long recent requests waited in the admission
// queue, for the Retry-After of a refusal: a client told to come back
// after about the current wait neither hammers a saturated router nor
// stays away from one that has drained. It is a moving average updated
// with atomics; requests that did not queue do not touch it.
type waitStats struct {
	avg atomic.Int64 // nanoseconds, exponentially weighted over recent waits
}

// observe folds one queue wait into the average, with weight 1/8.
func (w *waitStats) observe(d time.Duration) {
	for {
		old := w.avg.Load()
		next := old + (int64(d)-old)/8
		if w.avg.CompareAndSwap(old, next) {
			return
		}
	}
}

// Retry-After's bounds, in seconds.
const (
	minRetryAfter = 1
	maxRetryAfter = 60
)

// retryAfterSeconds is the recent average wait rounded up to whole seconds
// and clamped to [minRetryAfter, maxRetryAfter].
func (w *waitStats) retryAfterSeconds() int64 {
	secs := (w.avg.Load() + int64(time.Second) - 1) / int64(time.Second)
	return min(max(secs, minRetryAfter), maxRetryAfter)
}

// queued reports whether the request waiting under q had to queue: Done
// arms the wait only then.
func (q *queueWait) queued() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.done != nil
}

// queuedSince is when the request began to wait, or 0 if it never did.
func (q *queueWait) queuedSince() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.since
}
