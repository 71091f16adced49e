package fastpath

import (
	"testing"
	"time"
)

// TestEncoderAffinityBounded: each encoder remembers its most recently
// encoded items up to its bound, least recently used out first; an item
// lives on the encoder that encoded it last; an entry past the ttl is not
// trusted; a failed item is forgotten on its encoder only.
func TestEncoderAffinityBounded(t *testing.T) {
	a := newEncoderAffinity(2, time.Minute)
	now := time.Unix(1000, 0)
	a.record(1, 0, now)
	a.record(2, 0, now)
	a.record(3, 1, now)
	a.record(1, 0, now) // encoded again: now encoder 0's most recent
	if slot, ok := a.lookup(1, now); !ok || slot != 0 {
		t.Fatalf("item 1 on %d, %v; want encoder 0", slot, ok)
	}
	a.record(4, 0, now) // evicts 2, encoder 0's least recently used
	if _, ok := a.lookup(2, now); ok {
		t.Error("encoder 0 kept more than its bound")
	}
	if slot, ok := a.lookup(3, now); !ok || slot != 1 {
		t.Error("encoder 1 lost an item to encoder 0's bound")
	}
	a.record(3, 0, now) // encoded again elsewhere: it moves, evicting 1
	if slot, _ := a.lookup(3, now); slot != 0 {
		t.Errorf("item 3 on encoder %d, want 0, which encoded it last", slot)
	}
	if _, ok := a.lookup(1, now); ok {
		t.Error("encoder 0 kept more than its bound after a move")
	}
	a.forget(3, 1) // not on encoder 1: nothing happens
	if _, ok := a.lookup(3, now); !ok {
		t.Error("forgetting an item on another encoder dropped it")
	}
	a.forget(3, 0)
	if _, ok := a.lookup(3, now); ok {
		t.Error("a failed item stayed on its encoder")
	}
	if _, ok := a.lookup(4, now.Add(2*time.Minute)); ok {
		t.Error("an entry past the ttl was trusted")
	}
	if n := len(a.byItem); n != 0 {
		t.Errorf("%d items remembered, want none", n)
	}
	var off *encoderAffinity
	off.record(1, 0, now)
	if _, ok := off.lookup(1, now); ok {
		t.Error("affinity off remembered an item")
	}
}
