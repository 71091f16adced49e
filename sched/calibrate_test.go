package sched

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// noisy returns y with lognormal noise of about sigma relative, and with
// probability outliers an outlier instead: the value times or divided by
// up to 20, the way a request stuck behind a burst or a stalled
// connection looks.
func noisy(r *rand.Rand, y, sigma, outliers float64) float64 {
	if r.Float64() < outliers {
		f := 2 + 18*r.Float64()
		if r.IntN(4) == 0 {
			return y / f
		}
		return y * f
	}
	return y * math.Exp(sigma*r.NormFloat64())
}

func within(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

func TestRobustLineConvergesThroughNoiseAndOutliers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		c, m     float64 // the truth
		xMax     float64
		outliers float64
		cached   float64 // fraction of observations at x = 0, fully cached prompts
	}{
		// The prior is 20 ms + 50 µs/token; engines far from it either way.
		{"slower than the prior", 0.050, 400e-6, 8192, 0.10, 0},
		{"faster than the prior", 0.004, 8e-6, 8192, 0.10, 0},
		{"a fifth outliers", 0.020, 60e-6, 16384, 0.20, 0},
		// Short TTFTs weigh most in relative terms: they must not let the
		// prior hold the slope.
		{"most prompts cached", 0.003, 25e-6, 8192, 0.05, 0.6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			l := newRobustLine(priorPrefillOverhead.Seconds(), priorPrefillPerToken.Seconds(), priorPrefillRefTokens, priorWeight)
			for range 3000 {
				x := math.Floor(tc.xMax * r.Float64())
				if r.Float64() < tc.cached {
					x = 0
				}
				l.observe(x, noisy(r, tc.c+tc.m*x, 0.15, tc.outliers))
			}
			if !within(l.m, tc.m, 0.10) || !within(l.c, tc.c, 0.35) {
				t.Fatalf("fit %.4g + %.4g·x, want %.4g + %.4g·x", l.c, l.m, tc.c, tc.m)
			}
		})
	}
}

func TestRobustLineBoundsOneOutlier(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	l := newRobustLine(0.010, 150e-6, 32, priorWeight)
	for range 500 {
		x := float64(1 + r.IntN(64))
		l.observe(x, noisy(r, 0.005+200e-6*x, 0.05, 0))
	}
	before := l.m
	l.observe(32, 1000) // a request that hung for a quarter of an hour
	if !within(l.m, before, 0.05) {
		t.Fatalf("one outlier moved the slope from %.4g to %.4g", before, l.m)
	}
	for _, bad := range [][2]float64{{math.NaN(), 1}, {1, math.Inf(1)}, {-1, 1}, {1, -1}} {
		l.observe(bad[0], bad[1])
	}
	if l.m != l.m || l.c != l.c || l.samples != 501 {
		t.Fatalf("invalid observations were taken: %+v", l)
	}
}

func TestRobustLineFollowsADrift(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	l := newRobustLine(priorPrefillOverhead.Seconds(), priorPrefillPerToken.Seconds(), priorPrefillRefTokens, priorWeight)
	feed := func(m float64) {
		for range 4000 {
			x := math.Floor(8192 * r.Float64())
			l.observe(x, noisy(r, 0.01+m*x, 0.1, 0.05))
		}
	}
	feed(40e-6)
	feed(120e-6) // the engine became three times slower
	if !within(l.m, 120e-6, 0.10) {
		t.Fatalf("slope %.4g after the drift, want about %.4g", l.m, 120e-6)
	}
}

func TestRobustLineWithoutDataIsThePrior(t *testing.T) {
	l := newRobustLine(0.02, 50e-6, 4096, priorWeight)
	l.solve()
	if !within(l.c, 0.02, 1e-9) || !within(l.m, 50e-6, 1e-9) {
		t.Fatalf("fit %v + %v·x, want the prior", l.c, l.m)
	}
	// All observations at one x say nothing of the slope: it stays the
	// prior's, and the level follows the data.
	for range 100 {
		l.observe(1000, 0.2)
	}
	if got := l.predict(1000); !within(got, 0.2, 0.05) || !within(l.m, 50e-6, 0.01) {
		t.Fatalf("predicts %v at the only x seen, slope %v", got, l.m)
	}
}

