package guard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/sched"
)

// The state machine is specified by scripts: one step per line,
//
//	command [args] -> State [key=value ...]
//
// where the expectations after -> are checked right after the step:
// err= (none, stale, aborted, transition, pin), reason=, and the worker's
// load: blocks= (active prompt blocks), prefill= (tokens), reqs=, out=
// (output blocks). A final "events:" line lists what the observer saw.
//
// Commands:
//
//	select tokens=T [blocks=B] [expect=E]  Select on the test's one worker
//	select-unknown                          Select pinned to a missing rank
//	dispatch | dispatch-fail | close | release
//	item N [stop|eos|length|error]          OnItem(N tokens, finish)
//	abort REASON                            Abort on this goroutine
//	abort-async REASON                      Abort on another goroutine
//	panic                                   a handler panics with Release deferred
//	stale COMMAND                           COMMAND on the handle of the previous lifecycle
var scripts = []struct {
	name   string
	track  bool // track output blocks
	script string
}{
	{name: "completes on a stop item", script: `
		select tokens=64 blocks=4 -> Selected blocks=4 prefill=64 reqs=1
		dispatch                  -> Dispatched blocks=4 prefill=64 reqs=1
		item 1                    -> Dispatched blocks=4 prefill=0 reqs=1
		item 5                    -> Dispatched prefill=0
		item 1 stop               -> Completed blocks=0 prefill=0 reqs=0
		close                     -> Completed err=none
		release                   -> Free
		events: dispatched first finished(Completed,none,stop,7)`},
	{name: "completes on EOS and on length", script: `
		select tokens=16 blocks=1 -> Selected
		dispatch                  -> Dispatched
		item 3 eos                -> Completed reqs=0 blocks=0
		release                   -> Free
		events: dispatched first finished(Completed,none,eos,3)`},
	{name: "a normal close completes", script: `
		select tokens=40 blocks=2 -> Selected blocks=2 prefill=40
		dispatch                  -> Dispatched
		item 2                    -> Dispatched prefill=0
		close                     -> Completed reqs=0 blocks=0
		item 0                    -> Completed err=none
		release                   -> Free
		events: dispatched first finished(Completed,none,none,2)`},
	{name: "finish by length, then a trailing usage item", script: `
		select tokens=16 blocks=1 -> Selected
		dispatch                  -> Dispatched
		item 4 length             -> Completed reqs=0
		item 0                    -> Completed err=none
		release                   -> Free
		events: dispatched first finished(Completed,none,length,4)`},
	{name: "client cancels mid-stream", script: `
		select tokens=64 blocks=4 -> Selected
		dispatch                  -> Dispatched
		item 1                    -> Dispatched prefill=0 blocks=4
		abort client_cancel       -> Aborted reason=client_cancel blocks=0 reqs=0
		item 1                    -> Aborted err=aborted
		close                     -> Aborted err=aborted
		abort timeout             -> Aborted err=none reason=client_cancel
		release                   -> Free
		events: dispatched first finished(Aborted,client_cancel,none,1)`},
	{name: "cancelled from another goroutine", script: `
		select tokens=64 blocks=4 -> Selected
		dispatch                  -> Dispatched
		item 2                    -> Dispatched
		abort-async client_cancel -> Aborted reason=client_cancel blocks=0 prefill=0 reqs=0
		item 2 stop               -> Aborted err=aborted
		release                   -> Free
		events: dispatched first finished(Aborted,client_cancel,none,2)`},
	{name: "cancelled before dispatch reports no metrics", script: `
		select tokens=64 blocks=4 -> Selected reqs=1
		abort client_cancel       -> Aborted reqs=0 blocks=0 prefill=0
		dispatch                  -> Aborted err=aborted
		release                   -> Free
		events:`},
	{name: "dispatch fails", script: `
		select tokens=64 blocks=4 -> Selected reqs=1
		dispatch-fail             -> Aborted reason=dispatch_failed reqs=0 blocks=0 prefill=0
		dispatch                  -> Aborted err=aborted
		release                   -> Free
		events:`},
	{name: "engine error item", script: `
		select tokens=64 blocks=4 -> Selected
		dispatch                  -> Dispatched
		item 3                    -> Dispatched
		item 0 error              -> Aborted reason=engine_error reqs=0 blocks=0
		release                   -> Free
		events: dispatched first finished(Aborted,engine_error,error,3)`},
	{name: "timeout before the first token releases prefill too", script: `
		select tokens=64 blocks=4 -> Selected prefill=64
		dispatch                  -> Dispatched prefill=64
		abort timeout             -> Aborted reason=timeout prefill=0 blocks=0 reqs=0
		release                   -> Free
		events: dispatched finished(Aborted,timeout,none,0)`},
	{name: "handler panics", script: `
		select tokens=64 blocks=4 -> Selected
		dispatch                  -> Dispatched
		item 2                    -> Dispatched
		panic                     -> Free reqs=0 blocks=0 prefill=0
		events: dispatched first finished(Aborted,panic,none,2)`},
	{name: "stream dropped without close", script: `
		select tokens=64 blocks=4 -> Selected
		dispatch                  -> Dispatched
		item 2                    -> Dispatched
		release                   -> Free reqs=0 blocks=0 prefill=0
		events: dispatched first finished(Aborted,dropped,none,2)`},
	{name: "dropped before dispatch", script: `
		select tokens=64 blocks=4 -> Selected reqs=1
		release                   -> Free reqs=0 blocks=0 prefill=0
		events:`},
	{name: "selection fails", script: `
		select-unknown            -> Acquired err=pin reqs=0
		dispatch                  -> Acquired err=transition
		release                   -> Free
		events:`},
	{name: "cancelled before selection", script: `
		abort client_cancel       -> Aborted
		select tokens=16 blocks=1 -> Aborted err=transition reqs=0
		release                   -> Free
		events:`},
	{name: "steps out of order", script: `
		item 1                    -> Acquired err=transition
		close                     -> Acquired err=transition
		select tokens=16 blocks=1 -> Selected
		select tokens=16 blocks=1 -> Selected err=transition reqs=1
		item 1                    -> Selected err=transition
		close                     -> Selected err=transition
		dispatch                  -> Dispatched
		dispatch                  -> Dispatched err=transition
		dispatch-fail             -> Dispatched err=transition
		item 1 stop               -> Completed reqs=0
		dispatch                  -> Completed err=transition
		abort client_cancel       -> Completed err=none reason=none
		release                   -> Free
		events: dispatched first finished(Completed,none,stop,1)`},
	{name: "a stale handle is refused", script: `
		select tokens=16 blocks=1 -> Selected
		release                   -> Free
		select tokens=16 blocks=1 -> Selected reqs=1
		stale release             -> Selected err=stale reqs=1
		stale item 1              -> Selected err=stale
		stale abort client_cancel -> Selected err=stale reqs=1
		stale dispatch            -> Selected err=stale
		dispatch                  -> Dispatched
		release                   -> Free reqs=0
		events: dispatched finished(Aborted,dropped,none,0)`},
	{name: "output blocks at block boundaries", track: true, script: `
		select tokens=32 blocks=2 -> Selected blocks=2 out=0
		dispatch                  -> Dispatched
		item 1                    -> Dispatched out=0 prefill=0
		item 14                   -> Dispatched out=0
		item 1                    -> Dispatched out=1
		item 20                   -> Dispatched out=2
		item 12 stop              -> Completed out=0 blocks=0
		release                   -> Free
		events: dispatched first finished(Completed,none,stop,48)`},
	{name: "output blocks decay toward the expected length", track: true, script: `
		select tokens=32 blocks=2 expect=64 -> Selected
		dispatch                  -> Dispatched
		item 16                   -> Dispatched out=0.75
		item 16                   -> Dispatched out=1
		item 16                   -> Dispatched out=0.75
		item 16                   -> Dispatched out=0
		item 16                   -> Dispatched out=0
		close                     -> Completed out=0 reqs=0
		release                   -> Free
		events: dispatched first finished(Completed,none,none,80)`},
}

