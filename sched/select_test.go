package sched

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func mustSelect(t testing.TB, s *Scheduler, req *Request, res *Reservation) Decision {
	t.Helper()
	d, err := s.Select(context.Background(), req, res)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestSelectWorkedExample is docs/routing.md's second worked example, run
// through real bookings: cache, in-flight prefill and in-flight decode pull
// the choice in different directions, and releasing load flips it.
func TestSelectWorkedExample(t *testing.T) {
	s := newTestScheduler(t, 3, Config{})
	const bs = 16
	req := prompt(1, 10, 1, 10) // the new request: 10 blocks, 160 tokens
	overlaps := workers.Overlaps{0: 2, 1: 5, 2: 8}

	// Worker A (slot 0) decodes an unrelated 4-block request.
	var onA Reservation
	mustSelect(t, s, &Request{Hashes: prompt(9, 0, 9, 4), PromptTokens: 4 * bs, Pinned: true, PinWorker: 100}, &onA)
	onA.PrefillDone()
	// Worker C (slot 2) runs a 12-block request sharing the first 6 blocks
	// of the new one, still in prefill, with nothing cached when it came.
	var onC Reservation
	mustSelect(t, s, &Request{Hashes: prompt(1, 6, 2, 12), PromptTokens: 12 * bs, Pinned: true, PinWorker: 102}, &onC)

	query := func() (Decision, Scores) {
		var sc Scores
		d := mustSelect(t, s, &Request{Hashes: req, PromptTokens: 10 * bs, Overlaps: &overlaps, QueryOnly: true, Scores: &sc}, nil)
		return d, sc
	}
	expect := func(step string, d Decision, sc Scores, want workers.Slot, costs [3]WorkerCost) {
		t.Helper()
		for w, c := range costs {
			if got := sc.Workers[w].WorkerCost; got != c {
				t.Errorf("%s: worker %c: %+v, want %+v", step, 'A'+w, got, c)
			}
		}
		if d.Slot != want {
			t.Errorf("%s: chose worker %c, want %c", step, 'A'+d.Slot, 'A'+want)
		}
	}

	// A: prefill 160/16 − 2 = 8, decode 4 + 10 → 22.
	// B: prefill 10 − 5 = 5, decode 0 + 10 → 15.
	// C: prefill (192 + 160)/16 − 8 = 14, decode 12 + (10 − 6 shared) = 16 → 30.
	d, sc := query()
	expect("C in prefill", d, sc, 1, [3]WorkerCost{{8, 14, 22}, {5, 10, 15}, {14, 16, 30}})
	if sc.Workers[2].SharedBlocks != 6 || sc.Workers[2].OverlapBlocks != 8 {
		t.Errorf("C shares %d in-flight blocks and caches %d, want 6 and 8", sc.Workers[2].SharedBlocks, sc.Workers[2].OverlapBlocks)
	}

	// C's request reaches its first token: its prefill leaves the cost.
	// C: prefill 10 − 8 = 2, decode 16 → 18; B still wins.
	onC.PrefillDone()
	d, sc = query()
	expect("C decoding", d, sc, 1, [3]WorkerCost{{8, 14, 22}, {5, 10, 15}, {2, 16, 18}})

	// C's request finishes: C: prefill 2, decode 0 + 10 → 12, and wins.
	onC.Release()
	d, sc = query()
	expect("C idle", d, sc, 2, [3]WorkerCost{{8, 14, 22}, {5, 10, 15}, {2, 10, 12}})

	onA.Release()
	requireZeroLoad(t, s)
}

func TestSelectBooksAndReleasesLoad(t *testing.T) {
	s := newTestScheduler(t, 2, Config{Cost: &CostParams{OverlapCredit: 1, PrefillLoadScale: 1, TrackOutputBlocks: true}})
	overlaps := workers.Overlaps{0: 3, 1: 0}
	h := prompt(4, 8, 4, 8)
	var res Reservation
	d := mustSelect(t, s, &Request{Hashes: h, PromptTokens: 8*16 + 5, Overlaps: &overlaps}, &res)
	if d.Slot != 0 || d.OverlapBlocks != 3 || d.WorkerID != 100 || d.Endpoint == "" {
		t.Fatalf("decision %+v, want slot 0 with 3 cached blocks", d)
	}
	want := WorkerLoad{Healthy: true, ActiveBlocks: 8, PrefillTokens: 8*16 + 5 - 3*16, Requests: 1}
	if got := s.Load(0); got != want {
		t.Fatalf("after booking: %+v, want %+v", got, want)
	}
	// A second request sharing 5 blocks on the same worker adds only its
	// own 3; shared blocks count once.
	var res2 Reservation
	mustSelect(t, s, &Request{Hashes: prompt(4, 5, 5, 8), PromptTokens: 8 * 16, Pinned: true, PinWorker: 100}, &res2)
	if got := s.Load(0).ActiveBlocks; got != 11 {
		t.Fatalf("active blocks with a shared prefix = %d, want 11", got)
	}
	res2.Release()

	res.PrefillDone()
	res.PrefillDone() // idempotent
	res.OutputTokens(15)
	if got := s.Load(0); got.PrefillTokens != 0 || got.OutputBlocks != 0 {
		t.Fatalf("after first token: %+v", got)
	}
	res.OutputTokens(16)
	res.OutputTokens(40)
	if got := s.Load(0).OutputBlocks; got != 2 {
		t.Fatalf("output blocks after 40 tokens = %v, want 2", got)
	}
	res.Release()
	requireZeroLoad(t, s)
	if res.Booked() {
		t.Fatal("still booked after release")
	}
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("second release did not panic")
		}
	}()
	res.Release()
}

