package sched

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// busyConfig makes a worker busy while more than 50 prompt tokens booked on
// it await their first token: one 64-token request fills it.
func busyConfig() Config { return Config{Busy: BusyThresholds{PrefillTokens: 50}} }

func TestBusyThresholds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		busy   BusyThresholds
		set    func(s *Scheduler, res *Reservation)
		isBusy bool
	}{
		{"no thresholds", BusyThresholds{}, func(s *Scheduler, res *Reservation) {
			mustSelect(t, s, &Request{Hashes: make([]uint64, 900), PromptTokens: 900 * 16}, res)
		}, false},
		{"prefill over", BusyThresholds{PrefillTokens: 100}, func(s *Scheduler, res *Reservation) {
			mustSelect(t, s, &Request{PromptTokens: 101}, res)
		}, true},
		{"prefill at the threshold", BusyThresholds{PrefillTokens: 100}, func(s *Scheduler, res *Reservation) {
			mustSelect(t, s, &Request{PromptTokens: 100}, res)
		}, false},
		{"decode blocks over the fraction of capacity", BusyThresholds{DecodeBlocksFraction: 0.01}, func(s *Scheduler, res *Reservation) {
			mustSelect(t, s, &Request{Hashes: prompt(1, 0, 1, 11), PromptTokens: 11 * 16}, res) // 11 > 0.01 × 1000
		}, true},
		{"decode blocks at the fraction", BusyThresholds{DecodeBlocksFraction: 0.01}, func(s *Scheduler, res *Reservation) {
			mustSelect(t, s, &Request{Hashes: prompt(1, 0, 1, 10), PromptTokens: 10 * 16}, res)
		}, false},
		{"engine reports its KV full", BusyThresholds{DecodeBlocksFraction: 0.9}, func(s *Scheduler, res *Reservation) {
			s.SetEngineLoad(0, 10, 5, 950, 1000)
		}, true},
		{"engine below", BusyThresholds{DecodeBlocksFraction: 0.9}, func(s *Scheduler, res *Reservation) {
			s.SetEngineLoad(0, 10, 5, 850, 1000)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, 1, Config{Busy: tc.busy})
			var res Reservation
			tc.set(s, &res)
			var sc Scores
			d := mustSelect(t, s, &Request{PromptTokens: 1, QueryOnly: true, Scores: &sc}, nil)
			if d.Busy != tc.isBusy || (sc.Busy == 1) != tc.isBusy {
				t.Fatalf("busy %v (set %b), want %v; load %+v", d.Busy, sc.Busy, tc.isBusy, s.Load(0))
			}
			res.Release()
		})
	}
}

// TestAdmissionHammer races selections, queueing, cancellations at random
// moments, releases and threshold changes, then checks that every request
// was admitted, refused or cancelled exactly once and that nothing is left:
// no load, no waiter, no queue entry.
func TestAdmissionHammer(t *testing.T) {
	s := newTestScheduler(t, 4, Config{Busy: BusyThresholds{PrefillTokens: 100}, QueueCapacity: 6})
	perG, goroutines := 2000, 16
	if testing.Short() || raceEnabled {
		perG = 400
	}
	var admitted, refused, cancelled atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 5))
			var res Reservation
			for range perG {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if r.IntN(4) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(200))*time.Microsecond)
				}
				req := Request{Hashes: prompt(uint64(r.IntN(3)), r.IntN(4), uint64(r.Uint32()), 4), PromptTokens: 64 + r.IntN(64)}
				if r.IntN(5) == 0 {
					req.Pinned, req.PinWorker = true, 100+uint64(r.IntN(4))
				}
				req.Priority = int32(r.IntN(3)) - 1
				if r.IntN(2) == 0 {
					pol := Policy(r.IntN(int(numPolicies)))
					req.Policy = &pol
				}
				_, err := s.Select(ctx, &req, &res)
				cancel()
				switch {
				case err == nil:
					admitted.Add(1)
					if r.IntN(2) == 0 {
						res.PrefillDone()
					}
					if r.IntN(3) == 0 { // hold the worker so that others queue
						time.Sleep(time.Duration(r.IntN(50)) * time.Microsecond)
					}
					res.Release()
					res.Reset()
				case errors.Is(err, ErrOverloaded):
					refused.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Add(1)
				default:
					t.Error(err)
					return
				}
				if res.Booked() {
					t.Error("failed selection left a booking")
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // thresholds and the global policy move under the queue's feet
		defer wg.Done()
		for i := range 50 {
			_ = s.SetPolicy(Policy(i % int(numPolicies)))
			_ = s.SetBusyThresholds(BusyThresholds{PrefillTokens: int64(60 + i%3*60)})
			time.Sleep(time.Millisecond)
		}
		_ = s.SetBusyThresholds(BusyThresholds{PrefillTokens: 100})
	}()
	wg.Wait()
	total := int64(perG * goroutines)
	if got := admitted.Load() + refused.Load() + cancelled.Load(); got != total {
		t.Fatalf("%d outcomes for %d requests", got, total)
	}
	if admitted.Load() == 0 || s.Stats().Queued == 0 {
		t.Fatalf("hammer never queued or admitted: %+v", s.Stats())
	}
	requireZeroLoad(t, s)
	if n := s.queue.len(); n != 0 {
		t.Fatalf("queue holds %d after everyone left", n)
	}
	t.Logf("admitted %d, refused %d, cancelled %d, queued %d", admitted.Load(), refused.Load(), cancelled.Load(), s.Stats().Queued)
}

