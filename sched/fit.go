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
// The prior is a ridge of weight priorWeight (solve), fading as
// observations come: with no data the fit is the prior, after a few dozen
// it is theirs wherever they say anything. robustLine is not safe for concurrent use.
type robustLine struct {
	c0, m0      float64 // the prior line
	xRef        float64 // where the prior's second pseudo-observation sits
	priorWeight float64

	n                   float64 // decayed count of the observations
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
	l.n = l.n*fitDecay + 1
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
//
// The prior is a ridge in centred form: the slope shrinks toward the
// prior's as if priorWeight observations sat xRef/2 either side of the
// data's mean, and the level at that mean toward the prior line's as if
// priorWeight observations sat there. So when the data barely spread in x
// (a worker whose batch hardly varies) the slope stays the prior's while
// the level follows the data, instead of the line pivoting on one prior
// point far from them; and data that do spread soon outweigh it.
func (l *robustLine) solve() {
	// The prior keeps its weight however many observations come: the
	// data's sums decay to about 500 of them, which outweigh it wherever
	// they spread, and where they do not (a batch that hardly varies) it
	// is what holds the slope.
	pw := l.priorWeight
	if l.n <= 0 || l.w <= 0 {
		l.c, l.m = l.c0, l.m0
		return
	}
	xbar, ybar := l.sx/l.w, l.sy/l.w
	sxx := max(l.sxx-l.w*xbar*xbar, 0)
	sxy := l.sxy - l.w*xbar*ybar
	// The pseudo-observations weigh what real ones at their x would:
	// 1/ŷ² by the current fit, as observe weighs.
	half := l.xRef / 2
	wLevel := pw / sq(max(l.predict(xbar), l.floor()))
	wSlope := pw * half * half / sq(max(l.predict(xbar+half), l.floor()))
	m := (sxy + wSlope*l.m0) / (sxx + wSlope)
	level := (l.w*ybar + wLevel*(l.c0+l.m0*xbar)) / (l.w + wLevel)
	c := level - m*xbar
	if math.IsNaN(m) || math.IsNaN(c) {
		return
	}
	if c < 0 {
		// The data want a line below the origin: fit through it instead.
		c, m = 0, (l.sxy+wSlope*l.m0)/(l.sxx+wSlope)
	}
	// A slope of zero would make the fitted cost free; bound the fit to
	// within a factor 10⁴ of the prior either way.
	l.m = min(max(m, l.m0*1e-4), l.m0*1e4)
	l.c = min(c, max(l.c0, l.floor())*1e4)
}

func sq(x float64) float64 { return x * x }

// ewma is an exponentially weighted mean with a prior that counts as
// priorWeight observations and decays like them. Once it has seen
// ewmaSettled observations' worth, an observation beyond ewmaClamp times
// the mean either way counts as that bound: one request with a 100k-token
// answer among 200-token ones moves the mean by a token or two instead
// of by hundreds, while a real shift is still followed, by a factor of about
// 2 every hundred observations.
type ewma struct {
	mean, weight float64
}

const (
	ewmaSettled = 8
	ewmaClamp   = 4
)

func (e *ewma) observe(v float64) {
	if !(v >= 0) || math.IsInf(v, 0) {
		return
	}
	if e.weight >= ewmaSettled && e.mean > 0 {
		v = min(max(v, e.mean/ewmaClamp), e.mean*ewmaClamp)
	}
	e.weight = e.weight*fitDecay + 1
	e.mean += (v - e.mean) / e.weight
}
