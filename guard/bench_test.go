package guard

import (
	"context"
	"sync"
	"testing"

	"github.com/kvfast/kvfast/sched"
)

const benchItems = 256

// BenchmarkGuardLifecycle is one request's whole life through a guard:
// acquire, select (a 32-block prompt), dispatch, 256 one-token items with
// output-block tracking, a terminal item, close, release. The mutex family
// does the same through the obvious guard — allocated per request, a mutex
// around every step, a sync.Once around cleanup — on the same scheduler,
// so the ratio isolates what the guard itself costs.
func BenchmarkGuardLifecycle(b *testing.B) {
	cost := sched.DefaultCostParams()
	cost.TrackOutputBlocks = true
	var finished int
	pool, s := newTestPool(b, 8, sched.Config{Cost: &cost}, Observer{Finished: func(Event) { finished++ }})
	prompt := hashes(1, 32)
	ctx := context.Background()

	b.Run("items=256", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			h := pool.Acquire()
			req := sched.Request{Hashes: prompt, PromptTokens: 32 * 16}
			if _, err := h.Select(ctx, &req); err != nil {
				b.Fatal(err)
			}
			_ = h.Dispatched()
			for range benchItems - 1 {
				_ = h.OnItem(1, FinishNone)
			}
			_ = h.OnItem(1, FinishStop)
			_ = h.Close()
			_ = h.Release()
		}
		reportItems(b)
	})
	b.Run("mutex/items=256", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g := &mutexGuard{s: s}
			req := sched.Request{Hashes: prompt, PromptTokens: 32 * 16}
			if err := g.selectAndBook(ctx, &req); err != nil {
				b.Fatal(err)
			}
			g.dispatched()
			for range benchItems - 1 {
				g.onItem(1, FinishNone)
			}
			g.onItem(1, FinishStop)
			g.release()
		}
		reportItems(b)
	})
	requireNoLoad(b, s)
}

func reportItems(b *testing.B) {
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)*benchItems/sec, "items/s")
	b.ReportMetric(float64(b.N)/sec, "lifecycles/s")
}

// mutexGuard is the baseline: the same lifecycle and accounting with a
// fresh object per request and a lock around every step.
type mutexGuard struct {
	mu     sync.Mutex
	once   sync.Once
	s      *sched.Scheduler
	res    sched.Reservation
	state  State
	tokens int
}

func (g *mutexGuard) selectAndBook(ctx context.Context, req *sched.Request) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, err := g.s.Select(ctx, req, &g.res); err != nil {
		return err
	}
	g.state = Selected
	return nil
}

func (g *mutexGuard) dispatched() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state = Dispatched
}

func (g *mutexGuard) onItem(tokens int, finish Finish) {
	g.mu.Lock()
	if g.state != Dispatched {
		g.mu.Unlock()
		return
	}
	if g.tokens == 0 && tokens > 0 {
		g.res.PrefillDone()
	}
	g.tokens += tokens
	g.res.OutputTokens(g.tokens)
	if finish != FinishNone {
		g.state = Completed
	}
	g.mu.Unlock()
	if finish != FinishNone {
		g.release()
	}
}

func (g *mutexGuard) release() {
	g.once.Do(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.res.Release()
	})
}
