package sched

import (
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/workers"
)

// The cost model counts prefill in blocks and decode in blocks, and
// PrefillLoadScale converts the one into the other. With
// CostParams.AutoPrefillLoadScale the scheduler measures that rate
// instead of taking it as configured (docs/routing.md, "Calibrated
// prefill load scale", derives it). Per worker it fits
//
//	TTFT           ≈ prefillOverhead + prefillPerToken · tokens
//	                 (tokens: prefill booked ahead on the worker, plus the
//	                 request's own uncached prompt)
//	inter-token    ≈ decodeStep + decodePerSequence · sequences
//	scale          = prefillPerToken · contextTokens / (outputTokens · decodePerSequence)
//
// where contextTokens is the mean KV a sequence in flight holds, in the
// decode term's blocks, and outputTokens the mean output of a request: a
// prefill block then weighs what the time to compute it is worth in
// decode blocks, each slowing every step of the new request's generation.
// Both fits are robustLines, fed at a request's first token and at its
// completion, never per token.
//
// The cost model applies one scale to every worker, the median of theirs:
// costs are compared across workers, so they must share a unit, and one
// worker's noisy fit must not make it look dearer or cheaper than its
// peers.

// Priors: an 8B-parameter model on one H100-class GPU, the same shape as
// mocker.DefaultTiming, give or take a factor of two. The fit leaves them
// behind after a few dozen requests.
const (
	priorPrefillOverhead  = 20 * time.Millisecond // TTFT intercept: dispatch, one step, the wire
	priorPrefillPerToken  = 50 * time.Microsecond // about 20k prefill tokens a second
	priorPrefillRefTokens = 1024                  // spread of the slope's prior, in prompt tokens
	priorDecodeStep       = 10 * time.Millisecond // step overhead with an empty batch
	// priorDecodePerPrefillToken is the prior of a sequence's share of a
	// decode step, in prefill tokens: one decoded token is one token's
	// forward pass plus a read of the sequence's whole KV, so it costs a
	// few prefilled tokens (2.4 to 2.8 in mocker.DefaultTiming). Tied to
	// the fitted prefill speed, the prior holds on any hardware; it
	// decides the decode slope only while the batch barely varies, as at
	// light load, where the router cannot measure it.
	priorDecodePerPrefillToken = 3
	priorDecodeRefSeqs         = 4 // spread of the slope's prior, in sequences
	// A sequence in flight holds a few thousand tokens of KV and a
	// request generates a short answer: the shape of the RAG, agent and
	// multi-turn traffic that prefix caching is for. With the decode
	// prior they give a scale of 4096 / (3 · 128) ≈ 10.7 until the
	// workers' first requests have been measured.
	priorContextTokens = 4096
	priorOutputTokens  = 128
	// priorWeight is the fitted lines' prior's worth in observations,
	// priorMeanWeight the measured means'.
	priorWeight     = 4
	priorMeanWeight = 0.25
	// minCalibrationSamples are the first tokens a worker must have seen
	// before its scale counts toward the one the cost model uses.
	minCalibrationSamples = 8
	// autoScaleEvery: the shared scale is recomputed after this many
	// observations, so that the median costs little per request.
	autoScaleEvery = 8
)

// Bounds on the derived scale: beyond them the cost model is pure
// affinity or pure load balance, which the fit has no business choosing
// on its own.
const (
	MinAutoPrefillLoadScale = 1.0 / 64
	MaxAutoPrefillLoadScale = 1024
)

// Calibration is one worker's fitted engine timing and the prefill load
// scale derived from it.
type Calibration struct {
	PrefillOverhead   time.Duration // TTFT with nothing to prefill
	PrefillPerToken   time.Duration // TTFT per prefill token booked ahead or in the prompt
	DecodeStep        time.Duration // inter-token gap with an empty batch
	DecodePerSequence time.Duration // inter-token gap per sequence in flight
	ContextTokens     float64       // mean KV tokens a sequence in flight holds
	OutputTokens      float64       // mean output tokens per request
	PrefillSamples    uint64        // first tokens observed
	DecodeSamples     uint64        // completions observed
	PrefillLoadScale  float64       // the scale derived from the above
}

// calibrator is one worker's estimator. Its mutex is taken twice per
// request (first token, completion), by the goroutine relaying that
// request, never by selection: selection reads scale, an atomic.
type calibrator struct {
	mu      sync.Mutex
	prefill robustLine
	decode  robustLine
	context ewma
	output  ewma
	scale   atomic.Uint64 // float64 bits of the derived scale
	samples atomic.Uint64 // first tokens observed (prefill.samples, for lock-free readers)
	batch   batchArea
	// retired counts prefill tokens whose first token came, so that a
	// request learns how much prefill the worker finished while it
	// waited: its own, what was queued ahead, and what shared its steps.
	retired atomic.Int64
	// blindPrefill is the part of the worker's booked prefill tokens that
	// unstreamed requests hold (Request.Unstreamed): no first token
	// releases them, so a request booked behind them cannot be timed.
	blindPrefill atomic.Int64
}

