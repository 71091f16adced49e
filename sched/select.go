package sched

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// Request is what selection needs to know about one request. The caller
// (the front end) hashes the prompt and runs the index's FindMatches
// itself; Select reads the result and keeps nothing that points into the
// request, so a Request and its buffers can live on the caller's stack.
type Request struct {
	Hashes       []uint64          // chained hashes of the prompt's full blocks
	PromptTokens int               // input length in tokens (ISL), >= len(Hashes)·BlockSize
	Overlaps     *workers.Overlaps // per-slot cached prefix in blocks; nil means none
	// LowerTiers, when not nil, says how many blocks of each Overlaps
	// prefix are held only on a lower tier (FindTieredMatches); they are
	// credited at the cost parameters' tier weights. nil: all on the GPU.
	LowerTiers *workers.LowerTiers
	Model      string // only workers serving this model; "" means any

	// Pinned restricts the request to exactly (PinWorker, PinRank). Rank 0
	// is a real rank; a pair not in the worker set is an error.
	Pinned    bool
	PinWorker uint64
	PinRank   uint32
	// PinBusyLimit, when not 0, lets the pin lapse while the request waits
	// in the admission queue: once the pinned worker has been busy this
	// long (busy.go's stretch, as every selection saw it), Select clears
	// the request's pin and routes it among the workers its other filters
	// allow, keeping its place in the queue, and says so in
	// Decision.PinLapsed. A sticky session's turn queued behind its busy
	// worker is moved this way, as its next turn would be.
	PinBusyLimit time.Duration

	// AllowListed restricts the request to the slots in Allow.
	AllowListed bool
	Allow       workers.Set

	// Priority moves a queued request ahead of earlier arrivals: each unit
	// counts as Config.PriorityBump of waiting. Negative values fall back.
	Priority int32

	// Stage keeps only the workers whose role can run this stage of a
	// disaggregated request (roles.go); StageAny keeps all.
	Stage Stage

	// QueryOnly returns the decision without booking anything or queueing.
	QueryOnly bool

	// Running books a request that already runs on the worker it names
	// (an endpoint picker's gateway fell back to it): the busy thresholds
	// and the admission queue do not apply, since refusing the booking
	// would not stop the request, only hide its load.
	Running bool

	// Cost, when not nil, replaces the global cost parameters for this
	// request (a full set: copy Config.Cost or DefaultCostParams, edit,
	// point here).
	Cost *CostParams

	// Policy, when not nil, replaces the global routing policy for this
	// request. Filters, busy thresholds, admission and booking are the
	// same under every policy; only the choice among candidates differs.
	Policy *Policy

	// ExpectedOutputTokens, when positive, decays tracked output blocks
	// toward zero as generation approaches it.
	ExpectedOutputTokens int

	// Unstreamed says the request will report no first token (a
	// completion asked for as one object): its prompt stays booked as
	// prefill until it ends, long after the engine computed it, so a
	// request booked behind it cannot tell what its own wait paid for,
	// and its first token teaches the worker's calibration nothing.
	Unstreamed bool

	// Scores, when not nil, receives every eligible worker's cost terms.
	Scores *Scores
}

// Decision is the outcome of a selection.
type Decision struct {
	Slot          workers.Slot
	WorkerID      uint64
	DPRank        uint32
	Endpoint      string
	OverlapBlocks uint32  // prompt blocks the chosen worker already caches
	Cost          float64 // the chosen worker's cost in the cost model, whatever the policy
	Policy        Policy  // the policy that chose
	// Busy is set on a query-only decision when every eligible worker is
	// over a busy threshold: a real request would have queued.
	Busy   bool
	Queued time.Duration // time spent in the admission queue
	// PinLapsed: the request's pin lapsed while it waited (PinBusyLimit),
	// and Select cleared it in the request and routed it unpinned.
	PinLapsed bool
}

// Scores are the per-worker terms of one selection, for route-only queries
// and debugging.
type Scores struct {
	Eligible workers.Set // healthy workers passing the filters
	Busy     workers.Set // of those, the ones over a busy threshold
	Workers  [workers.Max]WorkerScore
}