func TestScripts(t *testing.T) {
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) { runScript(t, sc.script, sc.track) })
	}
}

func runScript(t *testing.T, script string, track bool) {
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = track
	s, err := sched.New(sched.Config{Seed: 1, Cost: &cost})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Upsert(sched.WorkerInfo{ID: 1, Slot: 0, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	var events []string
	pool := NewPool(s, Observer{
		Dispatched: func(e Event) { events = append(events, "dispatched") },
		FirstToken: func(e Event) { events = append(events, "first") },
		Finished: func(e Event) {
			events = append(events, fmt.Sprintf("finished(%s,%s,%s,%d)", e.State, e.Reason, e.Finish, e.OutputTokens))
		},
	})
	h := pool.Acquire()
	var previous Handle
	wantEvents := ""
	for n, line := range strings.Split(strings.TrimSpace(script), "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "events:"); ok {
			wantEvents = strings.TrimSpace(rest)
			continue
		}
		cmd, want, ok := strings.Cut(line, "->")
		if !ok {
			t.Fatalf("line %d: no expectations in %q", n+1, line)
		}
		fields := strings.Fields(cmd)
		target := h
		stale := fields[0] == "stale"
		if stale {
			target, fields = previous, fields[1:]
		}
		var err error
		switch fields[0] {
		case "select":
			args := keyValues(t, fields[1:])
			req := sched.Request{
				Hashes:               hashes(uint64(n), args["blocks"]),
				PromptTokens:         args["tokens"],
				ExpectedOutputTokens: args["expect"],
			}
			_, err = target.Select(context.Background(), &req)
		case "select-unknown":
			req := sched.Request{PromptTokens: 1, Pinned: true, PinWorker: 1, PinRank: 3}
			_, err = target.Select(context.Background(), &req)
		case "dispatch":
			err = target.Dispatched()
		case "dispatch-fail":
			err = target.DispatchFailed()
		case "close":
			err = target.Close()
		case "item":
			tokens, _ := strconv.Atoi(fields[1])
			finish := FinishNone
			if len(fields) > 2 {
				finish = parseFinish(t, fields[2])
			}
			err = target.OnItem(tokens, finish)
		case "abort":
			err = target.Abort(parseReason(t, fields[1]))
		case "abort-async":
			done := make(chan error)
			go func() { done <- target.Abort(parseReason(t, fields[1])) }()
			err = <-done
		case "panic":
			func() {
				defer func() { _ = recover() }()
				func() {
					defer target.Release()
					panic("handler bug")
				}()
			}()
		case "release":
			err = target.Release()
		default:
			t.Fatalf("line %d: unknown command %q", n+1, fields[0])
		}
		// Expectations are about the live handle, except that a release
		// (or a panic unwinding through one) is checked on the handle it
		// retired, whose state then reads Free.
		subject := h
		if !stale && (fields[0] == "release" || fields[0] == "panic") {
			previous, h = h, pool.Acquire()
		}
		check(t, n+1, line, s, subject, err, strings.Fields(want))
	}
	if got := strings.Join(events, " "); got != wantEvents {
		t.Errorf("events %q, want %q", got, wantEvents)
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	for w := range radix.WorkerSlot(radix.MaxWorkers) {
		if l := s.Load(w); l.Requests != 0 || l.ActiveBlocks != 0 || l.PrefillTokens != 0 || l.OutputBlocks != 0 {
			t.Fatalf("script left load on slot %d: %+v", w, l)
		}
	}
}

func check(t *testing.T, n int, line string, s *sched.Scheduler, subject Handle, err error, want []string) {
	t.Helper()
	if state := subject.State(); state.String() != want[0] {
		t.Errorf("line %d %q: state %s, want %s", n, line, state, want[0])
	}
	errWant := "none"
	load := s.Load(0)
	for _, kv := range want[1:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "err":
			errWant = v
		case "reason":
			if got := subject.Reason().String(); got != v {
				t.Errorf("line %d %q: reason %s, want %s", n, line, got, v)
			}
		case "blocks", "prefill", "reqs", "out":
			x, _ := strconv.ParseFloat(v, 64)
			got := map[string]float64{
				"blocks": float64(load.ActiveBlocks), "prefill": float64(load.PrefillTokens),
				"reqs": float64(load.Requests), "out": load.OutputBlocks,
			}[k]
			if math.Abs(got-x) > 1e-3 {
				t.Errorf("line %d %q: %s = %v, want %v", n, line, k, got, x)
			}
		default:
			t.Fatalf("line %d: unknown expectation %q", n, kv)
		}
	}
	var want0 error
	switch errWant {
	case "none":
	case "stale":
		want0 = ErrStale
	case "aborted":
		want0 = ErrAborted
	case "transition":
		want0 = ErrBadTransition
	case "pin":
		want0 = sched.ErrPinnedWorkerNotFound
	default:
		t.Fatalf("line %d: unknown error %q", n, errWant)
	}
	if want0 == nil && err != nil || want0 != nil && !errors.Is(err, want0) {
		t.Errorf("line %d %q: err %v, want %s", n, line, err, errWant)
	}
}

func keyValues(t *testing.T, fields []string) map[string]int {
	m := map[string]int{}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		x, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("bad argument %q", f)
		}
		m[k] = x
	}
	return m
}

func hashes(seed uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = seed<<20 | uint64(i) + 1
	}
	return h
}

func parseReason(t *testing.T, s string) Reason {
	for r := range Reason(len(reasonNames)) {
		if r.String() == s {
			return r
		}
	}
	t.Fatalf("unknown reason %q", s)
	return 0
}

func parseFinish(t *testing.T, s string) Finish {
	for f := range Finish(len(finishNames)) {
		if f.String() == s {
			return f
		}
	}
	t.Fatalf("unknown finish %q", s)
	return 0
}
