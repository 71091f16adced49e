package sched

import (
	"context"
	"testing"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// TestBusyStretch: a stretch starts at the first busy observation, grows
// while observations keep coming at least once a second, lives through
// dips under the threshold (a saturated worker's, as each request ends),
// and starts again once seen free for busyDipTolerance or after a second
// without any observation.
func TestBusyStretch(t *testing.T) {
	var b busyStretch
	ms := func(n int64) int64 { return 1e12 + n*int64(time.Millisecond) }
	for _, step := range []struct {
		at   int64
		busy bool
		want int64 // ms busy, after noting the step
	}{
		{0, true, 0},
		{400, true, 400},
		{800, true, 800},
		{900, false, 900}, // a dip: the queue's next request admitted
		{1000, true, 1000},
		{1400, true, 1400},
		{1500, false, 1500},
		{1700, false, 1700},
		{1800, false, 0}, // free for 300 ms: recovered
		{2700, true, 0},
		{3100, true, 400},
		{3200, false, 3200 - 2700},
		{3300, true, 3300 - 2700}, // busy again: the dip is forgotten
		{3500, false, 3500 - 2700},
		{3700, false, 3700 - 2700}, // 200 ms since the dip began, not 400
		{3800, true, 3800 - 2700},
		{4000, true, 1300},
		{5200, true, 0}, // not seen for 1.2 s: a new stretch
		{5600, true, 400},
		{5605, true, 405}, // seen 5 ms later: not written, still counted
		{6600, true, 1400},
	} {
		b.note(step.busy, ms(step.at))
		if got := b.length(ms(step.at)); got != step.want*int64(time.Millisecond) {
			t.Fatalf("at %d ms (busy %v): length %v, want %d ms", step.at, step.busy, time.Duration(got), step.want)
		}
	}
	if got := b.length(ms(7700)); got != 0 {
		t.Fatalf("a stretch not seen for 1.1 s is still %v long", time.Duration(got))
	}
}

// TestBusyStretchFedBySelections: the selections that weigh a worker feed
// its stretch, so a session looked up only now sees how long the worker
// has been busy under everyone's traffic, not from its own lookup (a
// chat's turns are seconds apart, which restarted a stretch kept by
// session lookups alone, and a worker busy for good kept its sessions).
func TestBusyStretchFedBySelections(t *testing.T) {
	s, err := New(Config{Busy: BusyThresholds{DecodeBlocksFraction: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(2)
	if err := s.Upsert(WorkerInfo{ID: 1, Slot: slot, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	s.SetEngineLoad(slot, 0, 0, 90, 100) // busy
	req := Request{Model: "m", PromptTokens: 16, QueryOnly: true}
	// Selections for 60 ms, then one look at the worker's eligibility.
	// The stretch restarts after a second without an observation, which a
	// loaded machine can impose between two iterations: such a round is
	// measured again, not failed.
	for round := 0; ; round++ {
		if _, err := s.Select(context.Background(), &req, nil); err != nil {
			t.Fatal(err)
		}
		start, last, maxGap := time.Now(), time.Now(), time.Duration(0)
		for time.Since(start) < 60*time.Millisecond {
			if _, err := s.Select(context.Background(), &req, nil); err != nil {
				t.Fatal(err)
			}
			maxGap, last = max(maxGap, time.Since(last)), time.Now()
			time.Sleep(time.Millisecond) // other clients' requests, arriving
		}
		e := s.Eligibility(slot)
		if maxGap+time.Since(last) > 500*time.Millisecond && round < 5 {
			continue
		}
		if !e.Busy || e.BusyFor < 50*time.Millisecond {
			t.Fatalf("eligibility %+v after selections saw the worker busy for 60 ms: want BusyFor of at least 50 ms", e)
		}
		return
	}
}

// TestPinLapsesOnAWorkerThatStaysBusy: a pinned request queued behind its
// busy worker loses its pin once the worker has been busy for its
// PinBusyLimit (a sticky session's turn is then routed anew), keeps its
// place in the queue ahead of later arrivals, and is booked elsewhere
// (Decision.PinLapsed); without a limit it waits on, and is booked there
// as soon as the worker frees up.
func TestPinLapsesOnAWorkerThatStaysBusy(t *testing.T) {
	s := newTestScheduler(t, 2, Config{Busy: BusyThresholds{PrefillTokens: 1}, QueueCapacity: 8})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// One request in prefill on each worker makes both busy.
	var held [2]Reservation
	for i := range held {
		if _, err := s.Select(ctx, &Request{Model: "m", PromptTokens: 16, Pinned: true, PinWorker: 100 + uint64(i)}, &held[i]); err != nil {
			t.Fatal(err)
		}
	}
	out := make(chan outcome, 2)
	goSelect(s, ctx, "pinned", Request{Model: "m", PromptTokens: 16, Pinned: true, PinWorker: 100, PinBusyLimit: 50 * time.Millisecond}, out)
	waitFor(t, "the pinned request to queue", func() bool { return s.Stats().Waiting == 1 })
	goSelect(s, ctx, "later", Request{Model: "m", PromptTokens: 16}, out)
	waitFor(t, "a later request to queue behind it", func() bool { return s.Stats().Waiting == 2 })
	// The pin lapses: the first waiter, the pinned request, may now go to
	// either worker, and is still first.
	waitFor(t, "the pin to lapse", func() bool {
		s.queue.mu.Lock()
		defer s.queue.mu.Unlock()
		return len(s.queue.list) == 2 && s.queue.list[0].eligible.Has(1)
	})
	held[1].Release() // room on worker 1 for one request
	o := <-out
	if o.name != "pinned" || o.err != nil || o.d.Slot != 1 || !o.d.PinLapsed {
		t.Fatalf("first admitted: %s on slot %d, lapsed %v, %v; want the pinned request, lapsed, on slot 1", o.name, o.d.Slot, o.d.PinLapsed, o.err)
	}
	if got := time.Duration(s.stretch[0].length(clock.Now())); got < 50*time.Millisecond {
		t.Errorf("lapsed with the worker busy for %v, under the limit", got)
	}
	o.res.Release()
	held[0].Release()
	if o := <-out; o.name != "later" || o.err != nil || o.d.PinLapsed {
		t.Fatalf("the later request: %+v", o)
	} else {
		o.res.Release()
	}
	requireZeroLoad(t, s)

	// Without a limit the pin holds until its worker frees up.
	if _, err := s.Select(ctx, &Request{Model: "m", PromptTokens: 16, Pinned: true, PinWorker: 100}, &held[0]); err != nil {
		t.Fatal(err)
	}
	goSelect(s, ctx, "unlimited", Request{Model: "m", PromptTokens: 16, Pinned: true, PinWorker: 100}, out)
	waitFor(t, "the pinned request to queue", func() bool { return s.Stats().Waiting == 1 })
	held[0].Release()
	if o := <-out; o.err != nil || o.d.Slot != 0 || o.d.PinLapsed {
		t.Fatalf("an unlimited pin: slot %d, lapsed %v, %v; want booked on slot 0", o.d.Slot, o.d.PinLapsed, o.err)
	} else {
		o.res.Release()
	}
	requireZeroLoad(t, s)
}

// TestBusyStretchLivesThroughAdmissions: a saturated worker dips under
// its threshold each time a request ends, and the queue's next waiter is
// admitted at that moment, seeing it free. The stretch lives on: ended
// there, it never grew past one request, and a session bound to a worker
// that stayed saturated was never unbound (--session-busy-unbind).
func TestBusyStretchLivesThroughAdmissions(t *testing.T) {
	s := newTestScheduler(t, 2, Config{Busy: BusyThresholds{PrefillTokens: 1}, QueueCapacity: 8})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pinned := Request{Model: "m", PromptTokens: 16, Pinned: true, PinWorker: 100}
	var held Reservation
	if _, err := s.Select(ctx, &pinned, &held); err != nil {
		t.Fatal(err)
	}
	out := make(chan outcome, 1)
	goSelect(s, ctx, "queued", pinned, out)
	waitFor(t, "the pinned request to queue", func() bool { return s.Stats().Waiting == 1 })
	start := clock.Now()
	waitFor(t, "the stretch to reach 50 ms", func() bool { return s.stretch[0].length(clock.Now()) >= int64(50*time.Millisecond) })
	held.Release() // the worker dips; the waiter is admitted and fills it again
	o := <-out
	if o.err != nil || o.d.Slot != 0 {
		t.Fatalf("the queued request: slot %d, %v", o.d.Slot, o.err)
	}
	if got := s.stretch[0].length(clock.Now()); got < int64(50*time.Millisecond) {
		t.Fatalf("the stretch is %v after an admission, begun over %v before", time.Duration(got), time.Duration(clock.Now()-start))
	}
	o.res.Release()
	requireZeroLoad(t, s)
}

// TestMostlyIdleWorkerIsNotBusy: a worker over its threshold for 50 ms in
// every 900, observed every 10 ms, never has a stretch much longer than
// one busy spell and the dip tolerance after it (a longer tolerance had
// kept it "busy" for good, unbinding its sessions at every spell).
func TestMostlyIdleWorkerIsNotBusy(t *testing.T) {
	var b busyStretch
	longest := int64(0)
	for at := int64(0); at < 30_000; at += 10 {
		now := 1e12 + at*int64(time.Millisecond)
		b.note(at%900 < 50, now)
		longest = max(longest, b.length(now))
	}
	if limit := 50*int64(time.Millisecond) + busyDipTolerance + 20*int64(time.Millisecond); longest > limit {
		t.Fatalf("the longest stretch was %v, over %v", time.Duration(longest), time.Duration(limit))
	}
}
