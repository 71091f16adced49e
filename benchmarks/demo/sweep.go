package demo

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/kvfast/kvfast/benchmarks/replay"
)

// SweepPoint is one capacity of a sweep: every policy's replay with the
// engines holding Fraction of the working set between them.
type SweepPoint struct {
	Fraction float64
	KVBlocks int // per engine
	Runs     []PolicyRun
	Checks   []Check
}

// runSweep replays every policy at each of o.Capacities, a fraction of
// the replayed prompts' working set in KV blocks shared evenly by the
// engines, and reports the largest capacity as the main runs.
func runSweep(ctx context.Context, o Options, tr *replay.Trace) (*Report, error) {
	ws := tr.Head(o.MaxRequests).WorkingSetBlocks(o.BlockTokens, o.BlockSize)
	rep := &Report{Trace: tr.Source}
	for _, f := range o.Capacities {
		at := o
		at.Capacities = nil
		at.KVBlocks = sweepKVBlocks(f, ws, o.Engines)
		o.notef("capacity %gx of the working set (%d blocks): %d KV blocks per engine", f, ws, at.KVBlocks)
		r, err := Run(ctx, at, tr)
		if err != nil {
			if r == nil {
				return nil, fmt.Errorf("at %gx capacity: %w", f, err)
			}
			// Interrupted: the capacities every policy finished stand; a
			// point cut short is shown alone only when it is the first.
			rep.Interrupted = true
			if len(rep.Sweep) == 0 {
				rep.Options, rep.Runs = r.Options, r.Runs
				rep.Failed = rep.Failed || r.Failed
			} else {
				rep.Options.Capacities = o.Capacities[:len(rep.Sweep)]
			}
			return rep, fmt.Errorf("at %gx capacity: %w", f, err)
		}
		rep.Options, rep.Runs = r.Options, r.Runs
		rep.Failed = rep.Failed || r.Failed
		for _, c := range r.Checks {
			c.Target = fmt.Sprintf("at %gx capacity, %s", f, c.Target)
			rep.Checks = append(rep.Checks, c)
		}
		rep.Sweep = append(rep.Sweep, SweepPoint{Fraction: f, KVBlocks: at.KVBlocks, Runs: r.Runs, Checks: r.Checks})
	}
	rep.Options.Capacities = o.Capacities
	return rep, nil
}

// sweepKVBlocks is each engine's KV blocks at fraction f of a working set
// of ws blocks shared by engines.
func sweepKVBlocks(f float64, ws, engines int) int {
	return int(math.Ceil(f * float64(ws) / float64(engines)))
}

// sweepPolicies lists the sweep's policies in run order.
func (rep *Report) sweepPolicies() []string {
	var names []string
	for _, r := range rep.Sweep[0].Runs {
		names = append(names, r.Policy)
	}
	return names
}

// capacitySweep is the sweep as replay draws it: a line per policy, and
// the pooled-LRU reference and infinite-cache bound dashed.
func (rep *Report) capacitySweep() replay.CapacitySweep {
	sw := replay.CapacitySweep{Title: "Hit rate against capacity: " + rep.Trace}
	lru := replay.SweepSeries{Name: "pooled LRU", Reference: true}
	bound := replay.SweepSeries{Name: "infinite bound", Reference: true}
	series := map[string]*replay.SweepSeries{}
	names := rep.sweepPolicies()
	for _, n := range names {
		series[n] = &replay.SweepSeries{Name: n}
	}
	for _, pt := range rep.Sweep {
		sw.Fractions = append(sw.Fractions, pt.Fraction)
		ref, b := math.NaN(), math.NaN()
		for _, n := range names {
			h := math.NaN()
			for _, r := range pt.Runs {
				if r.Policy != n {
					continue
				}
				s := r.Result.Summary()
				if s.HitRateKnown() {
					h = s.HitRate
				}
				if s.PooledLRU != nil {
					ref = s.PooledLRU.Tokens
				}
				b = s.Bound.Tokens
			}
			series[n].Hit = append(series[n].Hit, h)
		}
		lru.Hit = append(lru.Hit, ref)
		bound.Hit = append(bound.Hit, b)
	}
	for _, n := range names {
		sw.Series = append(sw.Series, *series[n])
	}
	sw.Series = append(sw.Series, lru, bound)
	return sw
}

