package replay

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteHTML writes a self-contained HTML report comparing results: the
// summary table, a bar per result of its prefix hit rate against the
// infinite-cache bound, and one TTFT CDF chart per result. All charts are
// inline SVG on one shared log-scale axis, with the other results drawn
// faintly behind, so the page needs no script, stylesheet or network. The
// output is also well-formed XML.
func WriteHTML(w io.Writer, results []NamedResult) error {
	return WriteHTMLWith(w, results, nil, nil)
}

// WriteHTMLWith is WriteHTML followed by one line chart per capacity
// sweep (hit rate against cache capacity, a line per policy and the
// references dashed) and by the caller's own tables.
func WriteHTMLWith(w io.Writer, results []NamedResult, sweeps []CapacitySweep, tables []HTMLTable) error {
	rep := buildHTMLReport(results, time.Now())
	for _, sw := range sweeps {
		rep.Sweeps = append(rep.Sweeps, buildSweepChart(sw))
	}
	rep.Tables = tables
	return reportTemplate.Execute(w, rep)
}

// Chart geometry in SVG user units.
const (
	cdfWidth, cdfHeight                  = 560.0, 300.0
	cdfLeft, cdfRight, cdfTop, cdfBottom = 56.0, 16.0, 14.0, 44.0
	cdfMaxPoints                         = 300
	barLabelWidth, barScale, barRow      = 120.0, 320.0, 30.0
	barWidth                             = barLabelWidth + barScale + 190.0
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

type htmlReport struct {
	Generated string
	Sources   string
	Rows      []htmlRow
	Bars      htmlBars
	CDFs      []htmlCDF
	HasTTFT   bool
	HasLRU    bool
	Sweeps    []sweepChart
	W, H      float64
	PlotLeft  float64
	PlotRight float64
	PlotTop   float64
	PlotBot   float64
	XTicks    []htmlTick
	YTicks    []htmlTick
	XLabelY   float64
	XTitleX   float64
	XTitleY   float64
	Tables    []HTMLTable // the caller's, below the summary (htmltables.go)
}

type htmlRow struct {
	Name, Color               string
	Requests, Errors          int
	TTFTP50, TTFTP90, TTFTP99 string
	ITLP50, ITLP90, ITLP99    string
	E2E                       string
	HitRate, Bound, OfBound   string
	LRU, OfLRU                string
	ReqPerSec, TokPerSec      string
}

type htmlBars struct {
	W, H, ScaleLeft, ScaleMid, ScaleRight, AxisY, GridBot float64
	Rows                                                  []htmlBar
}

type htmlBar struct {
	Name, Color, Label       string
	Y, TextY, Width, BoundX  float64
	BoundTop, BoundBot, TxtX float64
	LRUX                     float64 // 0: no pooled-LRU reference
}

type htmlCDF struct {
	Name, Color string
	Path        string // empty when the result has no successful request
	Others      []string
	P50, P99    string
}

type htmlTick struct {
	Pos   float64
	Label string
}

func buildHTMLReport(results []NamedResult, now time.Time) htmlReport {
	rep := htmlReport{
		Generated: now.Format(time.RFC3339),
		W:         cdfWidth, H: cdfHeight,
		PlotLeft: cdfLeft, PlotRight: cdfWidth - cdfRight,
		PlotTop: cdfTop, PlotBot: cdfHeight - cdfBottom,
		XLabelY: cdfHeight - cdfBottom + 16,
		XTitleX: cdfLeft + (cdfWidth-cdfLeft-cdfRight)/2, XTitleY: cdfHeight - 6,
	}
	var sources []string
	ttfts := make([][]time.Duration, len(results))
	lo, hi := math.Inf(1), 0.0
	rep.Bars = htmlBars{W: barWidth, H: barRow*float64(len(results)) + 24,
		ScaleLeft: barLabelWidth, ScaleMid: barLabelWidth + barScale/2, ScaleRight: barLabelWidth + barScale,
		AxisY: barRow*float64(len(results)) + 20, GridBot: barRow*float64(len(results)) + 6}
	for i, nr := range results {
		s := nr.Result.Summary()
		color := palette[i%len(palette)]
		if !slices.Contains(sources, s.Source) {
			sources = append(sources, s.Source)
		}
		rep.Rows = append(rep.Rows, htmlRow{
			Name: nr.Name, Color: color, Requests: s.Requests, Errors: s.Errors,
			TTFTP50: s.latency(s.TTFTP50), TTFTP90: s.latency(s.TTFTP90), TTFTP99: s.latency(s.TTFTP99),
			ITLP50: s.itl(s.ITLP50), ITLP90: s.itl(s.ITLP90), ITLP99: s.itl(s.ITLP99),
			E2E:     s.latency(s.LatencyP50),
			HitRate: formatRate(s.HitRate, s.HitRateKnown()), Bound: fmt.Sprintf("%.3f", s.Bound.Tokens),
			OfBound: formatPercent(s.HitFractionOfBound()),
			LRU:     formatLRU(s.PooledLRU), OfLRU: formatPercent(s.HitFractionOfLRU()),
			ReqPerSec: fmt.Sprintf("%.2f", s.RequestsPerSec), TokPerSec: fmt.Sprintf("%.0f", s.OutputTokensPerSec),
		})
		y := 8 + barRow*float64(i)
		bar := htmlBar{
			Name: nr.Name, Color: color, Y: y, TextY: y + 15,
			BoundX: barLabelWidth + barScale*clamp01(s.Bound.Tokens), BoundTop: y - 3, BoundBot: y + 23,
			TxtX: barLabelWidth + barScale + 8,
		}
		if s.PooledLRU != nil {
			rep.HasLRU = true
			bar.LRUX = barLabelWidth + barScale*clamp01(s.PooledLRU.Tokens)
		}
		if s.HitRateKnown() {
			bar.Width = barScale * clamp01(s.HitRate)
			bar.Label = fmt.Sprintf("%.3f of bound %.3f (%s)", s.HitRate, s.Bound.Tokens, formatPercent(s.HitFractionOfBound()))
		} else {
			bar.Label = fmt.Sprintf("n/a (bound %.3f)", s.Bound.Tokens)
		}
		rep.Bars.Rows = append(rep.Bars.Rows, bar)

		ttfts[i] = nr.Result.TTFTs()
		for _, d := range ttfts[i] {
			if ms := float64(d) / 1e6; ms > 0 {
				lo, hi = math.Min(lo, ms), math.Max(hi, ms)
			}
		}
	}
	rep.Sources = strings.Join(sources, ", ")
	rep.HasTTFT = hi > 0
	if !rep.HasTTFT {
		lo, hi = 1, 1000
	}
	lo, hi = axisRange(lo, hi)
	ax := logAxis{lo: math.Log10(lo), hi: math.Log10(hi), left: cdfLeft, right: cdfWidth - cdfRight}
	for _, t := range logTicks(lo, hi) {
		rep.XTicks = append(rep.XTicks, htmlTick{Pos: round1(ax.x(t)), Label: tickLabel(t)})
	}
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 0.9, 1} {
		rep.YTicks = append(rep.YTicks, htmlTick{Pos: round1(cdfY(f)), Label: strconv.FormatFloat(f, 'f', -1, 64)})
	}
	paths := make([]string, len(results))
	for i := range results {
		paths[i] = cdfPath(ttfts[i], ax)
	}
	for i, nr := range results {
		c := htmlCDF{Name: nr.Name, Color: palette[i%len(palette)], Path: paths[i],
			P50: formatMillis(Percentile(ttfts[i], 0.5)), P99: formatMillis(Percentile(ttfts[i], 0.99))}
		for j, p := range paths {
			if j != i && p != "" {
				c.Others = append(c.Others, p)
			}
		}
		rep.CDFs = append(rep.CDFs, c)
	}
	return rep
}

