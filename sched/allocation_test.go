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
