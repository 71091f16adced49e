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

// newStagePool is a pool over eight workers: slots 0-1 prefill, 2-4
// decode, 5 both, 6-7 encode.
func newStagePool(t testing.TB, cfg sched.Config, obs Observer) (*Pool, *sched.Scheduler) {
	t.Helper()
	cfg.Seed = 5
	s, err := sched.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	roles := []workers.Role{workers.RolePrefill, workers.RolePrefill, workers.RoleDecode, workers.RoleDecode, workers.RoleDecode, workers.RoleBoth,
		workers.RoleEncode, workers.RoleEncode}
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
// -short or -race), each up to three encode guards (one per multimodal
// item), a prefill guard and a decode guard from one pool, with a fault
// injected at a random step of any stage: a client cancel from another
// goroutine racing the encode stage or both later stages, an encoder
// that refuses (retried on another) or errs (the item left to the
// prefill engine), a prefill worker that refuses or errs (retried on
// another, or prefilled locally), a decode dispatch failure, an engine
// error or a timeout mid-stream, a panic, a stream dropped without a
// close. Afterwards every worker of every role has zero booked load and
// every dispatched stage was reported finished exactly once.
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
				dispatched.Add(int64(twoStageLifecycle(pool, s, r, prompts, cancels, acked, fail)))
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
func twoStageLifecycle(pool *Pool, s *sched.Scheduler, r *rand.Rand, prompts [][]uint64, cancels chan<- [2]Handle, acked <-chan struct{}, fail func(string, ...any)) (dispatched int) {
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
		faultEncodeRefused
		faultEncodeError
		faultEncodeCancel
		faults
	)
	fault := r.IntN(faults)
	step := r.IntN(6) // where the fault strikes
	// The encoder stage comes first, each item with its own guard, as
	// fastpath runs it; a client leaving during it ends the request.
	encoded, gone := encodeStage(pool, s, r, fault == faultEncodeRefused, fault == faultEncodeError,
		fault == faultEncodeCancel, fault == faultPanic && step == 0, cancels, acked, fail)
	dispatched += encoded
	if gone {
		return dispatched
	}
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
		return dispatched
	}
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

// encodeStage runs the encoder stage of one request with up to three
// items as fastpath does, in rounds: each round books its items one
// after the other (only the first may queue; a later one that finds every
// encoder busy waits for the next round), dispatches them, and settles
// them. It returns how many of its guards were dispatched and whether the
// client left meanwhile. cancel has the client's goroutine abort the
// round's guards while they run.
func encodeStage(pool *Pool, s *sched.Scheduler, r *rand.Rand, refuse, engineError, cancel, panics bool, cancels chan<- [2]Handle, acked <-chan struct{}, fail func(string, ...any)) (dispatched int, gone bool) {
	items := r.IntN(4)
	var enc [3]Handle
	var held, settled [3]bool
	var attempts [3]int
	release := func(i int) {
		if held[i] {
			held[i] = false
			if err := enc[i].Release(); err != nil {
				fail("release encode: %v", err)
			}
		}
	}
	defer func() {
		if p := recover(); p != nil {
			for i := range enc {
				if held[i] {
					_ = enc[i].Abort(ReasonPanic)
				}
			}
			gone = true
		}
		for i := range enc {
			release(i)
		}
	}()
	for pending := items; pending > 0; {
		booked := 0
		var round [3]bool
		for i := range items {
			if settled[i] {
				continue
			}
			req := sched.Request{PromptTokens: 256, Stage: sched.StageEncode}
			if booked > 0 {
				q := req
				q.QueryOnly = true
				if d, err := s.Select(context.Background(), &q, nil); err == nil && d.Busy {
					continue // the next round
				}
			}
			enc[i], held[i] = pool.Acquire(), true
			if _, err := enc[i].Select(context.Background(), &req); err != nil {
				if !errors.Is(err, sched.ErrOverloaded) {
					fail("select encode: %v", err)
				}
				release(i)
				settled[i] = true // the prefill engine encodes the item
				continue
			}
			booked++
			round[i] = true
		}
		if panics && booked > 0 {
			panic("handler bug in the encode stage")
		}
		if cancel && booked > 0 {
			first, last := -1, -1
			for i := range items {
				if round[i] {
					if first < 0 {
						first = i
					}
					last = i
				}
			}
			cancels <- [2]Handle{enc[first], enc[last]}
		}
		for i := range items {
			if !round[i] {
				continue
			}
			attempts[i]++
			if refuse && attempts[i] == 1 {
				_ = enc[i].DispatchFailed()
				release(i) // retried on another encoder
				continue
			}
			settled[i] = true
			if enc[i].Dispatched() != nil {
				if !cancel {
					fail("dispatch of a live encode guard")
				}
				continue
			}
			dispatched++
			if engineError {
				_ = enc[i].OnItem(0, FinishError) // the prefill engine encodes it
			} else if err := enc[i].OnItem(1, FinishLength); err != nil && !cancel {
				fail("encode item: %v", err)
			}
			if !cancel {
				release(i)
			}
		}
		if cancel && booked > 0 {
			<-acked // the client's goroutine is done with the handles: they go in the deferred release
			return dispatched, true
		}
		pending = 0
		for i := range items {
			if !settled[i] {
				pending++
			}
		}
	}
	return dispatched, false
}
