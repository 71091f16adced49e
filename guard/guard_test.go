package guard

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

func newTestPool(t testing.TB, nWorkers int, cfg sched.Config, obs Observer) (*Pool, *sched.Scheduler) {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = 3
	}
	s, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range nWorkers {
		if err := s.Upsert(sched.WorkerInfo{ID: uint64(i), Slot: workers.Slot(i), Model: "m", KVCapacityBlocks: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	return NewPool(s, obs), s
}

func requireNoLoad(t testing.TB, s *sched.Scheduler) {
	t.Helper()
	for w := range workers.Slot(workers.Max) {
		if l := s.Load(w); l.ActiveBlocks != 0 || l.PrefillTokens != 0 || l.Requests != 0 || l.OutputBlocks != 0 {
			t.Fatalf("slot %d: load left: %+v", w, l)
		}
	}
	if st := s.Stats(); st.Booked != st.Released || st.Waiting != 0 || st.ActiveEntries != 0 {
		t.Fatalf("scheduler stats: %+v", st)
	}
}

func TestRecycledGuardRefusesItsOldHandle(t *testing.T) {
	pool, s := newTestPool(t, 1, sched.Config{}, Observer{})
	old := pool.Acquire()
	if _, err := old.Select(context.Background(), &sched.Request{PromptTokens: 16}); err != nil {
		t.Fatal(err)
	}
	if err := old.Release(); err != nil {
		t.Fatal(err)
	}
	// The pool hands the same guard back on this goroutine; if the
	// runtime chose otherwise, the old handle is still stale.
	cur := pool.Acquire()
	defer cur.Release()
	if _, err := cur.Select(context.Background(), &sched.Request{PromptTokens: 16}); err != nil {
		t.Fatal(err)
	}
	if cur.g != old.g {
		t.Log("pool returned a different guard; checking staleness only")
	}
	for name, err := range map[string]error{
		"Dispatched":     old.Dispatched(),
		"DispatchFailed": old.DispatchFailed(),
		"OnItem":         old.OnItem(1, FinishStop),
		"Close":          old.Close(),
		"Abort":          old.Abort(ReasonClientCancel),
		"Release":        old.Release(),
	} {
		if !errors.Is(err, ErrStale) {
			t.Errorf("%s on a released handle: %v", name, err)
		}
	}
	if _, err := old.Select(context.Background(), &sched.Request{PromptTokens: 16}); !errors.Is(err, ErrStale) {
		t.Errorf("Select on a released handle: %v", err)
	}
	if old.State() != Free || old.Reason() != ReasonNone {
		t.Error("a stale handle reads the new request's state")
	}
	if cur.State() != Selected || s.Load(0).Requests != 1 {
		t.Fatalf("the stale calls disturbed the live request: %s, %+v", cur.State(), s.Load(0))
	}
	var zero Handle
	if err := zero.Abort(ReasonTimeout); !errors.Is(err, ErrStale) || zero.State() != Free {
		t.Errorf("zero handle: %v", err)
	}
}

func TestAbortWhileSelectionWaits(t *testing.T) {
	pool, s := newTestPool(t, 1, sched.Config{Busy: sched.BusyThresholds{PrefillTokens: 50}}, Observer{})
	blocker := pool.Acquire()
	if _, err := blocker.Select(context.Background(), &sched.Request{PromptTokens: 64}); err != nil {
		t.Fatal(err)
	}
	h := pool.Acquire()
	done := make(chan error)
	go func() {
		_, err := h.Select(context.Background(), &sched.Request{PromptTokens: 64})
		done <- err
	}()
	for s.Stats().Waiting == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	if err := h.Abort(ReasonClientCancel); err != nil {
		t.Fatal(err)
	}
	// The worker frees up; the waiting selection books, finds its guard
	// aborted, and gives the booking back itself.
	if err := blocker.Release(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrAborted) {
		t.Fatalf("selection of an aborted guard: %v", err)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	requireNoLoad(t, s)
}

// TestAbortRacesRelay aborts from another goroutine while the relay is
// mid-stream, many times, and checks the load is released exactly once
// and reported exactly once.
func TestAbortRacesRelay(t *testing.T) {
	var finished atomic.Int64
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = true
	pool, s := newTestPool(t, 2, sched.Config{Cost: &cost}, Observer{Finished: func(Event) { finished.Add(1) }})
	h0 := hashes(1, 8)
	rounds := 3000
	if testing.Short() || raceEnabled {
		rounds = 300
	}
	for i := range rounds {
		h := pool.Acquire()
		if _, err := h.Select(context.Background(), &sched.Request{Hashes: h0, PromptTokens: 130, ExpectedOutputTokens: 200}); err != nil {
			t.Fatal(err)
		}
		if err := h.Dispatched(); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range i % 50 {
				_ = s.Load(0) // let the relay get ahead by a varying amount
			}
			if err := h.Abort(ReasonClientCancel); err != nil {
				t.Error(err)
			}
		}()
		for k := 1; ; k++ {
			if err := h.OnItem(3, FinishNone); err != nil {
				if !errors.Is(err, ErrAborted) {
					t.Fatal(err)
				}
				break
			}
			if k%16 == 0 {
				runtime.Gosched() // on a loaded machine the canceller may share this P
			}
		}
		wg.Wait()
		if h.State() != Aborted || h.Reason() != ReasonClientCancel {
			t.Fatalf("after the race: %s %s", h.State(), h.Reason())
		}
		if err := h.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if finished.Load() != int64(rounds) {
		t.Fatalf("%d finished events for %d dispatched requests", finished.Load(), rounds)
	}
	requireNoLoad(t, s)
}

func TestSelectRefusesQueryOnly(t *testing.T) {
	pool, _ := newTestPool(t, 1, sched.Config{}, Observer{})
	h := pool.Acquire()
	defer h.Release()
	if _, err := h.Select(context.Background(), &sched.Request{QueryOnly: true}); !errors.Is(err, sched.ErrInvalidRequest) {
		t.Fatalf("query-only through a guard: %v", err)
	}
}
