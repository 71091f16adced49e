package sched

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/workers"
	"github.com/puzpuzpuz/xsync/v3"
)

// Scheduler picks a worker for each request and books the request's load
// on it. It is safe for concurrent use.
type Scheduler struct {
	blockSize int

	// mu serialises the active-block table: one critical section per
	// selection (scan, score, book) and one per release, never one per
	// block. Booking inside the same section as scoring also means two
	// concurrent requests never both pick a worker on the strength of load
	// the other is about to add.
	mu    sync.Mutex
	table *activeTable

	wmu     sync.Mutex // serialises worker-set writers
	workers atomic.Pointer[workerSet]
	healthy atomic.Uint64 // workers.Set
	live    [workers.Max]workerLive
	calib   [workers.Max]calibrator // each worker's fitted timing (calibrate.go)
	// sharedScale is the float64 bits of the prefill load scale applied
	// with AutoPrefillLoadScale; observations counts what fed the fits.
	sharedScale, observations atomic.Uint64
	priorScale                float64 // the scale of a worker with no data
	// written counts, per slot, the prompt blocks booked uncached since
	// its engine joined: how full its cache is (capacity.go). Apart from
	// live, whose layout is one cache line per worker.
	written [workers.Max]atomic.Int64
	// progress is each worker's answers, for stall detection
	// (stall.go).
	progress [workers.Max]progress
	// stretch is how long each worker has been busy as selections saw it
	// (busy.go), for the sessions that leave a worker that stays busy.
	stretch [workers.Max]busyStretch

	params     atomic.Pointer[CostParams]
	thresholds atomic.Pointer[BusyThresholds]
	policy     atomic.Uint32 // Policy
	turns      atomic.Uint64 // round-robin turns taken
	rng        rng

	queue    admissionQueue
	waiting  atomic.Int64 // Select calls queued or woken and retrying
	bump     time.Duration
	refusals []OverloadError // by the queue wait in whole seconds (overload)
	waitEWMA atomic.Int64    // ns a queued request waited, smoothed

	// Booked and released move on every request from every core: striped
	// counters keep them off one contended cache line. The rare events use
	// plain atomics.
	booked, released     *xsync.Counter
	queuedTotal, refused atomic.Uint64
}

// New returns a scheduler with no workers.
func New(cfg Config) (*Scheduler, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		booked:    xsync.NewCounter(),
		released:  xsync.NewCounter(),
		blockSize: cfg.BlockSize,
		table:     newActiveTable(cfg.ActiveBlocks),
		bump:      cfg.PriorityBump,
		refusals:  newRefusals(cfg.RetryAfterMin, cfg.RetryAfterMax),
	}
	s.queue.init(cfg.QueueCapacity)
	for i := range s.calib {
		s.calib[i].reset()
	}
	s.priorScale = s.calib[0].loadScale()
	s.sharedScale.Store(math.Float64bits(s.priorScale))
	s.workers.Store(&workerSet{
		bySlot:  map[workerKey]workers.Slot{},
		byModel: map[string]workers.Set{},
	})
	p := *cfg.Cost
	s.params.Store(&p)
	b := cfg.Busy
	s.thresholds.Store(&b)
	s.policy.Store(uint32(cfg.Policy))
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	s.rng.state.Store(seed)
	return s, nil
}

// BlockSize returns the tokens per block the scheduler counts in.
func (s *Scheduler) BlockSize() int { return s.blockSize }

// Tiered reports whether the global cost parameters credit lower tiers,
// so that the caller looks them up (Request.LowerTiers).
func (s *Scheduler) Tiered() bool { return s.params.Load().Tiered() }

// Stats is a snapshot of the scheduler's counters.
type Stats struct {
	Booked, Released uint64 // reservations booked and released so far
	Queued           uint64 // requests that had to wait for a worker
	Refused          uint64 // requests refused as overloaded
	Waiting          int    // requests waiting now
	ActiveEntries    int    // distinct blocks held by in-flight requests
	TableCapacity    int
	Untracked        uint64 // booked blocks the full table could not de-duplicate
	DeepShares       int    // (block, worker) pairs held by more than 31 requests
}

// Stats returns the scheduler's counters.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	st := Stats{
		ActiveEntries: s.table.live,
		TableCapacity: len(s.table.entries),
		Untracked:     s.table.untracked,
		DeepShares:    len(s.table.high),
	}
	s.mu.Unlock()
	st.Booked = uint64(s.booked.Value())
	st.Released = uint64(s.released.Value())
	st.Queued = s.queuedTotal.Load()
	st.Refused = s.refused.Load()
	st.Waiting = int(s.waiting.Load())
	return st
}
