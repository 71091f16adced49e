package sched

import (
	"math"
	"time"

	"github.com/kvfast/kvfast/radix"
	"github.com/kvfast/kvfast/workers"
)

// CostParams are the knobs of the cost model (see docs/routing.md). The
// scheduler holds one global copy, set by New from Config; a request may
// carry its own full copy instead.
type CostParams struct {
	// OverlapCredit multiplies the blocks a worker already caches before
	// they are subtracted from the prefill term (Dynamo's
	// overlap_score_credit, formerly overlap_score_weight). 0 ignores the
	// cache and balances load only.
	OverlapCredit float64
	// PrefillLoadScale weighs the adjusted prefill term against the decode
	// term (Dynamo's prefill_load_scale).
	PrefillLoadScale float64
	// AutoPrefillLoadScale replaces PrefillLoadScale by the scale the
	// workers' fitted timing gives (calibrate.go: the median of theirs,
	// or a disaggregated pool's), shared by all: kvfast serve's default,
	// --prefill-load-scale auto.
	AutoPrefillLoadScale bool
	// Temperature 0 picks the cheapest worker (ties broken uniformly at
	// random); above 0 it samples from a softmax over normalised costs.
	Temperature float64
	// CreditInFlight also credits, as cached, the prompt blocks that
	// requests in flight on the worker already hold: the engine computes
	// them before or while this request prefills, but reports them stored
	// only afterwards, so the event-fed index alone misses the window in
	// which follow-ups of a new prefix arrive. Off in DefaultCostParams
	// (Dynamo's model); kvfast serve turns it on.
	CreditInFlight bool
	// HostTierWeight and DiskTierWeight credit a cached block a worker
	// holds only in host memory or only on storage as that fraction of
	// one on its GPU: loading it back is cheaper than recomputing it,
	// dearer than finding it in place. They apply when the caller fills
	// Request.LowerTiers (FindTieredMatches). Dynamo's defaults: 0.75 and
	// 0.25.
	HostTierWeight float64
	DiskTierWeight float64
	// EvictionWeight charges a placement for the cached blocks it evicts:
	// on a worker whose cache is full, every prompt block it does not
	// already cache costs this many prefill blocks more, since computing
	// it there pushes out a block some later request may want
	// (capacity.go, docs/routing.md). It makes kv keep a prefix in one
	// place unless load forces a copy. 0, Dynamo's model, ignores
	// eviction; kvfast serve sets DefaultEvictionWeight.
	EvictionWeight float64
	// StallAfter withdraws a worker's in-flight credit (CreditInFlight),
	// and the eviction term's discount for its free memory, while requests
	// have waited on it this long without any answer from it (stall.go):
	// an engine that accepts requests and never answers must not draw
	// traffic. 0 never stalls a worker (one that has never answered still
	// has its free memory priced as full); kvfast serve sets
	// DefaultStallAfter.
	StallAfter time.Duration
	// TrackOutputBlocks adds output blocks to the worker's decode load as
	// generation crosses block boundaries, decayed toward the request's
	// expected output length when it gives one.
	TrackOutputBlocks bool
}

// DefaultCostParams are Dynamo's defaults: full credit for cached blocks,
// three quarters for blocks in host memory and a quarter for blocks on
// storage, unscaled prefill, argmin selection, no output-block tracking.
func DefaultCostParams() CostParams {
	return CostParams{OverlapCredit: 1, PrefillLoadScale: 1, HostTierWeight: 0.75, DiskTierWeight: 0.25}
}

// Tiered reports whether lower tiers earn any credit, so that the caller
// need look them up (FindTieredMatches rather than FindMatches).
func (p *CostParams) Tiered() bool { return p.HostTierWeight > 0 || p.DiskTierWeight > 0 }

// Validate reports whether every parameter is finite and non-negative.
func (p CostParams) Validate() error {
	for _, f := range [...]struct {
		name string
		v    float64
	}{
		{"--overlap-credit", p.OverlapCredit},
		{"--prefill-load-scale", p.PrefillLoadScale},
		{"--temperature", p.Temperature},
		{"--host-tier-weight", p.HostTierWeight},
		{"--disk-tier-weight", p.DiskTierWeight},
		{"--eviction-weight", p.EvictionWeight},
	} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return invalidf("cannot use %s %v: want a finite number >= 0", f.name, f.v)
		}
	}
	// A tier's block is worth at most a GPU block: more would send a
	// request to a worker for what it must first copy back.
	for _, w := range [...]struct {
		name string
		v    float64
	}{{"--host-tier-weight", p.HostTierWeight}, {"--disk-tier-weight", p.DiskTierWeight}} {
		if w.v > 1 {
			return invalidf("cannot use %s %v: want a weight in [0, 1] (a GPU block is 1)", w.name, w.v)
		}
	}
	if p.StallAfter < 0 {
		return invalidf("cannot use --stall-after %v: want >= 0 (0: never stalled)", p.StallAfter)
	}
	return nil
}

// BusyThresholds mark a worker busy; a busy worker takes no new request
// until it drops back under. A zero field disables that test.
type BusyThresholds struct {
	// DecodeBlocksFraction: busy when the decode blocks the router has
	// booked (distinct prompt blocks plus output blocks) exceed this
	// fraction of the worker's KV capacity, or when the engine's own load
	// page reports its KV usage above it.
	DecodeBlocksFraction float64
	// PrefillTokens: busy when more than this many prompt tokens booked on
	// the worker still await their first output token.
	PrefillTokens int64
}

