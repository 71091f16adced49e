package guard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// TestSpec runs the lifecycle specs in testdata/: one guard at a time on a
// scheduler with one worker (slot 0), stepped by commands, with the
// guard's state and abort reason, the step's error, the worker's booked
// load and what the observer saw printed after every step. Commands:
//
//	new [track]                        a fresh scheduler and guard; track books output blocks
//	select tokens=T [blocks=B] [expect=E]
//	select-missing-pin                 Select pinned to a rank that does not exist
//	dispatch | dispatch-fail | close | release
//	item tokens=N [finish=stop|eos|length|error]
//	abort reason=R [async]             async aborts from another goroutine
//	panic                              a handler panics with Release deferred
//
// Any step takes `stale` to run on the handle of the previous lifecycle.
// A release reports on the handle it retired and acquires a fresh one.
// Each scenario must end with no load booked. Regenerate the expectations
// after an intended change with
//
//	go test ./guard -run TestSpec -rewrite
func TestSpec(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var sc *scenario
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
				sc = newScenario(t, d)
				return ""
			}
			if sc == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			return sc.step(t, d)
		})
	})
}

// scenario is one spec's world: the scheduler, the pool, the live handle
// and the one retired before it, and the observer's log.
type scenario struct {
	pos      string
	sched    *sched.Scheduler
	pool     *Pool
	live     Handle
	previous Handle
	events   []string
}

func newScenario(t *testing.T, d *datadriven.TestData) *scenario {
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = d.HasArg("track")
	s, err := sched.New(sched.Config{Seed: 1, Cost: &cost})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Upsert(sched.WorkerInfo{ID: 1, Slot: 0, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	sc := &scenario{pos: d.Pos, sched: s}
	sc.pool = NewPool(s, Observer{Finished: func(e Event) {
		sc.events = append(sc.events, fmt.Sprintf("finished %s reason=%s prompt=%d output=%d",
			e.State, e.Reason, e.PromptTokens, e.OutputTokens))
	}})
	sc.live = sc.pool.Acquire()
	return sc
}

// finish releases the live guard and fails unless the scenario left no
// load behind.
func (sc *scenario) finish(t *testing.T) {
	t.Helper()
	if err := sc.live.Release(); err != nil {
		t.Errorf("%s: releasing the last guard: %v", sc.pos, err)
	}
	for w := range workers.Slot(workers.Max) {
		if l := sc.sched.Load(w); l.Requests != 0 || l.ActiveBlocks != 0 || l.PrefillTokens != 0 || l.OutputBlocks != 0 {
			t.Errorf("%s: the scenario left load on slot %d: %+v", sc.pos, w, l)
		}
	}
}

func (sc *scenario) step(t *testing.T, d *datadriven.TestData) string {
	target := sc.live
	stale := d.HasArg("stale")
	if stale {
		target = sc.previous
	}
	sc.events = sc.events[:0]
	var out strings.Builder
	var err error
	switch d.Cmd {
	case "select":
		var tokens, blocks, expect int
		d.ScanArgs(t, "tokens", &tokens)
		d.MaybeScanArgs(t, "blocks", &blocks)
		d.MaybeScanArgs(t, "expect", &expect)
		req := sched.Request{Hashes: specHashes(d.Pos, blocks), PromptTokens: tokens, ExpectedOutputTokens: expect}
		_, err = target.Select(context.Background(), &req)
	case "select-missing-pin":
		req := sched.Request{PromptTokens: 1, Pinned: true, PinWorker: 1, PinRank: 3}
		_, err = target.Select(context.Background(), &req)
	case "dispatch":
		err = target.Dispatched()
	case "dispatch-fail":
		err = target.DispatchFailed()
	case "item":
		var tokens int
		finish := FinishNone
		d.ScanArgs(t, "tokens", &tokens)
		if d.HasArg("finish") {
			var name string
			d.ScanArgs(t, "finish", &name)
			finish = parseFinish(t, d, name)
		}
		err = target.OnItem(tokens, finish)
	case "close":
		err = target.Close()
	case "abort":
		var name string
		d.ScanArgs(t, "reason", &name)
		reason := parseReason(t, d, name)
		if d.HasArg("async") {
			done := make(chan error)
			go func() { done <- target.Abort(reason) }()
			err = <-done
		} else {
			err = target.Abort(reason)
		}
	case "panic":
		recovered := func() (p any) {
			defer func() { p = recover() }()
			defer target.Release()
			panic("handler bug")
		}()
		fmt.Fprintf(&out, "recovered: %v\n", recovered)
	case "release":
		err = target.Release()
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	// The report is about the live handle, except after a release (or a
	// panic unwinding through one), which reports on the handle it retired
	// (reading Free) and puts a fresh guard in its place.
	subject := sc.live
	if !stale && (d.Cmd == "release" || d.Cmd == "panic") {
		sc.previous, sc.live = sc.live, sc.pool.Acquire()
	}
	sc.report(&out, subject, err)
	return out.String()
}

func (sc *scenario) report(out *strings.Builder, subject Handle, err error) {
	out.WriteString(subject.State().String())
	if r := subject.Reason(); r != ReasonNone {
		fmt.Fprintf(out, " reason=%s", r)
	}
	out.WriteByte('\n')
	if err != nil {
		fmt.Fprintf(out, "error: %s\n", errorClass(err))
	}
	l := sc.sched.Load(0)
	fmt.Fprintf(out, "load: blocks=%d prefill=%d requests=%d output=%s\n",
		l.ActiveBlocks, l.PrefillTokens, l.Requests, strconv.FormatFloat(l.OutputBlocks, 'g', 4, 64))
	for _, e := range sc.events {
		fmt.Fprintf(out, "event: %s\n", e)
	}
}

// errorClass names err by the sentinel it wraps, so that specs state which
// error a step returns, not how its message is worded.
func errorClass(err error) string {
	var te *TransitionError
	switch {
	case errors.As(err, &te):
		return fmt.Sprintf("illegal transition %s → %s", te.From, te.To)
	case errors.Is(err, ErrStale):
		return "stale handle"
	case errors.Is(err, ErrAborted):
		return "aborted"
	case errors.Is(err, sched.ErrPinnedWorkerNotFound):
		return "pinned worker not found"
	}
	return "unexpected: " + err.Error()
}

// specHashes gives each select its own n block hashes, derived from where
// the command sits in the spec.
func specHashes(pos string, n int) []uint64 {
	seed := uint64(0)
	for _, c := range pos {
		seed = seed*131 + uint64(c)
	}
	return hashes(seed&(1<<40-1), n)
}

func hashes(seed uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = seed<<20 | uint64(i) + 1
	}
	return h
}

func parseReason(t *testing.T, d *datadriven.TestData, s string) Reason {
	for r := range Reason(len(reasonNames)) {
		if r.String() == s {
			return r
		}
	}
	d.Fatalf(t, "unknown reason %q", s)
	return 0
}

func parseFinish(t *testing.T, d *datadriven.TestData, s string) Finish {
	for f := range Finish(len(finishNames)) {
		if f.String() == s {
			return f
		}
	}
	d.Fatalf(t, "unknown finish %q", s)
	return 0
}
