package replay

import (
	"fmt"
	"math"
	"strings"
)

// CapacitySweep is hit rate against cache capacity on one trace: for each
// capacity (a fraction of the working set), one hit rate per series. A
// series is a routing policy as measured, or a reference computed from
// the trace (Reference), such as the pooled LRU.
type CapacitySweep struct {
	Title     string
	Fractions []float64 // capacity over working set, ascending
	Series    []SweepSeries
}

// SweepSeries is one line of a sweep: a hit rate per fraction, NaN where
// it was not measured.
type SweepSeries struct {
	Name      string
	Reference bool
	Hit       []float64
}

type sweepChart struct {
	Title                                       string
	W, H, PlotLeft, PlotRight, PlotTop, PlotBot float64
	XLabelY, XTitleX, XTitleY                   float64
	XTicks, YTicks                              []htmlTick
	Lines                                       []sweepLine
}

type sweepLine struct {
	Name, Color, Path string
	Reference         bool
	LegendX, LegendY  float64
}

const sweepLegendWidth = 150.0

// buildSweepChart lays a sweep out on a linear chart: capacity on x over
// the swept range, hit rate on y from 0 to 1.
func buildSweepChart(sw CapacitySweep) sweepChart {
	c := sweepChart{Title: sw.Title, W: cdfWidth + sweepLegendWidth, H: cdfHeight,
		PlotLeft: cdfLeft, PlotRight: cdfWidth - cdfRight, PlotTop: cdfTop, PlotBot: cdfHeight - cdfBottom,
		XLabelY: cdfHeight - cdfBottom + 16, XTitleX: cdfLeft + (cdfWidth-cdfLeft-cdfRight)/2, XTitleY: cdfHeight - 6}
	lo, hi := 0.0, 1.0
	if n := len(sw.Fractions); n > 0 {
		lo, hi = sw.Fractions[0], sw.Fractions[n-1]
	}
	if !(hi > lo) {
		lo, hi = lo-0.5, hi+0.5
	}
	x := func(f float64) float64 { return c.PlotLeft + (f-lo)/(hi-lo)*(c.PlotRight-c.PlotLeft) }
	y := func(h float64) float64 { return c.PlotBot - clamp01(h)*(c.PlotBot-c.PlotTop) }
	for _, f := range sw.Fractions {
		c.XTicks = append(c.XTicks, htmlTick{Pos: round1(x(f)), Label: fmt.Sprintf("%gx", f)})
	}
	for _, h := range []float64{0, 0.25, 0.5, 0.75, 1} {
		c.YTicks = append(c.YTicks, htmlTick{Pos: round1(y(h)), Label: fmt.Sprintf("%g", h)})
	}
	policies := 0
	for i, s := range sw.Series {
		color := "#000"
		if !s.Reference {
			color = palette[policies%len(palette)]
			policies++
		}
		var b strings.Builder
		move := true
		for j, h := range s.Hit {
			if j >= len(sw.Fractions) || math.IsNaN(h) {
				move = true
				continue
			}
			cmd := " L"
			if move {
				cmd, move = " M", false
			}
			fmt.Fprintf(&b, "%s%.1f %.1f", cmd, x(sw.Fractions[j]), y(h))
		}
		c.Lines = append(c.Lines, sweepLine{Name: s.Name, Color: color, Path: strings.TrimSpace(b.String()), Reference: s.Reference,
			LegendX: cdfWidth + 8, LegendY: c.PlotTop + 10 + 16*float64(i)})
	}
	return c
}