func TestOutputBlocksDecayTowardExpectedLength(t *testing.T) {
	s := newTestScheduler(t, 1, Config{Cost: &CostParams{OverlapCredit: 1, PrefillLoadScale: 1, TrackOutputBlocks: true}})
	var res Reservation
	mustSelect(t, s, &Request{PromptTokens: 10, ExpectedOutputTokens: 160}, &res)
	for _, step := range []struct {
		tokens int
		blocks float64
	}{
		{16, 0.9},  // 1 block × (1 − 16/160)
		{80, 2.5},  // 5 × 0.5
		{144, 0.9}, // 9 × 0.1
		{160, 0},   // at the expected length the request is about to free everything
		{400, 0},   // past it, too
		{-1, 0},    // nonsense is ignored
		{0, 0},     // back to nothing
		{32, 1.6},  // 2 × 0.8, in 1/1024 units (truncated)
	} {
		res.OutputTokens(step.tokens)
		if got := s.Load(0).OutputBlocks; got < step.blocks-1e-3 || got > step.blocks+1e-3 {
			t.Errorf("%d tokens: %v output blocks, want %v", step.tokens, got, step.blocks)
		}
	}
	res.Release()
	requireZeroLoad(t, s)

	// Without tracking, progress books nothing.
	s2 := newTestScheduler(t, 1, Config{})
	var r2 Reservation
	mustSelect(t, s2, &Request{PromptTokens: 10}, &r2)
	r2.OutputTokens(1000)
	if r2.TracksOutput() || s2.Load(0).OutputBlocks != 0 {
		t.Fatal("output tracked although disabled")
	}
	r2.Release()
}

