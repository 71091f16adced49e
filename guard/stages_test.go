package guard

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvfast/kvfast/sched"
	"github.com/kvfast/kvfast/workers"
)

// newStagePool is a pool over six workers: slots 0-1 prefill, 2-4
// decode, 5 both.
func newStagePool(t testing.TB, cfg sched.Config, obs Observer) (*Pool, *sched.Scheduler) {
	t.Helper()
	cfg.Seed = 5
	s, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	roles := []sched.Role{sched.RolePrefill, sched.RolePrefill, sched.RoleDecode, sched.RoleDecode, sched.RoleDecode, sched.RoleBoth}
	for i, r := range roles {
		if err := s.Upsert(sched.WorkerInfo{ID: uint64(i), Slot: workers.Slot(i), Model: "m", KVCapacityBlocks: 1 << 20, Role: r}); err != nil {
			t.Fatal(err)
		}
	}
	return NewPool(s, obs), s
}

func TestPrefillRemote(t *testing.T) {
	pool, s := newStagePool(t, sched.Config{}, Observer{})
	h := pool.Acquire()
	defer func() { _ = h.Release() }()
	d, err := h.Select(context.Background(), &sched.Request{Hashes: []uint64{1, 2}, PromptTokens: 40, Stage: sched.StageDecode})
	if err != nil {
		t.Fatal(err)
	}
	if l := s.Load(d.Slot); l.PrefillTokens != 40 || l.ActiveBlocks != 2 {
		t.Fatalf("booked %+v", l)
	}
	if err := h.PrefillRemote(); err != nil {
		t.Fatal(err)
	}
	if l := s.Load(d.Slot); l.PrefillTokens != 0 || l.ActiveBlocks != 2 || l.Requests != 1 {
		t.Fatalf("after PrefillRemote: %+v; want the blocks and the request still booked, no prefill", l)
	}
	if err := h.Dispatched(); err != nil {
		t.Fatal(err)
	}
	if err := h.PrefillRemote(); !errors.Is(err, ErrBadTransition) {
		t.Errorf("PrefillRemote after dispatch: %v, want a transition error", err)
	}
	if err := h.OnItem(1, FinishLength); err != nil {
		t.Fatal(err)
	}
	_ = h.Release()
	requireNoLoad(t, s)

	h = pool.Acquire()
	if _, err := h.Select(context.Background(), &sched.Request{PromptTokens: 40, Stage: sched.StageDecode}); err != nil {
		t.Fatal(err)
	}
	_ = h.Abort(ReasonClientCancel)
	if err := h.PrefillRemote(); !errors.Is(err, ErrAborted) {
		t.Errorf("PrefillRemote after abort: %v, want ErrAborted", err)
	}
	_ = h.Release()
	requireNoLoad(t, s)
}

// TestTwoStageHammer runs a million disaggregated lifecycles (fewer with
// -short or -race), each a prefill guard and a decode guard from one
// pool, with a fault injected at a random step of either stage: a client
// cancel from another goroutine racing both stages, a prefill worker
// that refuses or errs (retried on another, or prefilled locally), a
// decode dispatch failure, an engine error or a timeout mid-stream, a
// panic, a stream dropped without a close. Afterwards every worker of
// both roles has zero booked load and every dispatched stage was
// reported finished exactly once.
func TestTwoStageHammer(t *testing.T) {
	lifecycles := 1_000_000
	switch {
	case raceEnabled && testing.Short():
		lifecycles = 20_000
	case raceEnabled, testing.Short():
		lifecycles = 100_000
	}
	const goroutines = 8
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = true
	var dispatched, finished atomic.Int64
	pool, s := newStagePool(t, sched.Config{
		Cost:          &cost,
		Busy:          sched.BusyThresholds{PrefillTokens: 60},
		QueueCapacity: 4,
		ActiveBlocks:  256,
	}, Observer{Finished: func(Event) { finished.Add(1) }})
	prompts := make([][]uint64, 32)
	for i := range prompts {
		h := make([]uint64, 1+i%7)
		for j := range h {
			h[j] = uint64(i%3)<<40 | uint64(j) + 1
			if j > len(h)/2 {
				h[j] |= uint64(i) << 48
			}
		}
		prompts[i] = h
	}
	var failures atomic.Int64
	fail := func(format string, args ...any) {
		if failures.Add(1) <= 10 {
			t.Errorf(format, args...)
		}
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			cancels := make(chan [2]Handle)
			acked := make(chan struct{})
			go func() { // this goroutine's client, hanging up at a random moment
				for hs := range cancels {
					for range r.IntN(32) {
						_ = hs[0].State()
					}
					_ = hs[0].Abort(ReasonClientCancel)
					_ = hs[1].Abort(ReasonClientCancel)
					acked <- struct{}{}
				}
			}()
			defer close(cancels)
			for range lifecycles / goroutines {
				dispatched.Add(int64(twoStageLifecycle(pool, r, prompts, cancels, acked, fail)))
			}
		}()
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}
	requireNoLoad(t, s)
	if dispatched.Load() != finished.Load() {
		t.Fatalf("%d stages dispatched, %d finished", dispatched.Load(), finished.Load())
	}
	t.Logf("%d two-stage lifecycles: %d stages dispatched; scheduler %+v", lifecycles/goroutines*goroutines, dispatched.Load(), s.Stats())
}

