package sched

import (
	"math"
	"testing"

	"github.com/kvfast/kvfast/workers"
)

// TestCostDynamoClassicExample reproduces the example of Dynamo's router
// guide (docs/router/router_guide.md, "Cost Calculation"), weight 1.0: a
// 10-block request, workers caching 2, 5 and 8 of its blocks, with decode
// loads of 10, 5 and 9 blocks, cost 18, 10 and 11; worker 2 wins.
func TestCostDynamoClassicExample(t *testing.T) {
	p := DefaultCostParams()
	cases := []struct {
		cached, decode uint32
		prefill, cost  float64
	}{
		{cached: 2, decode: 10, prefill: 8, cost: 18},
		{cached: 5, decode: 5, prefill: 5, cost: 10},
		{cached: 8, decode: 9, prefill: 2, cost: 11},
	}
	var costs [workers.Max]float64
	for i, w := range cases {
		got := p.Cost(CostInputs{
			BlockSize:     16,
			PromptTokens:  10 * 16,
			OverlapBlocks: w.cached,
			// The guide quotes each worker's whole decode term (active
			// blocks plus the request's new ones), so it goes in as one.
			ActiveDecodeBlocks: float64(w.decode),
		})
		if got.PrefillBlocks != w.prefill || got.Cost != w.cost {
			t.Errorf("worker %d: prefill %v cost %v, want %v and %v", i+1, got.PrefillBlocks, got.Cost, w.prefill, w.cost)
		}
		costs[i] = got.Cost
	}
	var r rng
	for range 100 {
		if w := pick(&costs, 0b111, 0, &r); w != 1 {
			t.Fatalf("picked worker %d, want worker 2 (slot 1, cost 10)", w+1)
		}
	}
}

func TestCostFormula(t *testing.T) {
	base := CostInputs{BlockSize: 16, PromptTokens: 160}
	for _, tc := range []struct {
		name string
		p    CostParams
		in   func(CostInputs) CostInputs
		want WorkerCost
	}{
		{"idle worker pays the whole prompt", DefaultCostParams(), func(c CostInputs) CostInputs { return c },
			WorkerCost{PrefillBlocks: 10, DecodeBlocks: 0, Cost: 10}},
		{"active prefill adds to the prompt", DefaultCostParams(), func(c CostInputs) CostInputs {
			c.ActivePrefillTokens = 80
			c.OverlapBlocks = 4
			return c
		}, WorkerCost{PrefillBlocks: 11, Cost: 11}},
		{"overlap credit cannot make prefill negative", CostParams{OverlapCredit: 3, PrefillLoadScale: 1}, func(c CostInputs) CostInputs {
			c.OverlapBlocks = 10
			c.NewBlocks = 10
			return c
		}, WorkerCost{PrefillBlocks: 0, DecodeBlocks: 10, Cost: 10}},
		{"credit 0 ignores the cache", CostParams{OverlapCredit: 0, PrefillLoadScale: 1}, func(c CostInputs) CostInputs {
			c.OverlapBlocks = 10
			return c
		}, WorkerCost{PrefillBlocks: 10, Cost: 10}},
		{"half credit", CostParams{OverlapCredit: 0.5, PrefillLoadScale: 1}, func(c CostInputs) CostInputs {
			c.OverlapBlocks = 6
			return c
		}, WorkerCost{PrefillBlocks: 7, Cost: 7}},
		{"prefill scale weighs prefill against decode", CostParams{OverlapCredit: 1, PrefillLoadScale: 2}, func(c CostInputs) CostInputs {
			c.OverlapBlocks = 4
			c.ActiveDecodeBlocks = 3.5
			c.NewBlocks = 6
			return c
		}, WorkerCost{PrefillBlocks: 6, DecodeBlocks: 9.5, Cost: 21.5}},
		{"partial blocks count as fractions", DefaultCostParams(), func(c CostInputs) CostInputs {
			c.PromptTokens = 168
			return c
		}, WorkerCost{PrefillBlocks: 10.5, Cost: 10.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Cost(tc.in(base)); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestCostParamsValidate(t *testing.T) {
	for _, p := range []CostParams{
		{OverlapCredit: -1},
		{PrefillLoadScale: math.NaN()},
		{Temperature: math.Inf(1)},
	} {
		if p.Validate() == nil {
			t.Errorf("%+v validated", p)
		}
	}
	if err := (CostParams{OverlapCredit: 2, PrefillLoadScale: 0, Temperature: 3}).Validate(); err != nil {
		t.Errorf("valid params refused: %v", err)
	}
}

// TestTieBreakIsUniform checks that equal-cost workers are picked with
// equal probability (and a dearer one never): a chi-square test over a
// fixed-seed stream, at a significance no correct picker fails.
func TestTieBreakIsUniform(t *testing.T) {
	var costs [workers.Max]float64
	cands := workers.Set(0)
	for _, w := range []workers.Slot{3, 10, 40, 63} {
		costs[w] = 7
		cands |= workers.SetOf(w)
	}
	costs[20] = 7.0001
	cands |= workers.SetOf(20)
	var r rng
	r.state.Store(99)
	const n = 40000
	var got [workers.Max]int
	for range n {
		got[pick(&costs, cands, 0, &r)]++
	}
	if got[20] != 0 {
		t.Fatalf("the dearer worker was picked %d times", got[20])
	}
	chi := 0.0
	for _, w := range []workers.Slot{3, 10, 40, 63} {
		d := float64(got[w]) - n/4
		chi += d * d / (n / 4)
	}
	if chi > 16.27 { // chi-square, 3 degrees of freedom, p = 0.001
		t.Fatalf("tie-break not uniform: counts %v %v %v %v (chi2 %.1f)", got[3], got[10], got[40], got[63], chi)
	}
}

// TestSoftmaxDistribution checks that temperature sampling follows
// p ∝ exp(−normalised cost / T).
func TestSoftmaxDistribution(t *testing.T) {
	var costs [workers.Max]float64
	costs[0], costs[1], costs[2] = 10, 15, 20 // normalised 0, 0.5, 1
	for _, temp := range []float64{0.25, 0.5, 1, 4} {
		weights := []float64{1, math.Exp(-0.5 / temp), math.Exp(-1 / temp)}
		total := weights[0] + weights[1] + weights[2]
		var r rng
		r.state.Store(7)
		const n = 60000
		var got [3]int
		for range n {
			got[pick(&costs, 0b111, temp, &r)]++
		}
		for i, w := range weights {
			p := w / total
			sd := math.Sqrt(p * (1 - p) / n)
			if f := float64(got[i]) / n; math.Abs(f-p) > 5*sd {
				t.Errorf("T=%v worker %d: frequency %.4f, want %.4f ± %.4f", temp, i, f, p, 5*sd)
			}
		}
	}
}

func TestSoftmaxOfEqualCostsIsUniform(t *testing.T) {
	var costs [workers.Max]float64
	var r rng
	var got [4]int
	for range 8000 {
		got[pick(&costs, 0b1111, 2, &r)]++
	}
	for i, c := range got {
		if c < 1800 || c > 2200 {
			t.Fatalf("worker %d picked %d/8000 times with equal costs", i, c)
		}
	}
}

func TestNth(t *testing.T) {
	s := workers.Set(1<<2 | 1<<9 | 1<<63)
	for i, want := range []workers.Slot{2, 9, 63} {
		if got := nth(s, i); got != want {
			t.Fatalf("nth(%d) = %d, want %d", i, got, want)
		}
	}
}
