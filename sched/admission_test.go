package sched

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls until cond holds (the queue is filled by goroutines).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

type outcome struct {
	name string
	res  *Reservation
	d    Decision
	err  error
}

// goSelect starts a Select that may queue, reporting on out.
func goSelect(s *Scheduler, ctx context.Context, name string, req Request, out chan<- outcome) {
	go func() {
		res := new(Reservation)
		d, err := s.Select(ctx, &req, res)
		out <- outcome{name, res, d, err}
	}()
}

// busyConfig makes a worker busy while more than 50 prompt tokens booked on
// it await their first token: one 64-token request fills it.
func busyConfig() Config { return Config{Busy: BusyThresholds{PrefillTokens: 50}} }

func TestQueueWaitsForLoadToDrain(t *testing.T) {
	s := newTestScheduler(t, 1, busyConfig())
	var first Reservation
	mustSelect(t, s, &Request{PromptTokens: 64}, &first)

	out := make(chan outcome, 1)
	goSelect(s, context.Background(), "second", Request{PromptTokens: 64}, out)
	waitFor(t, "the second request to queue", func() bool { return s.Stats().Waiting == 1 })
	select {
	case o := <-out:
		t.Fatalf("second request admitted while the worker is busy: %+v", o)
	case <-time.After(20 * time.Millisecond):
	}
	first.PrefillDone() // the first token frees the prefill budget
	o := <-out
	if o.err != nil || o.d.Queued <= 0 || !o.res.Booked() {
		t.Fatalf("after the first token: %+v", o)
	}
	first.Release()
	o.res.Release()
	requireZeroLoad(t, s)
	if st := s.Stats(); st.Queued != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueOrdersByPriorityThenArrival(t *testing.T) {
	s := newTestScheduler(t, 1, busyConfig())
	var blocker Reservation
	mustSelect(t, s, &Request{PromptTokens: 64}, &blocker)
	out := make(chan outcome, 8)
	arrivals := []struct {
		name string
		prio int32
	}{{"a", 0}, {"b", 0}, {"c", 5}, {"d", 0}, {"e", -1}, {"f", 0}}
	for i, a := range arrivals {
		goSelect(s, context.Background(), a.name, Request{PromptTokens: 64, Priority: a.prio}, out)
		waitFor(t, a.name+" to queue", func() bool { return s.Stats().Waiting == i+1 })
	}
	// One request at a time fits: each admitted one holds the worker busy
	// until the test releases it.
	blocker.Release()
	var order string
	for range arrivals {
		o := <-out
		if o.err != nil {
			t.Fatal(o.err)
		}
		order += o.name
		o.res.Release()
	}
	// c's priority 5 moves it 5 s ahead; e's −1 puts it 1 s behind f.
	if order != "cabdfe" {
		t.Fatalf("admission order %q, want %q", order, "cabdfe")
	}
	requireZeroLoad(t, s)
}

func TestQueueFullRefusesWithRetryHint(t *testing.T) {
	s := newTestScheduler(t, 1, Config{
		Busy: BusyThresholds{PrefillTokens: 50}, QueueCapacity: 2,
		RetryAfterMin: 2 * time.Second, RetryAfterMax: 9 * time.Second,
	})
	var blocker Reservation
	mustSelect(t, s, &Request{PromptTokens: 64}, &blocker)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan outcome, 2)
	for i := range 2 {
		goSelect(s, ctx, "queued", Request{PromptTokens: 64}, out)
		waitFor(t, "queueing", func() bool { return s.Stats().Waiting == i+1 })
	}
	var res Reservation
	_, err := s.Select(context.Background(), &Request{PromptTokens: 64}, &res)
	var oe *OverloadError
	if !errors.Is(err, ErrOverloaded) || !errors.As(err, &oe) {
		t.Fatalf("full queue: %v", err)
	}
	if oe.RetryAfter != 2*time.Second || oe.Waiting != 2 || res.Booked() {
		t.Fatalf("overload %+v (booked %v)", oe, res.Booked())
	}
	if st := s.Stats(); st.Refused != 1 {
		t.Fatalf("stats %+v", st)
	}
	cancel()
	for range 2 {
		if o := <-out; !errors.Is(o.err, context.Canceled) || o.res.Booked() {
			t.Fatalf("cancelled waiter: %+v", o)
		}
	}
	blocker.Release()
	requireZeroLoad(t, s)
}

func TestRetryHintFollowsObservedWaits(t *testing.T) {
	s := newTestScheduler(t, 1, Config{Busy: BusyThresholds{PrefillTokens: 50}, QueueCapacity: -1})
	s.waitEWMA.Store(int64(4200 * time.Millisecond))
	var blocker Reservation
	mustSelect(t, s, &Request{PromptTokens: 64}, &blocker)
	var oe *OverloadError
	_, err := s.Select(context.Background(), &Request{PromptTokens: 1}, new(Reservation))
	if !errors.As(err, &oe) || oe.RetryAfter != 5*time.Second {
		t.Fatalf("with a 4.2 s typical wait: %v", err)
	}
	s.waitEWMA.Store(int64(time.Hour))
	if _, err := s.Select(context.Background(), &Request{PromptTokens: 1}, new(Reservation)); !errors.As(err, &oe) || oe.RetryAfter != DefaultRetryAfterMax {
		t.Fatalf("with an hour's wait: %v", err)
	}
	blocker.Release()
}

