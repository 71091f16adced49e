package guard

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvfast/kvfast/internal/invariants"
	"github.com/kvfast/kvfast/sched"
)

// Pool hands out guards bound to one scheduler and one observer.
type Pool struct {
	sched *sched.Scheduler
	obs   Observer
	pool  sync.Pool
}

// NewPool returns a pool of guards that book on s and report to obs.
func NewPool(s *sched.Scheduler, obs Observer) *Pool {
	p := &Pool{sched: s, obs: obs}
	p.pool.New = func() any {
		g := &Guard{pool: p}
		g.word.Store(pack(1, Free, ReasonNone))
		return g
	}
	return p
}

// Guard is the lifecycle of one routed request. Callers hold it through a
// Handle, never directly.
type Guard struct {
	// word is the whole synchronisation state: generation, lifecycle
	// state, abort reason and flags, moved only by compare-and-swap. A
	// handle carries the generation it was issued with, so every CAS from
	// a stale handle fails by construction, even on a recycled guard.
	word atomic.Uint64
	pool *Pool
	res  sched.Reservation

	// Written by the owner before the CAS that publishes them.
	promptTokens int
	blockSize    int
	track        bool

	// Written only by the goroutine relaying the stream.
	outputTokens int
	nextBoundary int
	// Set by the owner (Defer); run by Release after the load is freed.
	after AfterRelease
}

// Word layout: state in bits 0-7, flags in 8-15, reason in 16-23,
// generation in 32-63.
const (
	// busyBit: the relay is moving the reservation (first token, output
	// block). A terminal transition waits for it to clear, so the release
	// of load never interleaves with a progress update.
	busyBit uint64 = 1 << 8
	// cleanedBit: the terminal transition's load release has finished.
	cleanedBit uint64 = 1 << 9
	// dispatchedBit: the request reached Dispatched (metrics are due).
	dispatchedBit uint64 = 1 << 10
	// releasingBit: Release claimed the guard; a second Release is stale.
	releasingBit uint64 = 1 << 11
)

func pack(gen uint32, s State, r Reason) uint64 {
	return uint64(gen)<<32 | uint64(r)<<16 | uint64(s)
}

func genOf(w uint64) uint32              { return uint32(w >> 32) }
func stateOf(w uint64) State             { return State(w) }
func reasonOf(w uint64) Reason           { return Reason(w >> 16) }
func withState(w uint64, s State) uint64 { return w&^0xFF | uint64(s) }

// Handle is a caller's reference to a guard for one request. It is a small
// value: copy it freely, but every copy dies at Release.
type Handle struct {
	g   *Guard
	gen uint32
}

// Acquire returns a fresh guard in state Acquired. Release it exactly once,
// with defer right away, so that every path out of the handler — including
// a panic — releases the request's load:
//
//	h := pool.Acquire()
//	defer h.Release()
//
// A handler that recovers a panic aborts the guard with ReasonPanic before
// it is released; otherwise Release records the request as dropped.
func (p *Pool) Acquire() Handle {
	g := p.pool.Get().(*Guard)
	w := g.word.Load()
	gen := genOf(w)
	g.word.Store(pack(gen, Acquired, ReasonNone))
	if invariants.Enabled {
		checkTransition(w, pack(gen, Acquired, ReasonNone), gen)
	}
	return Handle{g: g, gen: gen}
}

// load returns the guard's word if h is current.
func (h Handle) load() (uint64, error) {
	if h.g == nil {
		return 0, ErrStale
	}
	w := h.g.word.Load()
	if genOf(w) != h.gen || stateOf(w) == Free || w&releasingBit != 0 {
		return 0, ErrStale
	}
	return w, nil
}

// State returns the request's state (Free for a stale handle).
func (h Handle) State() State {
	w, err := h.load()
	if err != nil {
		return Free
	}
	return stateOf(w)
}

