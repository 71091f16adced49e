package sched

import (
	"context"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

func TestProgressStalls(t *testing.T) {
	const after = 10 * time.Millisecond
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	var p progress
	check := func(at int64, want bool) {
		t.Helper()
		if got := p.stalled(ms(at), after); got != want {
			t.Fatalf("at %d ms with %d awaiting: stalled %v, want %v", at, p.awaiting.Load(), got, want)
		}
	}
	check(100, false) // nothing waits
	if p.unproven(ms(100), after) {
		t.Fatal("an engine with nothing waiting on it counts as unproven")
	}
	p.booked(ms(0))
	check(5, false)
	if !p.unproven(ms(5), after) {
		t.Fatal("an engine that never answered, with a request waiting, counts as proven")
	}
	check(11, true) // waited past after without a first token
	if p.stalled(ms(11), 0) {
		t.Fatal("a stall time of 0 must never stall")
	}
	p.firstToken(ms(12))
	check(50, false) // nothing waits any more
	p.booked(ms(51))
	if p.unproven(ms(52), after) {
		t.Fatal("an engine that answered and is not stalled counts as unproven")
	}
	if !p.unproven(ms(62), after) {
		t.Fatal("a stalled engine counts as proven")
	}
	p.abandoned()
	p.booked(ms(60))
	p.booked(ms(61)) // the wait is counted from the first arrival
	check(71, true)
	p.firstToken(ms(72)) // one answered: progress, though one still waits
	check(80, false)
	check(83, true)
	p.abandoned() // the router gave up on it
	check(200, false)
}

// An engine that keeps a request waiting past StallAfter loses the credit
// for the prefix that request holds, so its follow-ups go elsewhere; its
// first token restores it.
func TestStallWithdrawsInFlightCredit(t *testing.T) {
	cost := DefaultCostParams()
	cost.CreditInFlight = true
	cost.StallAfter = 20 * time.Millisecond
	// The first request still prefills: at credit 1 its queued prefill
	// cancels the credit for its prefix and the follow-up's choice would be
	// a tie.
	cost.OverlapCredit = 2
	s := newTestScheduler(t, 4, Config{Cost: &cost})
	p := prompt(7, 8, 0, 8)
	var first Reservation
	d1, err := s.Select(context.Background(), &Request{Hashes: p, PromptTokens: 8 * 16}, &first)
	if err != nil {
		t.Fatal(err)
	}
	follow := append(append([]uint64(nil), p...), prompt(9, 0, 9, 4)...)
	query := func() (Decision, uint32) {
		t.Helper()
		var sc Scores
		var no workers.Overlaps // the engine has reported nothing stored
		d, err := s.Select(context.Background(), &Request{Hashes: follow, PromptTokens: 12 * 16, Overlaps: &no,
			QueryOnly: true, Scores: &sc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d, sc.Workers[d1.Slot].OverlapBlocks
	}
	if d, credit := query(); d.Slot != d1.Slot || credit != 8 {
		t.Fatalf("before the stall: follow-up to slot %d, credit %d on slot %d; want slot %d, 8", d.Slot, credit, d1.Slot, d1.Slot)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !s.Load(d1.Slot).Stalled {
		if time.Now().After(deadline) {
			t.Fatal("the worker never counted as stalled")
		}
		time.Sleep(time.Millisecond)
	}
	if d, credit := query(); d.Slot == d1.Slot || credit != 0 {
		t.Fatalf("stalled: follow-up to slot %d, credit %d on the stalled slot %d; want another slot, 0", d.Slot, credit, d1.Slot)
	}
	first.PrefillDone()
	if s.Load(d1.Slot).Stalled {
		t.Fatal("a first token must end the stall")
	}
	if d, credit := query(); d.Slot != d1.Slot || credit != 8 {
		t.Fatalf("after its first token: follow-up to slot %d, credit %d; want slot %d, 8", d.Slot, credit, d1.Slot)
	}
	first.Release()
	requireZeroLoad(t, s)
}

func TestStallAfterValidated(t *testing.T) {
	cost := DefaultCostParams()
	cost.StallAfter = -time.Second
	if err := cost.Validate(); err == nil {
		t.Fatal("a negative stall time was accepted")
	}
}
