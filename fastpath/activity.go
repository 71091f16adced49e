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
// A drain seals the count at zero, so that nothing enters afterwards:
// fasthttp leaves open, after a Shutdown whose context has ended, every
// connection it does not yet count as idle, and a request arriving on one
// of them must not run a handler over a segment the node has unmapped.
//
// A sync.WaitGroup cannot do this: handlers keep arriving (Add from zero)
// while Shutdown waits. Here enter and exit are one atomic add each, and
// wait needs no helper goroutine.
type activity struct {
	n        atomic.Int64 // the count, with sealed set once a drain saw it at zero
	draining atomic.Bool
	idle     chan struct{} // one slot: a wake-up for wait, never blocks exit
}

// sealed is n's bit for a completed drain, far above any count.
const sealed = 1 << 62

func newActivity() *activity { return &activity{idle: make(chan struct{}, 1)} }

// enter counts one more handler or stream, or returns false when a drain
// has completed and nothing may start.
func (a *activity) enter() bool {
	if a.n.Add(1)&sealed != 0 {
		a.n.Add(-1)
		return false
	}
	return true
}

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

// wait returns true once nothing is active, sealing the count so that
// nothing enters afterwards, or false when ctx ends first.
func (a *activity) wait(ctx context.Context) bool {
	a.draining.Store(true)
	for !a.seal() {
		select {
		case <-a.idle:
		case <-ctx.Done():
			return a.seal()
		}
	}
	return true
}

// seal sets sealed if nothing is active, and reports whether it is set.
func (a *activity) seal() bool {
	for {
		n := a.n.Load()
		switch {
		case n&sealed != 0:
			return true // a refused enter may hold it above sealed for a moment
		case n != 0:
			return false
		case a.n.CompareAndSwap(0, sealed):
			return true
		}
	}
}