// WorkerScore is one worker's share of a selection.
type WorkerScore struct {
	OverlapBlocks uint32 // cached prefix blocks (from the index), on any tier
	HostBlocks    uint32 // of those, held only in host memory
	DiskBlocks    uint32 // of those, held only on storage
	SharedBlocks  uint32 // prompt blocks already held by in-flight requests here
	WorkerCost
	// EvictBlocks is the eviction term (capacity.go) in prefill blocks,
	// before scaling; WorkerCost.Cost includes it scaled by
	// PrefillLoadScale. 0 unless CostParams.EvictionWeight is set and the
	// worker's cache is full.
	EvictBlocks float64
}

// Select chooses a worker for req and, unless req.QueryOnly, books the
// request's load into res. When every eligible worker is busy it waits in
// the admission queue until one frees up or ctx ends; when the queue is
// full it returns an *OverloadError. res must not hold a booking; it is
// untouched on error and for query-only requests (res may then be nil).
func (s *Scheduler) Select(ctx context.Context, req *Request, res *Reservation) (Decision, error) {
	p, err := s.paramsFor(req)
	if err != nil {
		return Decision{}, err
	}
	pol, err := s.policyFor(req)
	if err != nil {
		return Decision{}, err
	}
	if err := s.check(req); err != nil {
		return Decision{}, err
	}
	if req.QueryOnly {
		return s.query(req, &p, pol)
	}
	if res == nil || res.state == resBooked {
		return Decision{}, fmt.Errorf("cannot book into a reservation that is missing or already booked: %w", ErrInvalidRequest)
	}
	var w *waiter
	tried, lapsed := false, false
	for {
		ws := s.workers.Load()
		filtered, cands, err := s.candidates(ws, req)
		if err != nil {
			s.leave(w, false)
			return Decision{}, err
		}
		// Queued requests go first: an arrival joins them unless it is one
		// of them, woken to retry.
		if w != nil || s.waiting.Load() == 0 || req.Running {
			tried = true
			if d, ok := s.tryBook(ws, req, &p, pol, cands, res); ok {
				if w != nil {
					d.Queued = clock.Since(w.since)
					s.leave(w, true)
				}
				d.PinLapsed = lapsed
				return d, nil
			}
			if req.Running {
				return Decision{}, s.overload() // no eligible worker at all
			}
		}
		if w == nil {
			w = s.join(req.Priority)
		}
		w.eligible = filtered
		if !s.queue.push(w) {
			if !tried {
				tried = true
				if d, ok := s.tryBook(ws, req, &p, pol, cands, res); ok {
					s.leave(w, false)
					return d, nil
				}
			}
			err := s.overload()
			s.leave(w, false)
			return Decision{}, err
		}
		s.admit()
		switch err := s.wait(ctx, w, ws, req); {
		case err == errPinLapsed:
			// Out of the queue, still counted as waiting: routed anew on
			// the next turn, it goes back to its place (its key) if it
			// must wait again.
			req.Pinned, req.PinWorker, req.PinRank, req.PinBusyLimit = false, 0, 0, 0
			lapsed = true
		case err != nil:
			s.leave(w, false)
			return Decision{}, err
		}
	}
}

// errPinLapsed is wait's report that the pinned worker stayed busy for
// the request's PinBusyLimit.
var errPinLapsed = errors.New("the pinned worker stayed busy")

// pinLapseCheck bounds how long a waiting pinned request goes without
// looking at its worker: often enough that the busy stretch it extends
// is not broken by busyStretchGap.
const pinLapseCheck = 250 * time.Millisecond

// wait blocks until w is woken to retry (nil), ctx ends, or the worker
// req pins has stayed busy for req.PinBusyLimit (errPinLapsed). On error w
// is out of the queue, with any wake-up token still in it for leave.
func (s *Scheduler) wait(ctx context.Context, w *waiter, ws *workerSet, req *Request) error {
	var lapse <-chan time.Time
	var slot workers.Slot
	if req.Pinned && req.PinBusyLimit > 0 {
		slot = ws.bySlot[workerKey{req.PinWorker, req.PinRank}] // candidates found it
		t := time.NewTimer(s.untilLapse(ws, slot, req.PinBusyLimit))
		defer t.Stop()
		lapse = t.C
		for {
			select {
			case <-w.wake:
				return nil
			case <-ctx.Done():
				return s.giveUp(ctx, w)
			case <-lapse:
			}
			next := s.untilLapse(ws, slot, req.PinBusyLimit)
			if next > 0 {
				t.Reset(next)
				continue
			}
			if !s.queue.remove(w) {
				<-w.wake // woken meanwhile: retry as any woken waiter does
				return nil
			}
			return errPinLapsed
		}
	}
	select {
	case <-w.wake:
		return nil
	case <-ctx.Done():
		return s.giveUp(ctx, w)
	}
}

