package dispatch

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvfast/kvfast/workers"
)

// flips records OnChange calls.
type flips struct {
	mu     sync.Mutex
	log    map[workers.Slot][]bool
	causes []string // of the flips to unroutable, in order
}

func (f *flips) onChange(slot workers.Slot, _ string, routable bool, cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.log == nil {
		f.log = map[workers.Slot][]bool{}
	}
	f.log[slot] = append(f.log[slot], routable)
	if !routable && cause != nil {
		f.causes = append(f.causes, cause.Error())
	}
}

func (f *flips) of(slot workers.Slot) []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]bool(nil), f.log[slot]...)
}

func failingEngine(t *testing.T) string {
	return serve(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"error":{"message":"sick"}}`)
	}, nil)
}

// call forwards one request to slot and reads the answer whole.
func call(t *testing.T, p *Pool, slot workers.Slot) {
	t.Helper()
	c := p.AcquireCall()
	defer c.Release()
	c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":"x"}`))
	if err := c.Do(slot, nil); err != nil {
		if errors.Is(err, ErrConnect) {
			return
		}
		t.Fatalf("Do: %v", err)
	}
	if _, err := c.ReadBody(); err != nil {
		t.Fatalf("ReadBody: %v", err)
	}
}

// TestEjectionBoundedPerGroup: MaxEjectedPercent bounds each ejection
// group apart. Two prefill engines and one decode engine all fail: one
// prefill engine may go (half of its group), the lone decode engine may
// not, though one of three engines would be within half of the pool.
func TestEjectionBoundedPerGroup(t *testing.T) {
	var f flips
	p := NewPool(Config{Health: HealthConfig{Interval: -1, OnChange: f.onChange},
		Outlier: OutlierConfig{Consecutive: 2, FailurePercent: -1, BaseEjection: time.Hour, MaxEjectedPercent: 50}})
	defer p.Close()
	const prefill, decode = 1, 2
	for s, g := range []uint32{decode, prefill, prefill} {
		e, err := p.Add(workers.Slot(s), failingEngine(t))
		if err != nil {
			t.Fatal(err)
		}
		e.SetEjectionGroup(g)
	}
	for range 5 {
		for s := range workers.Slot(3) {
			call(t, p, s)
		}
	}
	if p.Engine(0).Outlier().Ejected {
		t.Error("the only decode engine was ejected")
	}
	if a, b := p.Engine(1).Outlier().Ejected, p.Engine(2).Outlier().Ejected; a == b {
		t.Errorf("prefill engines ejected: %v and %v, want exactly one", a, b)
	}
}

// TestEjectionBoundedByMaxEjectedPercent: four engines all fail, but only
// half of them (50%) may be ejected at once; the other two stay routable
// however often they fail.
func TestEjectionBoundedByMaxEjectedPercent(t *testing.T) {
	var f flips
	p := NewPool(Config{Health: HealthConfig{Interval: -1, OnChange: f.onChange},
		Outlier: OutlierConfig{Consecutive: 2, FailurePercent: -1, BaseEjection: time.Hour, MaxEjectedPercent: 50}})
	defer p.Close()
	for s := range workers.Slot(4) {
		mustAdd(t, p, s, failingEngine(t))
	}
	for range 5 {
		for s := range workers.Slot(4) {
			call(t, p, s)
		}
	}
	ejected := 0
	for s := range workers.Slot(4) {
		o := p.Engine(s).Outlier()
		if o.Ejected {
			ejected++
			if got := f.of(s); len(got) != 1 || got[0] {
				t.Errorf("slot %d: OnChange got %v, want one flip to unroutable", s, got)
			}
		} else if got := f.of(s); len(got) != 0 {
			t.Errorf("slot %d is not ejected but OnChange got %v", s, got)
		}
	}
	if ejected != 2 {
		t.Fatalf("%d of 4 engines ejected, want 2 (50%%)", ejected)
	}
	// Removing an ejected engine gives its allowance back.
	for s := range workers.Slot(4) {
		if p.Engine(s).Outlier().Ejected {
			p.Remove(s)
			break
		}
	}
	for range 2 {
		for s := range workers.Slot(4) {
			if p.Engine(s) != nil {
				call(t, p, s)
			}
		}
	}
	ejected = 0
	for s := range workers.Slot(4) {
		if e := p.Engine(s); e != nil && e.Outlier().Ejected {
			ejected++
		}
	}
	if ejected != 1 {
		t.Errorf("after removing an ejected engine, %d of 3 are ejected; want 1 (50%% rounded down)", ejected)
	}
}