// batchArea integrates a worker's requests in flight over time, so that a
// request learns the mean batch it decoded with from two readings, at its
// first token and at its end, and not from the batch at either end, which
// a wave of requests finishing together would make look small. Writers
// (booking and release) are serialised by the scheduler's table lock;
// readers retry across a write, seqlock fashion, and never block it.
type batchArea struct {
	seq  atomic.Uint64 // odd while a writer is mid-update
	area atomic.Int64  // request·nanoseconds up to at
	at   atomic.Int64  // clock.Now of the last change
	n    atomic.Int64  // requests in flight since then
}

// add changes the requests in flight by d at now; the caller holds the
// scheduler's table lock.
func (b *batchArea) add(now, d int64) {
	b.seq.Add(1)
	at, n := b.at.Load(), b.n.Load()
	if at != 0 && now > at {
		b.area.Add(n * (now - at))
	}
	b.at.Store(max(now, at))
	b.n.Store(n + d)
	b.seq.Add(1)
}

// read returns the area up to now.
func (b *batchArea) read(now int64) int64 {
	for {
		s := b.seq.Load()
		if s&1 == 0 {
			area, at, n := b.area.Load(), b.at.Load(), b.n.Load()
			if b.seq.Load() == s {
				return area + n*max(now-at, 0)
			}
		}
		runtime.Gosched()
	}
}

func (c *calibrator) reset() {
	c.mu.Lock()
	c.prefill = newRobustLine(priorPrefillOverhead.Seconds(), priorPrefillPerToken.Seconds(), priorPrefillRefTokens, priorWeight)
	c.decode = newRobustLine(priorDecodeStep.Seconds(), priorDecodePerPrefillToken*priorPrefillPerToken.Seconds(), priorDecodeRefSeqs, priorWeight)
	// Context and output are measured, not fitted: one observation
	// already says more than the prior, which only fills the gap before.
	c.context = ewma{mean: priorContextTokens, weight: priorMeanWeight}
	c.output = ewma{mean: priorOutputTokens, weight: priorMeanWeight}
	c.samples.Store(0)
	c.publish()
	c.mu.Unlock()
}

// publish derives the scale from the fits; c.mu is held.
func (c *calibrator) publish() {
	c.scale.Store(math.Float64bits(scaleOf(c.prefill.m, c.decode.m, c.context.mean, c.output.mean)))
}

// scaleOf is the prefill load scale of a prefill slope alpha and a decode
// slope gamma (seconds per token, per sequence) with sequences holding
// context tokens and producing output tokens on average, bounded.
func scaleOf(alpha, gamma, context, output float64) float64 {
	s := alpha * context / (output * gamma)
	if math.IsNaN(s) {
		s = 1
	}
	return min(max(s, MinAutoPrefillLoadScale), MaxAutoPrefillLoadScale)
}

func (c *calibrator) loadScale() float64 { return math.Float64frombits(c.scale.Load()) }

// observePrefill records a first token ttft after booking, with tokens of
// prefill booked on the worker ahead of and including the request's own.
func (c *calibrator) observePrefill(tokens int64, ttft time.Duration) {
	c.mu.Lock()
	c.prefill.observe(float64(tokens), ttft.Seconds())
	c.samples.Store(c.prefill.samples)
	// The decode slope's prior follows the measured prefill speed.
	c.decode.m0 = priorDecodePerPrefillToken * c.prefill.m
	c.decode.solve()
	c.publish()
	c.mu.Unlock()
}

// observeDecode records a completed request: its mean inter-token gap
// over a batch of seqs sequences on average, each holding contextTokens
// of KV, and its output length.
func (c *calibrator) observeDecode(gap time.Duration, seqs, contextTokens float64, output int) {
	c.mu.Lock()
	if gap > 0 && seqs >= 1 {
		c.decode.observe(seqs, gap.Seconds())
		c.context.observe(contextTokens)
	}
	c.output.observe(float64(output))
	c.publish()
	c.mu.Unlock()
}

