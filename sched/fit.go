package sched

import "math"

// robustLine fits y ≈ intercept + slope·x online: a weighted least-squares
// line over exponentially decayed sums, with Huber weights on relative
// residuals and a prior that holds the fit until data outweigh it.
//
// Latencies are noisy in proportion to their size and carry heavy tails (a
// request that queued behind a burst, a stalled connection), so the fit
// works in relative residuals: an observation that misses the current line
// by more than huberK robust scales is down-weighted in proportion, so no
// single outlier can move the line by more than a bounded step. The sums
// decay by decay per observation, so memory and CPU are constant and the
// fit follows an engine whose speed drifts (a new model, a degraded GPU).
//
// The prior enters as two pseudo-observations on the prior line, at x = 0
// and x = xRef, of total weight priorWeight that fades as observations
// come, so with no data the fit is the prior, and after a few dozen
// observations it is theirs. robustLine is not safe for concurrent use.
type robustLine struct {
	c0, m0      float64 // the prior line
	xRef        float64 // where the prior's second pseudo-observation sits
	priorWeight float64

	w, sx, sy, sxx, sxy float64 // decayed weighted sums of the observations
	scale               float64 // robust scale of relative residuals
	samples             uint64

	c, m float64 // the current fit
}

const (
	// fitDecay keeps about the last 500 observations in the fit.
	fitDecay = 1 - 1.0/512
	// huberK is the Huber threshold in robust scales: residuals beyond it
	// count with weight huberK·scale/|r|.
	huberK = 2.0
	// scaleRate is how fast the robust scale follows the residuals.
	scaleRate = 0.05
	// initialScale is the relative residual scale assumed before any
	// data: generous, so that a prior far from the truth is not taken
	// for the measurement and the data's outliers for the rule.
	initialScale = 0.5
	// priorFade is the observations after which the prior weighs half
	// its initial worth.
	priorFade = 8
	// minScale keeps the scale from collapsing on noiseless data, which
	// would turn every later change of regime into an outlier.
	minScale = 0.01
)

func newRobustLine(c0, m0, xRef, priorWeight float64) robustLine {
	return robustLine{c0: c0, m0: m0, xRef: xRef, priorWeight: priorWeight, scale: initialScale, c: c0, m: m0}
}

// predict is the fitted y at x.
func (l *robustLine) predict(x float64) float64 { return l.c + l.m*x }

// observe adds one observation; non-finite or negative ones are ignored.
func (l *robustLine) observe(x, y float64) {
	if !(x >= 0) || !(y >= 0) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return
	}
	yhat := max(l.predict(x), l.floor())
	r := (y - yhat) / yhat
	ar := math.Abs(r)
	wt := 1.0
	if lim := huberK * l.scale; ar > lim {
		wt = lim / ar
	}
	l.scale += scaleRate * (min(ar, 3*l.scale) - l.scale)
	l.scale = max(l.scale, minScale)
	// Relative residuals: weigh each observation by 1/ŷ², so that a long
	// prompt's TTFT does not drown a short one's.
	wt /= yhat * yhat
	l.w = l.w*fitDecay + wt
	l.sx = l.sx*fitDecay + wt*x
	l.sy = l.sy*fitDecay + wt*y
	l.sxx = l.sxx*fitDecay + wt*x*x
	l.sxy = l.sxy*fitDecay + wt*x*y
	l.samples++
	l.solve()
}

// floor is the smallest prediction residuals are taken relative to, so
// that a line through the origin does not divide by zero near it.
func (l *robustLine) floor() float64 {
	return max(1e-3*(l.c0+l.m0*l.xRef), 1e-9)
}

// solve refits the line from the sums and the prior, keeping the slope
// positive and the intercept non-negative.
func (l *robustLine) solve() {
	w, sx, sy, sxx, sxy := l.w, l.sx, l.sy, l.sxx, l.sxy
	// The prior's pseudo-observations, weighted as an observation at
	// their x would be now: relative to the current fit, not to the
	// prior's own values, or a prior far below the data would outweigh
	// them however many there are.
	y1 := l.c0 + l.m0*l.xRef
	f0, f1 := max(l.c, l.floor()), max(l.predict(l.xRef), l.floor())
	// The prior fades as observations come: by the hundredth it weighs
	// under a tenth of one, still enough to pin a slope that the data,
	// all at one x, leave open.
	pw := l.priorWeight * priorFade / (priorFade + float64(l.samples))
	p0 := pw / 2 / (f0 * f0)
	p1 := pw / 2 / (f1 * f1)
	w += p0 + p1
	sx += p1 * l.xRef
	sy += p0*l.c0 + p1*y1
	sxx += p1 * l.xRef * l.xRef
	sxy += p1 * l.xRef * y1
	det := w*sxx - sx*sx
	m := (w*sxy - sx*sy) / det
	c := (sy - m*sx) / w
	if !(det > 0) || math.IsNaN(m) || math.IsNaN(c) {
		return
	}
	if c < 0 {
		// The data want a line below the origin: fit through it instead.
		c, m = 0, sxy/sxx
	}
	// A slope of zero would make the fitted cost free; bound the fit to
	// within a factor 10⁴ of the prior either way.
	l.m = min(max(m, l.m0*1e-4), l.m0*1e4)
	l.c = min(c, max(l.c0, l.floor())*1e4)
}

// ewma is an exponentially weighted mean with a prior that counts as
// priorWeight observations and decays like them.
type ewma struct {
	mean, weight float64
}

func (e *ewma) observe(v float64) {
	if !(v >= 0) || math.IsInf(v, 0) {
		return
	}
	e.weight = e.weight*fitDecay + 1
	e.mean += (v - e.mean) / e.weight
}