// TestCalibratorScale checks the derived scale on exact data: an engine
// prefilling at 60 µs a token, whose decode step costs 140 µs a sequence,
// with 5,000 tokens of context a sequence and 200 output tokens a request,
// weighs a prefill block 60·5000/(200·140) ≈ 10.7 decode blocks.
func TestCalibratorScale(t *testing.T) {
	var c calibrator
	c.reset()
	if prior, want := c.loadScale(), 50e-6*priorContextTokens/(priorOutputTokens*150e-6); !within(prior, want, 1e-9) {
		t.Fatalf("prior scale %v, want %v", prior, want)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		tokens := int64(r.IntN(20000))
		c.observePrefill(tokens, seconds(noisy(r, 0.008+60e-6*float64(tokens), 0.1, 0.05)))
		seqs := 1 + r.IntN(48)
		gap := seconds(noisy(r, 0.003+140e-6*float64(seqs), 0.1, 0.05))
		c.observeDecode(gap, float64(seqs), noisy(r, 5000, 0.1, 0), 150+r.IntN(101))
	}
	got := c.snapshot()
	if !within(got.PrefillLoadScale, 60e-6*5000/(200*140e-6), 0.15) {
		t.Fatalf("scale %.3g from %+v, want about %.3g", got.PrefillLoadScale, got, 60e-6*5000/(200*140e-6))
	}
	if got.PrefillSamples != 2000 || got.DecodeSamples != 2000 {
		t.Fatalf("samples %d and %d, want 2000 each", got.PrefillSamples, got.DecodeSamples)
	}
}