// logAxis maps milliseconds to x on a log10 scale.
type logAxis struct{ lo, hi, left, right float64 }

func (a logAxis) x(ms float64) float64 {
	if ms <= 0 {
		return a.left
	}
	f := (math.Log10(ms) - a.lo) / (a.hi - a.lo)
	return a.left + (a.right-a.left)*clamp01(f)
}

func cdfY(f float64) float64 { return cdfTop + (cdfHeight-cdfTop-cdfBottom)*(1-f) }

// axisRange pads [lo, hi] and widens it to at least one decade so that a
// tight distribution is not stretched into a misleading wall.
func axisRange(lo, hi float64) (float64, float64) {
	lo, hi = lo/1.15, hi*1.15
	if hi/lo < 10 {
		mid := math.Sqrt(lo * hi)
		lo, hi = mid/math.Sqrt(10), mid*math.Sqrt(10)
	}
	return lo, hi
}

// logTicks returns 1-2-5 ticks within [lo, hi], or only powers of ten when
// the range spans many decades.
func logTicks(lo, hi float64) []float64 {
	steps := []float64{1, 2, 5}
	if hi/lo > 1e4 {
		steps = []float64{1}
	}
	var ticks []float64
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range steps {
			t := m * math.Pow(10, e)
			if t >= lo && t <= hi {
				ticks = append(ticks, t)
			}
		}
	}
	return ticks
}