// TestEjectionBackoffGrowsAndEngineReturns: each ejection in a row lasts one
// base longer, up to the maximum, and the engine comes back routable after
// each; a real timer brings it back too.
func TestEjectionBackoffGrowsAndEngineReturns(t *testing.T) {
	var f flips
	const base = time.Hour
	p := NewPool(Config{Health: HealthConfig{Interval: -1, OnChange: f.onChange},
		Outlier: OutlierConfig{Consecutive: 3, FailurePercent: -1, BaseEjection: base, MaxEjection: 150 * time.Minute, MaxEjectedPercent: 100}})
	defer p.Close()
	mustAdd(t, p, 0, failingEngine(t))
	e := p.Engine(0)
	for i, want := range []time.Duration{base, 2 * base, 150 * time.Minute, 150 * time.Minute} {
		for range 3 {
			call(t, p, 0)
		}
		o := e.Outlier()
		if !o.Ejected || o.Ejections != uint64(i+1) {
			t.Fatalf("ejection %d: %+v", i+1, o)
		}
		// Remaining counts down from the backoff; the test takes far less
		// than a minute to get here.
		if o.Remaining > want || o.Remaining < want-time.Minute {
			t.Errorf("ejection %d lasts %v, want %v", i+1, o.Remaining, want)
		}
		e.EndEjection()
		if o := e.Outlier(); o.Ejected {
			t.Fatalf("still ejected after the ejection ended: %+v", o)
		}
	}
	if got, want := f.of(0), []bool{false, true, false, true, false, true, false, true}; len(got) != len(want) {
		t.Errorf("OnChange flips %v, want %v", got, want)
	}
	// Each ejection says why, and for how long: the log line an
	// operator reads had said only ejected=true.
	f.mu.Lock()
	causes := f.causes
	f.mu.Unlock()
	if len(causes) != 4 || !strings.Contains(causes[0], "3 failed requests in a row") || !strings.Contains(causes[0], "for 1h0m0s") {
		t.Errorf("ejection causes %q", causes)
	}

	// The timer ends an ejection by itself.
	var g flips
	q := NewPool(Config{Health: HealthConfig{Interval: -1, OnChange: g.onChange},
		Outlier: OutlierConfig{Consecutive: 1, FailurePercent: -1, BaseEjection: time.Millisecond, MaxEjectedPercent: 100}})
	defer q.Close()
	mustAdd(t, q, 0, failingEngine(t))
	call(t, q, 0)
	deadline := time.Now().Add(10 * time.Second)
	for len(g.of(0)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the engine did not return after its ejection: flips %v, %+v", g.of(0), q.Engine(0).Outlier())
		}
		time.Sleep(time.Millisecond)
	}
	if got := g.of(0); got[0] || !got[1] {
		t.Errorf("flips %v, want [false true]", got)
	}
}

// TestPassingHealthChecksDoNotUndoEjection: the engine's /health fails
// and then passes again while it is ejected; it stays out of selection.
func TestPassingHealthChecksDoNotUndoEjection(t *testing.T) {
	var healthFails atomic.Bool
	var passed atomic.Int64
	addr := serve(t, func(ctx *fasthttp.RequestCtx) {
		switch {
		case string(ctx.Path()) != "/health":
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		case healthFails.Load():
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		default:
			passed.Add(1)
		}
	}, nil)
	var f flips
	p := NewPool(Config{Health: HealthConfig{Interval: time.Millisecond, FailAfter: 1, RecoverAfter: 1, OnChange: f.onChange},
		Outlier: OutlierConfig{Consecutive: 1, FailurePercent: -1, BaseEjection: time.Hour, MaxEjectedPercent: 100}})
	defer p.Close()
	mustAdd(t, p, 0, addr)
	call(t, p, 0)
	if !p.Engine(0).Outlier().Ejected {
		t.Fatal("not ejected")
	}
	healthFails.Store(true)
	waitUntil(t, "a failed health check", func() bool { return checksFailed(p) })
	healthFails.Store(false)
	n := passed.Load()
	waitUntil(t, "three passing health checks", func() bool { return passed.Load() >= n+3 })
	if got := f.of(0); len(got) != 1 || got[0] {
		t.Fatalf("flips %v, want only the one to unroutable", got)
	}
}

