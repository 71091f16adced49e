package sched

import (
	"math"
	"math/bits"
	"sync/atomic"

	"github.com/kvfast/kvfast/workers"
)

// CostInputs is what the cost model knows about one worker for one request.
type CostInputs struct {
	BlockSize           int     // tokens per block
	PromptTokens        int     // the request's input length
	OverlapBlocks       uint32  // leading prompt blocks the worker already caches, on any tier
	HostBlocks          uint32  // of those, the ones held only in host memory
	DiskBlocks          uint32  // of those, the ones held only on storage
	ActivePrefillTokens int64   // prompt tokens booked on the worker, still in prefill
	ActiveDecodeBlocks  float64 // distinct in-flight blocks on the worker, plus output blocks
	NewBlocks           int64   // prompt blocks the request would add to the worker's active set
}

// WorkerCost is the cost of sending one request to one worker, with the two
// terms it is made of.
type WorkerCost struct {
	PrefillBlocks float64 // max(active prefill + request − credit·cached, 0), before scaling
	DecodeBlocks  float64 // active decode + new blocks
	Cost          float64 // PrefillLoadScale·PrefillBlocks + DecodeBlocks; lower wins
}

// Cost evaluates the cost model, lower being better:
//
//	cached  = gpu_blocks + HostTierWeight·host_blocks + DiskTierWeight·disk_blocks
//	prefill = max(active_prefill_blocks + request_blocks − OverlapCredit·cached, 0)
//	cost    = PrefillLoadScale·prefill + active_decode_blocks + new_blocks
//
// where gpu_blocks are the overlap's blocks on neither lower tier. Prefill
// terms are in blocks of BlockSize tokens, fractional when the token
// counts are not whole blocks.
func (p CostParams) Cost(in CostInputs) WorkerCost {
	bs := float64(in.BlockSize)
	prefill := (float64(in.ActivePrefillTokens)+float64(in.PromptTokens))/bs - p.OverlapCredit*p.cached(in.OverlapBlocks, in.HostBlocks, in.DiskBlocks)
	if prefill < 0 {
		prefill = 0
	}
	decode := in.ActiveDecodeBlocks + float64(in.NewBlocks)
	return WorkerCost{PrefillBlocks: prefill, DecodeBlocks: decode, Cost: p.PrefillLoadScale*prefill + decode}
}

// cached is the overlap in GPU-block equivalents: lower-tier blocks
// weighted by their tier. host+disk never exceeds overlap.
func (p *CostParams) cached(overlap, host, disk uint32) float64 {
	return float64(overlap-host-disk) + p.HostTierWeight*float64(host) + p.DiskTierWeight*float64(disk)
}

// rng is a splitmix64 stream over an atomic counter: safe from any
// goroutine, allocation-free, and reproducible for a given seed when draws
// are serialised (as the tests do).
type rng struct{ state atomic.Uint64 }

func (r *rng) next() uint64 {
	z := r.state.Add(0x9E3779B97F4A7C15)
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

// intn returns a uniform value in [0, n) for n <= 64; the multiply-shift
// bias is below 2^-26, far under what any test or workload could see.
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}

// float returns a uniform value in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) * 0x1p-53 }

// pick chooses among cands (non-empty) by cost: the argmin with ties broken
// uniformly when temperature is 0, otherwise a softmax sample.
func pick(costs *[workers.Max]float64, cands workers.Set, temperature float64, r *rng) workers.Slot {
	if temperature > 0 {
		return sample(costs, cands, temperature, r)
	}
	best := math.Inf(1)
	var ties workers.Set
	for w := range cands.All() {
		switch c := costs[w]; {
		case c < best:
			best, ties = c, workers.SetOf(w)
		case c == best:
			ties |= workers.SetOf(w)
		}
	}
	return nth(ties, r.intn(ties.Len()))
}

// sample draws a worker with probability proportional to
// exp(−(c−min)/(max−min)/temperature): costs are normalised to [0, 1] first
// so that one temperature means the same spread whatever the scale of the
// costs, as in Dynamo.
func sample(costs *[workers.Max]float64, cands workers.Set, temperature float64, r *rng) workers.Slot {
	lo, hi := math.Inf(1), math.Inf(-1)
	for w := range cands.All() {
		lo, hi = min(lo, costs[w]), max(hi, costs[w])
	}
	if !(hi > lo) {
		return nth(cands, r.intn(cands.Len()))
	}
	var weights [workers.Max]float64
	var total float64
	for w := range cands.All() {
		weights[w] = math.Exp(-(costs[w] - lo) / (hi - lo) / temperature)
		total += weights[w]
	}
	x := r.float() * total
	var last workers.Slot
	for w := range cands.All() {
		if x < weights[w] {
			return w
		}
		x -= weights[w]
		last = w
	}
	return last // rounding left x a hair above the sum
}

// nth returns the i-th lowest member of s.
func nth(s workers.Set, i int) workers.Slot {
	for ; i > 0; i-- {
		s &= s - 1
	}
	w, _ := s.First()
	return w
}
