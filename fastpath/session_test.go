package fastpath

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kvfast/kvfast/dispatch"
	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/shm"
	"github.com/kvfast/kvfast/workers"
)

// A bound worker whose requests waited past the stall time unanswered (an
// engine that hangs while passing /health) loses its sessions, also when
// the clients gave up on every request before the stall time: a session
// pinned there timed out request after request until its TTL.
func TestStickyLeavesAStalledWorker(t *testing.T) {
	index, _ := radix.NewHeap(radix.Config{Capacity: 1 << 10})
	approx, _ := radix.NewApprox(radix.Config{Capacity: 1 << 10}, time.Minute)
	cost := sched.DefaultCostParams()
	cost.StallAfter = time.Millisecond
	sc, err := sched.New(sched.Config{Cost: &cost})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(5)
	if err := sc.Upsert(sched.WorkerInfo{ID: 9, Slot: slot, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	pool := dispatch.NewPool(dispatch.DefaultConfig())
	t.Cleanup(pool.Close)
	s, err := New(DefaultConfig(), Deps{Index: index, Approx: approx, Sched: sc, Engines: pool, State: frontState{"kv"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	ex := &exchange{s: s}
	b := shm.Binding{WorkerID: 9}
	if got := s.sessions.ineligible(ex, b); got != "" {
		t.Fatalf("an idle worker: %q", got)
	}
	// One request waits on it, unanswered, past the stall time, and is
	// given up on: nothing waits any more, and the next look still sees
	// the stall.
	var r sched.Reservation
	if _, err := sc.Select(context.Background(), &sched.Request{Hashes: []uint64{1, 2}, PromptTokens: 32}, &r); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !sc.Load(slot).Stalled; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiting request never made the worker stalled")
		}
	}
	r.Release()
	if got := s.sessions.ineligible(ex, b); got != unbindStalled {
		t.Fatalf("a worker whose last request waited past the stall time: %q, want %q", got, unbindStalled)
	}
}

// A busy bound worker keeps its sessions through a transient overload and
// loses them only once it has stayed busy for BusyUnbindAfter, as this
// router's selections saw it (sched's TestBusyStretch has the stretch's
// rules); a recovery longer than a dip starts the count again.
func TestStickyBusyUnbindNeedsSustainedOverload(t *testing.T) {
	index, _ := radix.NewHeap(radix.Config{Capacity: 1 << 10})
	approx, _ := radix.NewApprox(radix.Config{Capacity: 1 << 10}, time.Minute)
	sc, err := sched.New(sched.Config{Busy: sched.BusyThresholds{DecodeBlocksFraction: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	const slot = workers.Slot(5)
	if err := sc.Upsert(sched.WorkerInfo{ID: 9, Slot: slot, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Sessions.BusyUnbindAfter = 50 * time.Millisecond
	pool := dispatch.NewPool(dispatch.DefaultConfig())
	t.Cleanup(pool.Close)
	s, err := New(cfg, Deps{Index: index, Approx: approx, Sched: sc, Engines: pool, State: frontState{"kv"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	ex := &exchange{s: s}
	b := shm.Binding{WorkerID: 9}
	busyFor := func() time.Duration {
		t.Helper()
		sc.SetEngineLoad(slot, 0, 0, 90, 100) // KV 90% used: busy
		start := time.Now()
		for deadline := start.Add(10 * time.Second); time.Now().Before(deadline); {
			if got := s.sessions.ineligible(ex, b); got == unbindBusy {
				return time.Since(start)
			} else if got != "" {
				t.Fatalf("busy worker: ineligible = %q", got)
			}
			time.Sleep(time.Millisecond) // another turn of the session
		}
		t.Fatal("a worker busy for 10 s kept its sessions")
		return 0
	}
	if d := busyFor(); d < cfg.Sessions.BusyUnbindAfter {
		t.Fatalf("unbound after %v busy, before BusyUnbindAfter (%v)", d, cfg.Sessions.BusyUnbindAfter)
	}
	// Recovered, and seen free for longer than a dip (one request ending
	// on a saturated worker, 250 ms at most) but under the second after
	// which an unseen stretch lapses anyway: the free observations reset
	// the count.
	sc.SetEngineLoad(slot, 0, 0, 10, 100)
	for start := time.Now(); time.Since(start) <= 400*time.Millisecond; time.Sleep(10 * time.Millisecond) {
		if got := s.sessions.ineligible(ex, b); got != "" {
			t.Fatalf("recovered worker: ineligible = %q", got)
		}
	}
	if d := busyFor(); d < cfg.Sessions.BusyUnbindAfter {
		t.Fatalf("after a recovery, unbound after %v busy, before BusyUnbindAfter", d)
	}
	sc.SetHealthy(slot, false)
	if got := s.sessions.ineligible(ex, b); got != unbindDown {
		t.Fatalf("unhealthy: %q", got)
	}
	ex.sreq.Model = "other"
	sc.SetHealthy(slot, true)
	if got := s.sessions.ineligible(ex, b); got != unbindModel {
		t.Fatalf("another model: %q", got)
	}
	// A LoRA adapter its engine does not list: its model too, though the
	// front end narrowed the allow-list to the adapter's workers.
	ex.sreq.Model, ex.adapterWorkers = "m", workers.SetOf(slot+1)
	ex.sreq.AllowListed, ex.sreq.Allow = true, ex.adapterWorkers
	if got := s.sessions.ineligible(ex, b); got != unbindModel {
		t.Fatalf("an adapter its engine does not list: %q", got)
	}
	ex.sreq.AllowListed, ex.adapterWorkers = false, 0
	sc.Remove(slot)
	if got := s.sessions.ineligible(ex, b); got != unbindRemoved {
		t.Fatalf("removed: %q", got)
	}
}