// Select chooses a worker and books the request's load straight into the
// guard (Acquired → Selected), so that from here on every path releases
// it. It may wait in the admission queue; ctx bounds the wait. On error
// nothing is booked and the guard stays Acquired.
func (h Handle) Select(ctx context.Context, req *sched.Request) (sched.Decision, error) {
	w, err := h.load()
	if err != nil {
		return sched.Decision{}, err
	}
	if stateOf(w) != Acquired {
		return sched.Decision{}, &TransitionError{From: stateOf(w), To: Selected}
	}
	if req.QueryOnly {
		return sched.Decision{}, fmt.Errorf("cannot book a query-only request: %w", sched.ErrInvalidRequest)
	}
	g := h.g
	d, err := g.pool.sched.Select(ctx, req, &g.res)
	if err != nil {
		return d, err
	}
	g.promptTokens = req.PromptTokens
	g.blockSize = g.res.BlockSize()
	g.nextBoundary = g.blockSize
	g.track = g.res.TracksOutput()
	if !g.word.CompareAndSwap(pack(h.gen, Acquired, ReasonNone), pack(h.gen, Selected, ReasonNone)) {
		// Aborted while selecting: nobody else knows about the booking.
		g.res.Release()
		return sched.Decision{}, ErrAborted
	}
	if invariants.Enabled {
		checkTransition(pack(h.gen, Acquired, ReasonNone), pack(h.gen, Selected, ReasonNone), h.gen)
	}
	return d, nil
}

// Dispatched records that the engine accepted the request (Selected →
// Dispatched).
func (h Handle) Dispatched() error {
	w, err := h.load()
	if err != nil {
		return err
	}
	g := h.g
	for {
		switch s := stateOf(w); s {
		case Selected:
		case Aborted:
			return ErrAborted
		default:
			return &TransitionError{From: s, To: Dispatched}
		}
		if g.word.CompareAndSwap(w, withState(w, Dispatched)|dispatchedBit) {
			if invariants.Enabled {
				checkTransition(w, withState(w, Dispatched)|dispatchedBit, h.gen)
			}
			return nil
		}
		if w, err = h.load(); err != nil {
			return err
		}
	}
}

// DispatchFailed records that the engine never accepted the request
// (Selected → Aborted) and releases its load.
func (h Handle) DispatchFailed() error {
	_, err := h.end(1<<Selected, Aborted, ReasonDispatchFailed)
	return err
}

// OnItem accounts for one stream item carrying tokens output tokens. The
// first token releases the prompt's prefill load; output blocks are booked
// as their boundaries pass. A terminal item (stop, EOS, length) completes
// the request and releases its load before OnItem returns, so before the
// caller hands the item on; an error item aborts it. It returns ErrAborted
// when the request was aborted meanwhile (stop relaying). Items after
// completion (a trailing usage chunk) pass unaccounted. Only one goroutine
// may call OnItem.
func (h Handle) OnItem(tokens int, finish Finish) error {
	w, err := h.load()
	if err != nil {
		return err
	}
	g := h.g
	switch s := stateOf(w); s {
	case Dispatched:
	case Completed:
		return nil
	case Aborted:
		return ErrAborted
	default:
		return &TransitionError{From: s, To: Dispatched}
	}
	if tokens > 0 {
		first := g.outputTokens == 0
		g.outputTokens += tokens
		boundary := g.track && g.outputTokens >= g.nextBoundary
		if first || boundary {
			if !h.enterBusy() {
				return ErrAborted
			}
			if first {
				g.res.PrefillDone()
			}
			if boundary {
				g.res.OutputTokens(g.outputTokens)
				g.nextBoundary = (g.outputTokens/g.blockSize + 1) * g.blockSize
			}
			g.word.And(^busyBit)
		}
	}
	switch finish {
	case FinishNone:
		return nil
	case FinishError:
		if won, err := h.end(1<<Dispatched, Aborted, ReasonEngineError); err != nil || !won {
			return orAborted(err)
		}
		return nil
	default:
		// The scheduler's calibration learns decode speed from requests
		// that finish; the busy bit keeps an abort's release out.
		if h.enterBusy() {
			g.res.Completed(g.outputTokens)
			g.word.And(^busyBit)
		}
		if won, err := h.end(1<<Dispatched, Completed, ReasonNone); err != nil || !won {
			return orAborted(err)
		}
		return nil
	}
}

func orAborted(err error) error {
	if err != nil {
		return err
	}
	return ErrAborted
}

