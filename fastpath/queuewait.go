package fastpath

import (
	"context"
	"sync"
	"time"
)

// queueWait is the context a request waits in the admission queue under.
// fasthttp's RequestCtx is a context too, but its Done only closes at
// server shutdown: a request whose client left would keep its place and be
// sent to an engine long after. queueWait adds the operator's queue
// timeout. sched.Select asks for Done only when it has to queue, so the
// timer and channel exist only for requests that actually wait; the common
// path allocates nothing.
type queueWait struct {
	parent  context.Context
	timeout time.Duration

	mu      sync.Mutex
	done    chan struct{}
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
	q.done, q.err, q.timer, q.unwatch = nil, nil, nil, nil
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
