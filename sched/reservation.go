package sched

import (
	"time"

	"github.com/kvfast/kvfast/internal/clock"
	"github.com/kvfast/kvfast/workers"
)

// Reservation is the load one request has booked on its worker: its prompt
// blocks, its prompt tokens until the first output token, and its tracked
// output blocks. It is released exactly once.
//
// A Reservation is a value its owner keeps (the guard embeds one), so that
// its buffer is reused across requests. Its methods are not safe for
// concurrent use: the owner serialises them.
type Reservation struct {
	s              *Scheduler
	idx            []uint32 // table entry of every booked block
	n              int
	prefill        int64 // prompt tokens booked as prefill
	outputUnits    int64 // output charge currently booked
	expectedOutput int64
	slot           workers.Slot
	state          resState
	prefillDone    bool
	trackOutput    bool
	waiting        bool   // counted in the worker's progress until answered or released (stall.go)
	awaitDecode    bool   // a decode stage between RemotePrefillDone and AwaitDecode
	engineGen      uint32 // the engine generation it was counted on

	// What the worker's calibration learns from (calibrate.go).
	bookedAt     int64 // clock.Now at booking
	prefillAhead int64 // prefill tokens booked on the worker, this request's included
	// blindAhead is the prefill tokens of unstreamed requests booked on
	// the worker before this one: while any are, the first token's wait
	// cannot be told apart (Request.Unstreamed).
	blindAhead    int64
	unstreamed    bool  // Request.Unstreamed: its prefill counts in blindPrefill
	retiredAtBook int64 // the worker's calibrator.retired then
	firstAt       int64 // clock.Now at the first token
	areaAtFirst   int64 // the worker's batchArea then
	stage         Stage // a disaggregated request's stage teaches only its half
}

type resState uint8

const (
	resEmpty resState = iota
	resBooked
	resReleased
)

// keepIdx caps the buffer a pooled reservation keeps between requests.
const keepIdx = 1 << 16

func (r *Reservation) grow(n int) []uint32 {
	if cap(r.idx) < n {
		r.idx = make([]uint32, n, n+n/4)
	}
	return r.idx[:n]
}

// BlockSize returns the tokens per block of the booking (0 if none).
func (r *Reservation) BlockSize() int {
	if r.s == nil {
		return 0
	}
	return r.s.blockSize
}

// TracksOutput reports whether output blocks are booked as they grow, so
// that callers can skip reporting progress when they are not.
func (r *Reservation) TracksOutput() bool { return r.state == resBooked && r.trackOutput }

// PrefillDone releases the booked prompt tokens: the first output token
// proves the engine finished the prompt, and it is the engine's answer
// (stall.go). After RemotePrefillDone it only records the answer and
// when decoding began; later calls do nothing.
func (r *Reservation) PrefillDone() {
	if r.state != resBooked {
		return
	}
	now := clock.Now()
	r.answer(now)
	switch {
	case !r.prefillDone:
		r.prefilled(now)
	case r.firstAt == 0: // the first token after a remote prefill
		r.firstAt = now
		r.areaAtFirst = r.s.calib[r.slot].batch.read(now)
	}
}

// RemotePrefillDone releases a decode stage's booked prompt tokens when
// another engine computes its prompt. The engine it is booked on has
// nothing to answer until its request is sent, so the request stops
// waiting on it until AwaitDecode. Call it before the decode stage is
// sent; its own first token's PrefillDone is the engine's answer.
func (r *Reservation) RemotePrefillDone() {
	if r.state != resBooked || r.prefillDone {
		return
	}
	r.prefillDone = true
	r.s.live[r.slot].prefillTokens.Add(-r.prefill)
	r.releaseBlind()
	if r.waiting {
		r.waiting, r.awaitDecode = false, true
		r.s.progress[r.slot].closed(r.engineGen, false, clock.Now())
	}
	r.s.wakeWaiters()
}

// AwaitDecode records that a decode stage whose prompt another engine
// computed (RemotePrefillDone) is being sent to its engine, which from
// now on owes it an answer (stall.go). Other calls do nothing.
func (r *Reservation) AwaitDecode() {
	if r.state != resBooked || !r.awaitDecode {
		return
	}
	r.awaitDecode = false
	r.engineGen = r.s.progress[r.slot].booked(clock.Now())
	r.waiting = true
}

// prefilled releases the booked prompt tokens of a prompt the worker
// computed at now and teaches the worker's calibration.
func (r *Reservation) prefilled(now int64) {
	r.prefillDone = true
	l := &r.s.live[r.slot]
	l.prefillTokens.Add(-r.prefill)
	r.releaseBlind()
	r.firstAt = now
	c := &r.s.calib[r.slot]
	r.areaAtFirst = c.batch.read(r.firstAt)
	// The prefill the wait paid for: what was queued ahead at booking,
	// or, when the engine batched later arrivals into the same steps,
	// what finished meanwhile, which counts them.
	done := max(r.prefillAhead, c.retired.Add(r.prefill)-r.retiredAtBook)
	// A decode stage that computed its prompt here (conditional
	// disaggregation kept it local) has a first token like any other.
	// One booked behind an unstreamed request's prompt does not: that
	// prompt stays counted until its request ends, computed or not.
	if r.blindAhead == 0 {
		c.observePrefill(done, time.Duration(r.firstAt-r.bookedAt))
		r.s.calibrated()
	}
	r.s.wakeWaiters()
}

