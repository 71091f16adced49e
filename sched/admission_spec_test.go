package sched

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/kvfast/kvfast/workers"
)

// TestAdmissionSpec runs the admission specs in testdata/admission*: named
// requests go through Select on their own goroutines, and after every
// step the spec shows which of them came back (admitted, refused, failed)
// and the admission queue in wake order. A step returns once the scheduler
// is quiet: every request not yet back sits in the queue and nobody is
// woken. Commands:
//
//	new workers=N [busy-prefill=T] [queue=C] [retry-min=D] [retry-max=D]
//	                                      workers in slots 0..N-1, ids 100+slot, model m
//	select name=X [tokens=T] [prio=P] [pin=ID] [model=M]
//	first-token name=X | release name=X   progress of an admitted request
//	cancel name=X [deadline]              end a queued request's context (deadline: as a timeout)
//	upsert id=ID slot=S [model=M] | remove slot=S
//	set-busy prefill=T                    new busy thresholds
//	typical-wait d=D                      what the retry hint has observed so far
//	stats
//
// Each scenario must end with no load and an empty queue. Regenerate the
// expectations after an intended change with
//
//	go test ./sched -run TestAdmissionSpec -rewrite
func TestAdmissionSpec(t *testing.T) {
	paths, err := filepath.Glob("testdata/admission*")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no admission specs: %v", err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) { runAdmissionSpec(t, path) })
	}
}

func runAdmissionSpec(t *testing.T, path string) {
	var sc *admissionScenario
	defer func() {
		if sc != nil {
			sc.finish(t)
		}
	}()
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd == "new" {
			if sc != nil {
				sc.finish(t)
			}
			sc = newAdmissionScenario(t, d)
			return ""
		}
		if sc == nil {
			d.Fatalf(t, "%s before new", d.Cmd)
		}
		return sc.step(t, d)
	})
}

type admissionScenario struct {
	pos      string
	s        *Scheduler
	held     map[string]*Reservation            // admitted, holding load
	pending  map[string]context.CancelCauseFunc // out in Select; ends its context
	names    map[uint64]string                  // waiter seq → request name
	outcomes chan outcome
}

func newAdmissionScenario(t *testing.T, d *datadriven.TestData) *admissionScenario {
	var workers int
	var cfg Config
	d.ScanArgs(t, "workers", &workers)
	d.MaybeScanArgs(t, "busy-prefill", &cfg.Busy.PrefillTokens)
	d.MaybeScanArgs(t, "queue", &cfg.QueueCapacity)
	cfg.RetryAfterMin = durationArg(t, d, "retry-min")
	cfg.RetryAfterMax = durationArg(t, d, "retry-max")
	return &admissionScenario{
		pos:      d.Pos,
		s:        newTestScheduler(t, workers, cfg),
		held:     map[string]*Reservation{},
		pending:  map[string]context.CancelCauseFunc{},
		names:    map[uint64]string{},
		outcomes: make(chan outcome, 64),
	}
}

func durationArg(t *testing.T, d *datadriven.TestData, key string) time.Duration {
	var s string
	if !d.MaybeScanArgs(t, key, &s) {
		return 0
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", key, err)
	}
	return v
}

// finish ends every request still queued, releases every booking, and
// fails unless that leaves the scheduler empty.
func (sc *admissionScenario) finish(t *testing.T) {
	t.Helper()
	var cancelled []string
	for name, cancel := range sc.pending {
		cancel(context.Canceled)
		cancelled = append(cancelled, name)
	}
	sc.settle(t, cancelled...)
	for _, res := range sc.held {
		res.Release()
	}
	sc.held = nil
	for w := range workers.Slot(workers.Max) {
		if l := sc.s.Load(w); l.ActiveBlocks != 0 || l.PrefillTokens != 0 || l.Requests != 0 || l.OutputBlocks != 0 {
			t.Errorf("%s: the scenario left load on slot %d: %+v", sc.pos, w, l)
		}
	}
	if st := sc.s.Stats(); st.Waiting != 0 || st.Booked != st.Released || sc.s.queue.len() != 0 {
		t.Errorf("%s: the scenario left the scheduler busy: %+v, queue %d", sc.pos, st, sc.s.queue.len())
	}
}

