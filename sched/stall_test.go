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
	check := func(at int64, stalled, unproven bool) {
		t.Helper()
		if got := p.stalled(ms(at), after); got != stalled {
			t.Fatalf("at %d ms with %d waiting: stalled %v, want %v", at, p.awaiting(), got, stalled)
		}
		if got := p.unproven(ms(at), after); got != unproven {
			t.Fatalf("at %d ms with %d waiting: unproven %v, want %v", at, p.awaiting(), got, unproven)
		}
	}
	check(100, false, false) // nothing waits
	g := p.booked(ms(0))
	check(5, false, true) // never answered
	check(11, true, true) // waited past after without an answer
	if p.stalled(ms(11), 0) {
		t.Fatal("a stall time of 0 must never stall")
	}
	p.closed(g, true, ms(12))
	check(50, false, false) // nothing waits any more
	p.booked(ms(60))
	p.booked(ms(61)) // the wait is counted from the first arrival
	check(62, false, false)
	check(71, true, true)
	p.closed(g, true, ms(72)) // one answered: progress, though one still waits
	check(80, false, false)
	check(83, true, true)
	p.closed(g, true, ms(85))
	check(200, false, false)

	// Requests given up on pause the clock; they do not reset it.
	p.booked(ms(300))
	p.closed(g, false, ms(303)) // 3 ms of waiting owed
	check(400, false, false)    // nothing waits
	p.booked(ms(500))
	check(507, false, false) // 3 + 7 ms
	check(508, true, true)   // 3 + 8 ms: past after
	p.closed(g, false, ms(509))
	// Nothing waits, so nothing is stalled; but the clock passed after,
	// which a sticky session looking before it books must see.
	if p.stalled(ms(550), after) || !p.overdue(ms(550), after) {
		t.Fatalf("with 9 ms owed and nothing waiting: stalled %v, overdue %v", p.stalled(ms(550), after), p.overdue(ms(550), after))
	}
	p.booked(ms(600)) // 12 ms owed: stalled at once
	check(600, true, true)
	p.closed(g, true, ms(601)) // an answer clears what was owed
	if p.overdue(ms(650), after) {
		t.Fatal("overdue after an answer")
	}
	p.booked(ms(700))
	check(709, false, false)
	p.closed(g, true, ms(709))

	// A new engine in the slot starts afresh: its predecessor's request
	// neither counts nor, when it ends, miscounts the new one's or marks
	// it answered.
	old := p.booked(ms(1000))
	p.closed(old, false, ms(1005))
	p.booked(ms(1006))
	p.renew(ms(1008))
	check(1100, false, false)
	g = p.booked(ms(1102))
	if g == old {
		t.Fatal("renew kept the generation")
	}
	check(1103, false, true) // the new engine has not answered yet
	check(1111, false, true) // and owes nothing of its predecessor's wait
	check(1113, true, true)
	p.closed(old, true, ms(1114))
	if p.awaiting() != 1 || p.answered() {
		t.Fatalf("the old engine's answer changed the new one's state: %d waiting, answered %v", p.awaiting(), p.answered())
	}
	p.closed(g, true, ms(1115))
	check(1200, false, false)
}

// TestShunnedBetweenRequests: a worker whose last waiting request was
// given up on past StallAfter is passed over by the next selections,
// though nothing waits on it (a hung engine's next request, a session's
// next turn, had gone to it and hung too), for StallAfter after its last
// request was given up on; an answer clears it.
func TestShunnedBetweenRequests(t *testing.T) {
	const after = 10 * time.Millisecond
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	var p progress
	g := p.booked(ms(0))
	if p.shunned(ms(5), after) || !p.shunned(ms(11), after) {
		t.Fatal("shunned is not stalled while a request waits")
	}
	p.closed(g, false, ms(15)) // its client gave up after 15 ms
	if !p.shunned(ms(16), after) || !p.shunned(ms(25), after) {
		t.Fatal("a worker left overdue is not passed over")
	}
	// StallAfter past the pause it competes again, however many
	// selections look (those that book nothing use nothing up).
	if p.shunned(ms(26), after) || p.shunned(ms(27), after) {
		t.Fatal("no second chance once StallAfter has passed since the pause")
	}
	g = p.booked(ms(28)) // the chance is booked: stalled at once
	if !p.shunned(ms(28), after) || !p.stalled(ms(28), after) {
		t.Fatal("a request booked on an overdue worker does not make it stalled at once")
	}
	p.closed(g, false, ms(30)) // given up on again: another window
	if !p.shunned(ms(31), after) || p.shunned(ms(41), after) {
		t.Fatal("a second pause does not start a new window")
	}
	g = p.booked(ms(42))
	p.closed(g, true, ms(43)) // answered: the engine recovered
	if p.shunned(ms(44), after) || p.overdue(ms(44), after) {
		t.Fatal("an answer does not clear the worker")
	}
	// A short pause (under StallAfter in all) shuns nothing.
	g = p.booked(ms(50))
	p.closed(g, false, ms(55))
	if p.shunned(ms(56), after) {
		t.Fatal("a 5 ms wait shunned the worker")
	}
}

