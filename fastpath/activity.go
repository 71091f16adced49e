package fastpath

import (
	"context"
	"sync/atomic"
)

// activity counts the work that may still touch the node's state: every
// handler from entry to return, and every stream from hand-off to its
// end. The node unmaps the index only once it drains, because a handler
// reading an unmapped segment faults the whole process.
//
// A sync.WaitGroup cannot do this: handlers keep arriving (Add from zero)
// while Shutdown waits. Here enter and exit are one atomic add each, and
// wait needs no helper goroutine.
type activity struct {
	n        atomic.Int64
	draining atomic.Bool
	idle     chan struct{} // one slot: a wake-up for wait, never blocks exit
}

func newActivity() *activity { return &activity{idle: make(chan struct{}, 1)} }

func (a *activity) enter() { a.n.Add(1) }

func (a *activity) exit() {
	// draining is read after the decrement and wait stores it before its
	// first load of n, so one of the two always sees the other.
	if a.n.Add(-1) == 0 && a.draining.Load() {
		select {
		case a.idle <- struct{}{}:
		default:
		}
	}
}

// wait returns true once nothing is active, or false when ctx ends first.
func (a *activity) wait(ctx context.Context) bool {
	a.draining.Store(true)
	for a.n.Load() != 0 {
		select {
		case <-a.idle:
		case <-ctx.Done():
			return a.n.Load() == 0
		}
	}
	return true
}