// giveUp takes w out of the queue because ctx ended.
func (s *Scheduler) giveUp(ctx context.Context, w *waiter) error {
	if !s.queue.remove(w) {
		<-w.wake // admit woke it as ctx ended; the wake-up passes on in leave
	}
	return fmt.Errorf("cannot wait for a free worker: %w", context.Cause(ctx))
}

// untilLapse looks at slot's busy state (which extends its busy stretch)
// and returns how long until the stretch reaches limit, at most
// pinLapseCheck; 0 once it has.
func (s *Scheduler) untilLapse(ws *workerSet, slot workers.Slot, limit time.Duration) time.Duration {
	now := clock.Now()
	if s.busy(ws, workers.SetOf(slot), now) == 0 {
		return pinLapseCheck // free: the waiter is woken, or is about to be
	}
	left := limit - time.Duration(s.stretch[slot].length(now))
	if left <= 0 {
		return 0
	}
	return min(left, pinLapseCheck)
}

func (s *Scheduler) paramsFor(req *Request) (CostParams, error) {
	if req.Cost == nil {
		return *s.params.Load(), nil
	}
	p := *req.Cost
	return p, p.Validate()
}

func (s *Scheduler) check(req *Request) error {
	if req.PromptTokens < 0 || req.ExpectedOutputTokens < 0 ||
		len(req.Hashes) > req.PromptTokens/s.blockSize {
		return fmt.Errorf("cannot route %d block hashes for %d prompt tokens: %w",
			len(req.Hashes), req.PromptTokens, ErrInvalidRequest)
	}
	return nil
}

// Eligible returns the healthy workers passing req's filters (model,
// allow-list, stage, pin) other than except: where an attempt that failed
// on except could go next. It books nothing.
func (s *Scheduler) Eligible(req *Request, except workers.Set) workers.Set {
	_, up, err := s.candidates(s.workers.Load(), req)
	if err != nil {
		return 0
	}
	return up &^ except
}

// Routable returns the error Select would refuse req with at once,
// whatever the load: a pin to an unknown or excluded worker, or no
// healthy worker passing its filters; nil otherwise. It books nothing.
// A caller about to do costly work before selecting (the encoder stage)
// refuses such a request first.
func (s *Scheduler) Routable(req *Request) error {
	_, _, err := s.candidates(s.workers.Load(), req)
	return err
}

// candidates returns the workers passing req's filters, and those of them
// that are healthy.
func (s *Scheduler) candidates(ws *workerSet, req *Request) (filtered, healthy workers.Set, err error) {
	set := ws.present
	if req.Model != "" {
		set &= ws.byModel[req.Model]
	}
	if req.AllowListed {
		set &= req.Allow
	}
	set &^= ws.excluded(req.Stage)
	up := workers.Set(s.healthy.Load())
	if req.Pinned {
		w, ok := ws.bySlot[workerKey{req.PinWorker, req.PinRank}]
		if !ok {
			return 0, 0, &PinError{WorkerID: req.PinWorker, DPRank: req.PinRank, Err: ErrPinnedWorkerNotFound}
		}
		if !(set & up).Has(w) {
			err := ErrNoEligibleWorker
			if ws.excludesPin(req, w) {
				err = ErrPinExcluded
			}
			return 0, 0, &PinError{WorkerID: req.PinWorker, DPRank: req.PinRank, Err: err}
		}
		set = workers.SetOf(w)
	}
	if set&up == 0 {
		return 0, 0, fmt.Errorf("cannot route request among %d workers: %w", ws.present.Len(), ErrNoEligibleWorker)
	}
	return set, set & up, nil
}