// TestFailureRateEjects: failures that never come three in a row still
// eject once they pass the rate over enough requests.
func TestFailureRateEjects(t *testing.T) {
	n := 0
	var mu sync.Mutex
	addr := serve(t, func(ctx *fasthttp.RequestCtx) {
		mu.Lock()
		n++
		fail := n%3 != 0
		mu.Unlock()
		if fail {
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		}
	}, nil)
	p := NewPool(Config{Health: noHealth,
		Outlier: OutlierConfig{Consecutive: 3, FailurePercent: 60, MinRequests: 10, Window: time.Hour, BaseEjection: time.Hour, MaxEjectedPercent: 100}})
	defer p.Close()
	mustAdd(t, p, 0, addr)
	for i := range 9 {
		call(t, p, 0)
		if p.Engine(0).Outlier().Ejected {
			t.Fatalf("ejected after %d requests, before the minimum of 10", i+1)
		}
	}
	call(t, p, 0)
	if !p.Engine(0).Outlier().Ejected {
		t.Fatal("2 in 3 requests failed over 10 requests, but the engine was not ejected")
	}
}

// checksFailed reports whether slot 0's active checks call it unhealthy.
func checksFailed(p *Pool) bool {
	e := p.Engine(0)
	e.healthMu.Lock()
	defer e.healthMu.Unlock()
	return !e.healthy
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHeldVerdicts: with Attempts, a 5xx counts against its engine when
// a later attempt of the same request, on another engine, is answered 2xx, or
// when the request ends unserved and the engine has served nothing else
// within the window. A request every engine answers with a 5xx ejects
// none of the engines that serve other requests, however often it is
// sent; engines that fail everything are ejected as before.
func TestHeldVerdicts(t *testing.T) {
	p := NewPool(Config{Health: HealthConfig{Interval: -1},
		Outlier: OutlierConfig{Consecutive: 2, FailurePercent: -1, Window: time.Hour, BaseEjection: time.Hour, MaxEjectedPercent: 100}})
	defer p.Close()
	// Slots 0 and 1 fail only the poison prompt; 2 serves everything; 3
	// and 4 fail everything.
	poisoned := func(ctx *fasthttp.RequestCtx) {
		if bytes.Contains(ctx.PostBody(), []byte("poison")) {
			ctx.SetStatusCode(fasthttp.StatusInternalServerError)
			return
		}
		ctx.SetBodyString(`{"choices":[]}`)
	}
	mustAdd(t, p, 0, serve(t, poisoned, nil))
	mustAdd(t, p, 1, serve(t, poisoned, nil))
	mustAdd(t, p, 2, serve(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"choices":[]}`) }, nil))
	mustAdd(t, p, 3, failingEngine(t))
	mustAdd(t, p, 4, failingEngine(t))

	// send tries the slots in order with one Call and one Attempts, as
	// the server's retry loop does, reads the last answer whole, and
	// settles the request.
	send := func(prompt string, slots ...workers.Slot) (unattributed int) {
		t.Helper()
		var a Attempts
		c := p.AcquireCall()
		c.SetAttempts(&a)
		c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":"`+prompt+`"}`))
		for i, s := range slots {
			if err := c.Do(s, nil); err != nil {
				t.Fatalf("Do on slot %d: %v", s, err)
			}
			if i < len(slots)-1 {
				if err := c.Discard(); !IsRetryable(err) {
					t.Fatalf("Discard on slot %d: %v is not retryable", s, err)
				}
			}
		}
		if _, err := c.ReadBody(); err != nil {
			t.Fatalf("ReadBody: %v", err)
		}
		c.Release()
		return a.Done()
	}
	ejected := func(s workers.Slot) bool { return p.Engine(s).Outlier().Ejected }

	send("x", 0)
	send("x", 1)
	for range 5 {
		if n := send("poison", 0, 1); n != 2 {
			t.Fatalf("a poison prompt both serving engines failed: %d verdicts unattributed, want 2", n)
		}
	}
	if ejected(0) || ejected(1) {
		t.Fatal("a request no engine served ejected engines that serve others")
	}

	for range 2 {
		if n := send("x", 3, 2); n != 0 {
			t.Fatalf("a request slot 2 served left %d verdicts unattributed", n)
		}
	}
	if !ejected(3) || ejected(2) {
		t.Errorf("slot 3 failed two requests slot 2 served: ejected %v (want true); slot 2 ejected %v", ejected(3), ejected(2))
	}

	for range 2 {
		if n := send("poison", 4, 1); n != 1 {
			t.Fatalf("a poison prompt failed on a sick and a serving engine: %d verdicts unattributed, want 1", n)
		}
	}
	if !ejected(4) || ejected(1) {
		t.Errorf("slot 4, which served nothing, failed two requests: ejected %v (want true); slot 1, which serves others, ejected %v", ejected(4), ejected(1))
	}

	// The held verdict is recorded when the serving engine's answer is
	// accepted (a plain answer read whole, a stream's first item), not at
	// its 2xx headers (an answer that then proves empty or broken is
	// retried: nothing served the request yet), nor when a stream ends (it
	// may run for minutes).
	{
		var a Attempts
		c := p.AcquireCall()
		c.SetAttempts(&a)
		c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":"x"}`))
		if err := c.Do(4, nil); err != nil {
			t.Fatalf("Do on slot 4: %v", err)
		}
		_ = c.Discard()
		before := p.Engine(4).out.failures.Load()
		if err := c.Do(2, nil); err != nil {
			t.Fatalf("Do on slot 2: %v", err)
		}
		if got := p.Engine(4).out.failures.Load(); got != before {
			t.Errorf("at slot 2's 2xx headers, slot 4's failures went %d -> %d; want the held one still held", before, got)
		}
		if _, err := c.ReadBody(); err != nil {
			t.Fatalf("ReadBody from slot 2: %v", err)
		}
		if got := p.Engine(4).out.failures.Load(); got != before+1 {
			t.Errorf("after slot 2's answer was read, slot 4's failures went %d -> %d; want the held one recorded", before, got)
		}
		c.Release()
		if n := a.Done(); n != 0 {
			t.Errorf("%d verdicts were still held after slot 2 served the request", n)
		}
	}

	// Without Attempts a 5xx counts at once.
	for range 2 {
		c := p.AcquireCall()
		c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":"poison"}`))
		if err := c.Do(0, nil); err != nil {
			t.Fatalf("Do: %v", err)
		}
		c.Release()
	}
	if !ejected(0) {
		t.Error("slot 0 answered two requests 5xx without Attempts but is not ejected")
	}
}

