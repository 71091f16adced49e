//go:build !race

package sched

import (
	"context"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

func TestSelectAllocatesNothing(t *testing.T) {
	s := newTestScheduler(t, 8, Config{Cost: &CostParams{OverlapCredit: 1, PrefillLoadScale: 1, TrackOutputBlocks: true}})
	var overlaps workers.Overlaps
	for w := range 8 {
		overlaps[w] = uint32(w * 50)
	}
	h := prompt(1, 512, 1, 512)
	var bg Reservation
	mustSelect(t, s, &Request{Hashes: h[:300], PromptTokens: 300 * 16, Pinned: true, PinWorker: 103}, &bg)
	ctx := context.Background()
	var res Reservation
	var sc Scores
	cases := map[string]func(){
		"select+release": func() {
			req := Request{Hashes: h, PromptTokens: 512*16 + 7, Overlaps: &overlaps}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		},
		"select with override and scores": func() {
			p := s.CostParams()
			p.Temperature = 0.5
			req := Request{Hashes: h, PromptTokens: 512 * 16, Overlaps: &overlaps, Cost: &p, Scores: &sc, Model: "m"}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		},
		"pinned": func() {
			req := Request{Hashes: h, PromptTokens: 512 * 16, Pinned: true, PinWorker: 105}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		},
		"query-only": func() {
			req := Request{Hashes: h, PromptTokens: 512 * 16, Overlaps: &overlaps, QueryOnly: true, Scores: &sc}
			if _, err := s.Select(ctx, &req, nil); err != nil {
				t.Fatal(err)
			}
		},
		"progress": func() {
			req := Request{Hashes: h[:10], PromptTokens: 10 * 16, ExpectedOutputTokens: 100}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			res.PrefillDone()
			for tok := 16; tok < 200; tok += 16 {
				res.OutputTokens(tok)
			}
			res.Completed(200) // feeds the calibration, which recomputes the shared scale every 8th call
			res.Release()
			res.Reset()
		},
	}
	for _, pol := range allPolicies {
		cases["policy "+pol.String()] = func() {
			req := Request{Hashes: h, PromptTokens: 512 * 16, Overlaps: &overlaps, Policy: &pol}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
		}
		cases["policy "+pol.String()+" query-only"] = func() {
			req := Request{Hashes: h, PromptTokens: 512 * 16, Overlaps: &overlaps, Policy: &pol, QueryOnly: true, Scores: &sc}
			if _, err := s.Select(ctx, &req, nil); err != nil {
				t.Fatal(err)
			}
		}
		cases["global policy "+pol.String()] = func() {
			if err := s.SetPolicy(pol); err != nil {
				t.Fatal(err)
			}
			req := Request{Hashes: h, PromptTokens: 512 * 16, Overlaps: &overlaps}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			res.Release()
			if err := s.SetPolicy(PolicyKV); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, fn := range cases {
		if n := testing.AllocsPerRun(200, fn); n != 0 {
			t.Errorf("%s: %v allocs per run", name, n)
		}
	}
	bg.Release()
	requireZeroLoad(t, s)
}

// kvfast serve turns on what the plain cost model leaves off (in-flight
// credit, the fitted scale, stall detection, the eviction term), and the
// shared scale is recomputed only every autoScaleEvery observations,
// which AllocsPerRun's whole-number average would hide: so each run
// carries autoScaleEvery whole requests, and a disaggregated pool's
// (pooledScale) is measured too.
func TestServingDefaultsAllocateNothing(t *testing.T) {
	cost := DefaultCostParams()
	cost.CreditInFlight, cost.AutoPrefillLoadScale, cost.TrackOutputBlocks = true, true, true
	cost.StallAfter, cost.EvictionWeight = DefaultStallAfter, DefaultEvictionWeight
	ctx := context.Background()
	h := prompt(3, 0, 3, 64)
	for _, disagg := range []bool{false, true} {
		s, err := New(Config{Cost: &cost, Seed: 42})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			role := workers.RoleBoth
			if disagg {
				role = []workers.Role{workers.RolePrefill, workers.RolePrefill, workers.RoleDecode, workers.RoleDecode}[i]
			}
			if err := s.Upsert(WorkerInfo{ID: uint64(i), Slot: workers.Slot(i), Model: "m", KVCapacityBlocks: 100, Role: role}); err != nil {
				t.Fatal(err)
			}
		}
		var res Reservation
		serve := func(stage Stage, remote bool, output int) {
			req := Request{Hashes: h, PromptTokens: 64 * 16, Stage: stage, ExpectedOutputTokens: output}
			if _, err := s.Select(ctx, &req, &res); err != nil {
				t.Fatal(err)
			}
			if remote {
				res.RemotePrefillDone()
				res.AwaitDecode()
			}
			res.PrefillDone()
			res.OutputTokens(output)
			res.Completed(output)
			res.Release()
			res.Reset()
		}
		n := testing.AllocsPerRun(50, func() {
			for range autoScaleEvery {
				if disagg {
					serve(StagePrefill, false, 1)
					serve(StageDecode, true, 40)
				} else {
					serve(StageAny, false, 40)
				}
			}
		})
		if n != 0 {
			t.Errorf("disaggregated %v: %v allocs per %d requests", disagg, n, autoScaleEvery)
		}
		if disagg && s.Calibration(0).PrefillSamples < minCalibrationSamples {
			t.Fatalf("the prefill workers learnt nothing: %+v", s.Calibration(0))
		}
		requireZeroLoad(t, s)
	}
}