func (sc *admissionScenario) step(t *testing.T, d *datadriven.TestData) string {
	var out strings.Builder
	var name string
	if d.HasArg("name") {
		d.ScanArgs(t, "name", &name)
	}
	switch d.Cmd {
	case "select":
		if sc.held[name] != nil || sc.pending[name] != nil {
			d.Fatalf(t, "request %s is still live", name)
		}
		req := Request{PromptTokens: 64}
		var pin uint64
		d.MaybeScanArgs(t, "tokens", &req.PromptTokens)
		d.MaybeScanArgs(t, "prio", &req.Priority)
		d.MaybeScanArgs(t, "model", &req.Model)
		if d.MaybeScanArgs(t, "pin", &pin) {
			req.Pinned, req.PinWorker = true, pin
		}
		ctx, cancel := context.WithCancelCause(context.Background())
		sc.pending[name] = cancel
		goSelect(sc.s, ctx, name, req, sc.outcomes)
		back := sc.settle(t)
		if _, queued := sc.pending[name]; queued {
			sc.nameNewWaiter(t, name)
		}
		sc.report(&out, back)
	case "first-token":
		sc.admitted(t, d, name).PrefillDone()
		sc.report(&out, sc.settle(t))
	case "release":
		sc.admitted(t, d, name).Release()
		delete(sc.held, name)
		sc.report(&out, sc.settle(t))
	case "cancel":
		cancel := sc.pending[name]
		if cancel == nil {
			d.Fatalf(t, "request %s is not queued", name)
		}
		cause := context.Canceled
		if d.HasArg("deadline") {
			cause = context.DeadlineExceeded
		}
		cancel(cause)
		sc.report(&out, sc.settle(t, name))
	case "upsert":
		var id uint64
		var slot int
		model := "m"
		d.ScanArgs(t, "id", &id)
		d.ScanArgs(t, "slot", &slot)
		d.MaybeScanArgs(t, "model", &model)
		if err := sc.s.Upsert(WorkerInfo{ID: id, Slot: workers.Slot(slot), Model: model, KVCapacityBlocks: 1000}); err != nil {
			d.Fatalf(t, "%v", err)
		}
		sc.report(&out, sc.settle(t))
	case "remove":
		var slot int
		d.ScanArgs(t, "slot", &slot)
		sc.s.Remove(workers.Slot(slot))
		sc.report(&out, sc.settle(t))
	case "set-busy":
		var b BusyThresholds
		d.ScanArgs(t, "prefill", &b.PrefillTokens)
		if err := sc.s.SetBusyThresholds(b); err != nil {
			d.Fatalf(t, "%v", err)
		}
		sc.report(&out, sc.settle(t))
	case "typical-wait":
		sc.s.waitEWMA.Store(int64(durationArg(t, d, "d")))
	case "stats":
		st := sc.s.Stats()
		fmt.Fprintf(&out, "queued=%d refused=%d waiting=%d\n", st.Queued, st.Refused, st.Waiting)
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return out.String()
}

func (sc *admissionScenario) admitted(t *testing.T, d *datadriven.TestData, name string) *Reservation {
	res := sc.held[name]
	if res == nil {
		d.Fatalf(t, "request %s holds no booking", name)
	}
	return res
}

// settle waits until the requests named have come back and the scheduler
// is quiet — every request not yet back is in the queue and nobody is
// woken — and returns the outcomes that came back meanwhile, sorted by
// name. (A cancelled request sits in the queue until its goroutine
// notices, which is why it must be named.)
//
// A request that has just pushed itself into the queue still runs an
// admission pass before it blocks, which may wake another. settle runs
// that pass itself once the queue looks quiet: a pass is idempotent (it
// wakes exactly who can be placed now), so if it wakes nobody, the
// request's own pass will not either.
func (sc *admissionScenario) settle(t *testing.T, awaited ...string) []outcome {
	t.Helper()
	var back []outcome
	deadline := time.Now().Add(10 * time.Second)
	for {
		for drained := false; !drained; {
			select {
			case o := <-sc.outcomes:
				delete(sc.pending, o.name)
				if o.err == nil {
					sc.held[o.name] = o.res
				}
				back = append(back, o)
			default:
				drained = true
			}
		}
		if sc.quiet(awaited) {
			sc.s.admit()
			if sc.quiet(awaited) {
				slices.SortFunc(back, func(a, b outcome) int { return strings.Compare(a.name, b.name) })
				return back
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the scheduler never settled: %d requests out, stats %+v", sc.pos, len(sc.pending), sc.s.Stats())
		}
		time.Sleep(50 * time.Microsecond)
	}
}

func (sc *admissionScenario) quiet(awaited []string) bool {
	for _, name := range awaited {
		if sc.pending[name] != nil {
			return false
		}
	}
	q := &sc.s.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.transit == 0 && len(q.list) == len(sc.pending)
}

// nameNewWaiter gives the one waiter without a name the name of the
// request that has just queued.
func (sc *admissionScenario) nameNewWaiter(t *testing.T, name string) {
	q := &sc.s.queue
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.list {
		if _, ok := sc.names[w.seq]; !ok {
			sc.names[w.seq] = name
			return
		}
	}
	t.Fatalf("%s: request %s is out but not in the queue", sc.pos, name)
}

func (sc *admissionScenario) report(out *strings.Builder, back []outcome) {
	for _, o := range back {
		fmt.Fprintf(out, "%s: %s\n", o.name, describeOutcome(o))
	}
	q := &sc.s.queue
	q.mu.Lock()
	var names []string
	for _, w := range q.list {
		names = append(names, sc.names[w.seq])
	}
	q.mu.Unlock()
	if len(names) == 0 {
		out.WriteString("queue: empty\n")
	} else {
		fmt.Fprintf(out, "queue: %s\n", strings.Join(names, " "))
	}
}

func describeOutcome(o outcome) string {
	var oe *OverloadError
	switch {
	case o.err == nil && o.d.Queued > 0:
		return fmt.Sprintf("admitted on slot %d after queueing", o.d.Slot)
	case o.err == nil:
		return fmt.Sprintf("admitted on slot %d", o.d.Slot)
	case errors.As(o.err, &oe):
		return fmt.Sprintf("refused as overloaded (retry after %s)", oe.RetryAfter)
	case errors.Is(o.err, context.DeadlineExceeded):
		return "timed out in the queue"
	case errors.Is(o.err, context.Canceled):
		return "cancelled in the queue"
	case errors.Is(o.err, ErrPinnedWorkerNotFound):
		return "failed: pinned worker not found"
	case errors.Is(o.err, ErrNoEligibleWorker):
		return "failed: no eligible worker"
	}
	return "unexpected error: " + o.err.Error()
}