// TestAutoScaleSteersSelection: with AutoPrefillLoadScale every worker's
// cost uses the median of the workers' scales, the prior's standing for a
// worker not yet calibrated, which follows their fits; a fixed scale
// ignores them.
func TestAutoScaleSteersSelection(t *testing.T) {
	cost := DefaultCostParams()
	cost.AutoPrefillLoadScale = true
	s := newTestScheduler(t, 3, Config{BlockSize: 16, Cost: &cost})
	prior := s.autoScale()
	if !within(prior, s.calib[0].loadScale(), 1e-12) {
		t.Fatalf("shared scale %v before any data, want the prior's %v", prior, s.calib[0].loadScale())
	}
	// Workers 0 and 1 learn that prefill is dear against decode; worker 2
	// has seen too little to count.
	for w := range 2 {
		for i := range 500 {
			tokens := int64(i * 16)
			s.calib[w].observePrefill(tokens, time.Duration(tokens)*time.Duration(300+100*w)*time.Microsecond)
			s.calibrated()
			seqs := 1 + i%48
			s.calib[w].observeDecode(2*time.Millisecond+time.Duration(seqs)*100*time.Microsecond, float64(seqs), priorContextTokens, priorOutputTokens)
		}
	}
	s.calib[2].observePrefill(10, time.Second)
	for range autoScaleEvery {
		s.calibrated()
	}
	// Worker 2 votes for the prior: the median of three is the lower of
	// the two fits.
	want := min(s.calib[0].loadScale(), s.calib[1].loadScale())
	if got := s.autoScale(); !within(got, want, 1e-12) || !(got > 2*prior) {
		t.Fatalf("shared scale %v, want %v, the median of the two fits and the prior %v", got, want, prior)
	}
	var scores Scores
	req := &Request{Hashes: prompt(1, 0, 1, 10), PromptTokens: 160, QueryOnly: true, Scores: &scores}
	if _, err := s.Select(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	for w := range 3 {
		ws := scores.Workers[w]
		if !within(ws.Cost, want*ws.PrefillBlocks+ws.DecodeBlocks, 1e-12) {
			t.Errorf("worker %d: cost %v, want %v·%v + %v", w, ws.Cost, want, ws.PrefillBlocks, ws.DecodeBlocks)
		}
	}
	fixed := DefaultCostParams()
	fixed.PrefillLoadScale = 3
	req.Cost = &fixed
	if _, err := s.Select(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	if ws := scores.Workers[0]; ws.Cost != 3*ws.PrefillBlocks+ws.DecodeBlocks {
		t.Errorf("a fixed scale used the fit: cost %v", ws.Cost)
	}
}

// TestReservationFeedsCalibration: a booked request's first token and
// completion reach its worker's calibrator, an aborted one's completion
// does not, a decode stage whose prompt another engine computed teaches
// only decode, timed from its own first token, and a new engine in the
// slot starts from the prior.
func TestReservationFeedsCalibration(t *testing.T) {
	s := newTestScheduler(t, 1, Config{BlockSize: 16})
	var res Reservation
	for i, stage := range []Stage{StageAny, StageAny, StageAny, StagePrefill, StageDecode, StageAny, StageDecode} {
		if _, err := s.Select(context.Background(), &Request{Hashes: prompt(uint64(i+1), 0, 1, 4), PromptTokens: 70, Stage: stage}, &res); err != nil {
			t.Fatal(err)
		}
		if i == 4 { // prefilled elsewhere; request 6 prefills here
			res.RemotePrefillDone()
			res.AwaitDecode()
			if res.firstAt != 0 {
				t.Fatal("the end of a remote prefill was taken for the first token")
			}
		}
		res.PrefillDone()
		if res.firstAt == 0 {
			t.Fatalf("request %d: no first token recorded", i)
		}
		switch i {
		case 0, 1, 3, 4:
			res.Completed(20)
		case 5:
			res.Completed(1) // one token: nothing was decoded
		}
		res.Release()
		res.Completed(20) // released: ignored
		res.Reset()
	}
	// Requests 0-3, 5 and 6 taught prefill; 0, 1 and 4 taught decode (2
	// and 6 aborted, a prefill stage's one token and a one-token answer
	// never decoded).
	got := s.Calibration(0)
	if got.PrefillSamples != 6 || got.DecodeSamples != 3 || got.OutputTokens >= priorOutputTokens/2 {
		t.Fatalf("calibration %+v: want 6 first tokens, 3 completions, output pulled toward 20", got)
	}
	if err := s.Upsert(WorkerInfo{ID: 7, Slot: 0, Model: "m", Endpoint: "http://127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	if got := s.Calibration(0); got.PrefillSamples != 0 || got.DecodeSamples != 0 {
		t.Fatalf("a new engine inherited its slot's calibration: %+v", got)
	}
	if got := s.Calibration(workers.Slot(workers.Max)); got != (Calibration{}) {
		t.Fatalf("invalid slot: %+v", got)
	}
}

// TestUnstreamedAheadTeachesNothing: a request booked behind an
// unstreamed one's prompt (which stays counted until that request ends,
// computed long before) teaches the prefill fit nothing: it took the
// stale tokens for work its wait paid for, and a mix of streamed and
// unstreamed clients pulled the fitted cost per token down 73-fold. Once
// the unstreamed request is released, the next one teaches again, and the
// counters return to zero.
func TestUnstreamedAheadTeachesNothing(t *testing.T) {
	s := newTestScheduler(t, 1, Config{BlockSize: 16})
	var blind, behind, after Reservation
	book := func(res *Reservation, first uint64, unstreamed bool) {
		t.Helper()
		if _, err := s.Select(context.Background(), &Request{Hashes: prompt(first, 0, 1, 4), PromptTokens: 70, Unstreamed: unstreamed}, res); err != nil {
			t.Fatal(err)
		}
	}
	book(&blind, 1, true)
	book(&behind, 2, false)
	behind.PrefillDone()
	if got := s.Calibration(0).PrefillSamples; got != 0 {
		t.Fatalf("a first token booked behind an unstreamed prompt taught the fit: %d samples", got)
	}
	behind.Release()
	blind.Release()
	book(&after, 3, false)
	after.PrefillDone()
	if got := s.Calibration(0).PrefillSamples; got != 1 {
		t.Fatalf("once the unstreamed request ended, a first token taught %d samples, want 1", got)
	}
	after.Release()
	if l, c := &s.live[0], &s.calib[0]; l.prefillTokens.Load() != 0 || c.blindPrefill.Load() != 0 {
		t.Fatalf("prefill %d, unstreamed prefill %d left booked", l.prefillTokens.Load(), c.blindPrefill.Load())
	}
}

// TestDisaggregatedPoolScale: without workers of both roles, the scale
// comes from the prefill workers' prefill slope and the decode workers'
// decode fit, neither of which times the other half; an encoder has no
// vote.
func TestDisaggregatedPoolScale(t *testing.T) {
	cost := DefaultCostParams()
	cost.AutoPrefillLoadScale = true
	s, err := New(Config{Cost: &cost, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	roles := []workers.Role{workers.RolePrefill, workers.RolePrefill, workers.RoleDecode, workers.RoleDecode, workers.RoleEncode}
	for i, r := range roles {
		if err := s.Upsert(WorkerInfo{ID: uint64(i), Slot: workers.Slot(i), Model: "m", Role: r}); err != nil {
			t.Fatal(err)
		}
	}
	prior := s.PrefillLoadScale()
	for i := range 200 {
		for w := range 2 { // prefill: 200 and 240 µs a token
			tokens := int64(100 + i*16)
			s.calib[w].observePrefill(tokens, time.Duration(tokens)*time.Duration(200+40*w)*time.Microsecond)
		}
		for w := 2; w < 4; w++ { // decode: 140 µs a sequence
			seqs := 1 + i%32
			s.calib[w].observeDecode(3*time.Millisecond+time.Duration(seqs)*140*time.Microsecond, float64(seqs), 5000, 200)
		}
		s.calib[4].observePrefill(10, time.Second) // an encoder's timing means nothing here
	}
	for range autoScaleEvery {
		s.calibrated()
	}
	// Two votes each: their geometric mean (median).
	alpha := math.Sqrt(s.calib[0].prefill.m * s.calib[1].prefill.m)
	gamma := math.Sqrt(s.calib[2].decode.m * s.calib[3].decode.m)
	want := scaleOf(alpha, gamma, s.calib[2].context.mean, s.calib[2].output.mean)
	if got := s.PrefillLoadScale(); !within(got, want, 1e-9) || !within(got, 220e-6*5000/(200*140e-6), 0.1) || within(got, prior, 0.5) {
		t.Fatalf("pool scale %v, want %v (about %v), away from the prior %v", got, want, 220e-6*5000/(200*140e-6), prior)
	}
	pinned := DefaultCostParams()
	pinned.PrefillLoadScale = 3
	if err := s.SetCostParams(pinned); err != nil {
		t.Fatal(err)
	}
	if got := s.PrefillLoadScale(); got != 3 {
		t.Fatalf("pinned at 3: PrefillLoadScale %v", got)
	}
}

func TestBatchAreaIntegratesRequestsInFlight(t *testing.T) {
	var b batchArea
	b.add(10, 1)
	b.add(20, 1)
	if got := b.read(30); got != 1*10+2*10 {
		t.Fatalf("area %d at 30, want 30", got)
	}
	b.add(30, -2)
	b.add(25, 1) // a clock read before the last change: counted from it
	if got := b.read(50); got != 30+1*20 {
		t.Fatalf("area %d at 50, want 50", got)
	}
}

// TestEWMABoundsOneOutlier: one huge answer barely moves a settled mean,
// a lasting shift still moves it.
func TestEWMABoundsOneOutlier(t *testing.T) {
	e := ewma{mean: priorOutputTokens, weight: priorMeanWeight}
	for range 600 {
		e.observe(200)
	}
	before := e.mean
	e.observe(100_000)
	if d := e.mean - before; !(d > 0 && d < 2) {
		t.Fatalf("one 100k-token answer moved the mean from %v by %v, want under 2 tokens", before, d)
	}
	for range 1000 {
		e.observe(2000)
	}
	if e.mean < 1700 {
		t.Fatalf("after 1000 answers of 2000 tokens the mean is %v, want it to have followed", e.mean)
	}
	fresh := ewma{mean: priorOutputTokens, weight: priorMeanWeight}
	fresh.observe(5000)
	if fresh.mean < 4000 {
		t.Fatalf("a first observation of 5000 gives %v: an unsettled mean must follow the data", fresh.mean)
	}
}