func tickLabel(ms float64) string {
	if ms >= 1000 {
		return strconv.FormatFloat(ms/1000, 'g', 3, 64) + "s"
	}
	return strconv.FormatFloat(ms, 'g', 3, 64) + "ms"
}

// cdfPath draws the empirical CDF of sorted as a step path, thinned to at
// most cdfMaxPoints steps taken at evenly spaced ranks.
func cdfPath(sorted []time.Duration, ax logAxis) string {
	n := len(sorted)
	if n == 0 {
		return ""
	}
	var b strings.Builder
	x0 := ax.x(float64(sorted[0]) / 1e6)
	fmt.Fprintf(&b, "M%.1f,%.1f", x0, cdfY(0))
	steps := min(n, cdfMaxPoints)
	for k := 1; k <= steps; k++ {
		idx := k*n/steps - 1 // the last index whose rank is within step k
		fmt.Fprintf(&b, " H%.1f V%.1f", ax.x(float64(sorted[idx])/1e6), cdfY(float64(idx+1)/float64(n)))
	}
	return b.String()
}

func clamp01(f float64) float64 {
	if math.IsNaN(f) {
		return 0
	}
	return min(max(f, 0), 1)
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1"/>
<title>kvfast replay report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 4px 10px; text-align: right; border-bottom: 1px solid #ddd; }
th:first-child, td:first-child { text-align: left; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
.cdfs { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; }
figcaption { font-weight: bold; }
svg text { font-size: 11px; fill: #444; }
.grid { stroke: #eee; }
.axis { stroke: #888; }
.other { fill: none; stroke: #ccc; stroke-width: 1; }
.cdf-curve { fill: none; stroke-width: 2; }
.bound { stroke: #000; stroke-width: 2; stroke-dasharray: 4 2; }
.lru { stroke: #000; stroke-width: 2; stroke-dasharray: 1 2; }
.sweep-line { fill: none; stroke-width: 2; }
.sweep-ref { fill: none; stroke-width: 2; stroke-dasharray: 5 3; }
.note { color: #666; font-size: 0.9em; }
</style>
</head>
<body>
<h1>kvfast replay report</h1>
<p class="note">Trace: {{.Sources}}. Generated {{.Generated}}.</p>
<table class="summary">
<thead><tr><th>policy</th><th>requests</th><th>errors</th><th>TTFT p50</th><th>TTFT p90</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p90</th><th>ITL p99</th><th>E2E p50</th><th>hit rate</th><th>bound</th><th>of bound</th>{{if .HasLRU}}<th>pooled LRU</th><th>of LRU</th>{{end}}<th>req/s</th><th>out tok/s</th></tr></thead>
<tbody>
{{- range .Rows}}
<tr><td><span class="swatch" style="background: {{.Color}}"></span>{{.Name}}</td><td>{{.Requests}}</td><td>{{.Errors}}</td><td>{{.TTFTP50}}</td><td>{{.TTFTP90}}</td><td>{{.TTFTP99}}</td><td>{{.ITLP50}}</td><td>{{.ITLP90}}</td><td>{{.ITLP99}}</td><td>{{.E2E}}</td><td>{{.HitRate}}</td><td>{{.Bound}}</td><td>{{.OfBound}}</td>{{if $.HasLRU}}<td>{{.LRU}}</td><td>{{.OfLRU}}</td>{{end}}<td>{{.ReqPerSec}}</td><td>{{.TokPerSec}}</td></tr>
{{- end}}
</tbody>
</table>
{{- range .Tables}}
<h2>{{.Title}}</h2>
{{- if .Note}}
<p class="note">{{.Note}}</p>
{{- end}}
<table class="extra">
<thead><tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr></thead>
<tbody>
{{- range .Rows}}
<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{- end}}
</tbody>
</table>
{{- end}}
<h2>Prefix hit rate</h2>
<p class="note">Cached prompt tokens reported by the engines over all prompt tokens. The dashed line is the infinite-cache bound computed from the trace: no routing can do better.{{if .HasLRU}} The dotted line is the pooled-LRU reference: one LRU cache of all engines' capacity together, fed the same prompts.{{end}}</p>
<svg class="hits" xmlns="http://www.w3.org/2000/svg" width="{{.Bars.W}}" height="{{.Bars.H}}" viewBox="0 0 {{.Bars.W}} {{.Bars.H}}" role="img">
<line class="axis" x1="{{.Bars.ScaleLeft}}" y1="2" x2="{{.Bars.ScaleLeft}}" y2="{{.Bars.GridBot}}"/>
<line class="grid" x1="{{.Bars.ScaleMid}}" y1="2" x2="{{.Bars.ScaleMid}}" y2="{{.Bars.GridBot}}"/>
<line class="grid" x1="{{.Bars.ScaleRight}}" y1="2" x2="{{.Bars.ScaleRight}}" y2="{{.Bars.GridBot}}"/>
{{- range .Bars.Rows}}
<g class="hit-bar" data-policy="{{.Name}}">
<text x="4" y="{{.TextY}}">{{.Name}}</text>
<rect x="{{$.Bars.ScaleLeft}}" y="{{.Y}}" width="{{.Width}}" height="20" fill="{{.Color}}"/>
<line class="bound" x1="{{.BoundX}}" y1="{{.BoundTop}}" x2="{{.BoundX}}" y2="{{.BoundBot}}"/>
{{- if .LRUX}}
<line class="lru" x1="{{.LRUX}}" y1="{{.BoundTop}}" x2="{{.LRUX}}" y2="{{.BoundBot}}"/>
{{- end}}
<text x="{{.TxtX}}" y="{{.TextY}}">{{.Label}}</text>
</g>
{{- end}}
<text x="{{.Bars.ScaleLeft}}" y="{{.Bars.AxisY}}" text-anchor="middle">0</text>
<text x="{{.Bars.ScaleMid}}" y="{{.Bars.AxisY}}" text-anchor="middle">0.5</text>
<text x="{{.Bars.ScaleRight}}" y="{{.Bars.AxisY}}" text-anchor="middle">1</text>
</svg>
<h2>TTFT distribution</h2>
<p class="note">Empirical CDF of time to first token per policy, log scale, same axes throughout; the other policies are drawn in grey for comparison.{{if not .HasTTFT}} No request succeeded, so the charts are empty.{{end}}</p>
<div class="cdfs">
{{- range .CDFs}}
<figure class="cdf" data-policy="{{.Name}}">
<figcaption>{{.Name}}: p50 {{.P50}}, p99 {{.P99}}</figcaption>
<svg xmlns="http://www.w3.org/2000/svg" width="{{$.W}}" height="{{$.H}}" viewBox="0 0 {{$.W}} {{$.H}}" role="img">
{{- range $.YTicks}}
<line class="grid" x1="{{$.PlotLeft}}" y1="{{.Pos}}" x2="{{$.PlotRight}}" y2="{{.Pos}}"/>
<text x="{{$.PlotLeft}}" y="{{.Pos}}" dx="-4" dy="4" text-anchor="end">{{.Label}}</text>
{{- end}}
{{- range $.XTicks}}
<line class="grid" x1="{{.Pos}}" y1="{{$.PlotTop}}" x2="{{.Pos}}" y2="{{$.PlotBot}}"/>
<text x="{{.Pos}}" y="{{$.XLabelY}}" text-anchor="middle">{{.Label}}</text>
{{- end}}
<line class="axis" x1="{{$.PlotLeft}}" y1="{{$.PlotBot}}" x2="{{$.PlotRight}}" y2="{{$.PlotBot}}"/>
<line class="axis" x1="{{$.PlotLeft}}" y1="{{$.PlotTop}}" x2="{{$.PlotLeft}}" y2="{{$.PlotBot}}"/>
{{- range .Others}}
<path class="other" d="{{.}}"/>
{{- end}}
{{- if .Path}}
<path class="cdf-curve" stroke="{{.Color}}" d="{{.Path}}"/>
{{- end}}
<text x="{{$.XTitleX}}" y="{{$.XTitleY}}" text-anchor="middle">TTFT (log scale)</text>
</svg>
</figure>
{{- end}}
</div>
{{- range .Sweeps}}
<h2>{{.Title}}</h2>
<p class="note">Prefix hit rate against total cache capacity, as a fraction of the replayed prompts' working set (distinct KV blocks). Solid: policies; dashed: references computed from the trace.</p>
<svg class="sweep" xmlns="http://www.w3.org/2000/svg" width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}" role="img">
{{- range .YTicks}}
<line class="grid" x1="{{$.PlotLeft}}" y1="{{.Pos}}" x2="{{$.PlotRight}}" y2="{{.Pos}}"/>
<text x="{{$.PlotLeft}}" y="{{.Pos}}" dx="-4" dy="4" text-anchor="end">{{.Label}}</text>
{{- end}}
{{- range .XTicks}}
<line class="grid" x1="{{.Pos}}" y1="{{$.PlotTop}}" x2="{{.Pos}}" y2="{{$.PlotBot}}"/>
<text x="{{.Pos}}" y="{{$.XLabelY}}" text-anchor="middle">{{.Label}}</text>
{{- end}}
<line class="axis" x1="{{$.PlotLeft}}" y1="{{$.PlotBot}}" x2="{{$.PlotRight}}" y2="{{$.PlotBot}}"/>
<line class="axis" x1="{{$.PlotLeft}}" y1="{{$.PlotTop}}" x2="{{$.PlotLeft}}" y2="{{$.PlotBot}}"/>
{{- range .Lines}}
<path class="{{if .Reference}}sweep-ref{{else}}sweep-line{{end}}" stroke="{{.Color}}" d="{{.Path}}" data-series="{{.Name}}"/>
{{- end}}
{{- range .Lines}}
<text x="{{.LegendX}}" y="{{.LegendY}}" fill="{{.Color}}">{{.Name}}</text>
{{- end}}
<text x="{{.XTitleX}}" y="{{.XTitleY}}" text-anchor="middle">capacity / working set</text>
</svg>
{{- end}}
</body>
</html>
`))