func TestSelectPinsAndAllowLists(t *testing.T) {
	s, err := New(Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []WorkerInfo{
		{ID: 7, DPRank: 0, Slot: 0, Model: "m"},
		{ID: 7, DPRank: 1, Slot: 1, Model: "m"},
		{ID: 8, DPRank: 0, Slot: 2, Model: "m"},
		{ID: 9, DPRank: 0, Slot: 3, Model: "other"},
		{ID: 10, DPRank: 0, Slot: 4, Model: "m"},
		{ID: 11, DPRank: 0, Slot: 5}, // a static worker without model=, before discovery
	} {
		if err := s.Upsert(w); err != nil {
			t.Fatal(err)
		}
	}
	s.SetHealthy(4, false)
	// Slot 1 caches the whole prompt, so unpinned selection prefers it.
	overlaps := workers.Overlaps{1: 4, 2: 1}
	h := prompt(3, 4, 3, 4)
	pin := func(id uint64, rank uint32) func(*Request) {
		return func(r *Request) { r.Pinned, r.PinWorker, r.PinRank = true, id, rank }
	}
	allow := func(set workers.Set) func(*Request) {
		return func(r *Request) { r.AllowListed, r.Allow = true, set }
	}
	model := func(m string) func(*Request) { return func(r *Request) { r.Model = m } }
	for _, tc := range []struct {
		name    string
		opts    []func(*Request)
		want    workers.Slot
		wantErr error
	}{
		{name: "unpinned picks the cache", want: 1},
		{name: "rank 0 is a real rank", opts: []func(*Request){pin(7, 0)}, want: 0},
		{name: "rank 1", opts: []func(*Request){pin(7, 1)}, want: 1},
		{name: "unresolvable rank is an error, not rank 0", opts: []func(*Request){pin(7, 5)}, wantErr: ErrPinnedWorkerNotFound},
		{name: "unknown worker", opts: []func(*Request){pin(99, 0)}, wantErr: ErrPinnedWorkerNotFound},
		{name: "pin outside the allow-list", opts: []func(*Request){pin(7, 0), allow(workers.SetOf(2))}, wantErr: ErrPinExcluded},
		{name: "pin inside the allow-list", opts: []func(*Request){pin(8, 0), allow(workers.SetOf(2) | workers.SetOf(1))}, want: 2},
		{name: "pinned worker unhealthy", opts: []func(*Request){pin(10, 0)}, wantErr: ErrNoEligibleWorker},
		{name: "pin to another model's worker", opts: []func(*Request){pin(9, 0), model("m")}, wantErr: ErrPinExcluded},
		{name: "pin to a worker whose model is not known yet", opts: []func(*Request){pin(11, 0), model("m")}, wantErr: ErrNoEligibleWorker},
		{name: "allow-list picks its cheapest", opts: []func(*Request){allow(workers.SetOf(0) | workers.SetOf(2))}, want: 2},
		{name: "allow-list of one", opts: []func(*Request){allow(workers.SetOf(0))}, want: 0},
		{name: "empty allow-list", opts: []func(*Request){allow(0)}, wantErr: ErrNoEligibleWorker},
		{name: "allow-list of unhealthy only", opts: []func(*Request){allow(workers.SetOf(4))}, wantErr: ErrNoEligibleWorker},
		{name: "allow-list of another model", opts: []func(*Request){allow(workers.SetOf(3)), model("m")}, wantErr: ErrNoEligibleWorker},
		{name: "model filter", opts: []func(*Request){model("other")}, want: 3},
		{name: "unknown model", opts: []func(*Request){model("nope")}, wantErr: ErrNoEligibleWorker},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, queryOnly := range []bool{false, true} {
				req := Request{Hashes: h, PromptTokens: 64, Overlaps: &overlaps, QueryOnly: queryOnly}
				for _, o := range tc.opts {
					o(&req)
				}
				var res Reservation
				d, err := s.Select(context.Background(), &req, &res)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("query-only %v: err %v, want %v", queryOnly, err, tc.wantErr)
					}
					if tc.wantErr != ErrPinExcluded && errors.Is(err, ErrPinExcluded) {
						t.Fatalf("query-only %v: err %v: a client error for what may pass", queryOnly, err)
					}
					if res.Booked() {
						t.Fatal("failed selection booked load")
					}
					if req.Pinned {
						var pe *PinError
						if !errors.As(err, &pe) || pe.WorkerID != req.PinWorker || pe.DPRank != req.PinRank {
							t.Fatalf("pin error %v does not name the pin", err)
						}
					}
					continue
				}
				if err != nil {
					t.Fatalf("query-only %v: %v", queryOnly, err)
				}
				if d.Slot != tc.want {
					t.Fatalf("query-only %v: slot %d, want %d", queryOnly, d.Slot, tc.want)
				}
				if info, _ := s.Worker(d.Slot); d.WorkerID != info.ID || d.DPRank != info.DPRank {
					t.Fatalf("decision names worker %d rank %d, slot holds %d rank %d", d.WorkerID, d.DPRank, info.ID, info.DPRank)
				}
				res.Release()
			}
		})
	}
	requireZeroLoad(t, s)
}

