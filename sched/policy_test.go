package sched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

var allPolicies = []Policy{PolicyKV, PolicyRoundRobin, PolicyRandom, PolicyLeastLoaded, PolicyAffinity}

func TestParsePolicy(t *testing.T) {
	cases := []struct {
		name   string
		want   Policy
		approx bool
	}{
		{"kv", PolicyKV, false},
		{"approx", PolicyKV, true},
		{"round-robin", PolicyRoundRobin, false},
		{"random", PolicyRandom, false},
		{"least-loaded", PolicyLeastLoaded, false},
		{"affinity", PolicyAffinity, true},
	}
	var names []string
	for _, tc := range cases {
		names = append(names, tc.name)
		p, approx, err := ParsePolicy(tc.name)
		if err != nil || p != tc.want || approx != tc.approx {
			t.Errorf("ParsePolicy(%q) = %v, %v, %v; want %v, %v", tc.name, p, approx, err, tc.want, tc.approx)
		}
		if p != PolicyKV && p.String() != tc.name || tc.name == "kv" && p.String() != "kv" {
			t.Errorf("%v.String() = %q, want %q", p, p.String(), tc.name)
		}
	}
	if got := PolicyNames(); !slices.Equal(got, names) {
		t.Errorf("PolicyNames() = %q, want %q", got, names)
	}
	for _, bad := range []string{"", "KV", "roundrobin", "least_loaded", "kv ", "Policy(1)"} {
		_, approx, err := ParsePolicy(bad)
		if !errors.Is(err, ErrInvalidConfig) || approx {
			t.Errorf("ParsePolicy(%q): approx %v, err %v", bad, approx, err)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, fmt.Sprintf("%q", bad)) {
			t.Errorf("error %q does not name %q", msg, bad)
		}
		if strings.Contains(msg, ErrInvalidConfig.Error()) {
			t.Errorf("error %q repeats the sentinel's words", msg)
		}
		for _, n := range names {
			if !strings.Contains(msg, n) {
				t.Errorf("error %q does not list %q", msg, n)
			}
		}
	}
	for _, p := range allPolicies {
		if err := p.Validate(); err != nil {
			t.Errorf("%v: %v", p, err)
		}
	}
	if bad := Policy(9); bad.String() != "Policy(9)" || !errors.Is(bad.Validate(), ErrInvalidConfig) {
		t.Errorf("Policy(9): %q, %v", bad.String(), bad.Validate())
	}
}

