package guard

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/internal/invariants"
	"github.com/kvfast/kvfast/sched"
)

// TestTransitionChecks holds checkTransition to the lifecycle of doc.go:
// every edge of it passes, every other pair of states, a wrong generation,
// a terminal move during a progress update and a premature free panic.
func TestTransitionChecks(t *testing.T) {
	edges := map[[2]State]bool{
		{Free, Acquired}: true, {Acquired, Selected}: true, {Selected, Dispatched}: true,
		{Dispatched, Completed}: true, {Acquired, Aborted}: true, {Selected, Aborted}: true,
		{Dispatched, Aborted}: true, {Completed, Free}: true, {Aborted, Free}: true,
	}
	const gen = 7
	word := func(g uint32, s State, flags uint64) uint64 { return pack(g, s, ReasonNone) | flags }
	freeable := cleanedBit | releasingBit
	for from := range State(len(stateNames)) {
		for to := range State(len(stateNames)) {
			next := uint32(gen)
			if to == Free {
				next++
			}
			msg := panicOf(func() { checkTransition(word(gen, from, freeable), word(next, to, 0), gen) })
			if edges[[2]State{from, to}] != (msg == "") {
				t.Errorf("%s → %s: %q", from, to, msg)
			}
		}
	}
	for name, fn := range map[string]func(){
		"stale handle":       func() { checkTransition(word(gen, Selected, 0), word(gen, Dispatched, 0), gen-1) },
		"generation changed": func() { checkTransition(word(gen, Selected, 0), word(gen+1, Dispatched, 0), gen) },
		"free keeps gen":     func() { checkTransition(word(gen, Completed, freeable), word(gen, Free, 0), gen) },
		"abort while busy":   func() { checkTransition(word(gen, Dispatched, busyBit), word(gen, Aborted, 0), gen) },
		"free before clean":  func() { checkTransition(word(gen, Aborted, releasingBit), word(gen+1, Free, 0), gen) },
		"free unclaimed":     func() { checkTransition(word(gen, Aborted, cleanedBit), word(gen+1, Free, 0), gen) },
	} {
		if msg := panicOf(fn); !strings.HasPrefix(msg, "BUG: guard: illegal transition") {
			t.Errorf("%s: %q", name, msg)
		}
	}
}

func panicOf(fn func()) (msg string) {
	defer func() {
		if p := recover(); p != nil {
			msg = fmt.Sprint(p)
		}
	}()
	fn()
	return ""
}

// TestPooledLiveGuardPanics checks that the assertions are wired in: a
// guard that went back to the pool while live (a double put) is caught at
// its next Acquire.
func TestPooledLiveGuardPanics(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("needs -tags invariants or -race")
	}
	pool, _ := newTestPool(t, 1, sched.Config{}, Observer{})
	// sync.Pool may drop a Put (the race detector makes it do so at
	// random), so try until the forged guard comes back.
	for range 1000 {
		g := &Guard{pool: pool}
		g.word.Store(pack(3, Dispatched, ReasonNone) | dispatchedBit)
		pool.pool.Put(g)
		var h Handle
		msg := panicOf(func() { h = pool.Acquire() })
		if msg != "" {
			if !strings.Contains(msg, "BUG: guard: illegal transition Dispatched → Acquired") {
				t.Fatalf("panic %q", msg)
			}
			return
		}
		if h.g == g {
			t.Fatal("a live guard was handed out again without a panic")
		}
		_ = h.Release()
	}
	t.Fatal("the pool never returned the forged guard")
}