// Validate reports whether the thresholds are usable.
func (b BusyThresholds) Validate() error {
	f := b.DecodeBlocksFraction
	if !(f >= 0 && f <= 1) {
		// Past 1 it would never hold: the operator meant something else
		// (a percentage?) than turning the threshold off, which is 0.
		return invalidf("cannot use --busy-decode-fraction %v: want a fraction of the KV capacity, from 0 (off) to 1", f)
	}
	if b.PrefillTokens < 0 {
		return invalidf("cannot use --busy-prefill-tokens %d: want a count of tokens, 0 (off) or more", b.PrefillTokens)
	}
	return nil
}

// DefaultBusy are the busy thresholds kvfast serve and kvfast epp run
// with. A worker is busy when the decode blocks booked on it (or its engine's reported KV
// usage) pass 95% of its KV capacity, where the engine would start to
// preempt, or when more than 128Ki prompt tokens booked on it still await
// their first token: seconds of prefill even on a fast engine, which the
// request is better off waiting out in the router's queue, free to take
// whichever worker drops under first. Workers that report no KV capacity
// are judged on prompt tokens alone.
var DefaultBusy = BusyThresholds{DecodeBlocksFraction: 0.95, PrefillTokens: 128 << 10}

// Defaults applied by New to zero Config fields.
const (
	DefaultActiveBlocks  = 1 << 16
	DefaultQueueCapacity = 1024
	DefaultPriorityBump  = time.Second
	DefaultRetryAfterMin = time.Second
	DefaultRetryAfterMax = 30 * time.Second
	// MaxRetryAfter bounds RetryAfterMax: a client told to wait longer
	// has been turned away, and the scheduler keeps one prebuilt refusal
	// per second of the range.
	MaxRetryAfter = time.Hour
)

// Config sizes and tunes a Scheduler. The zero value is usable.
type Config struct {
	// BlockSize is the tokens per KV block, shared by the router's hashes
	// and every engine; 0 means radix.DefaultBlockSize.
	BlockSize int
	// ActiveBlocks bounds the distinct in-flight prompt blocks tracked for
	// de-duplication (rounded up to a power of two; 0 means
	// DefaultActiveBlocks). Beyond it blocks are still counted, only
	// without sharing, so load is over- never under-estimated.
	ActiveBlocks int
	// Cost is the global cost model; nil means DefaultCostParams.
	Cost *CostParams
	// Policy is the global routing policy; the zero value is
	// PolicyKV, the cost model.
	Policy Policy
	// Busy are the busy thresholds (zero: never busy).
	Busy BusyThresholds
	// QueueCapacity bounds the admission queue: 0 means
	// DefaultQueueCapacity, negative means no queue (refuse at once).
	QueueCapacity int
	// PriorityBump is how much earlier one unit of priority makes a
	// request look in the queue (0 means DefaultPriorityBump).
	PriorityBump time.Duration
	// RetryAfterMin and RetryAfterMax clamp the overload retry hint;
	// RetryAfterMax may not exceed MaxRetryAfter.
	RetryAfterMin, RetryAfterMax time.Duration
	// Seed seeds tie-breaking and sampling; 0 picks one from the clock.
	Seed uint64
}

// Validate reports whether New would accept c, so that a command can
// refuse bad settings before it starts anything.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	if c.BlockSize == 0 {
		c.BlockSize = radix.DefaultBlockSize
	}
	if c.BlockSize < 0 || c.BlockSize > workers.MaxBlockSize {
		return c, invalidf("cannot use --block-size %d: must be at most %d", c.BlockSize, workers.MaxBlockSize)
	}
	if c.ActiveBlocks == 0 {
		c.ActiveBlocks = DefaultActiveBlocks
	}
	if c.ActiveBlocks < 0 || c.ActiveBlocks > 1<<30 {
		return c, invalidf("cannot track %d active blocks", c.ActiveBlocks)
	}
	if c.Cost == nil {
		p := DefaultCostParams()
		c.Cost = &p
	}
	if err := c.Cost.Validate(); err != nil {
		return c, err
	}
	if err := c.Policy.Validate(); err != nil {
		return c, err
	}
	if err := c.Busy.Validate(); err != nil {
		return c, err
	}
	switch {
	case c.QueueCapacity == 0:
		c.QueueCapacity = DefaultQueueCapacity
	case c.QueueCapacity < 0:
		c.QueueCapacity = 0
	}
	if c.PriorityBump == 0 {
		c.PriorityBump = DefaultPriorityBump
	}
	if c.RetryAfterMin <= 0 {
		c.RetryAfterMin = DefaultRetryAfterMin
	}
	if c.RetryAfterMax <= 0 {
		c.RetryAfterMax = DefaultRetryAfterMax
	}
	if c.PriorityBump < 0 || c.RetryAfterMax < c.RetryAfterMin || c.RetryAfterMax > MaxRetryAfter {
		return c, invalidf("cannot use priority bump %s and retry hint %s..%s (the bump must not be negative, the hint's range not reversed nor reach past %s)",
			c.PriorityBump, c.RetryAfterMin, c.RetryAfterMax, MaxRetryAfter)
	}
	return c, nil
}