// excludesPin reports whether req's own filters exclude worker w, which
// it pins: its allow-list, its stage, or its model when w's model is
// known. A static worker given without model= serves none until the
// engine's /v1/models names it, and until then a pin to it may yet be
// honoured, as one to an unhealthy worker may.
func (ws *workerSet) excludesPin(req *Request, w workers.Slot) bool {
	switch {
	case req.AllowListed && !req.Allow.Has(w), ws.excluded(req.Stage).Has(w):
		return true
	case req.Model != "" && ws.info[w].Model != "":
		return !ws.byModel[req.Model].Has(w)
	}
	return false
}

// tryBook scores cands and books req on the worker pol chooses among those
// that are not busy, or reports false if all of them are.
func (s *Scheduler) tryBook(ws *workerSet, req *Request, p *CostParams, pol Policy, cands workers.Set, res *Reservation) (Decision, bool) {
	n := len(req.Hashes)
	idx := res.grow(n)
	var acc laneCounter
	var costs [workers.Max]float64

	s.mu.Lock()
	now := clock.Now()
	s.table.scan(req.Hashes, uint64(cands), idx, &acc)
	s.score(ws, req, p, cands, &acc, &costs, now)
	busy := s.busy(ws, cands, now)
	if req.Scores != nil {
		req.Scores.Busy = busy
	}
	free := cands &^ busy
	if req.Running {
		free = cands
	}
	if free == 0 {
		s.mu.Unlock()
		return Decision{}, false
	}
	free = s.progressing(p, free, now)
	// A pin is not a round-robin turn: it must not push the rotation on.
	w := s.choose(pol, req, &costs, free, p.Temperature, !req.Pinned)
	shared := s.inFlightCredit(p, w, acc.get(uint(w)), now)
	overlap := p.overlap(req, w, n, shared)
	host, disk := p.lowerTiers(req, w, overlap, shared)
	prefill := int64(req.PromptTokens) - int64(p.cached(overlap, host, disk)*float64(s.blockSize))
	l := &s.live[w]
	// Counters move inside the section that moves the table, so that they
	// always agree with it and never dip below zero.
	l.activeBlocks.Add(s.table.book(req.Hashes, idx, uint(w)))
	// What the first token will have waited for: the prefill booked here
	// ahead of this request, and its own (calibrate.go).
	ahead := l.prefillTokens.Add(prefill)
	blindAhead := s.calib[w].blindPrefill.Load()
	if req.Unstreamed {
		s.calib[w].blindPrefill.Add(prefill)
	}
	s.written[w].Add(int64(n) - int64(overlap))
	l.requests.Add(1)
	gen := s.progress[w].booked(now)
	s.calib[w].batch.add(now, 1)
	retired := s.calib[w].retired.Load()
	s.mu.Unlock()

	*res = Reservation{
		s:              s,
		idx:            res.idx,
		n:              n,
		prefill:        prefill,
		expectedOutput: int64(req.ExpectedOutputTokens),
		slot:           w,
		state:          resBooked,
		trackOutput:    p.TrackOutputBlocks,
		bookedAt:       now, // before the table scan: microseconds, against TTFTs of milliseconds
		prefillAhead:   ahead,
		blindAhead:     blindAhead,
		unstreamed:     req.Unstreamed,
		retiredAtBook:  retired,
		stage:          req.Stage,
		waiting:        true,
		engineGen:      gen,
	}
	s.booked.Inc()
	info := &ws.info[w]
	return Decision{
		Slot:          w,
		WorkerID:      info.ID,
		DPRank:        info.DPRank,
		Endpoint:      info.Endpoint,
		OverlapBlocks: overlap,
		Cost:          costs[w],
		Policy:        pol,
	}, true
}

