package sched

import (
	"context"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// newTestScheduler returns a scheduler with workers in slots 0..n-1
// (worker id 100+slot, rank 0, model "m") and a fixed seed.
func newTestScheduler(t testing.TB, n int, cfg Config) *Scheduler {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = 42
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := s.Upsert(WorkerInfo{
			ID: 100 + uint64(i), Slot: workers.Slot(i), Model: "m",
			Endpoint: "http://127.0.0.1:1", KVCapacityBlocks: 1000,
		}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// prompt returns n distinct block hashes sharing their first shared with
// prefix (a chained prompt's hashes are unique per prefix, so two prompts
// share exactly their common leading blocks).
func prompt(prefix uint64, shared int, suffix uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		if i < shared {
			h[i] = prefix<<32 | uint64(i) + 1
		} else {
			h[i] = suffix<<32 | uint64(i) + 1 | 1<<63
		}
	}
	return h
}

// requireZeroLoad fails unless every slot's bookings are back to zero and
// the table holds no reference.
func requireZeroLoad(t testing.TB, s *Scheduler) {
	t.Helper()
	for w := range workers.Slot(workers.Max) {
		if l := s.Load(w); l.ActiveBlocks != 0 || l.PrefillTokens != 0 || l.Requests != 0 || l.OutputBlocks != 0 {
			t.Errorf("slot %d: load left after every release: %+v", w, l)
		}
	}
	if st := s.Stats(); st.ActiveEntries != 0 || st.DeepShares != 0 || st.Waiting != 0 || st.Booked != st.Released {
		t.Errorf("stats after every release: %+v", st)
	}
}

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

// len is how many requests are queued or between queue and admission.
func (q *admissionQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.list) + q.transit
}