// writeSweep writes the sweep as a table: a row per capacity, the
// references, then each policy's hit rate and its share of the pooled
// LRU's, then each policy's TTFT p99.
func (rep *Report) writeSweep(w io.Writer) error {
	names := rep.sweepPolicies()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := append([]string{"capacity", "KV blocks", "bound", "pooled LRU"}, names...)
	for _, n := range names {
		head = append(head, n+" p99")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, pt := range rep.Sweep {
		var cells []string
		var lru *replay.PooledLRU
		var bound float64
		hits := make([]string, 0, len(names))
		p99s := make([]string, 0, len(names))
		for _, r := range pt.Runs {
			s := r.Result.Summary()
			lru, bound = s.PooledLRU, s.Bound.Tokens
			hit := "n/a"
			if s.HitRateKnown() {
				hit = fmt.Sprintf("%.3f", s.HitRate)
				if f := s.HitFractionOfLRU(); !math.IsNaN(f) {
					hit += fmt.Sprintf(" (%.0f%%)", 100*f)
				}
			}
			hits = append(hits, hit)
			p99s = append(p99s, millis(s.TTFTP99))
		}
		ref := "n/a"
		if lru != nil {
			ref = fmt.Sprintf("%.3f", lru.Tokens)
		}
		cells = append(cells, fmt.Sprintf("%gx", pt.Fraction), fmt.Sprint(pt.KVBlocks), fmt.Sprintf("%.3f", bound), ref)
		cells = append(cells, hits...)
		cells = append(cells, p99s...)
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "hit rate (share of the pooled-LRU reference); capacity is the engines' KV blocks together over the working set\n")
	return err
}

type jsonSweepPoint struct {
	Fraction  float64              `json:"capacity_fraction"`
	KVBlocks  int                  `json:"kv_blocks"`
	PooledLRU *replay.PooledLRU    `json:"pooled_lru,omitempty"`
	Policies  map[string]jsonSwept `json:"policies"`
	Checks    []Check              `json:"checks"`
}

type jsonSwept struct {
	HitRate   *float64 `json:"hit_rate"`
	OfLRU     *float64 `json:"hit_rate_of_pooled_lru,omitempty"`
	TTFTP50ms float64  `json:"ttft_p50_ms"`
	TTFTP99ms float64  `json:"ttft_p99_ms"`
	Evicted   uint64   `json:"blocks_evicted"`
}

func (rep *Report) jsonSweep() []jsonSweepPoint {
	var out []jsonSweepPoint
	for _, pt := range rep.Sweep {
		jp := jsonSweepPoint{Fraction: pt.Fraction, KVBlocks: pt.KVBlocks, Policies: map[string]jsonSwept{}, Checks: pt.Checks}
		for i := range pt.Runs {
			r := &pt.Runs[i]
			s := r.Result.Summary()
			jp.PooledLRU = s.PooledLRU
			js := jsonSwept{TTFTP50ms: float64(s.TTFTP50) / 1e6, TTFTP99ms: float64(s.TTFTP99) / 1e6,
				Evicted: r.Totals(&rep.Options).BlocksEvicted}
			if s.HitRateKnown() {
				h := s.HitRate
				js.HitRate = &h
				if f := s.HitFractionOfLRU(); !math.IsNaN(f) {
					js.OfLRU = &f
				}
			}
			jp.Policies[r.Policy] = js
		}
		if jp.Checks == nil {
			jp.Checks = []Check{}
		}
		out = append(out, jp)
	}
	return out
}
