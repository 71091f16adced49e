package dispatch

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvfast/kvfast/internal/clock"
)

// OutlierConfig sets passive health checking: every forwarded request is a
// verdict on its engine, and an engine whose requests keep failing while
// its /health still answers is ejected from selection for a while, as
// Envoy's outlier detection does. Zero picks the default; a negative
// Consecutive, FailurePercent or MaxEjectedPercent disables that part.
//
// A failure is a refused connection, a reset or garbage instead of an
// answer, a stream that breaks off, a timeout, or a 5xx status. A client
// that leaves, a busy connection pool or a 4xx (a 429 too: load, not
// sickness) is no verdict on the engine.
type OutlierConfig struct {
	// Consecutive failures in a row eject the engine. Default 5.
	Consecutive int
	// FailurePercent ejects an engine when at least this share of its
	// requests failed within one Window, once it saw MinRequests there.
	// Default 80.
	FailurePercent int
	MinRequests    int           // default 20
	Window         time.Duration // default 10s
	// BaseEjection is the first ejection's length; the n-th ejection in a
	// row lasts n times as long, up to MaxEjection. Each BaseEjection an
	// engine then serves without being ejected again forgives one step.
	// Defaults 30s and 5m.
	BaseEjection, MaxEjection time.Duration
	// MaxEjectedPercent bounds the share of each ejection group's engines
	// (Engine.SetEjectionGroup) ejected at once, rounded down: ejection
	// must not empty the pool, or a role's part of it, because of a fault
	// on the router's side. Below 100 the last engine of a group is never
	// ejected. An engine over the bound stays in selection, and retries
	// route around it. Default 50.
	MaxEjectedPercent int
}

// OutlierStatus is an engine's passive-health state, for operators.
type OutlierStatus struct {
	Ejected   bool
	Ejections uint64        // since the engine was added
	Remaining time.Duration // left of the current ejection; 0 when not ejected
}

// outlier is one engine's passive-health record. The counters move on every
// request without a lock; ejecting and returning take the engine's
// healthMu, which also orders them with active-health flips.
type outlier struct {
	consecutive           atomic.Int32
	lastServed            atomic.Int64 // clock time a request last succeeded; 0: never
	windowStart           atomic.Int64 // clock time the rate window began
	requests, failures    atomic.Int32 // within the window
	ejected               atomic.Bool
	ejections             atomic.Uint64
	until                 atomic.Int64
	multiplier            int   // under healthMu
	returnedAt            int64 // clock time of the last return; under healthMu
	timer                 *time.Timer
	heldEjectionAllowance bool   // counted in Pool.ejected; under healthMu
	heldGroup             uint32 // the group it is counted in; under healthMu
}

// IsEngineFault reports whether err, a failure of a forwarded request,
// is its engine's doing, and so counts against it: not the client's
// leaving, the router's own bounds or shutdown, another stage's failure,
// or an engine's state (a 429, an adapter it unloaded).
func IsEngineFault(err error) bool {
	for _, not := range [...]error{ErrClientGone, ErrAbandoned, ErrUnknownEngine, ErrResponseTooLarge, ErrResponseBudget,
		ErrShuttingDown, ErrPrefillFailed, ErrConnsExhausted, ErrEngineOverloaded, ErrAdapterGone} {
		if errors.Is(err, not) {
			return false
		}
	}
	return true
}

// record counts one request's verdict on e and ejects it when the verdicts
// say so.
func (e *Engine) record(ok bool) {
	cfg := &e.pool.cfg.Outlier
	o := &e.out
	now := clock.Now()
	if start := o.windowStart.Load(); now-start > int64(cfg.Window) && o.windowStart.CompareAndSwap(start, now) {
		// A racing request may count into the old window's totals; the
		// rate is an estimate either way.
		o.requests.Store(0)
		o.failures.Store(0)
	}
	reqs := o.requests.Add(1)
	if ok {
		o.lastServed.Store(now)
		if o.consecutive.Load() != 0 {
			o.consecutive.Store(0)
		}
		return
	}
	fails := o.failures.Add(1)
	n := o.consecutive.Add(1)
	if o.ejected.Load() {
		return
	}
	byRun := cfg.Consecutive > 0 && int(n) >= cfg.Consecutive
	byRate := cfg.FailurePercent > 0 && int(reqs) >= cfg.MinRequests && int(fails)*100 >= cfg.FailurePercent*int(reqs)
	if byRun || byRate {
		e.eject(now, ejectionWhy{byRun: byRun, run: n, fails: fails, reqs: reqs})
	}
}

// ejectionWhy is what tripped an ejection, formatted only for one that
// happens: an engine over the ejection bound fails on without allocating.
type ejectionWhy struct {
	byRun            bool
	run, fails, reqs int32
}

func (w ejectionWhy) String() string {
	if w.byRun {
		return fmt.Sprintf("%d failed requests in a row", w.run)
	}
	return fmt.Sprintf("%d of its last %d requests failed", w.fails, w.reqs)
}