func TestQueryOnlyBooksNothing(t *testing.T) {
	s := newTestScheduler(t, 4, Config{Busy: BusyThresholds{PrefillTokens: 10}})
	overlaps := workers.Overlaps{2: 3}
	var sc Scores
	req := Request{Hashes: prompt(1, 3, 1, 3), PromptTokens: 48, Overlaps: &overlaps, QueryOnly: true, Scores: &sc}
	for range 10 {
		d := mustSelect(t, s, &req, nil)
		if d.Slot != 2 || d.Busy || d.OverlapBlocks != 3 {
			t.Fatalf("decision %+v", d)
		}
	}
	requireZeroLoad(t, s)
	if st := s.Stats(); st.Booked != 0 {
		t.Fatalf("query-only booked %d reservations", st.Booked)
	}
	if sc.Eligible != 0b1111 || sc.Workers[2].OverlapBlocks != 3 || sc.Workers[2].Cost != 3 || sc.Workers[0].Cost != 6 {
		t.Fatalf("scores %+v", sc)
	}

	// With every worker busy a query still answers (and says so) instead
	// of queueing.
	var held [4]Reservation
	for i := range held {
		mustSelect(t, s, &Request{PromptTokens: 48, Pinned: true, PinWorker: 100 + uint64(i)}, &held[i])
	}
	d := mustSelect(t, s, &req, nil)
	if !d.Busy || sc.Busy != 0b1111 {
		t.Fatalf("all busy: decision %+v, busy set %b", d, sc.Busy)
	}
	for i := range held {
		held[i].Release()
	}
	requireZeroLoad(t, s)
}

func TestPerRequestAndRuntimeCostParams(t *testing.T) {
	s := newTestScheduler(t, 2, Config{})
	// Worker 0 caches the prompt but is loaded; worker 1 is idle.
	var load Reservation
	mustSelect(t, s, &Request{Hashes: prompt(8, 0, 8, 6), PromptTokens: 96, Pinned: true, PinWorker: 100}, &load)
	load.PrefillDone()
	overlaps := workers.Overlaps{0: 8}
	req := Request{Hashes: prompt(2, 8, 2, 8), PromptTokens: 128, Overlaps: &overlaps, QueryOnly: true}
	// Credit 1: worker 0 costs 0 + 6 + 8 = 14, worker 1 costs 8 + 8 = 16.
	if d := mustSelect(t, s, &req, nil); d.Slot != 0 || d.Cost != 14 {
		t.Fatalf("global params: %+v", d)
	}
	// Credit 0 for this request only: 8 + 14 = 22 against 16.
	p := s.CostParams()
	p.OverlapCredit = 0
	req.Cost = &p
	if d := mustSelect(t, s, &req, nil); d.Slot != 1 || d.Cost != 16 {
		t.Fatalf("per-request credit 0: %+v", d)
	}
	req.Cost = nil
	if d := mustSelect(t, s, &req, nil); d.Slot != 0 {
		t.Fatalf("the override leaked into the global params: %+v", d)
	}
	// Runtime update of the global params.
	if err := s.SetCostParams(p); err != nil {
		t.Fatal(err)
	}
	if d := mustSelect(t, s, &req, nil); d.Slot != 1 {
		t.Fatalf("after SetCostParams: %+v", d)
	}
	bad := p
	bad.Temperature = -1
	if err := s.SetCostParams(bad); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("SetCostParams(%+v) = %v", bad, err)
	}
	req.Cost = &bad
	if _, err := s.Select(context.Background(), &req, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("invalid override: %v", err)
	}
	load.Release()
	requireZeroLoad(t, s)
}