// releaseBlind takes an unstreamed request's prefill out of the worker's
// blindPrefill, with the prefillTokens it is part of.
func (r *Reservation) releaseBlind() {
	if r.unstreamed {
		r.s.calib[r.slot].blindPrefill.Add(-r.prefill)
	}
}

// Answered records that the engine answered the request: a request that
// is not streamed gives no first token, and its completion is the first
// sign of progress the worker's stall detection gets (stall.go). Later
// calls, and calls after a first token, do nothing.
func (r *Reservation) Answered() {
	if r.state == resBooked {
		r.answer(clock.Now())
	}
}

func (r *Reservation) answer(now int64) {
	if r.waiting {
		r.waiting = false
		r.s.progress[r.slot].closed(r.engineGen, true, now)
	}
}

// Completed records that the request finished normally after output
// tokens: the worker's calibration learns its decode speed from the mean
// gap between tokens against the batch it shared. Call it once, before
// Release, from the goroutine that called PrefillDone; a request that
// aborted teaches nothing and is not reported.
func (r *Reservation) Completed(output int) {
	// A request of one token never decoded, and a prefill stage's one
	// token is all it was asked for; without a first token there is no
	// decode to time.
	if r.state != resBooked || r.firstAt == 0 || output < 2 || r.stage == StagePrefill {
		return
	}
	s := r.s
	l := &s.live[r.slot]
	now := clock.Now()
	seqs := l.requests.Load()
	var gap time.Duration
	avgSeqs := float64(seqs)
	if now > r.firstAt {
		gap = time.Duration(now-r.firstAt) / time.Duration(output-1)
		// The batch it decoded with, averaged over its decode.
		avgSeqs = float64(s.calib[r.slot].batch.read(now)-r.areaAtFirst) / float64(now-r.firstAt)
	}
	// The context a sequence holds, in the decode term's own blocks
	// (distinct, plus output when tracked), so that the derived scale
	// converts into them.
	blocks := float64(l.activeBlocks.Load()) + float64(l.outputUnits.Load())/outputUnit
	context := blocks * float64(s.blockSize) / float64(max(seqs, 1))
	s.calib[r.slot].observeDecode(gap, avgSeqs, context, output)
	s.calibrated()
}

// OutputTokens books the output blocks of total generated tokens, counted
// in whole blocks. With an expected output length E the charge is
// blocks·max(0, 1 − total/E): a request nearing its expected end will soon
// free everything, so it weighs less on the choice of worker for the next.
func (r *Reservation) OutputTokens(total int) {
	if r.state != resBooked || !r.trackOutput || total < 0 {
		return
	}
	blocks := int64(total / r.s.blockSize)
	units := blocks * outputUnit
	if e := r.expectedOutput; e > 0 {
		left := max(e-int64(total), 0)
		units = int64(float64(units) * float64(left) / float64(e))
	}
	d := units - r.outputUnits
	if d == 0 {
		return
	}
	r.outputUnits = units
	r.s.live[r.slot].outputUnits.Add(d)
	if d < 0 {
		r.s.wakeWaiters()
	}
}

// Release returns everything still booked. Releasing an empty reservation
// does nothing; releasing one twice is a bug and panics.
func (r *Reservation) Release() {
	switch r.state {
	case resEmpty:
		return
	case resReleased:
		panic("BUG: sched: reservation released twice")
	}
	s := r.s
	l := &s.live[r.slot]
	s.mu.Lock()
	l.activeBlocks.Add(-s.table.release(r.idx[:r.n], uint(r.slot)))
	if !r.prefillDone {
		l.prefillTokens.Add(-r.prefill)
		r.releaseBlind()
	}
	now := clock.Now()
	if r.waiting {
		r.waiting = false
		s.progress[r.slot].closed(r.engineGen, false, now)
	}
	l.outputUnits.Add(-r.outputUnits)
	l.requests.Add(-1)
	s.calib[r.slot].batch.add(now, -1)
	s.mu.Unlock()
	r.state = resReleased
	s.released.Inc()
	s.wakeWaiters()
}

// Reset makes a released (or never booked) reservation ready for the next
// request, keeping its buffer unless it grew past what a pool should hold.
// Resetting a booking would leak its load, so it panics.
func (r *Reservation) Reset() {
	if r.state == resBooked {
		panic("BUG: sched: resetting a reservation that still holds load")
	}
	idx := r.idx
	if cap(idx) > keepIdx {
		idx = nil
	}
	*r = Reservation{idx: idx[:0]}
}