// twoStageLifecycle runs one disaggregated request as fastpath does and
// returns how many of its guards were dispatched.
func twoStageLifecycle(pool *Pool, r *rand.Rand, prompts [][]uint64, cancels chan<- [2]Handle, acked <-chan struct{}, fail func(string, ...any)) (dispatched int) {
	const (
		faultNone = iota
		faultCancel
		faultPrefillRefused
		faultPrefillError
		faultDecodeRefused
		faultDecodeError
		faultTimeout
		faultPanic
		faultDrop
		faults
	)
	fault := r.IntN(faults)
	dec := pool.Acquire()
	var pre Handle
	preHeld := false
	defer func() {
		if p := recover(); p != nil {
			_ = dec.Abort(ReasonPanic)
			if preHeld {
				_ = pre.Abort(ReasonPanic)
			}
		}
		if preHeld {
			if err := pre.Release(); err != nil {
				fail("release prefill: %v", err)
			}
		}
		if err := dec.Release(); err != nil {
			fail("release decode: %v", err)
		}
	}()
	p := prompts[r.IntN(len(prompts))]
	req := sched.Request{Hashes: p, PromptTokens: len(p)*16 + r.IntN(16), Stage: sched.StageDecode}
	if r.IntN(4) == 0 {
		req.ExpectedOutputTokens = 1 + r.IntN(50)
	}
	if _, err := dec.Select(context.Background(), &req); err != nil {
		if !errors.Is(err, sched.ErrOverloaded) {
			fail("select decode: %v", err)
		}
		return 0
	}
	step := r.IntN(6) // where the fault strikes
	async := fault == faultCancel && step%2 == 0
	remote := r.IntN(5) > 0 // otherwise prefilled locally (short or cached prompt)
	if remote {
		preq := req
		preq.Stage, preq.ExpectedOutputTokens = sched.StagePrefill, 0
		for attempt := 0; attempt < 2; attempt++ {
			pre, preHeld = pool.Acquire(), true
			if async && attempt == 0 {
				cancels <- [2]Handle{dec, pre}
			}
			if fault == faultCancel && !async && step == 1 {
				_ = dec.Abort(ReasonClientCancel)
				_ = pre.Abort(ReasonClientCancel)
			}
			if _, err := pre.Select(context.Background(), &preq); err != nil {
				if !errors.Is(err, sched.ErrOverloaded) && !errors.Is(err, ErrAborted) && !errors.Is(err, ErrBadTransition) {
					fail("select prefill: %v", err)
				}
				remote = false
				break
			}
			if fault == faultPanic && step == 1 {
				panic("handler bug in the prefill stage")
			}
			if fault == faultPrefillRefused && attempt == 0 {
				_ = pre.DispatchFailed()
				_ = pre.Release()
				preHeld = false
				continue // retried on another prefill worker
			}
			if pre.Dispatched() != nil {
				remote = false // aborted by the client
				break
			}
			dispatched++
			if fault == faultPrefillError {
				_ = pre.OnItem(0, FinishError)
				remote = false // falls back to local prefill
				break
			}
			if err := pre.OnItem(1, FinishLength); err != nil && !async && fault != faultCancel {
				fail("prefill item: %v", err)
			}
			break
		}
		if async {
			<-acked
		}
		if remote && dec.PrefillRemote() != nil && !(fault == faultCancel) {
			fail("prefill remote on a live decode guard")
		}
	} else if async {
		cancels <- [2]Handle{dec, dec}
		<-acked
	}
	if fault == faultCancel && step == 2 {
		_ = dec.Abort(ReasonClientCancel)
	}
	if fault == faultDecodeRefused {
		_ = dec.DispatchFailed()
		return dispatched
	}
	if dec.Dispatched() != nil {
		return dispatched // cancelled
	}
	dispatched++
	for k := range r.IntN(10) {
		if err := dec.OnItem(1+r.IntN(20), FinishNone); err != nil {
			if !errors.Is(err, ErrAborted) {
				fail("decode item: %v", err)
			}
			return dispatched
		}
		if k == step {
			switch fault {
			case faultTimeout:
				_ = dec.Abort(ReasonTimeout)
			case faultCancel:
				_ = dec.Abort(ReasonClientCancel)
			case faultPanic:
				panic("handler bug in the decode stage")
			}
		}
	}
	switch fault {
	case faultDecodeError:
		_ = dec.OnItem(0, FinishError)
	case faultDrop:
	default:
		_ = dec.OnItem(1, FinishStop)
	}
	return dispatched
}