func TestSelectRejectsInconsistentRequests(t *testing.T) {
	s := newTestScheduler(t, 1, Config{})
	var res Reservation
	for _, req := range []Request{
		{Hashes: make([]uint64, 3), PromptTokens: 40},
		{PromptTokens: -1},
		{PromptTokens: 1, ExpectedOutputTokens: -1},
	} {
		if _, err := s.Select(context.Background(), &req, &res); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if _, err := s.Select(context.Background(), &Request{PromptTokens: 1}, nil); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("booking without a reservation: %v", err)
	}
	mustSelect(t, s, &Request{PromptTokens: 1}, &res)
	if _, err := s.Select(context.Background(), &Request{PromptTokens: 1}, &res); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("booking into a booked reservation: %v", err)
	}
	res.Release()
	res.Reset()
	mustSelect(t, s, &Request{PromptTokens: 1}, &res)
	res.Release()
}

func TestWorkerSetChanges(t *testing.T) {
	s := newTestScheduler(t, 2, Config{})
	for _, w := range []WorkerInfo{
		{ID: 1, Slot: 64},
		{ID: 1, Slot: 5, BlockSize: 32},
		{ID: 100, Slot: 5}, // (100, 0) already holds slot 0
	} {
		if err := s.Upsert(w); !errors.Is(err, ErrInvalidConfig) || strings.Contains(err.Error(), ErrInvalidConfig.Error()) {
			t.Errorf("Upsert(%+v) = %v; want ErrInvalidConfig, without its words", w, err)
		} else if w.BlockSize != 0 && !strings.Contains(err.Error(), "--block-size") {
			t.Errorf("Upsert(%+v) = %v; want the router's flag named", w, err)
		}
	}
	if slot, ok := s.Resolve(101, 0); !ok || slot != 1 {
		t.Fatalf("Resolve(101, 0) = %d, %v", slot, ok)
	}
	if _, ok := s.Resolve(101, 1); ok {
		t.Fatal("resolved a rank that does not exist")
	}
	// A request in flight on slot 1 survives its worker's removal and the
	// slot's reuse, and drains to zero.
	var res Reservation
	mustSelect(t, s, &Request{Hashes: prompt(1, 2, 1, 2), PromptTokens: 32, Pinned: true, PinWorker: 101}, &res)
	s.Remove(1)
	if _, ok := s.Resolve(101, 0); ok || s.Workers() != 0b1 {
		t.Fatal("removed worker still resolvable")
	}
	if err := s.Upsert(WorkerInfo{ID: 555, DPRank: 2, Slot: 1, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if l := s.Load(1); l.Requests != 1 || !l.Healthy {
		t.Fatalf("slot 1 after reuse: %+v", l)
	}
	res.Release()
	requireZeroLoad(t, s)

	s.SetEngineLoad(1, 3, 4, 50, 100)
	if l := s.Load(1); l.EngineRunning != 3 || l.EngineWaiting != 4 || l.EngineKVUsed != 50 || l.EngineKVTotal != 100 {
		t.Fatalf("engine load %+v", l)
	}
	// Re-upserting the same identity keeps its health and load page.
	s.SetHealthy(1, false)
	if err := s.Upsert(WorkerInfo{ID: 555, DPRank: 2, Slot: 1, Model: "m", Endpoint: "new"}); err != nil {
		t.Fatal(err)
	}
	if l := s.Load(1); l.Healthy || l.EngineKVUsed != 50 {
		t.Fatalf("re-upsert reset the worker: %+v", l)
	}
	if info, _ := s.Worker(1); info.Endpoint != "new" || info.BlockSize != 16 {
		t.Fatalf("re-upsert did not update: %+v", info)
	}
}

// TestSelectCreditsLowerTiers: a 10-block prompt that worker A holds on
// its GPU for 4 blocks, worker B for 8 blocks of which 6 only in host
// memory, worker C for 10 blocks of which 8 only on storage. With
// Dynamo's weights (host 0.75, disk 0.25) the cached equivalents are 4,
// 2 + 4.5 = 6.5 and 2 + 2 = 4, so B wins; without tier credit it would be
// C (10 blocks), and crediting only the GPU, A.
func TestSelectCreditsLowerTiers(t *testing.T) {
	s := newTestScheduler(t, 3, Config{})
	const bs = 16
	req := prompt(1, 10, 1, 10)
	overlaps := workers.Overlaps{0: 4, 1: 8, 2: 10}
	var lower workers.LowerTiers
	lower[workers.TierHost-1][1] = 6
	lower[workers.TierDisk-1][2] = 8
	var sc Scores
	d := mustSelect(t, s, &Request{Hashes: req, PromptTokens: 10 * bs, Overlaps: &overlaps, LowerTiers: &lower,
		QueryOnly: true, Scores: &sc}, nil)
	want := [3]float64{10 - 4 + 10, 10 - 6.5 + 10, 10 - 4 + 10}
	for w, c := range want {
		if got := sc.Workers[w].Cost; got != c {
			t.Errorf("worker %c: cost %v, want %v", 'A'+w, got, c)
		}
	}
	if d.Slot != 1 || sc.Workers[1].HostBlocks != 6 || sc.Workers[2].DiskBlocks != 8 {
		t.Errorf("chose %c with scores %+v", 'A'+d.Slot, sc.Workers[:3])
	}

	// Booking credits the weighted blocks: B's prefill is 160 − 6.5·16 tokens.
	var res Reservation
	d = mustSelect(t, s, &Request{Hashes: req, PromptTokens: 10 * bs, Overlaps: &overlaps, LowerTiers: &lower}, &res)
	if got := s.Load(d.Slot).PrefillTokens; d.Slot != 1 || got != 160-104 {
		t.Errorf("booked %d prefill tokens on %c, want 56 on B", got, 'A'+d.Slot)
	}
	res.Release()

	// Tier weights 0: lower tiers earn nothing, and A's GPU blocks win.
	p := DefaultCostParams()
	p.HostTierWeight, p.DiskTierWeight = 0, 0
	d = mustSelect(t, s, &Request{Hashes: req, PromptTokens: 10 * bs, Overlaps: &overlaps, LowerTiers: &lower,
		QueryOnly: true, Cost: &p}, nil)
	if d.Slot != 0 {
		t.Errorf("without tier credit chose %c, want A", 'A'+d.Slot)
	}
	requireZeroLoad(t, s)
}

// TestUpsertRefusesUnprintableModelNames: a model name becomes a metric
// label, a log field and a JSON string, and a registration can carry any
// bytes; one that is not printable UTF-8 is refused (one invalid label
// value fails every scrape of /metrics). Real names, non-ASCII ones
// included, pass.
func TestUpsertRefusesUnprintableModelNames(t *testing.T) {
	s := newTestScheduler(t, 0, Config{})
	for i, tc := range []struct {
		model string
		ok    bool
	}{
		{"Qwen/Qwen3-8B", true}, {"模型-7b", true}, {"", true},
		{"bad\xffname", false}, {"a\x00b", false}, {"line\nbreak", false},
	} {
		err := s.Upsert(WorkerInfo{ID: uint64(i), Slot: workers.Slot(i), Model: tc.model})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("Upsert(model %q) = %v, want ok %v", tc.model, err, tc.ok)
		}
	}
}