// enterBusy sets busyBit while the request is Dispatched; false means it
// no longer is (a concurrent abort won).
func (h Handle) enterBusy() bool {
	for {
		w := h.g.word.Load()
		if genOf(w) != h.gen || stateOf(w) != Dispatched {
			return false
		}
		if h.g.word.CompareAndSwap(w, w|busyBit) {
			return true
		}
	}
}

// Close records a normal end of stream (Dispatched → Completed). After a
// terminal item it does nothing.
func (h Handle) Close() error {
	w, err := h.load()
	if err != nil {
		return err
	}
	if stateOf(w) == Completed {
		return nil
	}
	if won, err := h.end(1<<Dispatched, Completed, ReasonNone); err != nil || !won {
		if err == nil && h.State() == Completed {
			return nil
		}
		return orAborted(err)
	}
	return nil
}

// Abort ends the request with reason and releases its load, from any
// state before Completed. It may be called from any goroutine (a context
// watcher, a timeout) while another relays the stream; the relay's next
// OnItem returns ErrAborted. Aborting a finished request does nothing.
func (h Handle) Abort(reason Reason) error {
	_, err := h.end(1<<Acquired|1<<Selected|1<<Dispatched, Aborted, reason)
	return err
}

// end moves the guard from one of the states in from to the terminal
// state to, and releases the load exactly once: only the CAS winner does.
// It reports false, nil when the guard was already terminal.
func (h Handle) end(from uint8, to State, reason Reason) (bool, error) {
	g := h.g
	for {
		w, err := h.load()
		if err != nil {
			return false, err
		}
		s := stateOf(w)
		if s.Terminal() {
			return false, nil
		}
		if from&(1<<s) == 0 {
			return false, &TransitionError{From: s, To: to}
		}
		if w&busyBit != 0 {
			runtime.Gosched() // the relay is mid-update; it takes nanoseconds
			continue
		}
		if !g.word.CompareAndSwap(w, pack(h.gen, to, reason)|w&dispatchedBit) {
			continue
		}
		if invariants.Enabled {
			checkTransition(w, pack(h.gen, to, reason)|w&dispatchedBit, h.gen)
		}
		if s != Acquired {
			if to == Completed || reason == ReasonEngineRejected {
				// An answer, for the worker's stall detection, even
				// when no first token was seen (not streamed): the
				// engine judged the request, whatever it said.
				g.res.Answered()
			}
			g.res.Release()
		}
		g.word.Or(cleanedBit)
		return true, nil
	}
}

// Release ends the request's lifecycle and recycles the guard. A request
// still live is aborted first with ReasonDropped, so its load is released
// on every path, a panic included. Metrics are reported for requests that
// were dispatched. Every other user of the handle must be done before
// Release (the guard is reused right after); a second Release returns
// ErrStale.
func (h Handle) Release() error {
	if _, err := h.end(1<<Acquired|1<<Selected|1<<Dispatched, Aborted, ReasonDropped); err != nil {
		return err
	}
	g := h.g
	var w uint64
	for {
		var err error
		if w, err = h.load(); err != nil {
			return err
		}
		if w&cleanedBit == 0 {
			runtime.Gosched() // another goroutine won the abort and is releasing
			continue
		}
		if g.word.CompareAndSwap(w, w|releasingBit) {
			w |= releasingBit
			break
		}
	}
	ev := Event{State: stateOf(w), Reason: reasonOf(w), PromptTokens: g.promptTokens, OutputTokens: g.outputTokens}
	if f := g.pool.obs.Finished; f != nil && w&dispatchedBit != 0 {
		f(ev)
	}
	after := g.after
	g.after = nil
	g.word.Store(pack(h.gen+1, Free, ReasonNone))
	if invariants.Enabled {
		checkTransition(w, pack(h.gen+1, Free, ReasonNone), h.gen)
	}
	g.res.Reset()
	g.promptTokens, g.blockSize, g.track = 0, 0, false
	g.outputTokens, g.nextBoundary = 0, 0
	g.pool.pool.Put(g)
	if after != nil {
		after.AfterRelease(ev)
	}
	return nil
}
