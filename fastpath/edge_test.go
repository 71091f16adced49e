package fastpath

import (
	"sync"
	"testing"
	"time"
)

func TestBodyBudgetReserve(t *testing.T) {
	b := bodyBudget{limit: 100}
	if !b.reserve(60) || !b.reserve(40) {
		t.Fatal("reservations within the limit refused")
	}
	if b.reserve(1) {
		t.Fatal("a reservation over the limit accepted")
	}
	b.release(40)
	if b.reserve(41) || !b.reserve(40) {
		t.Fatal("the released bytes are not exactly what is free again")
	}
	b.release(100)
	// Concurrent reservations never overshoot the limit.
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range 50 {
		wg.Go(func() {
			if b.reserve(7) {
				mu.Lock()
				granted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if granted != 100/7 || b.used.Load() != int64(7*granted) {
		t.Fatalf("%d reservations of 7 granted under a limit of 100, %d bytes used", granted, b.used.Load())
	}
}

func TestRetryAfterFollowsQueueWaits(t *testing.T) {
	var w waitStats
	if got := w.retryAfterSeconds(); got != minRetryAfter {
		t.Fatalf("with no waits: %d, want %d", got, minRetryAfter)
	}
	for range 64 {
		w.observe(7500 * time.Millisecond)
	}
	if got := w.retryAfterSeconds(); got != 8 {
		t.Fatalf("after waits of 7.5 s: %d, want 8", got)
	}
	for range 64 {
		w.observe(10 * time.Minute)
	}
	if got := w.retryAfterSeconds(); got != maxRetryAfter {
		t.Fatalf("after long waits: %d, want the bound %d", got, maxRetryAfter)
	}
	for range 128 {
		w.observe(0)
	}
	if got := w.retryAfterSeconds(); got != minRetryAfter {
		t.Fatalf("after the queue drained: %d, want %d", got, minRetryAfter)
	}
}