// query is Select for a query-only request: the same scores and choice,
// nothing booked, never queued.
func (s *Scheduler) query(req *Request, p *CostParams, pol Policy) (Decision, error) {
	ws := s.workers.Load()
	_, cands, err := s.candidates(ws, req)
	if err != nil {
		return Decision{}, err
	}
	var acc laneCounter
	var costs [workers.Max]float64
	s.mu.Lock()
	s.table.scan(req.Hashes, uint64(cands), nil, &acc)
	s.mu.Unlock()
	now := clock.Now()
	s.score(ws, req, p, cands, &acc, &costs, now)
	busy := s.busy(ws, cands, now)
	if req.Scores != nil {
		req.Scores.Busy = busy
	}
	free := cands &^ busy
	allBusy := free == 0
	if allBusy {
		free = cands
	}
	free = s.progressing(p, free, now)
	w := s.choose(pol, req, &costs, free, p.Temperature, false)
	info := &ws.info[w]
	return Decision{
		Slot:          w,
		WorkerID:      info.ID,
		DPRank:        info.DPRank,
		Endpoint:      info.Endpoint,
		OverlapBlocks: p.overlap(req, w, len(req.Hashes), acc.get(uint(w))),
		Cost:          costs[w],
		Policy:        pol,
		Busy:          allBusy,
	}, nil
}

// score fills costs for every candidate, and req.Scores if asked, as of
// clock time now.
func (s *Scheduler) score(ws *workerSet, req *Request, p *CostParams, cands workers.Set, acc *laneCounter, costs *[workers.Max]float64, now int64) {
	n := len(req.Hashes)
	reqBlocks := int64((req.PromptTokens + s.blockSize - 1) / s.blockSize)
	if req.Scores != nil {
		req.Scores.Eligible = cands
	}
	// With the scale on auto, every worker's cost uses the shared fitted
	// one (calibrate.go).
	q := *p
	if q.AutoPrefillLoadScale {
		q.PrefillLoadScale = s.autoScale()
	}
	fill := s.cacheFill(ws, p, cands, now)
	for w := range cands.All() {
		l := &s.live[w]
		shared := s.inFlightCredit(p, w, acc.get(uint(w)), now)
		overlap := p.overlap(req, w, n, shared)
		host, disk := p.lowerTiers(req, w, overlap, shared)
		c := q.Cost(CostInputs{
			BlockSize:           s.blockSize,
			PromptTokens:        req.PromptTokens,
			OverlapBlocks:       overlap,
			HostBlocks:          host,
			DiskBlocks:          disk,
			ActivePrefillTokens: l.prefillTokens.Load(),
			ActiveDecodeBlocks:  float64(l.activeBlocks.Load()) + float64(l.outputUnits.Load())/outputUnit,
			NewBlocks:           reqBlocks - int64(shared),
		})
		evict := p.evictBlocks(fill[w], n-int(overlap))
		c.Cost += q.PrefillLoadScale * evict
		costs[w] = c.Cost
		if req.Scores != nil {
			req.Scores.Workers[w] = WorkerScore{OverlapBlocks: overlap, HostBlocks: host, DiskBlocks: disk,
				SharedBlocks: shared, WorkerCost: c, EvictBlocks: evict}
		}
	}
}

// overlap is the prefix the cost model credits on w: what the index says w
// caches and, with CreditInFlight, what in-flight requests booked on w
// already hold. Chained hashes make the latter a prefix too: a block held
// in flight implies every block before it was in that request's prompt.
func (p *CostParams) overlap(req *Request, w workers.Slot, n int, shared uint32) uint32 {
	o := overlapOf(req, w, n)
	if p.CreditInFlight {
		o = max(o, min(shared, uint32(n)))
	}
	return o
}

// lowerTiers returns how many of the overlap blocks credited on w are
// held only in host memory and only on storage. Blocks that in-flight
// requests hold (CreditInFlight) are on the GPU, so an overlap that came
// from them has none on a lower tier; the index's counts are capped to
// the credited overlap.
func (p *CostParams) lowerTiers(req *Request, w workers.Slot, overlap, shared uint32) (host, disk uint32) {
	if req.LowerTiers == nil || p.CreditInFlight && shared >= overlap {
		return 0, 0
	}
	host = min(req.LowerTiers.Blocks(workers.TierHost, w), overlap)
	disk = min(req.LowerTiers.Blocks(workers.TierDisk, w), overlap-host)
	return host, disk
}

// overlapOf is w's cached prefix, capped at the prompt: an index racing
// ahead of the request cannot credit more blocks than the prompt has.
func overlapOf(req *Request, w workers.Slot, n int) uint32 {
	if req.Overlaps == nil {
		return 0
	}
	return min(req.Overlaps[w], uint32(n))
}