// An engine that keeps a request waiting past StallAfter loses the credit
// for the prefix that request holds, so its follow-ups go elsewhere; its
// first token restores it.
func TestStallWithdrawsInFlightCredit(t *testing.T) {
	cost := DefaultCostParams()
	cost.CreditInFlight = true
	cost.StallAfter = time.Hour // the test moves the clock (backdateProgress)
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
	s.backdateProgress(d1.Slot, 2*time.Hour)
	if !s.Load(d1.Slot).Stalled || !s.Eligibility(d1.Slot).Stalled {
		t.Fatal("a worker whose request waited past the stall time is not stalled")
	}
	if d, credit := query(); d.Slot == d1.Slot || credit != 0 {
		t.Fatalf("stalled: follow-up to slot %d, credit %d on the stalled slot %d; want another slot, 0", d.Slot, credit, d1.Slot)
	}
	first.PrefillDone()
	if s.Load(d1.Slot).Stalled || s.Eligibility(d1.Slot).Stalled {
		t.Fatal("a first token must end the stall")
	}
	if d, credit := query(); d.Slot != d1.Slot || credit != 8 {
		t.Fatalf("after its first token: follow-up to slot %d, credit %d; want slot %d, 8", d.Slot, credit, d1.Slot)
	}
	first.Release()
	requireZeroLoad(t, s)
}

// TestStalledWorkerIsChosenLast: a request that costs nothing anywhere
// (no prompt tokens, nothing cached) ties on every worker; a stalled
// worker, which has kept requests waiting past StallAfter, is not among
// the tied while another is free, and is chosen when only it is left.
func TestStalledWorkerIsChosenLast(t *testing.T) {
	cost := DefaultCostParams()
	cost.StallAfter = time.Hour // the test moves the clock (backdateProgress)
	s := newTestScheduler(t, 2, Config{Cost: &cost})
	var hung Reservation
	mustSelect(t, s, &Request{Pinned: true, PinWorker: 100}, &hung)
	s.backdateProgress(0, 2*time.Hour)
	if !s.Load(0).Stalled {
		t.Fatal("the worker whose request waited past the stall time is not stalled")
	}
	for range 20 {
		if d := mustSelect(t, s, &Request{QueryOnly: true}, nil); d.Slot != 1 {
			t.Fatalf("a free request went to the stalled slot %d", d.Slot)
		}
	}
	allow := workers.SetOf(0)
	if d := mustSelect(t, s, &Request{QueryOnly: true, AllowListed: true, Allow: allow}, nil); d.Slot != 0 {
		t.Fatalf("only the stalled worker allowed: slot %d", d.Slot)
	}
	// Its client gives up: nothing waits on the worker any more, but it
	// stays last choice until it answers (one probe an hour here).
	hung.Release()
	requireZeroLoad(t, s)
	for range 20 {
		if d := mustSelect(t, s, &Request{QueryOnly: true}, nil); d.Slot != 1 {
			t.Fatalf("a free request went to slot %d, whose last request was given up on unanswered", d.Slot)
		}
	}
}

// What counts as an answer: a stream's first token (a disaggregated
// decode stage's own, not the end of its remote prefill); for a request
// that is not streamed, its completion (Answered). A request given up on
// before any of them is no answer. A decode stage whose prompt another
// engine computes does not wait on its worker until it is sent.
func TestWhatAnswers(t *testing.T) {
	remote := func(r *Reservation) { r.RemotePrefillDone() }
	sent := func(r *Reservation) { r.RemotePrefillDone(); r.AwaitDecode() }
	for _, tc := range []struct {
		name     string
		stage    Stage
		steps    func(r *Reservation)
		answered bool
		waiting  uint32 // still waiting after steps
	}{
		{"first token", StageAny, func(r *Reservation) { r.PrefillDone() }, true, 0},
		{"not streamed, completed", StageAny, func(r *Reservation) { r.Answered() }, true, 0},
		{"given up on", StageAny, func(*Reservation) {}, false, 1},
		{"decode stage, remote prefill under way", StageDecode, remote, false, 0},
		{"decode stage, sent after its remote prefill", StageDecode, sent, false, 1},
		{"decode stage, sent twice", StageDecode, func(r *Reservation) { sent(r); r.AwaitDecode() }, false, 1},
		{"decode stage, then its first token", StageDecode, func(r *Reservation) { sent(r); r.PrefillDone() }, true, 0},
		{"decode stage prefilled here, its first token", StageDecode, func(r *Reservation) { r.PrefillDone() }, true, 0},
		{"sent without a remote prefill", StageDecode, func(r *Reservation) { r.AwaitDecode() }, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(t, 1, Config{})
			var r Reservation
			mustSelect(t, s, &Request{Hashes: prompt(1, 0, 1, 4), PromptTokens: 64, Stage: tc.stage}, &r)
			tc.steps(&r)
			p := &s.progress[r.Slot()]
			if got := p.awaiting(); got != tc.waiting {
				t.Errorf("%d requests waiting, want %d", got, tc.waiting)
			}
			if got := p.answered(); got != tc.answered {
				t.Errorf("answered %v, want %v", got, tc.answered)
			}
			r.Release()
			if got := p.awaiting(); got != 0 {
				t.Errorf("%d requests waiting after the release", got)
			}
			requireZeroLoad(t, s)
		})
	}
}

func TestStallAfterValidated(t *testing.T) {
	cost := DefaultCostParams()
	cost.StallAfter = -time.Second
	if err := cost.Validate(); err == nil {
		t.Fatal("a negative stall time was accepted")
	}
}
