package guard

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/sched"
)

// TestHammer runs at least a million request lifecycles (fewer with -short
// or -race) from many goroutines, each taking a random path: completion by
// a terminal item or a close, client cancels at random points (some from
// another goroutine racing the relay), dispatch failures, engine errors,
// timeouts in the admission queue and mid-stream, panics, and streams
// dropped without a close. Busy thresholds are low enough that requests
// queue. Afterwards every worker's active blocks, prefill tokens, output
// blocks and request count must be exactly zero, every dispatched request
// must have been reported finished exactly once, and the queue empty.
func TestHammer(t *testing.T) {
	lifecycles := 1_000_000
	switch {
	case raceEnabled:
		lifecycles = 100_000
	case testing.Short():
		lifecycles = 100_000
	}
	const goroutines = 8
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = true
	var dispatched, finished, completed, aborted atomic.Int64
	pool, s := newTestPool(t, 4, sched.Config{
		Cost:          &cost,
		Busy:          sched.BusyThresholds{PrefillTokens: 40},
		QueueCapacity: 4,   // under the goroutine count, so that some requests are refused
		ActiveBlocks:  256, // small, so that idle entries are evicted constantly
	}, Observer{Finished: func(e Event) {
		finished.Add(1)
		if e.State == Completed {
			completed.Add(1)
		} else {
			aborted.Add(1)
		}
	}})

	// Prompts share prefixes in a few families, so that requests hold
	// blocks in common on one worker and across workers.
	prompts := make([][]uint64, 64)
	for i := range prompts {
		family := uint64(i % 4)
		n := 1 + i%9
		h := make([]uint64, n)
		for j := range h {
			if j < n/2 {
				h[j] = family<<40 | uint64(j) + 1
			} else {
				h[j] = uint64(i)<<48 | uint64(j) + 1
			}
		}
		prompts[i] = h
	}

	var failures atomic.Int64
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 99))
			abortc := make(chan Handle)
			acked := make(chan struct{})
			go func() { // this goroutine's canceller
				for h := range abortc {
					// Let the relay get ahead by a varying number of items.
					for range h.gen % 64 {
						_ = h.State()
					}
					if err := h.Abort(ReasonClientCancel); err != nil {
						fail("async abort: %v", err)
					}
					acked <- struct{}{}
				}
			}()
			defer close(abortc)
			for i := range lifecycles / goroutines {
				if lifecycle(pool, r, i, prompts, abortc, acked, fail) {
					dispatched.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}
	requireNoLoad(t, s)
	if dispatched.Load() != finished.Load() {
		t.Fatalf("%d dispatched, %d finished", dispatched.Load(), finished.Load())
	}
	st := s.Stats()
	if completed.Load() == 0 || aborted.Load() == 0 || st.Queued == 0 {
		t.Fatalf("the hammer missed paths: completed %d, aborted %d, stats %+v", completed.Load(), aborted.Load(), st)
	}
	t.Logf("%d lifecycles: %d dispatched (%d completed, %d aborted), scheduler %+v",
		lifecycles/goroutines*goroutines, dispatched.Load(), completed.Load(), aborted.Load(), st)
}

// lifecycle runs one request down a random path and reports whether it
// reached an engine (and so is due a Finished event).
func lifecycle(pool *Pool, r *rand.Rand, i int, prompts [][]uint64, abortc chan<- Handle, acked <-chan struct{}, fail func(string, ...any)) (dispatched bool) {
	path := r.IntN(10)
	h := pool.Acquire()
	if path == 7 { // the handler panics at a random point, Release deferred
		defer func() { _ = recover() }()
	}
	defer func() {
		if err := h.Release(); err != nil {
			fail("release: %v", err)
		}
	}()
	if path == 7 && i%2 == 0 { // ... and, like fastpath, recovers and aborts before the release
		defer func() {
			if recover() != nil {
				_ = h.Abort(ReasonPanic)
			}
		}()
	}

	ctx := context.Background()
	if r.IntN(8) == 0 { // a client that gives up while queued
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(100))*time.Microsecond)
		defer cancel()
	}
	p := prompts[r.IntN(len(prompts))]
	req := sched.Request{Hashes: p, PromptTokens: len(p)*16 + r.IntN(16), Priority: int32(r.IntN(3))}
	if r.IntN(4) == 0 {
		req.ExpectedOutputTokens = 1 + r.IntN(100)
	}
	if r.IntN(6) == 0 {
		req.Pinned, req.PinWorker = true, uint64(r.IntN(4))
	}
	if path == 0 && r.IntN(2) == 0 { // cancelled before selection
		_ = h.Abort(ReasonClientCancel)
	}
	if _, err := h.Select(ctx, &req); err != nil {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, sched.ErrOverloaded) && !errors.Is(err, ErrBadTransition) {
			fail("select: %v", err)
		}
		return
	}
	switch path {
	case 0: // cancelled between selection and dispatch
		_ = h.Abort(ReasonClientCancel)
		if err := h.Dispatched(); !errors.Is(err, ErrAborted) {
			fail("dispatch after cancel: %v", err)
		}
		return
	case 1:
		if err := h.DispatchFailed(); err != nil {
			fail("dispatch failed: %v", err)
		}
		return
	}
	if err := h.Dispatched(); err != nil {
		fail("dispatch: %v", err)
		return
	}
	dispatched = true
	items := r.IntN(12)
	async := path == 8
	if async {
		abortc <- h
	}
	if r.IntN(8) == 0 {
		runtime.Gosched() // hold the booking while others run, so that workers fill up and requests queue
	}
	aborted := false
	for k := range items {
		if err := h.OnItem(1+r.IntN(20), FinishNone); err != nil {
			if !(async || aborted) || !errors.Is(err, ErrAborted) {
				fail("item: %v", err)
			}
			break
		}
		switch {
		case path == 2 && k == items/2:
			aborted = h.Abort(ReasonClientCancel) == nil
		case path == 6 && k == items/2:
			aborted = h.Abort(ReasonTimeout) == nil
		case path == 7 && k == items/2:
			panic("handler bug")
		}
	}
	switch path {
	case 3:
		_ = h.OnItem(0, FinishError)
	case 4: // stream dropped: Release without close or terminal item
	case 5:
		_ = h.Close()
	default:
		_ = h.OnItem(1, Finish(1+r.IntN(3)))
	}
	if async {
		<-acked // the canceller is done with the handle before Release
	}
	return dispatched
}
