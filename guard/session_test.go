package guard

import (
	"context"
	"testing"

	"github.com/kvfast/kvfast/sched"
)

// closer records when its deferred action ran and what the scheduler
// still had booked at that moment.
type closer struct {
	s       *sched.Scheduler
	runs    int
	ev      Event
	booked  int64
	handleS State
	h       Handle
}

func (c *closer) AfterRelease(ev Event) {
	c.runs++
	c.ev = ev
	c.booked = c.s.Load(0).Requests
	c.handleS = c.h.State()
}

// A deferred close runs once, after the booking is freed and the handle
// went stale, on the normal, error, cancel and drop paths alike.
func TestDeferRunsAfterTheBookingIsFreed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		end   func(h Handle)
		state State
		why   Reason
	}{
		{"completed", func(h Handle) { _ = h.OnItem(1, FinishStop) }, Completed, ReasonNone},
		{"engine error", func(h Handle) { _ = h.OnItem(0, FinishError) }, Aborted, ReasonEngineError},
		{"client cancel", func(h Handle) { _ = h.Abort(ReasonClientCancel) }, Aborted, ReasonClientCancel},
		{"dropped stream", func(Handle) {}, Aborted, ReasonDropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, s := newTestPool(t, 1, sched.Config{}, Observer{})
			h := pool.Acquire()
			c := &closer{s: s, h: h}
			if err := h.Defer(c); err != nil {
				t.Fatal(err)
			}
			if _, err := h.Select(context.Background(), &sched.Request{PromptTokens: 64}); err != nil {
				t.Fatal(err)
			}
			if err := h.Dispatched(); err != nil {
				t.Fatal(err)
			}
			tc.end(h)
			if c.runs != 0 {
				t.Fatal("the deferred action ran before Release")
			}
			if err := h.Release(); err != nil {
				t.Fatal(err)
			}
			if c.runs != 1 {
				t.Fatalf("the deferred action ran %d times", c.runs)
			}
			if c.booked != 0 || c.handleS != Free {
				t.Fatalf("at the deferred action: %d requests still booked, handle state %v; want 0, Free", c.booked, c.handleS)
			}
			if c.ev.State != tc.state || c.ev.Reason != tc.why {
				t.Fatalf("event %+v, want %v/%v", c.ev, tc.state, tc.why)
			}
			requireNoLoad(t, s)
			// The recycled guard does not carry the action into its next life.
			next := pool.Acquire()
			_ = next.Release()
			if c.runs != 1 {
				t.Fatal("a recycled guard ran the previous request's action")
			}
		})
	}
}

func TestDeferOnStaleHandle(t *testing.T) {
	pool, s := newTestPool(t, 1, sched.Config{}, Observer{})
	h := pool.Acquire()
	_ = h.Release()
	if err := h.Defer(&closer{s: s}); err != ErrStale {
		t.Fatalf("Defer on a released handle = %v, want ErrStale", err)
	}
}