// eject takes e out of selection for its backoff, if the pool's bound
// allows another ejection.
func (e *Engine) eject(now int64, why ejectionWhy) {
	p := e.pool
	cfg := &p.cfg.Outlier
	e.healthMu.Lock()
	defer e.healthMu.Unlock()
	o := &e.out
	group := e.ejectGroup.Load()
	if o.ejected.Load() || p.engines[e.slot].Load() != e || !p.reserveEjection(group) {
		return
	}
	if o.multiplier > 0 && cfg.BaseEjection > 0 {
		forgiven := int((now - o.returnedAt) / int64(cfg.BaseEjection))
		o.multiplier = max(0, o.multiplier-forgiven)
	}
	o.multiplier++
	d := min(time.Duration(o.multiplier)*cfg.BaseEjection, cfg.MaxEjection)
	o.heldEjectionAllowance, o.heldGroup = true, group
	o.until.Store(now + int64(d))
	o.ejections.Add(1)
	o.ejected.Store(true)
	o.consecutive.Store(0)
	o.requests.Store(0)
	o.failures.Store(0)
	o.timer = time.AfterFunc(d, e.unEject)
	e.reportLocked(fmt.Errorf("ejected by passive health checking: %v, for %v", why, d))
}

// unEject returns e to selection when its ejection ends. It starts with a
// clean record, so a still-failing engine is ejected again, for longer.
func (e *Engine) unEject() {
	e.healthMu.Lock()
	defer e.healthMu.Unlock()
	o := &e.out
	if !o.ejected.Load() || e.pool.engines[e.slot].Load() != e {
		return
	}
	e.endEjectionLocked()
	o.returnedAt = clock.Now()
	e.reportLocked(nil)
}

// endEjectionLocked clears e's ejection and gives its allowance back.
func (e *Engine) endEjectionLocked() {
	o := &e.out
	if o.timer != nil {
		o.timer.Stop()
		o.timer = nil
	}
	o.ejected.Store(false)
	o.until.Store(0)
	o.consecutive.Store(0)
	if o.heldEjectionAllowance {
		o.heldEjectionAllowance = false
		e.pool.ejectMu.Lock()
		if e.pool.ejected[o.heldGroup]--; e.pool.ejected[o.heldGroup] == 0 {
			delete(e.pool.ejected, o.heldGroup)
		}
		e.pool.ejectMu.Unlock()
	}
}

// reserveEjection counts one more ejected engine of group if
// MaxEjectedPercent of the pool's engines in that group allows it.
func (p *Pool) reserveEjection(group uint32) bool {
	pct := p.cfg.Outlier.MaxEjectedPercent
	if pct <= 0 {
		return false
	}
	n := 0
	for i := range p.engines {
		if e := p.engines[i].Load(); e != nil && e.ejectGroup.Load() == group {
			n++
		}
	}
	p.ejectMu.Lock()
	defer p.ejectMu.Unlock()
	if (p.ejected[group]+1)*100 > n*pct {
		return false
	}
	if p.ejected == nil {
		p.ejected = map[uint32]int{}
	}
	p.ejected[group]++
	return true
}

// Outlier returns e's passive-health state. It reads atomics only, so a
// health hook may call it.
func (e *Engine) Outlier() OutlierStatus {
	o := &e.out
	st := OutlierStatus{Ejected: o.ejected.Load(), Ejections: o.ejections.Load()}
	if st.Ejected {
		st.Remaining = max(0, time.Duration(o.until.Load()-clock.Now()))
	}
	return st
}

// Attempts is one client request's memory of the engines that answered
// it with a 5xx, over the attempts of a stage that retries elsewhere
// (Call.SetAttempts). A 5xx proves an engine sick when another engine
// then serves the same request. A request that every engine it tries
// answers with a 5xx (a prompt that crashes the model, sent by mistake or
// on purpose) is more likely at fault itself: held against each engine,
// it would eject healthy engines one retry at a time, up to
// MaxEjectedPercent of the pool, for as long as a client keeps sending
// it. So a Call given Attempts holds its 5xx verdicts there and records
// them as failures when a later attempt gets a success status; when the
// request ends with verdicts still held, Done counts each against its
// engine unless that engine served another request within the outlier
// Window (it works; this request did not). Engines that fail everything
// still go: they serve nothing. Refused or broken connections and
// timeouts are judged at once, as without Attempts: they say nothing
// about the request. A request that cannot be retried elsewhere (pinned
// to its worker, say) gets no Attempts: with one engine's word alone, a
// poisonous request cannot be told from a flaky engine.
//
// The zero value is ready. The owner serialises its attempts, as it does
// the Call's, and calls Done once the request is over.
type Attempts struct {
	held [maxHeldVerdicts]*Engine
	n    int
}

// maxHeldVerdicts bounds the 5xx verdicts one request holds back: each
// retry goes to another engine, so this is more retries than an operator
// sets. A 5xx past it is judged at once.
const maxHeldVerdicts = 8

// hold keeps e's 5xx verdict until the request is served, or reports
// false when there is no room.
func (a *Attempts) hold(e *Engine) bool {
	if a.n == len(a.held) {
		return false
	}
	a.held[a.n] = e
	a.n++
	return true
}

// served records the held verdicts as failures: another engine served
// the request they failed.
func (a *Attempts) served() {
	for i := range a.n {
		a.held[i].record(false)
		a.held[i] = nil
	}
	a.n = 0
}

// Done settles the verdicts still held when the request is over, no
// engine having served it: each counts against its engine unless that
// engine served another request within the outlier Window. It returns
// how many it did not count, and leaves a ready for another request.
func (a *Attempts) Done() (unattributed int) {
	if a.n == 0 {
		return 0
	}
	now := clock.Now()
	for i := range a.n {
		e := a.held[i]
		a.held[i] = nil
		if served := e.out.lastServed.Load(); served != 0 && now-served <= int64(e.pool.cfg.Outlier.Window) {
			unattributed++
			continue
		}
		e.record(false)
	}
	a.n = 0
	return unattributed
}