func (c *calibrator) snapshot() Calibration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Calibration{
		PrefillOverhead:   seconds(c.prefill.c),
		PrefillPerToken:   seconds(c.prefill.m),
		DecodeStep:        seconds(c.decode.c),
		DecodePerSequence: seconds(c.decode.m),
		ContextTokens:     c.context.mean,
		OutputTokens:      c.output.mean,
		PrefillSamples:    c.prefill.samples,
		DecodeSamples:     c.decode.samples,
		PrefillLoadScale:  c.loadScale(),
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// autoScale is the prefill load scale the cost model applies with
// AutoPrefillLoadScale, refreshed by calibrated.
func (s *Scheduler) autoScale() float64 { return math.Float64frombits(s.sharedScale.Load()) }

// PrefillLoadScale returns the prefill load scale the cost model applies
// now: the pinned one, or with AutoPrefillLoadScale the one the workers'
// fits give.
func (s *Scheduler) PrefillLoadScale() float64 {
	if p := s.params.Load(); !p.AutoPrefillLoadScale {
		return p.PrefillLoadScale
	}
	return s.autoScale()
}

// calibrated counts one observation and, every autoScaleEvery of them,
// recomputes the shared scale. Concurrent recomputations may race; each
// stores a scale of current fits, so whichever lands last is right.
//
// Costs are compared across workers, so they share one scale. Workers
// that serve both roles measure both halves of it, and the scale is the
// median of theirs. A disaggregated pool without such workers measures
// prefill speed on its prefill workers and decode cost on its decode
// workers, so the scale is derived from the medians of each half. Either
// way a worker that has seen fewer than minCalibrationSamples votes for
// the prior, so that the first worker's first fits do not steer the
// others' requests: the scale leaves the prior once half the workers have
// measured theirs. Encoders time neither half and have no vote.
func (s *Scheduler) calibrated() {
	if s.observations.Add(1)%autoScaleEvery != 0 {
		return
	}
	ws := s.workers.Load()
	var m float64
	if both := ws.present &^ (ws.onlyPrefill | ws.onlyDecode | ws.onlyEncode); both != 0 {
		var scales [workers.Max]float64
		n := 0
		for w := range both.All() {
			c := &s.calib[w]
			scales[n] = s.priorScale
			if c.samples.Load() >= minCalibrationSamples {
				scales[n] = c.loadScale()
			}
			n++
		}
		m = median(scales[:n])
	} else {
		if ws.onlyPrefill == 0 || ws.onlyDecode == 0 {
			return
		}
		m = s.pooledScale(ws.onlyPrefill, ws.onlyDecode)
	}
	s.sharedScale.Store(math.Float64bits(m))
}

// pooledScale is the scale of a pool whose prefill workers are prefill
// and decode workers decode: the prefill slope's median over the former
// against the decode slope's, context's and output's over the latter.
func (s *Scheduler) pooledScale(prefill, decode workers.Set) float64 {
	priorAlpha := priorPrefillPerToken.Seconds()
	var slopes, decodes, contexts, outputs [workers.Max]float64
	n := 0
	for w := range prefill.All() {
		c := &s.calib[w]
		c.mu.Lock()
		slopes[n] = priorAlpha
		if c.prefill.samples >= minCalibrationSamples {
			slopes[n] = c.prefill.m
		}
		c.mu.Unlock()
		n++
	}
	alpha := median(slopes[:n])
	n = 0
	for w := range decode.All() {
		c := &s.calib[w]
		c.mu.Lock()
		decodes[n], contexts[n], outputs[n] = priorDecodePerPrefillToken*priorAlpha, priorContextTokens, priorOutputTokens
		if c.decode.samples >= minCalibrationSamples {
			decodes[n], contexts[n], outputs[n] = c.decode.m, c.context.mean, c.output.mean
		}
		c.mu.Unlock()
		n++
	}
	return scaleOf(alpha, median(decodes[:n]), median(contexts[:n]), median(outputs[:n]))
}

// median sorts v (non-empty) and returns its middle value; of an even
// count, the geometric mean of the middle two. The values are scales and
// rates, which err by factors: with two workers the arithmetic mean let
// one sick engine's fit (a scale of 52 beside a healthy 0.33) set
// everyone's scale (26), where the geometric one stays between them in
// ratio (4.1).
func median(v []float64) float64 {
	slices.Sort(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		if lo := v[len(v)/2-1]; lo > 0 {
			m = math.Sqrt(lo * m)
		} else {
			m = (lo + m) / 2
		}
	}
	return m
}

// Calibration returns slot's fitted timing and derived prefill load scale:
// the prior until its requests have taught it otherwise. The fit runs
// whether or not the cost parameters use it.
func (s *Scheduler) Calibration(slot workers.Slot) Calibration {
	if !slot.Valid() {
		return Calibration{}
	}
	return s.calib[slot].snapshot()
}
