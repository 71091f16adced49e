package sched

import (
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func TestAffinityFollowsTheLongestMatchWhateverTheLoad(t *testing.T) {
	s := newTestScheduler(t, 4, Config{Policy: PolicyAffinity})
	// Slot 1 is loaded with three requests; it still caches the longest
	// prefix, so it takes the request, as kv at this load would not.
	var held [3]Reservation
	for i := range held {
		mustSelect(t, s, &Request{Hashes: prompt(uint64(50+i), 0, 7, 40), PromptTokens: 40 * 16, Pinned: true, PinWorker: 101}, &held[i])
	}
	overlaps := workers.Overlaps{0: 2, 1: 6, 2: 5}
	req := Request{Hashes: prompt(1, 8, 2, 8), PromptTokens: 8 * 16, Overlaps: &overlaps}
	for range 20 {
		if got := selectAndRelease(t, s, req); got != 1 {
			t.Fatalf("picked %d, want slot 1 (longest prefix, 6 blocks)", got)
		}
	}
	kv := PolicyKV
	req.Policy = &kv
	if got := selectAndRelease(t, s, req); got == 1 {
		t.Fatal("kv also picked the loaded slot 1: the test shows no difference between the policies")
	}
	for i := range held {
		held[i].Release()
	}
}

func TestAffinityBreaksTiesByLoad(t *testing.T) {
	s := newTestScheduler(t, 4, Config{Policy: PolicyAffinity})
	var held [2]Reservation
	mustSelect(t, s, &Request{Hashes: prompt(60, 0, 1, 4), PromptTokens: 64, Pinned: true, PinWorker: 100}, &held[0])
	mustSelect(t, s, &Request{Hashes: prompt(61, 0, 1, 4), PromptTokens: 64, Pinned: true, PinWorker: 103}, &held[1])
	// Slots 0 and 3 tie on the match but carry a request each; slots 1
	// and 2 match less.
	overlaps := workers.Overlaps{0: 3, 1: 1, 3: 3}
	req := Request{Hashes: prompt(1, 4, 2, 4), PromptTokens: 64, Overlaps: &overlaps}
	held[1].Release()
	for range 20 {
		if got := selectAndRelease(t, s, req); got != 3 {
			t.Fatalf("picked %d, want slot 3 (longest match, idle)", got)
		}
	}
	// No match anywhere: the least loaded, at random among the idle.
	seen := map[workers.Slot]bool{}
	for range 200 {
		var res Reservation
		seen[mustSelect(t, s, &Request{Hashes: prompt(2, 0, 3, 4), PromptTokens: 64}, &res).Slot] = true
		res.Release()
	}
	if len(seen) != 3 || seen[0] {
		t.Fatalf("a prompt nobody caches went to %v, want the three idle slots 1, 2 and 3", seen)
	}
	held[0].Release()
}