// TestRefusedEngineKeyIsEngineFailure: with an engine key, an engine's
// 401 or 403 is the engine refusing the router's key (restarted with
// another): a failure to retry elsewhere and to hold against it. Without
// one, it is the client's key the engine refused.
func TestRefusedEngineKeyIsEngineFailure(t *testing.T) {
	for _, status := range []int{fasthttp.StatusUnauthorized, fasthttp.StatusForbidden} {
		refusing := serve(t, func(ctx *fasthttp.RequestCtx) {
			ctx.SetStatusCode(status)
			ctx.SetBodyString(`{"error":"Unauthorized"}`)
		}, nil)
		for _, token := range []string{"engine-key", ""} {
			p := NewPool(Config{EngineToken: token, Health: HealthConfig{Interval: -1},
				Outlier: OutlierConfig{Consecutive: 2, FailurePercent: -1, BaseEjection: time.Hour, MaxEjectedPercent: 100}})
			mustAdd(t, p, 0, refusing)
			for range 2 {
				c := p.AcquireCall()
				c.SetRequest([]byte("/v1/completions"), []byte(`{"prompt":"x"}`))
				if err := c.Do(0, nil); err != nil {
					t.Fatalf("Do: %v", err)
				}
				if got, want := c.Failed(), token != ""; got != want {
					t.Errorf("status %d, engine key %q: Failed() = %v, want %v", status, token, got, want)
				}
				if _, err := c.ReadBody(); err != nil {
					t.Fatalf("ReadBody: %v", err)
				}
				c.Release()
			}
			if got, want := p.Engine(0).Outlier().Ejected, token != ""; got != want {
				t.Errorf("status %d twice, engine key %q: ejected %v, want %v", status, token, got, want)
			}
			p.Close()
		}
	}
}