func TestGlobalAndPerRequestPolicy(t *testing.T) {
	if _, err := New(Config{Policy: 7}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with policy 7: %v", err)
	}
	s := newTestScheduler(t, 2, Config{Policy: PolicyLeastLoaded})
	if got := s.Policy(); got != PolicyLeastLoaded {
		t.Fatalf("Policy() = %v from the config", got)
	}
	if err := s.SetPolicy(numPolicies); !errors.Is(err, ErrInvalidConfig) || s.Policy() != PolicyLeastLoaded {
		t.Fatalf("SetPolicy(invalid) = %v, policy now %v", err, s.Policy())
	}
	if err := s.SetPolicy(PolicyKV); err != nil || s.Policy() != PolicyKV {
		t.Fatalf("SetPolicy(kv) = %v, policy now %v", err, s.Policy())
	}
	if def := newTestScheduler(t, 1, Config{}); def.Policy() != PolicyKV {
		t.Fatalf("zero Config policy is %v", def.Policy())
	}

	// Worker 0 caches the whole prompt and holds one request; worker 1 is
	// idle. kv follows the cache, least-loaded the emptiness.
	var hold Reservation
	mustSelect(t, s, &Request{PromptTokens: 16, Pinned: true, PinWorker: 100}, &hold)
	hold.PrefillDone()
	overlaps := workers.Overlaps{0: 8}
	h := prompt(2, 8, 2, 8)
	for _, tc := range []struct {
		global   Policy
		override *Policy
		want     workers.Slot
		wantPol  Policy
	}{
		{PolicyKV, nil, 0, PolicyKV},
		{PolicyKV, ptr(PolicyLeastLoaded), 1, PolicyLeastLoaded},
		{PolicyLeastLoaded, nil, 1, PolicyLeastLoaded},
		{PolicyLeastLoaded, ptr(PolicyKV), 0, PolicyKV},
	} {
		if err := s.SetPolicy(tc.global); err != nil {
			t.Fatal(err)
		}
		for _, queryOnly := range []bool{true, false} {
			req := Request{Hashes: h, PromptTokens: 128, Overlaps: &overlaps, Policy: tc.override, QueryOnly: queryOnly}
			var res Reservation
			d := mustSelect(t, s, &req, &res)
			if d.Slot != tc.want || d.Policy != tc.wantPol {
				t.Errorf("global %v, override %v, query-only %v: slot %d by %v, want %d by %v",
					tc.global, tc.override, queryOnly, d.Slot, d.Policy, tc.want, tc.wantPol)
			}
			res.Release()
		}
		if s.Policy() != tc.global {
			t.Fatalf("a per-request policy leaked into the global one: %v", s.Policy())
		}
	}
	bad := Policy(200)
	if _, err := s.Select(context.Background(), &Request{PromptTokens: 16, Policy: &bad}, &Reservation{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid per-request policy: %v", err)
	}
	hold.Release()
	requireZeroLoad(t, s)
}

func ptr[T any](v T) *T { return &v }

// selectAndRelease books one small request, checks that a query made just
// before predicted it, and releases it.
func selectAndRelease(t *testing.T, s *Scheduler, req Request) workers.Slot {
	t.Helper()
	q := req
	q.QueryOnly = true
	predicted := mustSelect(t, s, &q, nil)
	var res Reservation
	d := mustSelect(t, s, &req, &res)
	res.Release()
	if predicted.Slot != d.Slot {
		t.Fatalf("query-only predicted slot %d, the booking went to %d", predicted.Slot, d.Slot)
	}
	return d.Slot
}

func TestRoundRobinCyclesOverFreeWorkers(t *testing.T) {
	s := newTestScheduler(t, 5, busyConfig()) // busy above 50 prefill tokens
	if err := s.SetPolicy(PolicyRoundRobin); err != nil {
		t.Fatal(err)
	}
	s.SetHealthy(2, false)
	var hold Reservation // makes slot 3 busy
	mustSelect(t, s, &Request{PromptTokens: 64, Pinned: true, PinWorker: 103}, &hold)
	run := func(step string, want ...workers.Slot) {
		t.Helper()
		var got []workers.Slot
		for range want {
			got = append(got, selectAndRelease(t, s, Request{PromptTokens: 16}))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: picked %v, want %v", step, got, want)
		}
	}
	run("2 unhealthy, 3 busy", 0, 1, 4, 0, 1)
	// A pin is not a turn: the rotation carries on after slot 1.
	var pinned Reservation
	mustSelect(t, s, &Request{PromptTokens: 16, Pinned: true, PinWorker: 100}, &pinned)
	pinned.Release()
	run("after a pin", 4, 0)
	// The workers come back and take their turns in slot order.
	hold.Release()
	s.SetHealthy(2, true)
	run("all back", 1, 2, 3, 4, 0, 1, 2)
	// Round-robin books load like every policy: held requests keep
	// cycling, and past the threshold the busy ones are skipped.
	var held [5]Reservation
	for i := range held {
		d := mustSelect(t, s, &Request{PromptTokens: 40}, &held[i])
		if want := workers.Slot((3 + i) % 5); d.Slot != want {
			t.Fatalf("held request %d went to %d, want %d", i, d.Slot, want)
		}
	}
	if l := s.Load(3); l.Requests != 1 || l.PrefillTokens != 40 {
		t.Fatalf("slot 3 load %+v", l)
	}
	mustSelect(t, s, &Request{PromptTokens: 20, Pinned: true, PinWorker: 104}, &pinned) // 60 > 50: slot 4 busy
	run("4 busy", 3, 0, 1, 2, 3, 0)
	pinned.Release()
	for i := range held {
		held[i].Release()
	}
	requireZeroLoad(t, s)
}

// TestRoundRobinPerFilter checks that interleaved requests with disjoint
// candidate sets each get their own rotation: a single global cursor would
// send every request of the first model to slot 0.
func TestRoundRobinPerFilter(t *testing.T) {
	s, err := New(Config{Seed: 1, Policy: PolicyRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		model := "a"
		if i >= 3 {
			model = "b"
		}
		if err := s.Upsert(WorkerInfo{ID: uint64(i), Slot: workers.Slot(i), Model: model}); err != nil {
			t.Fatal(err)
		}
	}
	var a, b []workers.Slot
	for range 6 {
		a = append(a, selectAndRelease(t, s, Request{PromptTokens: 16, Model: "a"}))
		b = append(b, selectAndRelease(t, s, Request{PromptTokens: 16, Model: "b"}))
	}
	if !slices.Equal(a, []workers.Slot{0, 1, 2, 0, 1, 2}) || !slices.Equal(b, []workers.Slot{3, 4, 5, 3, 4, 5}) {
		t.Fatalf("model a got %v, model b got %v", a, b)
	}
	// An allow-list cycles within itself too.
	var c []workers.Slot
	for range 4 {
		c = append(c, selectAndRelease(t, s, Request{PromptTokens: 16, AllowListed: true, Allow: workers.SetOf(1) | workers.SetOf(4)}))
	}
	// Slot 4 took its last turn after slot 1 did, so slot 1 is next.
	if !slices.Equal(c, []workers.Slot{1, 4, 1, 4}) {
		t.Fatalf("allow-list {1, 4} got %v", c)
	}
	requireZeroLoad(t, s)
}

// TestRandomPolicyIsUniform checks with a chi-square test (fixed seed,
// p = 0.001) that random spreads over the free candidates evenly and
// never picks a busy, unhealthy or filtered-out worker, nor follows the
// cache.
func TestRandomPolicyIsUniform(t *testing.T) {
	s := newTestScheduler(t, 6, busyConfig())
	if err := s.SetPolicy(PolicyRandom); err != nil {
		t.Fatal(err)
	}
	s.SetHealthy(1, false)
	var hold Reservation
	mustSelect(t, s, &Request{PromptTokens: 64, Pinned: true, PinWorker: 104}, &hold) // slot 4 busy
	overlaps := workers.Overlaps{0: 4}
	h := prompt(1, 4, 1, 4)
	const n = 4000
	var got [workers.Max]int
	for range n {
		var res Reservation
		d := mustSelect(t, s, &Request{Hashes: h, PromptTokens: 64, Overlaps: &overlaps, AllowListed: true, Allow: 0b11111}, &res)
		res.Release()
		got[d.Slot]++
	}
	if got[1]+got[4]+got[5] != 0 {
		t.Fatalf("picked unhealthy %d, busy %d, not allowed %d times", got[1], got[4], got[5])
	}
	chi := 0.0
	for _, w := range []int{0, 2, 3} {
		d := float64(got[w]) - n/3
		chi += d * d / (n / 3)
	}
	if chi > 13.82 { // 2 degrees of freedom, p = 0.001
		t.Fatalf("not uniform: %d %d %d (chi2 %.1f)", got[0], got[2], got[3], chi)
	}
	hold.Release()
	requireZeroLoad(t, s)
}

func TestLeastLoadedPicksTheEmptiest(t *testing.T) {
	s := newTestScheduler(t, 5, Config{Policy: PolicyLeastLoaded})
	book := func(slot int, blocks int) *Reservation {
		res := new(Reservation)
		mustSelect(t, s, &Request{Hashes: prompt(uint64(10+slot), 0, uint64(100*slot+blocks), blocks),
			PromptTokens: blocks * 16, Pinned: true, PinWorker: 100 + uint64(slot)}, res)
		return res
	}
	// Requests: slot 0 two, slots 1, 2 and 4 one (10, 3 and 4 blocks),
	// slot 3 none but unhealthy.
	held := []*Reservation{book(0, 1), book(0, 1), book(1, 10), book(2, 3), book(4, 4)}
	s.SetHealthy(3, false)
	// The cache is ignored: slot 0 caching the whole prompt does not help.
	overlaps := workers.Overlaps{0: 4}
	req := Request{Hashes: prompt(1, 4, 1, 4), PromptTokens: 64, Overlaps: &overlaps}
	for range 20 {
		if got := selectAndRelease(t, s, req); got != 2 {
			t.Fatalf("picked %d, want slot 2 (one request, fewest blocks)", got)
		}
	}
	// Output blocks count among the blocks.
	p := s.CostParams()
	p.TrackOutputBlocks = true
	var out Reservation
	mustSelect(t, s, &Request{PromptTokens: 16, Pinned: true, PinWorker: 104, Cost: &p}, &out)
	out.OutputTokens(32)
	held[4].Release()
	held = held[:4]
	// Slot 4: one request, no prompt blocks, 2 output blocks; slot 2: one
	// request, 3 prompt blocks. 2 < 3.
	if got := selectAndRelease(t, s, req); got != 4 {
		t.Fatalf("picked %d, want slot 4", got)
	}
	out.Release()
	for _, r := range held {
		r.Release()
	}
	requireZeroLoad(t, s)
	s.SetHealthy(3, true)

	// From empty, held requests fill the workers evenly: after every
	// booking the request counts differ by at most one.
	var many [40]Reservation
	var firstRound workers.Set
	for i := range many {
		d := mustSelect(t, s, &Request{Hashes: prompt(1, 4, uint64(i), 4), PromptTokens: 64}, &many[i])
		if i < 5 {
			firstRound |= workers.SetOf(d.Slot)
		}
		lo, hi := int64(1<<62), int64(0)
		for w := range workers.Slot(5) {
			r := s.Load(w).Requests
			lo, hi = min(lo, r), max(hi, r)
		}
		if hi-lo > 1 {
			t.Fatalf("after %d bookings the request counts span %d..%d", i+1, lo, hi)
		}
	}
	if firstRound != 0b11111 {
		t.Fatalf("first round covered %b", firstRound)
	}
	for i := range many {
		many[i].Release()
	}
	requireZeroLoad(t, s)
}

func TestLeastLoadedTiesAreRandom(t *testing.T) {
	s := newTestScheduler(t, 4, Config{Policy: PolicyLeastLoaded})
	var got [4]int
	for range 4000 {
		got[mustSelect(t, s, &Request{PromptTokens: 16, QueryOnly: true}, nil).Slot]++
	}
	for w, c := range got {
		if c < 850 || c > 1150 {
			t.Fatalf("idle worker %d picked %d/4000 times: %v", w, c, got)
		}
	}
}

// TestPoliciesRespectFilters runs the filters of TestSelectPinsAndAllowLists
// under every policy: pins, allow-lists, the model filter and health decide
// the candidates and the errors, whatever the policy.
func TestPoliciesRespectFilters(t *testing.T) {
	s, err := New(Config{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []WorkerInfo{
		{ID: 7, DPRank: 0, Slot: 0, Model: "m"},
		{ID: 7, DPRank: 1, Slot: 1, Model: "m"},
		{ID: 8, DPRank: 0, Slot: 2, Model: "m"},
		{ID: 9, DPRank: 0, Slot: 3, Model: "other"},
		{ID: 10, DPRank: 0, Slot: 4, Model: "m"},
	} {
		if err := s.Upsert(w); err != nil {
			t.Fatal(err)
		}
	}
	s.SetHealthy(4, false)
	overlaps := workers.Overlaps{1: 4, 2: 1}
	h := prompt(3, 4, 3, 4)
	for _, tc := range []struct {
		name    string
		edit    func(*Request)
		want    workers.Set
		wantErr error
	}{
		{"no filter", func(*Request) {}, 0b1111, nil},
		{"model", func(r *Request) { r.Model = "m" }, 0b111, nil},
		{"other model", func(r *Request) { r.Model = "other" }, 0b1000, nil},
		{"pin rank 0", func(r *Request) { r.Pinned, r.PinWorker = true, 7 }, 0b1, nil},
		{"pin rank 1", func(r *Request) { r.Pinned, r.PinWorker, r.PinRank = true, 7, 1 }, 0b10, nil},
		{"allow-list", func(r *Request) { r.AllowListed, r.Allow = true, 0b10101 }, 0b101, nil},
		{"unknown pin", func(r *Request) { r.Pinned, r.PinWorker, r.PinRank = true, 7, 5 }, 0, ErrPinnedWorkerNotFound},
		{"unhealthy pin", func(r *Request) { r.Pinned, r.PinWorker = true, 10 }, 0, ErrNoEligibleWorker},
		{"pin outside the allow-list", func(r *Request) {
			r.Pinned, r.PinWorker, r.AllowListed, r.Allow = true, 7, true, 0b100
		}, 0, ErrNoEligibleWorker},
		{"unhealthy only", func(r *Request) { r.AllowListed, r.Allow = true, 0b10000 }, 0, ErrNoEligibleWorker},
		{"unknown model", func(r *Request) { r.Model = "nope" }, 0, ErrNoEligibleWorker},
	} {
		for _, pol := range allPolicies {
			t.Run(tc.name+"/"+pol.String(), func(t *testing.T) {
				var seen workers.Set
				for i := range 30 {
					req := Request{Hashes: h, PromptTokens: 64, Overlaps: &overlaps, Policy: &pol, QueryOnly: i%2 == 1}
					tc.edit(&req)
					var res Reservation
					d, err := s.Select(context.Background(), &req, &res)
					if tc.wantErr != nil {
						if !errors.Is(err, tc.wantErr) || res.Booked() {
							t.Fatalf("err %v (booked %v), want %v", err, res.Booked(), tc.wantErr)
						}
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					if !tc.want.Has(d.Slot) || d.Policy != pol {
						t.Fatalf("slot %d by %v, want one of %b by %v", d.Slot, d.Policy, tc.want, pol)
					}
					seen |= workers.SetOf(d.Slot)
					res.Release()
				}
				// kv and affinity follow the cache (slot 1 holds the
				// longest prefix); the others must reach every candidate.
				if pol != PolicyKV && pol != PolicyAffinity && tc.wantErr == nil && seen != tc.want {
					t.Fatalf("%v only ever picked %b of %b", pol, seen, tc.want)
				}
			})
		}
	}
	requireZeroLoad(t, s)
}

// TestPoliciesQueueWhenAllBusy checks that every policy defers to the busy
// thresholds and the admission queue, and that a query says "busy" and
// still fills the scores.
func TestPoliciesQueueWhenAllBusy(t *testing.T) {
	for _, pol := range allPolicies {
		t.Run(pol.String(), func(t *testing.T) {
			s := newTestScheduler(t, 2, busyConfig())
			if err := s.SetPolicy(pol); err != nil {
				t.Fatal(err)
			}
			var held [2]Reservation
			for i := range held {
				mustSelect(t, s, &Request{PromptTokens: 64, Pinned: true, PinWorker: 100 + uint64(i)}, &held[i])
			}
			var sc Scores
			overlaps := workers.Overlaps{1: 2}
			q := mustSelect(t, s, &Request{Hashes: prompt(1, 2, 1, 2), PromptTokens: 32, Overlaps: &overlaps, QueryOnly: true, Scores: &sc}, nil)
			if !q.Busy || sc.Busy != 0b11 || sc.Eligible != 0b11 || q.Policy != pol {
				t.Fatalf("all busy: decision %+v, scores eligible %b busy %b", q, sc.Eligible, sc.Busy)
			}
			if sc.Workers[1].OverlapBlocks != 2 || sc.Workers[0].Cost == 0 || q.Cost != sc.Workers[q.Slot].Cost {
				t.Fatalf("scores not filled: %+v, decision %+v", sc.Workers[:2], q)
			}
			out := make(chan outcome, 1)
			goSelect(s, context.Background(), "waiter", Request{PromptTokens: 16}, out)
			waitFor(t, "the request to queue", func() bool { return s.Stats().Waiting == 1 })
			select {
			case o := <-out:
				t.Fatalf("admitted while every worker is busy: %+v", o)
			case <-time.After(10 * time.Millisecond):
			}
			held[1].PrefillDone()
			o := <-out
			if o.err != nil || o.d.Slot != 1 || o.d.Queued <= 0 {
				t.Fatalf("after slot 1 freed: %+v", o)
			}
			o.res.Release()
			for i := range held {
				held[i].Release()
			}
			requireZeroLoad(t, s)
		})
	}
}