func TestCancelledWaiterLeavesNothingBehind(t *testing.T) {
	s := newTestScheduler(t, 1, busyConfig())
	var blocker Reservation
	mustSelect(t, s, &Request{PromptTokens: 64}, &blocker)
	for _, mk := range []func() (context.Context, context.CancelFunc){
		func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
		func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 5*time.Millisecond)
		},
	} {
		ctx, cancel := mk()
		out := make(chan outcome, 1)
		goSelect(s, ctx, "w", Request{PromptTokens: 64}, out)
		waitFor(t, "queueing", func() bool { return s.Stats().Waiting == 1 })
		cancel()
		o := <-out
		if !errors.Is(o.err, context.Canceled) && !errors.Is(o.err, context.DeadlineExceeded) || o.res.Booked() {
			t.Fatalf("cancelled waiter: %+v", o)
		}
		if st := s.Stats(); st.Waiting != 0 || s.queue.len() != 0 {
			t.Fatalf("after cancel: %+v, queue %d", st, s.queue.len())
		}
	}
	blocker.Release()
	// Nothing stale in the queue holds the next request back.
	var res Reservation
	if d := mustSelect(t, s, &Request{PromptTokens: 64}, &res); d.Queued != 0 {
		t.Fatalf("queued behind nobody: %+v", d)
	}
	res.Release()
	requireZeroLoad(t, s)
}

func TestNoQueueRefusesAtOnce(t *testing.T) {
	s := newTestScheduler(t, 2, Config{Busy: BusyThresholds{PrefillTokens: 50}, QueueCapacity: -1})
	var a, b Reservation
	mustSelect(t, s, &Request{PromptTokens: 64}, &a)
	mustSelect(t, s, &Request{PromptTokens: 64}, &b)
	if a.Slot() == b.Slot() {
		t.Fatal("second request went to the busy worker")
	}
	if _, err := s.Select(context.Background(), &Request{PromptTokens: 1}, new(Reservation)); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("all busy, no queue: %v", err)
	}
	a.Release()
	b.Release()
	requireZeroLoad(t, s)
}

func TestWaitersSeeWorkerSetAndThresholdChanges(t *testing.T) {
	s := newTestScheduler(t, 2, busyConfig())
	var b0, b1 Reservation
	mustSelect(t, s, &Request{PromptTokens: 64, Pinned: true, PinWorker: 100}, &b0)
	mustSelect(t, s, &Request{PromptTokens: 64, Pinned: true, PinWorker: 101}, &b1)
	out := make(chan outcome, 3)
	goSelect(s, context.Background(), "pinned0", Request{PromptTokens: 64, Pinned: true, PinWorker: 100}, out)
	waitFor(t, "queueing", func() bool { return s.Stats().Waiting == 1 })
	goSelect(s, context.Background(), "any", Request{PromptTokens: 64, Model: "m"}, out)
	waitFor(t, "queueing", func() bool { return s.Stats().Waiting == 2 })

	// A new worker for the model admits the unpinned waiter only.
	if err := s.Upsert(WorkerInfo{ID: 200, Slot: 9, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	o := <-out
	if o.name != "any" || o.err != nil || o.d.Slot != 9 {
		t.Fatalf("after a worker joined: %+v", o)
	}
	o.res.Release()

	// Removing the pinned waiter's worker fails it: the pin is gone.
	s.Remove(0)
	o = <-out
	if o.name != "pinned0" || !errors.Is(o.err, ErrPinnedWorkerNotFound) {
		t.Fatalf("after its worker left: %+v", o)
	}

	// Raising the threshold admits a waiter without any release.
	goSelect(s, context.Background(), "raised", Request{PromptTokens: 64, Pinned: true, PinWorker: 101}, out)
	waitFor(t, "queueing", func() bool { return s.Stats().Waiting == 1 })
	if err := s.SetBusyThresholds(BusyThresholds{PrefillTokens: 100}); err != nil {
		t.Fatal(err)
	}
	o = <-out
	if o.name != "raised" || o.err != nil {
		t.Fatalf("after raising the threshold: %+v", o)
	}
	o.res.Release()
	b0.Release()
	b1.Release()
	requireZeroLoad(t, s)
}

func TestArrivalsJoinTheQueueButPassBlockedWaiters(t *testing.T) {
	s := newTestScheduler(t, 2, busyConfig())
	var b0 Reservation
	mustSelect(t, s, &Request{PromptTokens: 64, Pinned: true, PinWorker: 100}, &b0)
	out := make(chan outcome, 2)
	goSelect(s, context.Background(), "pinned0", Request{PromptTokens: 64, Pinned: true, PinWorker: 100}, out)
	waitFor(t, "queueing", func() bool { return s.Stats().Waiting == 1 })
	// Worker 1 is free: an unpinned arrival goes through the queue (FCFS)
	// but is admitted at once, past the waiter that cannot move.
	var res Reservation
	d := mustSelect(t, s, &Request{PromptTokens: 64}, &res)
	if d.Slot != 1 {
		t.Fatalf("arrival went to slot %d", d.Slot)
	}
	res.Release()
	b0.Release()
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	o.res.Release()
	requireZeroLoad(t, s)
}

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