func TestPriorityBumpSaturates(t *testing.T) {
	for _, tc := range []struct {
		p    int32
		bump time.Duration
		want int64
	}{
		{3, time.Second, 3e9},
		{-2, time.Second, -2e9},
		{0, time.Hour, 0},
		{1 << 30, 1000 * time.Hour, 1 << 62},
		{-1 << 31, 1000 * time.Hour, -1 << 62},
	} {
		if got := bumpOf(tc.p, tc.bump); got != tc.want {
			t.Errorf("bumpOf(%d, %s) = %d, want %d", tc.p, tc.bump, got, tc.want)
		}
	}
}

// TestRefusalHints checks the prebuilt refusals against the rule they
// precompute: the queue wait rounded up to whole seconds, then clamped to
// [RetryAfterMin, RetryAfterMax], for bounds on and off whole seconds.
func TestRefusalHints(t *testing.T) {
	for _, b := range []struct{ lo, hi time.Duration }{
		{time.Second, 30 * time.Second},
		{1500 * time.Millisecond, 10200 * time.Millisecond},
		{3 * time.Second, 3 * time.Second},
		{time.Millisecond, MaxRetryAfter},
	} {
		s := newTestScheduler(t, 1, Config{RetryAfterMin: b.lo, RetryAfterMax: b.hi})
		for _, wait := range []time.Duration{-time.Second, 0, 1, time.Second - 1, time.Second, time.Second + 1,
			2500 * time.Millisecond, 10 * time.Second, 10*time.Second + 1, 11 * time.Second, 2 * time.Hour, math.MaxInt64} {
			s.waitEWMA.Store(int64(wait))
			want := b.hi // the rule's own rounding would overflow at the largest wait
			if wait < time.Hour*1000 {
				want = min(max((max(wait, 0)+time.Second-1).Truncate(time.Second), b.lo), b.hi)
			}
			var oe *OverloadError
			if !errors.As(s.overload(), &oe) || oe.RetryAfter != want {
				t.Errorf("bounds %s..%s, wait %s: hint %v, want %s", b.lo, b.hi, wait, oe, want)
			}
		}
	}
	if _, err := New(Config{RetryAfterMax: MaxRetryAfter + time.Second}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a retry hint above MaxRetryAfter was accepted: %v", err)
	}
}

// TestRunningRequestIsBookedWhateverTheLoad: a request that already runs
// on its worker (a gateway fell back to it) is booked there at once, past
// the busy thresholds and ahead of the queue, so that its load is counted;
// a new request to the same worker still waits.
func TestRunningRequestIsBookedWhateverTheLoad(t *testing.T) {
	s := newTestScheduler(t, 1, Config{Busy: BusyThresholds{PrefillTokens: 50}, QueueCapacity: 4})
	var first, running Reservation
	mustSelect(t, s, &Request{Hashes: prompt(1, 0, 1, 4), PromptTokens: 64}, &first) // the worker is busy now
	queued := make(chan outcome, 1)
	goSelect(s, context.Background(), "queued", Request{Hashes: prompt(2, 0, 2, 4), PromptTokens: 64}, queued)
	waitFor(t, "the new request to queue", func() bool { return s.queue.len() == 1 })

	d, err := s.Select(context.Background(), &Request{Hashes: prompt(3, 0, 3, 4), PromptTokens: 64,
		Pinned: true, PinWorker: 100, Running: true}, &running)
	if err != nil || d.Slot != 0 {
		t.Fatalf("a running request on a busy worker: %+v, %v", d, err)
	}
	if got := s.Load(0); got.Requests != 2 || got.PrefillTokens != 128 {
		t.Fatalf("load with the running request booked: %+v", got)
	}
	if s.queue.len() != 1 {
		t.Fatal("the running request's booking took the queued request's turn")
	}
	running.Release()
	first.Release()
	if o := <-queued; o.err != nil {
		t.Fatalf("the queued request: %v", o.err)
	} else {
		o.res.Release()
	}
	requireZeroLoad(t, s)
}
